"""Reports that say what to do next: verified patches left unapplied come with the exact command that
applies them and the path of each one's .diff in the report folder."""

import argparse
import dataclasses
import json
from pathlib import Path

import optimize_results

from advisor.commands.optimize import _write_reports, apply_command
from advisor.results import OptimizeReport, PatchVerdict
from advisor.report import optimize_view as view
from advisor.report.optimize_markdown import render_markdown


def test_the_apply_command_repeats_the_run_with_apply_before_the_script():
    script = argparse.Namespace(argv=["optimize", "--device", "cpu", "--", "python", "gen.py", "--n", "3"])
    assert apply_command(script) == "advisor optimize --device cpu --apply -- python gen.py --n 3"
    target = argparse.Namespace(argv=["--debug", "optimize", "my model.py:workload"])
    assert apply_command(target) == "advisor --debug optimize 'my model.py:workload' --apply"


def test_each_verified_patch_gets_a_diff_file_and_the_reports_say_how_to_apply(tmp_path):
    document = optimize_results.typical()  # hand-built: its patches leave out the fields the reports never read
    every_field = dict.fromkeys("reason" if f.name == "reasons" else f.name  # the JSON's names
                                for f in dataclasses.fields(PatchVerdict))
    typed = OptimizeReport.from_json({**document, "patches": [{**every_field, **p} for p in document["patches"]]})
    typed.apply_command = "advisor optimize demo/model.py:workload --apply"
    _write_reports(typed, str(tmp_path))
    result = typed.to_json()
    assert json.loads((tmp_path / "result.json").read_text()) == result
    verified = [p for p in result["patches"] if p["verified"]]
    assert verified and all(Path(p["diff_file"]).read_text() == p["diff"] for p in verified)
    assert all("diff_file" not in p for p in result["patches"] if not p["verified"])
    notes = view.notes(result)
    assert "apply the verified patches: advisor optimize demo/model.py:workload --apply" in notes
    assert f"{verified[0]['id']} diff: {verified[0]['diff_file']}" in notes
    assert "advisor optimize demo/model.py:workload --apply" in render_markdown(result).replace("\\", "")


def test_parity_says_pass_or_fail_with_the_tolerance_actually_applied():
    from advisor.verify.parity import compare
    import torch

    original = torch.tensor([[100.0, 0.001], [2.0, -3.0]])
    close = compare(original, original + torch.tensor([[5e-4, 5e-7], [0.0, 0.0]]))
    assert close.ok and close.elements == 4 and close.mismatched == 0 and close.atol_applied == 1e-5 * 100
    far = compare(original, original + 1.0)
    assert not far.ok and far.mismatched == 4
    lines = view.parity_lines({"max_abs_err": 5e-4, "max_rel_err": 5e-4, "atol": 1e-5, "rtol": 1e-5,
                               "atol_applied": 1e-3, "elements": 4, "mismatched": 0, "seeds": 3,
                               "outputs_compared": 3})
    assert lines[:2] == ["pass: 0 of 4 elements outside |diff| <= 1.0e-03 + 1e-05 * |original|",
                         "max abs 5.0e-04, max rel 5.0e-04 (atol 1e-05 scaled by the largest |original|)"]
    failed = view.parity_lines({"max_abs_err": 1.0, "max_rel_err": 1.0, "atol": 1e-5, "rtol": 1e-5,
                                "atol_applied": 1e-3, "elements": 4, "mismatched": 4})
    assert failed[0] == "FAIL: 4 of 4 elements outside |diff| <= 1.0e-03 + 1e-05 * |original|"


def test_op_kinds_name_convolutions_and_normalisations():
    from advisor.runtime.trace_analysis import OP_KINDS, op_category

    assert {"convolution", "normalization"} <= set(OP_KINDS)
    for name in ("aten::convolution", "aten::mkldnn_convolution", "aten::slow_conv2d_forward", "aten::conv2d",
                 "sm80_xmma_fprop_implicit_gemm_indexed_f16f16", "cudnn::winograd_nonfused::wgrad"):
        assert op_category(name) == "convolution", name
    for name in ("aten::native_layer_norm", "aten::native_batch_norm", "aten::native_group_norm",
                 "void at::native::vectorized_layer_norm_kernel<float>", "aten::_fused_rms_norm"):
        assert op_category(name) == "normalization", name
    assert op_category("aten::sum") == "reduction" and op_category("aten::addmm") == "gemm"
    assert op_category("aten::linalg_vector_norm") == "reduction"


def test_a_flag_that_changed_nothing_says_so(tmp_path, capsys):
    import json

    from advisor.cli import main

    (tmp_path / "linear.py").write_text("import torch\n\ndef workload():\n"
                                        "    return torch.nn.Linear(4, 4), torch.ones(2, 4)\n")
    code = main(["optimize", f"{tmp_path / 'linear.py'}:workload", "--unsafe-fixes", "--calls", "2",
                 "--format", "json", "--timing-budget", "0.2", "--report", str(tmp_path / "r")])
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert code == 0
    assert "--unsafe-fixes changed nothing: no patch of the code that ran is marked unsafe" in notes
    assert "--calls changed nothing: it sets how many model calls a script after `--` runs for" in notes[-1]


def test_a_new_finding_after_the_patch_is_explained_in_every_format():
    from advisor.report.optimize_html import render_html

    result = optimize_results.typical()
    result["findings_after"] = [{"rule": "ADV201", "path": "demo/model.py", "line": 44, "function": "Attn.forward",
                                 "message": "useless .contiguous() copy before .view (12 KiB per call)"}]
    [new] = [row for row in view.findings_diff(result) if row[3] == "new"]
    assert new[4] == ("found in the patched code: useless .contiguous() copy before .view (12 KiB per call)")
    assert all(row[4] == "" for row in view.findings_diff(result) if row[3] != "new")
    assert "found in the patched code" in render_html(result)
    assert "found in the patched code" in render_markdown(result)
