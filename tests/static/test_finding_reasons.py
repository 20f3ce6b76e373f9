"""A finding's reasons stay a list (a tuple of sentences) through the finding and the patch verdict; they are joined
with "; " only where text is rendered, and JSON keeps its one `reason` string field where it always was."""

from __future__ import annotations

from pathlib import Path

from advisor.contracts.finding import Finding
from advisor.engine.static import analyze_source
from advisor.results import PatchVerdict

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FINDING_KEYS = ["rule", "kind", "path", "line", "end_line", "function", "message", "fixable", "fix_safety", "reason",
                "patch"]


def _findings(source: str, path: str = "m.py") -> list[Finding]:
    return analyze_source(source, path).findings


def test_escaping_weights_with_an_unproved_fact_are_two_reasons_and_one_json_line():
    path = FIXTURES / "attention" / "negative" / "03_helper_returns_attention.py"
    # a fill plus an added mask: the rows fact stays unproved (one fill under `if` alone has it proved)
    source = path.read_text().replace("    if mask is not None:\n        attn_logits = attn_logits.masked_fill(",
                                      "    attn_logits = attn_logits + mask\n    attn_logits = attn_logits.masked_fill(")
    (finding,) = _findings(source, str(path))
    escape, unproved = finding.reasons
    assert escape.startswith("the attention weights are used outside the block (line 20)")
    assert unproved.startswith("unproved: no query row is fully masked") and "; the attention weights" not in unproved
    document = finding.to_json()
    assert document["reason"] == f"{escape}; {unproved}" == finding.reason
    assert "reasons" not in document and list(document)[:len(FINDING_KEYS)] == FINDING_KEYS


def test_a_configuration_finding_keeps_each_assumption_apart():
    source = ('from transformers import AutoModel\nm = AutoModel.from_pretrained("x", attn_implementation="eager")\n'
              "out = m(ids, output_attentions=True)\n")
    (finding,) = _findings(source)
    assert finding.fix_safety == "unsafe"
    assert [reason.split(" ")[0] for reason in finding.reasons] == ["assumes", "output_attentions=True"]
    assert finding.to_json()["reason"] == "; ".join(finding.reasons)


def test_a_finding_without_reasons_prints_null():
    finding = Finding("ADV101", "attention", "m.py", 1, 2, "f", "m")
    assert finding.reasons == () and finding.reason is None and finding.to_json()["reason"] is None


def test_a_patch_verdict_joins_its_reasons_only_in_json():
    failures = ("output: 3 of 8 elements outside tolerance", "grads.w: 1 of 4 elements outside tolerance")
    verdict = PatchVerdict(
        id="P1", rule="ADV101", path="m.py", line=1, end_line=4, function="f", fix_safety="safe", facts=None,
        discharged=None, diff=None, verdict="parity-failed", verified=False, offered=False, exercised=True,
        parity=None, speedup=None, speedup_ci=None, reasons=failures, applied=False, written_to=None,
        state_dict=None, unsafe_facts_checked_on=None)
    document = verdict.to_json()
    assert document["reason"] == "; ".join(failures) == verdict["reason"]
    assert list(document).index("reason") == list(document).index("speedup_ci") + 1 and "reasons" not in document
    assert PatchVerdict.from_json(document).to_json() == document
