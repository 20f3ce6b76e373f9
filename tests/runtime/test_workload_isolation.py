"""Workloads run in a child process: whatever they print, however they end, advisor prints one line or its JSON."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from advisor.cli import main
from processes import HAS_PROC, children, running

MODEL = """
import os, sys, time, torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        print("chatter on stdout")
        print("chatter on stderr", file=sys.stderr)
        {action}
        return self.linear(x)

def workload():
    return Model(), torch.randn(2, 4)
"""

ENDINGS = {
    "sys_exit": ("sys.exit(3)", "called sys.exit(3)"),
    "os_exit": ("os._exit(0)", "ended during `load` (exit code 0"),
    "hang": ("time.sleep(600)", "did not finish `load` within 3 s"),
    "crash": ("import ctypes; ctypes.string_at(0)", "killed by SIGSEGV"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_every_way_a_workload_ends_is_one_line_exit_2(tmp_path, capsys, ending):
    action, expected = ENDINGS[ending]
    (tmp_path / "w.py").write_text(MODEL.format(action=action))
    code = main(["profile", f"{tmp_path / 'w.py'}:workload", "--format", "json", "--timeout", "3"])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and captured.out == ""
    assert len(err) == 1 and err[0].startswith("advisor: error:") and expected in err[0], err


def test_workload_output_never_reaches_stdout(tmp_path, capsys):
    (tmp_path / "w.py").write_text(MODEL.format(action="pass"))
    code = main(["profile", f"{tmp_path / 'w.py'}:workload", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0
    assert json.loads(captured.out)["findings"] == []
    assert "chatter" not in captured.out + captured.err


FORKING = """
import subprocess, sys, torch

def workload():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open({pidfile!r}, "w") as handle:
        handle.write(str(child.pid))
    return torch.nn.Linear(4, 4), torch.randn(2, 4)
"""


@pytest.mark.skipif(not HAS_PROC, reason="reads process states from Linux /proc")
def test_a_process_the_workload_started_is_ended_reported_and_fails_the_run(tmp_path, capsys):
    pidfile = tmp_path / "child.pid"
    (tmp_path / "w.py").write_text(FORKING.format(pidfile=str(pidfile)))
    code = main(["profile", f"{tmp_path / 'w.py'}:workload", "--format", "json"])
    captured = capsys.readouterr()
    child = int(pidfile.read_text())
    alive = running(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the workload's child outlived advisor profile"
    assert json.loads(captured.out)["findings"] == []  # the report is still printed
    [warning] = captured.err.strip().splitlines()
    assert code == 2 and warning.startswith("advisor: warning:") and str(child) in warning and "killed" in warning


HANGING = FORKING.replace("    return torch.nn.Linear(4, 4), torch.randn(2, 4)\n", """    class Hang(torch.nn.Module):
        def forward(self, x):
            time.sleep(300)
            return x
    return Hang(), torch.randn(2, 4)
""").replace("import subprocess,", "import time, subprocess,")


@pytest.mark.skipif(not HAS_PROC, reason="reads process states from Linux /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_workload_process_and_what_it_started_end_with_advisor(tmp_path, signum):
    pidfile = tmp_path / "child.pid"
    (tmp_path / "w.py").write_text(HANGING.format(pidfile=str(pidfile)))
    advisor = subprocess.Popen([sys.executable, "-m", "advisor", "profile", f"{tmp_path / 'w.py'}:workload"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = list(children(advisor.pid))
    started = int(pidfile.read_text())
    advisor.send_signal(signum)
    advisor.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(map(running, [*workers, started])) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in [*workers, started] if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert workers and left == []



SCRIPT = """
import torch

model = torch.nn.Linear(4, 4)
for _ in range(3):
    model(torch.randn(2, 4))
"""


@pytest.mark.parametrize("how", ["function", "script"])
def test_a_users_module_named_like_the_standard_library_beside_the_workload_is_no_error(tmp_path, capsys, how):
    """`profile.py` and `statistics.py` beside the workload: plain Python runs it, and so does advisor, whose recorder
    imports torch._dynamo (`cProfile` imports `profile`) before the user's folder goes first on sys.path (promise
    round 33: "the workload raised AttributeError: module 'profile' has no attribute 'run'")."""
    (tmp_path / "profile.py").write_text("HELPER = 1\n")
    (tmp_path / "statistics.py").write_text("MEAN = 0.5\n")
    (tmp_path / "w.py").write_text(MODEL.format(action="pass") if how == "function" else SCRIPT)
    target = [f"{tmp_path / 'w.py'}:workload"] if how == "function" else ["--", "python", str(tmp_path / "w.py")]
    code = main(["profile", "--format", "json", *target])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["findings"] == []
