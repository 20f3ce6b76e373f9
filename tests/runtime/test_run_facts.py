"""Facts from the run: what every call of an attention block saw discharges the facts the source
cannot prove, as `observed` (never proved): `fix` still does not apply such a patch, `optimize` tries and verifies it
without --unsafe-fixes and labels it. A call where a fact did not hold (a fully padded sample) leaves it assumed."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.cli import main
from advisor.engine.static import analyze_source
from advisor.contracts.evidence import BlockCall, MaskSeen, RuntimeEvidence, add_block_calls
from advisor.engine.profiling import evidence_from_report
from advisor.report import optimize_console, optimize_html, optimize_markdown
from advisor.report import optimize_view as view
from advisor.runtime.detect.attention_graph import block_calls
from advisor.runtime.recorder import OpRecorder
from profile_helpers import FIXTURES, by_rule, run_fixture
from rich.console import Console

PADDING = FIXTURES / "padding_mask.py"


# -- the recorder's fully masked rows ----------------------------------------------------------------------------------
def _recorded(attend, *tensors):
    recorder = OpRecorder()
    with torch.no_grad(), recorder:
        attend(*tensors)
    return block_calls(recorder.result())


def _keep(lengths, tokens=6):
    return torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]


def _scores(q):
    return q @ q.transpose(-2, -1) / math.sqrt(q.size(-1))


MASKINGS = {
    "masked_fill finite": lambda s, keep: s.masked_fill(~keep[:, None, None, :], torch.finfo(s.dtype).min),
    "where": lambda s, keep: torch.where(keep[:, None, None, :], s, -1e4),
    "added finfo.min": lambda s, keep: s + (1.0 - keep[:, None, None, :].float()) * torch.finfo(s.dtype).min,
    "in place": lambda s, keep: s.masked_fill_(~keep[:, None, None, :], -1e9),
    "on a 3-D view": lambda s, keep: s.view(-1, 6, 6).view(s.shape).masked_fill(~keep[:, None, None, :], -1e9),
    "causal and padding": lambda s, keep: s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
                                           .masked_fill(~keep[:, None, None, :], float("-inf")),
}


@pytest.mark.parametrize("masking", MASKINGS)
def test_fully_masked_rows_are_counted_at_the_softmax(masking):
    q = torch.randn(2, 3, 6, 4)

    def attend(keep):
        return MASKINGS[masking](_scores(q), keep).softmax(-1) @ q

    [padded] = _recorded(attend, _keep([6, 0]))
    assert padded.fully_masked_rows == 3 * 6  # every row of the empty sample, in each head
    [kept] = _recorded(attend, _keep([6, 1]))
    assert kept.fully_masked_rows == 0
    assert [m.how for m in kept.masks] == (["additive"] if masking.startswith("added") else
                                           ["fill"] * (2 if masking.startswith("causal") else 1))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_the_count_matches_the_masks_whatever_their_forms_and_values(data):
    """Generated masks (forms, ranks, polarities, key and query padding, a causal triangle) against the count
    computed from the masks themselves."""
    batch, tokens = 2, 5
    masks = [data.draw(st.lists(st.booleans(), min_size=batch * tokens, max_size=batch * tokens))
             for _ in range(data.draw(st.integers(1, 3)))]
    forms = [data.draw(st.sampled_from(["fill", "where", "added", "keys", "queries"])) for _ in masks]
    causal = data.draw(st.booleans())
    q = torch.randn(batch, 2, tokens, 4)
    shaped = [torch.tensor(m).view(batch, 1, 1, tokens) if form != "queries" else
              torch.tensor(m).view(batch, 1, tokens, 1) for m, form in zip(masks, forms)]

    def attend():
        s = _scores(q)
        if causal:
            s = s.masked_fill(torch.ones(tokens, tokens, dtype=torch.bool).triu(1), float("-inf"))
        for masked, form in zip(shaped, forms):
            if form == "where":
                s = torch.where(~masked, s, torch.finfo(s.dtype).min)
            elif form == "added":
                s = s + masked.float() * torch.finfo(s.dtype).min
            else:
                s = s.masked_fill(masked, -1e4)
        return s.softmax(-1) @ q

    [call] = _recorded(attend)
    expected = torch.zeros(batch, 2, tokens, tokens, dtype=torch.bool)
    if causal:
        expected |= torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    for masked in shaped:
        expected |= masked
    assert call.fully_masked_rows == int(expected.all(-1).sum())


def test_causal_mask_with_left_padding_masks_the_first_rows():
    """Neither mask alone masks a whole row of the second sample; together they mask its first two."""
    q = torch.randn(2, 1, 6, 4)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, :2] = False
    [call] = _recorded(lambda k: MASKINGS["causal and padding"](_scores(q), k).softmax(-1) @ q, keep)
    assert call.fully_masked_rows == 2


def test_scores_the_tracker_cannot_follow_give_an_unknown_count_and_a_tensor_scale_is_seen():
    q = torch.randn(2, 3, 6, 4)
    weights = torch.rand(6, 6)
    [call] = _recorded(lambda: (_scores(q) * weights).softmax(-1) @ q)  # a multiplicative "mask"
    assert call.fully_masked_rows is None and call.tensor_scale
    [call] = _recorded(lambda: (q @ q.transpose(-2, -1) * torch.tensor(0.5)).softmax(-1) @ q)
    assert call.tensor_scale and call.fully_masked_rows == 0


def test_dtypes_are_read_where_they_enter_the_block():
    q = torch.randn(1, 2, 6, 4, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 6, 4)
    [call] = _recorded(lambda: (q.float() @ q.float().transpose(-2, -1)).softmax(-1) @ v)
    assert (call.query, call.key, call.value) == ("bfloat16", "bfloat16", "float32")


def test_keys_and_values_of_one_length_are_seen_where_the_value_product_is_a_matmul():
    q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 3)
    [call] = _recorded(lambda: (q @ k.transpose(-2, -1)).softmax(-1) @ v)
    assert call.kv_lengths_agree is True
    [call] = _recorded(lambda: v.transpose(-2, -1) @ (q @ k.transpose(-2, -1)).softmax(-1).transpose(-2, -1))
    assert call.kv_lengths_agree is True
    [call] = _recorded(lambda: torch.einsum("bhij,bhjd->bhid", (q @ k.transpose(-2, -1)).softmax(-1), v))
    assert call.kv_lengths_agree is True  # recorded as the bmm it runs
    calls = _recorded(lambda: torch.einsum("bhij,bhjd->bhid", (q @ k.transpose(-2, -1)).softmax(-1), v[:, :, :1]))
    assert all(call.kv_lengths_agree is not True for call in calls)  # one row of v broadcast to every key


def test_batch_sizes_of_the_products_factors_are_read():
    q, k = torch.randn(6, 5, 4), torch.randn(6, 7, 4)
    [call] = _recorded(lambda: torch.bmm(torch.bmm(q, k.transpose(1, 2)).softmax(-1), k))
    assert call.batches_agree is True
    one = torch.randn(1, 7, 4)  # matmul broadcasts a batch of 1, as SDPA does; bmm would raise
    [call] = _recorded(lambda: torch.matmul(q, one.transpose(1, 2)).softmax(-1) @ one)
    assert call.batches_agree is False


# -- facts of the static finding, from a profile (`fix --profile`) -----------------------------------------------------
@pytest.fixture(scope="module")
def profiles():
    return {name: run_fixture("padding_mask.py", name, steps=1) for name in ("workload", "fully_padded")}


def _findings(report):
    source = PADDING.read_text()
    return analyze_source(source, str(PADDING), runtime=evidence_from_report(report)).findings


def test_every_unproved_fact_held_on_the_profiled_run_is_observed_but_the_patch_stays_unsafe(profiles):
    findings = _findings(profiles["workload"])
    assert [f.rule for f in findings] == ["ADV101", "ADV101"]
    filled, added = findings  # the finite fill's rows are made uniform by the patch: proved, nothing to observe
    assert filled.fix_safety == "safe" and "discharged" not in filled.extra and "observed" not in filled.extra["facts"]
    for finding in [added]:
        facts = finding.extra["facts"]
        assert finding.fix_safety == "unsafe" and finding.extra["discharged"] == "observed"
        assert facts["assumed"] == [] and [f["name"] for f in facts["guarded"]] == ["mask-rank"]
        assert {f["name"] for f in facts["observed"]} == {"fully-masked-rows"}
        assert all("held on all 1 recorded call(s) of the run" in f["why"] for f in facts["observed"])
        assert "not proved" in facts["observed"][0]["why"] and "held on every recorded call" in finding.reason
    measured = by_rule(profiles["workload"], "ADV110")
    assert {f.line for f in measured} == {f.line for f in findings}  # the profile still records both blocks
    for finding in measured:  # `profile` shows what every call saw
        [seen] = finding.extra["evidence"]["observed"]
        assert seen["fully_masked_rows"] == 0 and seen["scale"] == "number" and seen["query"] == "float32"


def test_a_fully_padded_sample_leaves_fully_masked_rows_assumed(profiles):
    filled, added = _findings(profiles["fully_padded"])
    assert filled.fix_safety == "safe"  # its fully padded sample's rows are uniform in both
    for finding in [added]:
        facts = finding.extra["facts"]
        assert "discharged" not in finding.extra
        assert [f["name"] for f in facts["assumed"]] == ["fully-masked-rows"]
        assert "observed" not in facts  # mask-rank, which did hold, is guarded: it needs no observation
        assert "fully-masked-rows was not seen to hold on 1 of 1 recorded call(s)" in finding.reason


def test_calls_that_disagree_earn_no_observed_fact(profiles):
    """One call with a fully padded sample among calls without: the fact stays assumed."""
    evidence = RuntimeEvidence("t")
    for name in ("workload", "fully_padded"):
        add_block_calls(evidence, evidence_from_report(profiles[name]).for_path(str(PADDING)).blocks)
    _, added = analyze_source(PADDING.read_text(), str(PADDING), runtime=evidence).findings
    assert "discharged" not in added.extra
    assert "fully-masked-rows was not seen to hold on 1 of 2 recorded call(s)" in added.reason


def test_a_static_scan_has_no_observed_group():
    for finding in analyze_source(PADDING.read_text(), str(PADDING)).findings:
        assert "observed" not in finding.extra["facts"] and "discharged" not in finding.extra


def test_only_calls_inside_the_block_are_joined():
    path = str(PADDING.resolve())
    other = BlockCall(path, 1, 2, "float32", "float32", "float32", 4, (), False, 0)
    mixed = BlockCall(path, 42, 45, "float32", "float32", "float32", 4, (MaskSeen("additive", "float32", 1),), False,
                      0)
    evidence = RuntimeEvidence("t")
    add_block_calls(evidence, [other, mixed])
    [_, filled] = analyze_source(PADDING.read_text(), str(PADDING), runtime=evidence).findings
    # only the call inside the block is joined; its 1-D mask breaks no fact, since mask-rank is guarded (a 1-D mask
    # runs the original block), so the fact its rows showed is all the patch needed
    assert [f["name"] for f in filled.extra["facts"]["observed"]] == ["fully-masked-rows"]
    assert "held on all 1 recorded call(s)" in filled.extra["facts"]["observed"][0]["why"]
    assert [f["name"] for f in filled.extra["facts"]["guarded"]] == ["mask-rank"]
    assert filled.extra["discharged"] == "observed"


def test_weights_that_leave_the_block_keep_the_patch_behind_unsafe_fixes_whatever_the_run_saw():
    returned = "        return (weights @ v).transpose(1, 2).reshape(B, T, C)\n\n\nclass Encoder"
    source = PADDING.read_text().replace(returned, "        self.weights = weights\n" + returned)
    call = BlockCall(str(PADDING.resolve()), 42, 45, "float32", "float32", "float32", 4,
                     (MaskSeen("additive", "float32", 4),), False, 0)
    evidence = RuntimeEvidence("t")
    add_block_calls(evidence, [call])
    stored = analyze_source(source, str(PADDING), runtime=evidence).findings[1]
    assert stored.rule == "ADV102" and stored.extra["facts"]["observed"] and "discharged" not in stored.extra


def test_fix_with_profile_never_applies_an_observed_patch(tmp_path, capsys):
    path = tmp_path / "padding_mask.py"
    shutil.copyfile(PADDING, path)
    code = main(["fix", str(path), "--profile", f"{path}:workload", "--apply"])
    added = PADDING.read_text().split("class AddedAttention")[1]
    assert code == 1 and added in path.read_text()  # the filled block's safe patch is written, the added one not
    assert "its unproved facts held on every call of the profiled run" in capsys.readouterr().err


# -- optimize -----------------------------------------------------------------------------------------------------
def _optimize(tmp_path, capsys, function, *flags):
    shutil.copyfile(PADDING, tmp_path / "padding_mask.py")
    main(["optimize", f"{tmp_path / 'padding_mask.py'}:{function}", "--format", "json", "--timing-budget", "0.5",
          "--report", str(tmp_path / "report"), "--root", str(tmp_path), *flags])
    return json.loads(capsys.readouterr().out)


def test_apply_writes_an_observed_patch_only_with_unsafe_fixes(tmp_path, capsys):
    """Breaker round 17: a script's first three calls had no padded row, its later batches did, and `--apply`
    wrote the patch verified on those three (gradients 0.29 apart on the fifth batch)."""
    result = _optimize(tmp_path, capsys, "workload", "--apply")
    [added] = [patch for patch in result["patches"] if patch["discharged"] == "observed"]
    assert not added["applied"]
    if added["verified"]:  # else (no gain on this machine) nothing would have been written anyway
        assert "--unsafe-fixes" in added["reason"] and "--unsafe-fixes" in result["apply_command"]


def test_optimize_tries_a_padding_mask_patch_without_unsafe_fixes_and_labels_it(tmp_path, capsys):
    result = _optimize(tmp_path, capsys, "workload")
    assert len(result["patches"]) == 2
    filled, added = sorted(result["patches"], key=lambda patch: patch["line"])
    assert filled["fix_safety"] == "safe" and filled["discharged"] is None
    for patch in [added]:
        assert patch["discharged"] == "observed" and patch["fix_safety"] == "unsafe"
        assert patch["verdict"] in ("verified", "no-gain"), patch["reason"]
        assert patch["parity"]["seeds"] == 3 and patch["parity"]["max_abs_err"] <= patch["parity"]["atol"]
        assert {f["name"] for f in patch["facts"]["observed"]} == {"fully-masked-rows"}
        assert "held on all 3 recorded call(s)" in patch["facts"]["observed"][0]["why"]  # one per parity input
        label = view.safety_label(patch)
        assert label.startswith("verified on this workload; assumes: " if patch["verified"] else
                                 "held on every call of this workload; assumes: ")
        assert "no query row is fully masked" in label


def test_optimize_does_not_try_it_when_a_sample_is_fully_padded(tmp_path, capsys):
    result = _optimize(tmp_path, capsys, "fully_padded")
    filled, added = sorted(result["patches"], key=lambda patch: patch["line"])
    assert filled["fix_safety"] == "safe" and filled["verdict"] != "not-run"  # its rows are uniform in both
    for patch in [added]:
        assert patch["discharged"] is None and patch["verdict"] == "not-run"
        assert "fully-masked-rows was not seen to hold" in patch["reason"] and "--unsafe-fixes" in patch["reason"]
        assert view.safety_label(patch) == "unsafe fix"


def test_every_report_format_labels_an_observed_patch():
    from optimize_results import typical

    result = typical()
    patch = result["patches"][0]
    patch.update(fix_safety="unsafe", discharged="observed", facts={"proved": [], "accepted": [], "assumed": [],
                 "observed": [{"name": "fully-masked-rows", "statement": "no query row is fully masked", "why": "."}]})
    label = "verified on this workload; assumes: no query row is fully masked"
    console = Console(record=True, width=400)
    optimize_console.print_optimize(console, result)
    assert label in console.export_text()
    assert label in optimize_markdown.render_markdown(result)
    assert label in optimize_html.render_html(result)
