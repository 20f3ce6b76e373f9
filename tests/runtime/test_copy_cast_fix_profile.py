"""`advisor fix --profile`: runtime copy/cast findings joined to the call on their line, each patch with its safety;
on the bundled fixture, `--apply` removes what is provably redundant, parity holds with the same weights and
inputs, and a profile of the fixed file no longer shows those copies."""

from __future__ import annotations

import importlib.util
import json
import shutil
import textwrap
from collections import Counter

import pytest
import torch

from advisor.cli import main
from advisor.contracts.evidence import FileEvidence, RuntimeEvidence, RuntimeHit
from advisor.engine.profiling import evidence_from_report, profile_workload
from advisor.engine.static import analyze_source
from advisor.workload_loader import load_workload
from profile_helpers import FIXTURES, marker_line



def _evidence(path, line: int, rule: str, ran: int = 1, redundant: int = 1, name: str = "contiguous",
              mutating=(), **evidence) -> RuntimeEvidence:
    hit = RuntimeHit(rule, line, line, redundant, "f", "measured", {"self_us": 5.0, "calls": redundant,
                                                                     "evidence": evidence})
    file = FileEvidence({line: [hit]}, Counter({(line, name): ran}), frozenset(mutating))
    return RuntimeEvidence("t.py:w", {str(path.resolve()): file})


def _one(tmp_path, body: str, rule: str, line: int, **options):
    path = tmp_path / "m.py"
    path.write_text("import torch\n\n\ndef f(x, w):\n" + textwrap.indent(textwrap.dedent(body), "    "))
    result = analyze_source(path.read_text(), str(path), runtime=_evidence(path, line, rule, **options))
    [finding] = [f for f in result.findings if f.rule == rule]
    return finding, result


def test_strided_ok_copy_removed_safely(tmp_path):
    finding, result = _one(tmp_path, "t = x.transpose(1, 2).contiguous()\nreturn torch.matmul(t, w).sum()\n",
                           "ADV202", 5)
    assert (finding.fixable, finding.fix_safety, finding.reason) == (True, "safe", None)
    assert "t = x.transpose(1, 2)\n" in result.fixed and finding.extra["self_us"] == 5.0
    assert {f["name"] for f in finding.extra["facts"]["proved"]} >= {"layout-unobserved", "no-inplace"}


@pytest.mark.parametrize("body, why", [
    ("t = x.transpose(1, 2).contiguous()\nreturn t\n", "returned"),
    ("t = x.transpose(1, 2).contiguous()\nx.add_(1)\nreturn torch.matmul(t, w).sum()\n", "add_"),
    ("t = x.transpose(1, 2).contiguous()\nreturn t.view(-1).sum()\n", ".view"),
    ("t = x.transpose(1, 2).contiguous()\nself.cache = t\nreturn t.sum()\n", "stored"),
    ("t = x.transpose(1, 2).contiguous()\nreturn self.proj(t).sum()\n", "passed to `self.proj`"),
    # breaker round 31: view_as_complex raises on strides a copy made regular (Llama's rotary embedding)
    ("t = x.transpose(1, 2).contiguous()\nreturn torch.view_as_complex(t.reshape(2, -1, 2)).abs().sum()\n",
     "torch.view_as_complex"),
    ("t = x.transpose(1, 2).contiguous()\nreturn torch.view_as_real(t).sum()\n", "torch.view_as_real"),
    # breaker round 32: an operator method writing the receiver, and a save writing the strides out
    ("t = x.transpose(1, 2).contiguous()\nif w is None:\n    t.__setitem__(0, 1.0)\nreturn t.sum()\n",
     "__setitem__"),
    ("t = x.transpose(1, 2).contiguous()\ntorch.save(t, 't.pt')\nreturn t.sum()\n", "torch.save"),
])
def test_copy_removal_that_could_change_aliasing_or_layout_is_unsafe(tmp_path, body, why):
    finding, result = _one(tmp_path, body, "ADV202", 5)
    assert finding.fixable and finding.fix_safety == "unsafe" and why in finding.reason
    assert result.fixed == result.source  # unsafe patches are not applied by default


def test_in_place_op_measured_in_the_function_makes_removal_unsafe(tmp_path):
    finding, _ = _one(tmp_path, "t = x.transpose(1, 2).contiguous()\nreturn torch.relu(t).sum()\n", "ADV202", 5,
                      mutating=(6,))
    assert finding.fix_safety == "unsafe" and "wrote a tensor in place" in finding.reason


def test_no_patch_when_not_every_call_was_redundant_or_the_call_is_ambiguous(tmp_path):
    finding, _ = _one(tmp_path, "t = x.transpose(1, 2).contiguous()\nreturn torch.matmul(t, w).sum()\n",
                      "ADV202", 5, ran=3, redundant=2)
    assert not finding.fixable and "only 2 of the 3" in finding.reason
    finding, _ = _one(tmp_path, "return torch.matmul(x.contiguous(), w.contiguous()).sum()\n", "ADV201", 5)
    assert not finding.fixable and "cannot tell them apart" in finding.reason


def test_runtime_same_dtype_cast_is_unsafe_with_its_assumption_named(tmp_path):
    finding, _ = _one(tmp_path, "h = x.float()\nreturn h @ w\n", "ADV301", 5, name="float", dtype="float32")
    assert finding.fixable and finding.fix_safety == "unsafe"
    assert "the input is float32 in every call" in finding.reason


def test_param_cast_is_reported_with_why_it_is_not_hoisted(tmp_path):
    finding, _ = _one(tmp_path, "return x @ w.to(torch.float32)\n", "ADV303", 5, name="to", param="w",
                      to="float32")
    assert not finding.fixable and "state_dict" in finding.reason


