"""Several advisor command lines run one after another in one fresh process: each gets its exit code, stdout and
stderr as if run alone, and the torch import that a process per command line pays is paid once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Each command line's stdout and stderr go to buffers of their own; the list of [code, stdout, stderr] is the
# process's only output.
_RUN_IN_TURN = """
import contextlib, io, json, sys
from advisor.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append((code, out.getvalue(), err.getvalue()))
json.dump(results, sys.__stdout__)
"""


def start_in_one_process(commands: list[list[str]], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Starts the process (several can run side by side); `results_of` waits for it."""
    argv = json.dumps([[str(arg) for arg in command] for command in commands])
    return subprocess.Popen([sys.executable, "-c", _RUN_IN_TURN, argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def results_of(process: subprocess.Popen, timeout: float = 600) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each command line, in order; the process itself must end cleanly."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return [tuple(result) for result in json.loads(out)]
