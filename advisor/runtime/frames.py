"""Which stack frames are the user's: attribution skips torch, advisor, the standard library and helpers.

Model code in site-packages (transformers, an installed target package) counts as user code: it is where
the slow lines live. Profiler stacks name files with the sys.path prefix trimmed ("torch/nn/functional.py"),
so both absolute and trimmed paths are classified by their top-level package.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

import advisor

# Libraries whose frames never hold the line to blame; time inside them goes to their caller.
SKIP_TOP_LEVEL = frozenset({"torch", "advisor", "einops", "typing_extensions", "numpy", "functorch", "triton",
                            "opt_einsum", "_pytest", "pytest", "pluggy"})
_ADVISOR_DIR = os.path.dirname(os.path.abspath(advisor.__file__))
_STDLIB_DIRS = tuple({os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")})
_PROFILER_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.+)$")


@dataclass(frozen=True)
class Location:
    """A user source position; `def_line` is the first line of the enclosing function (profiler stacks stop there)."""

    path: str
    line: int
    function: str
    def_line: int


def _sys_prefixes() -> tuple[str, ...]:
    entries = {os.path.abspath(p) for p in sys.path if p}
    return tuple(sorted(entries, key=len, reverse=True))


def trimmed(path: str) -> str:
    """The path as torch.profiler prints it: relative to the longest sys.path entry that holds it."""
    for prefix in _sys_prefixes():
        if path.startswith(prefix + os.sep):
            return path[len(prefix) + 1:]
    return path


@lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """True when frames in `path` belong to the workload's code rather than torch/advisor/stdlib/helpers."""
    if not path or path.startswith("<") or path.startswith("nn.Module:"):
        return False
    if os.path.isabs(path):
        real = os.path.realpath(path)
        if real.startswith(_ADVISOR_DIR + os.sep):
            return False
        if "site-packages" not in real and real.startswith(tuple(d + os.sep for d in _STDLIB_DIRS)):
            return False
        return _top_level(trimmed(path)) not in SKIP_TOP_LEVEL
    # A trimmed path from a trace made elsewhere: only its top-level name is known.
    top = _top_level(path)
    return top not in SKIP_TOP_LEVEL and top not in sys.stdlib_module_names


def _top_level(path: str) -> str:
    top = path.replace("\\", "/").split("/", 1)[0]
    return top[:-3] if top.endswith(".py") else top


def parse_profiler_frame(frame: str) -> tuple[str, int, str] | None:
    """'pkg/mod.py(12): forward' -> (file, line, name); None for built-ins and module markers."""
    match = _PROFILER_FRAME.match(frame)
    if not match:
        return None
    return match["file"], int(match["line"]), match["name"]


@lru_cache(maxsize=1 << 16)
def first_user_profiler_frame(stack: tuple[str, ...]) -> tuple[str, int, str] | None:
    """Innermost user frame of a profiler stack (innermost first); its line is the function's first line.
    Cached: a trace repeats each stack once per layer and step."""
    for frame in stack:
        parsed = parse_profiler_frame(frame)
        if parsed and is_user_file(parsed[0]):
            return parsed
    return None


def first_user_frame(frame) -> Location | None:
    """Walk a live Python frame chain outward to the first user frame (used by the dispatch recorder)."""
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return Location(os.path.realpath(code.co_filename), frame.f_lineno, code.co_qualname, code.co_firstlineno)
        frame = frame.f_back
    return None
