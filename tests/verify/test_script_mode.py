"""Script mode: `advisor optimize/profile -- python script.py ARGS` runs the user's script as it is,
captures its model and the inputs of a few calls, and verifies patches with no workload function written.

Timing verdicts are not asserted (they depend on the machine's load): parity, what was captured, and what may be
written are."""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import advisor
from advisor.cli import main, split_script

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "gpt_generate.py"


def tree_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def optimize_json(capsys, *argv, script: list[str]) -> tuple[int, dict | None, str]:
    code = main(["optimize", *argv, "--format", "json", "--timing-budget", "1", "--", "python", *script])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else None, captured.err


def test_a_gpt_generation_script_gets_its_attention_patch_verified_without_a_workload_function(tmp_path, capsys):
    shutil.copyfile(SCRIPT, tmp_path / "generate.py")
    before = tree_digest(tmp_path)
    code, result, err = optimize_json(capsys, "--report", str(tmp_path / "report"),
                                      script=[str(tmp_path / "generate.py"), "--prompt", "64", "--tokens", "5"])
    assert code in (0, 1), err
    [patch] = result["patches"]
    assert patch["rule"] == "ADV101" and patch["function"] == "CausalSelfAttention.forward"
    assert patch["verdict"] in ("verified", "no-gain") and not patch["applied"]
    # three recorded calls of the generation loop (prompt 64, 65, 66 tokens) are the parity inputs
    assert patch["parity"]["seeds"] == 3 and patch["parity"]["outputs_compared"] == 3
    assert patch["state_dict"] == {"missing": [], "unexpected": []}
    assert "captured GPT and the inputs of 3 call(s); the script stopped at the model's call 3" in result["notes"]
    assert result["target"].endswith("generate.py --prompt 64 --tokens 5")
    report = {p: d for p, d in tree_digest(tmp_path).items() if not p.startswith("report/")}
    assert report == before  # without --apply nothing of the user's tree is written


SCRIPT_PRELUDE = "import sys, time, torch\nfrom torch import nn\n"
BAD_SCRIPTS = {
    "no_module": ("print(torch.ones(2).sum())", "no model captured: the script ran to its end without calling an "
                                                "nn.Module"),
    "two_models": ("a, b = nn.Linear(4, 4), nn.Linear(4, 2)\nx = torch.ones(1, 4)\nb(a(x)); b(a(x))",
                   "several unrelated models were called at the top level: Linear (2 call(s)), Linear (2 call(s))"),
    "unpicklable": ("class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.l = nn.Linear(2, 2)\n    def forward(self, x, hook):\n        return self.l(x)\n"
                    "M()(torch.ones(1, 2), hook=lambda: 0)",
                    "captured M, but the inputs of its call 1 cannot be sent to another process"),
    "stdin": ("n = int(input())\nnn.Linear(n, n)(torch.ones(1, n))",
              "the script raised EOFError: EOF when reading a line (it reads stdin, which advisor closes"),
    "forever": ("while True:\n    time.sleep(0.1)",
                "did not finish running the script to its model's call 3 within 3 s (--timeout)"),
    "crash": ("raise ValueError('no data')", "the script raised ValueError: no data without calling an nn.Module"),
    "exits": ("sys.exit(3)", "the script exited with code 3 without calling an nn.Module"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCRIPTS))
