"""The profile verb's contract: JSON on stdout only, and one-line errors with exit code 2 for bad input."""

import json

import pytest
import torch

from advisor.cli import main
from profile_helpers import FIXTURES

BAD_TARGETS = {
    "missing.py": None,
    "no_attr.py": "def other():\n    return None\n",
    "raises.py": "def workload():\n    raise ValueError('boom')\n",
    "wrong_type.py": "def workload():\n    return 42\n",
    "bad_inputs.py": ("import torch\n\ndef workload():\n"
                      "    return torch.nn.Linear(4, 4), torch.randn(2, 3)\n"),
}
EXPECTED = {"missing.py": "no such file", "no_attr.py": "has no attribute", "raises.py": "raised ValueError: boom",
            "wrong_type.py": "returned int", "bad_inputs.py": "failed on its inputs"}


@pytest.mark.parametrize("name", sorted(BAD_TARGETS))
def test_bad_targets_are_one_line_exit_2(tmp_path, capsys, name):
    if BAD_TARGETS[name] is not None:
        (tmp_path / name).write_text(BAD_TARGETS[name])
    code = main(["profile", f"{tmp_path / name}:workload"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("advisor: error:") and EXPECTED[name] in err[0]
    assert "Traceback" not in err[0]


def test_cuda_without_gpu_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["profile", f"{FIXTURES / 'clean.py'}:workload", "--device", "cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no CUDA GPU" in err[0]


def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path, capsys):
    """--debug adds the traceback; the exit code stays the error's (2), not Python's 1 for an uncaught one."""
    (tmp_path / "raises.py").write_text(BAD_TARGETS["raises.py"])
    code = main(["--debug", "profile", f"{tmp_path / 'raises.py'}:workload"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and "boom" in err
    assert main(["scan", str(tmp_path / "missing.py"), "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_json_is_one_object_on_stdout_and_trace_is_written(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    code = main(["profile", f"{FIXTURES / 'sdpa_fallback.py'}:workload", "--format", "json", "--trace", str(trace)])
    out = capsys.readouterr().out
    data = json.loads(out)
    assert code == 1
    assert {"version", "device", "dtype", "step_us", "findings", "attributed_share"} <= set(data)
    finding = data["findings"][0]
    for key in ("rule", "kind", "path", "line", "end_line", "function", "message", "self_us", "share", "calls",
                "evidence"):
        assert key in finding
    assert finding["kind"] == "sdpa-fallback"
    assert "traceEvents" in json.loads(trace.read_text())


def test_package_module_target_and_pair_return(tmp_path, monkeypatch, capsys):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("import torch\n\ndef pair():\n"
                                      "    return torch.nn.Linear(8, 8), {'input': torch.randn(2, 8)}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["profile", "mypkg.model:pair", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