def test_round_trip_fix_is_unsafe(tmp_path):
    finding, result = _one(tmp_path, "return x.to(torch.bfloat16).to(torch.float32) @ w\n", "ADV302", 5,
                           name="to", ran=2, **{"from": "float32", "to": "bfloat16"})
    assert finding.fixable and finding.fix_safety == "unsafe" and "rounding to bfloat16" in finding.reason
    assert "-    return x.to(torch.bfloat16).to(torch.float32) @ w\n+    return x @ w\n" in finding.patch


# --- the bundled fixture, end to end ---------------------------------------------------------------------

APPLIED = {"ADV202": "LINE_STRIDED_OK", "ADV201": "LINE_ALREADY_CONTIGUOUS", "ADV203": "LINE_UNDONE",
           "ADV304": "LINE_SOFTMAX_UPCAST"}
# ADV204's fold is unsafe: it drops the strides of size-1 dims that `.contiguous()` leaves alone
NOT_APPLIED = {"ADV301": "LINE_SAME_DTYPE", "ADV302": "LINE_ROUND_TRIP", "ADV303": "LINE_PARAM_CAST",
               "ADV204": "LINE_COPY_COPY"}


@pytest.fixture(scope="module")
def fixed_fixture(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fixture")
    path = folder / "copies_and_casts.py"
    shutil.copy(FIXTURES / "copies_and_casts.py", path)
    # attention (ADV101) is left out so that the copy/cast fixes are what is measured
    code = main(["fix", str(path), "--profile", f"{path}:workload", "--apply", "--select", "ADV2,ADV3"])
    return path, code


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fix_apply_profile_removes_what_is_provably_redundant(fixed_fixture):
    path, code = fixed_fixture
    assert code == 1  # the unsafe and unfixable findings remain
    before = (FIXTURES / "copies_and_casts.py").read_text().splitlines()
    after = path.read_text().splitlines()
    changed = {number for number, (old, new) in enumerate(zip(before, after), 1) if old != new}
    assert len(before) == len(after)
    assert changed == {marker_line(path, marker) for marker in APPLIED.values()}
    assert not any(".contiguous()" in after[line - 1] for line in changed)


def test_fixed_fixture_has_parity_with_the_same_weights_and_inputs(fixed_fixture):
    path, _ = fixed_fixture
    original = _module(FIXTURES / "copies_and_casts.py", "copycast_original").Mixer().eval()
    fixed = _module(path, "copycast_fixed").Mixer().eval()
    fixed.load_state_dict(original.state_dict())
    worst = 0.0
    for seed in range(3):
        x = torch.randn(2, 256, 128, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            expected, actual = original(x), fixed(x)
        worst = max(worst, (expected - actual).abs().max().item())
    assert worst <= 1e-5, worst


def test_profile_after_the_fix_no_longer_shows_the_removed_copies(fixed_fixture):
    path, _ = fixed_fixture
    target = f"{path}:workload"
    workload = load_workload(target)
    workload.steps = 2
    report = profile_workload(workload, target)
    for rule, marker in APPLIED.items():
        assert not [f for f in report.findings if f.rule == rule and f.line == marker_line(path, marker)], rule
    assert {"ADV204", "ADV301", "ADV302", "ADV303"} <= {f.rule for f in report.findings}  # not provably redundant
    # the step's copies: only the user's own `.contiguous().clone()` is left (ADV204's fold is unsafe)
    graph = report.capture.graph.graph
    clones = Counter(data["loc"].line for _, data in graph.nodes(data=True)
                     if data["op"] == "clone" and data["loc"] is not None)
    assert set(clones) == {marker_line(path, "LINE_COPY_COPY")}
    # idempotent: with the new profile there is nothing safe left to fix
    evidence = evidence_from_report(report)
    result = analyze_source(path.read_text(), str(path), select=["ADV2", "ADV3"], runtime=evidence)
    assert result.fixed == result.source


def test_fix_without_profile_offers_only_static_proofs(capsys):
    code = main(["fix", str(FIXTURES / "copies_and_casts.py"), "--select", "ADV2,ADV3"])
    out = capsys.readouterr().out
    assert code == 1
    added = [line.split("#")[0].rstrip() for line in out.splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    assert added == ["+        probs = F.softmax(low, dim=-1, dtype=torch.float32)"]  # ADV304 (attention not selected)


def test_scan_profile_lists_the_runtime_findings_fix_profile_acts_on(capsys, fixed_fixture):
    fixed_path, _ = fixed_fixture
    path = fixed_path.parent / "scanned_copies_and_casts.py"
    shutil.copy(FIXTURES / "copies_and_casts.py", path)
    code = main(["scan", str(path), "--profile", f"{path}:workload", "--format", "json", "--select", "ADV2,ADV3"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    safe = {(f["rule"], f["line"]) for f in findings if f["fixable"] and f["fix_safety"] == "safe"}
    listed = {(f["rule"], f["line"]) for f in findings}
    assert code == 1
    assert {(rule, marker_line(path, marker)) for rule, marker in APPLIED.items()} == safe  # what fix applied
    assert {(rule, marker_line(path, marker)) for rule, marker in NOT_APPLIED.items()} <= listed
    assert all("self_us" in f for f in findings if (f["rule"], f["line"]) in safe)  # measured, ranked by time
    removals = [f for f in findings if f["rule"] in ("ADV201", "ADV202", "ADV203") and f["fix_safety"] == "safe"]
    assert removals and all("input-writes" in {fact["name"] for fact in f["facts"]["accepted"]}
                            for f in removals)  # autograd may save a view of the input: named, not hidden