def test_a_script_without_one_capturable_model_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, case):
    body, expected = BAD_SCRIPTS[case]
    (tmp_path / "user.py").write_text(SCRIPT_PRELUDE + body + "\n")
    before = tree_digest(tmp_path)
    code, result, err = optimize_json(capsys, "--timeout", "3", "--report", str(tmp_path.parent / f"r-{case}"),
                                      script=[str(tmp_path / "user.py")])
    lines = err.strip().splitlines()
    assert code == 2 and result is None
    assert lines[-1].startswith("advisor: error:") and expected in lines[-1], lines
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("calls", [None, "2"])
def test_profile_refuses_a_script_calling_several_models_as_optimize_does(tmp_path, capsys, calls):
    """Promise round 32: profile stopped at the first model's first call, never saw the second, and profiled
    whichever model came first (exit 0) where optimize refused the same script."""
    body, expected = BAD_SCRIPTS["two_models"]
    (tmp_path / "user.py").write_text(SCRIPT_PRELUDE + body + "\n")
    code = main(["profile", "--format", "json", *(["--calls", calls] if calls else []), "--", "python",
                 str(tmp_path / "user.py")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("advisor: error:") and "several unrelated models" in err[-1], err


@pytest.mark.parametrize("argv, expected", [
    (["optimize", "--", "python"], "nothing after `--`"),
    (["optimize", "--", "python", "-c", "pass"], "`python -c ...` is not supported"),
    (["optimize", "--", "python", "-m"], "`python -m` needs a module name"),
    (["optimize", "--", "python", "missing.py"], "missing.py: no such script"),
    (["profile", "x.py:f", "--", "python", "y.py"], "give a TARGET or a script after `--`, not both"),
])
def test_a_bad_script_command_is_one_line_exit_2(capsys, argv, expected):
    assert main(argv) == 2
    assert expected in capsys.readouterr().err.strip().splitlines()[-1]


def test_profile_runs_a_script_and_reports_its_attention(tmp_path, capsys):
    code = main(["profile", "--format", "json", "--", "python", str(SCRIPT), "--prompt", "64", "--tokens", "1"])
    captured = capsys.readouterr()
    rules = {finding["rule"] for finding in json.loads(captured.out)["findings"]}
    assert code == 1 and "ADV110" in rules
    assert "captured GPT and the inputs of 1 call(s)" in captured.err


def test_only_the_verbs_that_run_a_workload_take_a_script_after_the_double_dash():
    assert split_script(["optimize", "--apply", "--", "python", "t.py", "--lr", "1"]) == \
        (["optimize", "--apply"], ["python", "t.py", "--lr", "1"])
    assert split_script(["--debug", "profile", "--", "t.py"]) == (["--debug", "profile"], ["t.py"])
    assert split_script(["scan", "--", "-odd.py"]) == (["scan", "--", "-odd.py"], None)


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x, scale=1.0):
        return self.inner(x) * scale


def test_capture_records_the_outermost_call_with_its_keyword_inputs_and_ignores_a_parameterless_loss():
    model, loss = Pair(), nn.MSELoss()
    x = torch.ones(2, 3)
    with advisor.capture() as captured:
        loss(model(x, scale=2.0), torch.zeros(2, 3))
        x.add_(1)  # an in-place change after the call does not reach the recorded copy
    found, calls = captured.model()
    assert found is model and len(calls) == 1 and calls[0].kwargs == {"scale": 2.0}
    assert torch.equal(calls[0].args[0], torch.ones(2, 3))
    assert [type(m) for m in captured.modules] == [Pair, nn.MSELoss]  # the inner Linear was never outermost
    workload = captured.workload()
    assert workload.model is model and workload.kwargs == {"scale": 2.0} and workload.device == "cpu"


def test_capture_with_a_limit_stops_the_block_at_the_models_nth_call_past_the_users_except():
    model, ran = Pair(), []
    with advisor.capture(limit=2) as captured:
        for step in range(10):
            try:
                model(torch.ones(1, 3))
            except Exception:  # noqa: BLE001 - the user's own handler must not swallow the stop
                pass
            ran.append(step)
    assert ran == [0] and len(captured.model()[1]) == 2


def test_a_script_that_catches_the_stop_runs_no_further_model_call_and_is_told_so(tmp_path, monkeypatch):
    """A fourth promises round: a bare `except:` caught the stop; the script called its model three more times,
    six calls were kept, and the line still said it stopped at call 3. Every later call now stops again before it
    runs, only the first N are kept, and the line says what happened."""
    from advisor.script import parse_command, run_script

    (tmp_path / "s.py").write_text(SCRIPT_PRELUDE + "model = nn.Linear(3, 3)\nran = 0\nfor step in range(6):\n"
                                   "    try:\n        model(torch.ones(1, 3))\n        ran += 1\n"
                                   "    except:\n        pass\nopen('after.txt', 'w').write(str(ran))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    _, recorded, ended = run_script(parse_command(["python", "s.py"]), 3)
    assert len(recorded) == 3 and (tmp_path / "after.txt").read_text() == "2"  # calls 3 to 6 never ran
    assert "went on after advisor's stop at the model's call 3" in ended and "then it ran to its end" in ended, ended


def test_capture_restores_module_call_after_the_block():
    original = nn.Module.__call__
    with pytest.raises(ValueError), advisor.capture():
        raise ValueError
    assert nn.Module.__call__ is original


def test_inputs_recorded_under_inference_mode_are_normal_tensors_that_train_mode_can_use():
    model = nn.Linear(2, 2)
    with torch.inference_mode(), advisor.capture() as captured:
        model(torch.ones(1, 2))
    [call] = captured.model()[1]
    assert not call.args[0].is_inference()
    model(call.args[0]).sum().backward()  # --train on a script that generated under inference_mode


def test_python_dash_m_runs_a_package_module_with_its_relative_imports(tmp_path, capsys, monkeypatch):
    package = tmp_path / "tools"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "net.py").write_text("import torch\nclass Net(torch.nn.Linear):\n    pass\n")
    (package / "run.py").write_text("import sys, torch\nfrom .net import Net\nn = int(sys.argv[1])\n"
                                    "assert sys.argv[0].endswith('run.py') and __name__ == '__main__'\n"
                                    # as `python -m` sets it: spawned children import the module by its name
                                    "assert __spec__ is not None and __spec__.name == 'tools.run'\n"
                                    "Net(n, n)(torch.ones(1, n))\n")
    monkeypatch.chdir(tmp_path)
    code = main(["profile", "--format", "json", "--", "python", "-m", "tools.run", "3"])
    captured = capsys.readouterr()
    assert code in (0, 1) and "captured Net and the inputs of 1 call(s)" in captured.err, captured.err
    assert json.loads(captured.out)["target"] == "-m tools.run 3"
    assert main(["profile", "--", "python", "-m", "tools.nothing"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "advisor: error: -m tools.nothing: no module named 'tools.nothing'" in line and "current directory" in line


def test_the_script_sees_its_argv_as_the_command_spelled_it(tmp_path, monkeypatch):
    """A third promises round: `-- python ../s.py a 'b c'` ran with argv[0] made absolute; `python` keeps it as
    given (and makes `__main__.__file__` absolute, since 3.9)."""
    from advisor.script import _execute, parse_command

    (tmp_path / "s.py").write_text("import sys, json\nseen = [sys.argv, __file__]\n")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    command = parse_command(["python", "../s.py", "a", "b c"])
    _execute(command, command.path, None, None)
    argv, file = sys.modules["__main__"].seen
    assert argv == ["../s.py", "a", "b c"] and file == str(tmp_path / "s.py")


@pytest.mark.parametrize("encoded", [b"\xef\xbb\xbfname = 'caf\xc3\xa9'\n",
                                     "# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n".encode("latin-1")])
def test_a_script_runs_in_the_encoding_python_reads_it_in(tmp_path, monkeypatch, encoded):
    """Breaker round 19: a script starting with a UTF-8 BOM, or declaring latin-1, ran under `python` and was
    refused by `profile -- python s.py` (read as UTF-8 text)."""
    from advisor.script import _execute, parse_command

    (tmp_path / "s.py").write_bytes(encoded)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    command = parse_command(["python", "s.py"])
    _execute(command, command.path, None, None)
    assert sys.modules["__main__"].name == "café"


def test_the_script_a_command_runs_is_read_for_double_backward(tmp_path, monkeypatch):
    """Breaker round 17: train.py took a gradient penalty (`create_graph=True`) through model.py's attention, but
    only the files the profile saw running were read for autograd requests: the patch was safe, `--apply` wrote
    it, and train.py then raised (SDPA's fused kernels have no double backward)."""
    from advisor.verify.optimize_pipeline import collect_candidates, script_files

    model = tmp_path / "model.py"
    shutil.copy(Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py",
                model)
    (tmp_path / "train.py").write_text("import torch\nfrom model import make\n\n\nm, x = make()\nx.requires_grad_()\n"
                                       "g, = torch.autograd.grad(m(x).sum(), x, create_graph=True)\n"
                                       "g.pow(2).sum().backward()\n")
    monkeypatch.chdir(tmp_path)
    assert script_files(["python", "train.py", "--steps", "3"]) == [str((tmp_path / "train.py").resolve())]
    alone = collect_candidates([str(model)], unsafe_fixes=False)
    read = collect_candidates([str(model)], unsafe_fixes=False, scripts=script_files(["python", "train.py"]))
    assert [c.finding.fix_safety for c in alone.values()] == ["safe"]
    assert [c.finding.fix_safety for c in read.values()] == ["unsafe"]


def test_a_call_made_under_autocast_is_replayed_under_it_wherever_the_workload_runs():
    """Breaker round 17c: parity replayed a script's model call in float32 where the script ran it under bfloat16
    autocast (verified at float32's tolerance; the script's own values moved). The call's autocast regions are
    recorded with its inputs and every prepared forward replays them."""
    from advisor.runtime.runner import prepare

    model = nn.Linear(4, 4)
    with advisor.capture() as captured, torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(1, 4))
    model(torch.ones(1, 4))  # outside the capture and autocast: nothing recorded
    workload = captured.workload()
    assert workload.autocast == (("cpu", "bfloat16"),)
    assert prepare(workload).forward().dtype == torch.bfloat16
    assert prepare(advisor.Workload(model, (torch.ones(1, 4),))).forward().dtype == torch.float32


def test_parity_of_a_model_computed_in_bfloat16_allows_bfloat16_rounding_on_float32_outputs():
    from advisor.verify.parity import compare

    a = torch.ones(8)
    b = a + 4e-3
    assert not compare(a, b).ok
    assert compare(a, b, computed_in=torch.bfloat16).ok
    assert not compare(a, a + 0.1, computed_in=torch.bfloat16).ok


AUTOCAST_SCRIPT = """import torch
from model import make

model, (x,) = make()
model.eval()
with torch.no_grad():
    for step in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x + step)
        print(step, float(y.float().sum()))
"""


def test_optimize_verifies_a_script_s_patch_under_the_script_s_autocast(tmp_path, capsys):
    shutil.copyfile(Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "positive" /
                    "01_nanogpt_causal.py", tmp_path / "model.py")
    (tmp_path / "run.py").write_text(AUTOCAST_SCRIPT)
    code, result, err = optimize_json(capsys, "--report", str(tmp_path / "report"), script=[str(tmp_path / "run.py")])
    assert code in (0, 1), err
    assert result["environment"]["autocast"] == "torch.autocast('cpu', dtype=torch.bfloat16)"
    assert any("ran under torch.autocast('cpu', dtype=torch.bfloat16)" in note for note in result["notes"])
    [patch] = result["patches"]
    assert patch["parity"]["outputs_compared"] == 3 and patch["parity"]["atol"] == 1e-2
    assert patch["verdict"] in ("verified", "no-gain")  # SDPA in bfloat16 agrees at bfloat16's rounding


SPREAD_PROGRAM = '''import math

import torch

torch.manual_seed(0)


class Model(torch.nn.Module):
    def forward(self, query, key, value, attn_mask):
        qk = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        qk = qk + attn_mask
        return torch.softmax(qk, dim=-1) @ value


MASK = torch.zeros(1, 1, 16, 16)
inputs = [torch.randn(1, 4, 16, 32), torch.randn(1, 4, 16, 32), torch.randn(1, 4, 16, 32), MASK]
model = Model()
output = model(*inputs)
'''


def test_a_python_file_as_target_is_the_script_run_as_it_is(tmp_path, capsys, monkeypatch):
    """`advisor optimize program.py` (no `:function`) runs the program as `-- python program.py` does: its model is
    captured and its patch, safe from the mask its call spreads (`model(*inputs)`), verified without a flag."""
    (tmp_path / "program.py").write_text(SPREAD_PROGRAM, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = main(["optimize", "program.py", "--format", "json", "--timing-budget", "1", "--report",
                 str(tmp_path / "report")])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    result = json.loads(captured.out)
    [patch] = result["patches"]
    assert patch["rule"] == "ADV101" and patch["verdict"] in ("verified", "no-gain"), patch
    assert "captured Model and the inputs of 1 call(s); the script ran to its end" in result["notes"]
    assert main(["profile", "program.py:workload"]) == 2  # a function TARGET is still read as one
    assert "program.py has no attribute 'workload'" in capsys.readouterr().err


def test_a_py_target_that_is_no_file_names_the_script_form(capsys):
    assert main(["profile", "no_such_program.py"]) == 2
    assert "to run the script as it is: advisor optimize -- python no_such_program.py" in capsys.readouterr().err
