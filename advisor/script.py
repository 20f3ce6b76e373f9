"""Script mode (`advisor optimize -- python script.py ARGS`): run the user's script as it is, in a worker process,
until its model has been called a few times, and make a Workload of that model and those calls.

The script runs as `__main__` with its own argv and directory on sys.path, stdin closed (the worker's is /dev/null)
and its output in the worker's log. advisor.capture stops it at the model's N-th call. The patched side runs it
again under the import overlay (its own file too, when it holds the patched code) up to the model's first call:
that builds the same model from the patched source, which then takes the original's weights and inputs.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
import os
import pickle
import sys
import types
from dataclasses import dataclass

from advisor.model_calls import Call, capture
from advisor.errors import AdvisorError, shell_join
from advisor.workload import Workload


@dataclass(frozen=True)
class ScriptCommand:
    path: str | None  # absolute; None for `-m module`, found where it runs (`located`)
    args: tuple[str, ...]
    module: str | None = None  # `python -m module`
    spelled: str | None = None  # the script's path as the command gave it: its argv[0], as `python` keeps it

    @property
    def shown(self) -> str:
        if self.module is not None:
            return shell_join(["-m", self.module, *self.args])
        return shell_join([os.path.relpath(self.path) if self.path.startswith(os.getcwd()) else self.path,
                           *self.args])


def parse_command(argv: list[str]) -> ScriptCommand:
    """`python script.py ARGS`, `python -m module ARGS` or `script.py ARGS` (the interpreter is always this one's).
    A module is not looked up here: finding it imports its packages, which only the worker may run."""
    words = list(argv)
    if words and os.path.basename(words[0]).startswith("python") and not words[0].endswith(".py"):
        words = words[1:]
    if not words:
        raise AdvisorError("nothing after `--`: give the script to run, as in `advisor optimize -- python train.py`")
    if words[0] == "-m":
        if len(words) < 2:
            raise AdvisorError("`python -m` needs a module name: `-- python -m package.module ARGS`")
        return ScriptCommand(None, tuple(words[2:]), module=words[1])
    if words[0].startswith("-"):
        raise AdvisorError(f"`python {words[0]} ...` is not supported: give the script's path "
                           "(`-- python path/to/script.py ARGS` or `-m package.module`), or a TARGET "
                           "`package.module:function`")
    path = os.path.abspath(words[0])
    if not os.path.isfile(path):
        raise AdvisorError(f"{words[0]}: no such script")
    return ScriptCommand(path, tuple(words[1:]), spelled=words[0])


def located(command: ScriptCommand) -> tuple[str, ModuleSpec | None]:
    """(the file to run, its module's spec) as `python -m` finds them: the current directory first, a package's
    `__main__`. Imports the module's parent packages, as `python -m` does."""
    if command.module is None:
        return command.path, None
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(command.module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(command.module + ".__main__")
    except ImportError as exc:
        spec, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = f"no module named {command.module!r}"
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise AdvisorError(f"{command.shown}: {why} (searched the current directory {cwd}, then sys.path): run "
                           "advisor from the folder `python -m` would run from")
    return spec.origin, spec


def run_script(command: ScriptCommand, calls: int, loader=None) -> tuple[Workload, list[Call], str]:
    """Run the script until its model's `calls`-th call: (the workload of its first call, every recorded call,
    one line on how the script ended). `loader(path)` gives the overlay's patched copy of a file, if it has one."""
    from advisor.workload_loader import import_before_user_folders

    import_before_user_folders()
    path, spec = located(command)
    recorder = capture(limit=calls)
    try:
        with recorder:
            _execute(command, path, spec, loader)
        ended = "ran to its end"
    except SystemExit as exc:
        ended = f"exited with code {exc.code!r}"
    except EOFError as exc:
        ended = f"raised EOFError: {exc} (it reads stdin, which advisor closes: pass its input as arguments)"
    except Exception as exc:  # noqa: BLE001 - user code: its crash is one line
        ended = f"raised {type(exc).__name__}: {exc}"
    if recorder.stop_reached_the_end:
        ended = f"stopped at the model's call {calls}"
    elif recorder.stopped:
        ended = (f"went on after advisor's stop at the model's call {calls} (a bare `except:` caught it, or the model "
                 f"ran in a thread, which the stop ended), each later model call stopped again before it ran; then it "
                 f"{ended}")
    captured = recorder.captured
    if not captured.modules:
        raise AdvisorError(f"{command.shown}: no model captured: the script {ended} without calling an nn.Module")
    try:
        model, recorded = captured.model()
    except AdvisorError as exc:
        raise AdvisorError(f"{command.shown}: no model captured: {exc}") from exc
    _check_picklable(command, model, recorded)
    return captured.workload(), recorded, (f"captured {type(model).__name__} and the inputs of "
                                           f"{len(recorded)} call(s); the script {ended}")


def _execute(command: ScriptCommand, path: str, spec: ModuleSpec | None, loader) -> None:
    """Run the script's code (its patched copy under an overlay) as `__main__`, as `python script.py` (or
    `python -m`) would: argv[0] the file as the command spelled it, its folder (the current directory for -m)
    first on sys.path; a `-m` module has its spec, which multiprocessing's spawned children import it by (without
    one they ran its file by path, where its relative imports failed: promise breaker round 30)."""
    patched = loader(path) if loader else None
    source_path = patched.copy if patched is not None else path
    with open(source_path, "rb") as handle:  # bytes: compile reads a BOM and a coding line as Python does
        code = compile(handle.read(), source_path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__package__ = (spec.name.rpartition(".")[0] or None) if spec is not None else None  # relative imports
    main.__spec__ = spec
    main.__builtins__ = __builtins__
    # the script stays `__main__` in this worker: its classes pickle and resolve by module name, as in a real run
    sys.modules["__main__"] = main
    sys.argv[:] = [command.spelled or path, *command.args]  # `__file__` is absolute, as Python 3.9+ makes it
    if command.module is None:
        sys.path.insert(0, os.path.dirname(path))
    exec(code, main.__dict__)  # noqa: S102 - the user's own script, as `python script.py` would run it


def _check_picklable(command: ScriptCommand, model, recorded: list[Call]) -> None:
    """The inputs travel to the patched worker: one that cannot is a clear error now, not a failed reply later."""
    for index, call in enumerate(recorded, 1):
        try:
            pickle.dumps((call.args, call.kwargs))
        except Exception as exc:  # noqa: BLE001 - any pickling failure
            raise AdvisorError(f"{command.shown}: captured {type(model).__name__}, but the inputs of its call "
                               f"{index} cannot be sent to another process ({type(exc).__name__}: {exc}); "
                               "write a TARGET function that builds them") from exc
