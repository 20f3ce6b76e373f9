"""Workloads run in a child process: whatever they print, however they end, advisor prints one line or its JSON."""

import json

import pytest

from advisor.cli import main

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
