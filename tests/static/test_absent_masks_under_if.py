"""Masks the caller's own `if <name> is not None:` applies (timm's BEiT `shared_rel_pos_bias`, a padding mask that
is None unless the batch is padded): where only facts about those masks are still assumed, the patch takes SDPA
where every such mask is None and runs the original block otherwise, so it is safe and exact for every input."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

BEIT = '''
from typing import Optional

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, shared_rel_pos_bias: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        if shared_rel_pos_bias is not None:
            attn = attn + shared_rel_pos_bias
        if attn_mask is not None:
            attn = attn + attn_mask
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, N, C)
'''


def _finding(source: str = BEIT):
    (finding,) = [f for f in analyze_source(source, "beit.py").findings if f.kind == "attention"]
    return finding


def _models(source: str = BEIT):
    fixed = analyze_source(source, "beit.py").fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "beit").Attention().double()
    patched = load_module_from_source(fixed, "beit_fixed").Attention().double()
    patched.load_state_dict(original.state_dict())
    return original, patched


def test_masks_under_their_own_if_are_guarded_by_their_absence():
    finding = _finding()
    facts = finding.extra["facts"]
    assert finding.fix_safety == "safe" and finding.fixable, finding.reason
    assert not facts["assumed"] and "fully-masked-rows" in {f["name"] for f in facts["guarded"]}
    assert "if shared_rel_pos_bias is None and attn_mask is None:" in finding.patch
    assert "attn_mask=" not in finding.patch.split("else:")[0]


def test_unsafe_fixes_pass_the_masks_to_sdpa_with_their_facts_assumed():
    finding = [f for f in analyze_source(BEIT, "beit.py", unsafe_fixes=True).findings if f.kind == "attention"][0]
    assert finding.fix_safety == "unsafe" and "attn_mask=" in finding.patch
    assert "fully-masked-rows" in {f["name"] for f in finding.extra["facts"]["assumed"]}


def _evidence(path: str, rows: int = 0):
    from advisor.contracts.evidence import BlockCall, MaskSeen, RuntimeEvidence, add_block_calls

    lines = BEIT.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "attn = q @ k" in line)
    last = next(i for i, line in enumerate(lines, 1) if "(attn @ v)" in line)
    masks = (MaskSeen("additive", "float32", 4), MaskSeen("additive", "float32", 4))
    evidence = RuntimeEvidence("t")
    add_block_calls(evidence, [BlockCall(path, first, last, "float32", "float32", "float32", 4, masks, False, rows)])
    return evidence


@pytest.mark.parametrize("observed_masks,rows,safety", [(False, 0, "safe"), (True, 0, "unsafe"), (True, 3, "safe")],
                         ids=["fix --profile: guarded", "optimize: observed", "optimize, rows masked: guarded"])
def test_a_run_that_saw_the_masks_hold_gives_optimize_the_patch_that_passes_them(tmp_path, observed_masks, rows,
                                                                                  safety):
    path = tmp_path / "beit.py"
    path.write_text(BEIT)
    evidence = _evidence(str(path.resolve()), rows)
    [finding] = [f for f in analyze_source(BEIT, str(path), runtime=evidence, observed_masks=observed_masks).findings
                 if f.kind == "attention"]
    assert finding.fix_safety == safety, finding.reason
    assert (finding.extra.get("discharged") == "observed") is (safety == "unsafe")
    assert ("attn_mask=" in finding.patch) is (safety == "unsafe")


@pytest.mark.parametrize("bias,mask", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["none: SDPA", "bias: the original", "mask: the original", "both: the original"])
def test_outputs_and_gradients_match_with_the_masks_absent_and_present(bias, mask):
    original, patched = _models()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=generator)
    rel = torch.randn(1, 2, 5, 5, dtype=torch.float64, generator=generator) if bias else None
    pad = None
    if mask:
        pad = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
        pad[0, ..., 3:] = float("-inf")
    results = []
    for model in (original, patched):
        leaf = x.clone().requires_grad_()
        out = model(leaf, rel, pad)
        out.sum().backward()
        results.append((out, leaf.grad, model.qkv.weight.grad))
    torch.testing.assert_close(results[1], results[0])
    assert uses_sdpa(dispatched_ops(patched, (x, rel, pad))) is not (bias or mask)


def test_the_guard_never_swallows_a_shape_error():
    original, patched = _models()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    wrong = torch.zeros(2, 1, 1, 4, dtype=torch.float64)
    for model in (original, patched):
        with pytest.raises(RuntimeError, match="size"):
            model(x, None, wrong)


def test_the_guarded_patch_scripts_like_the_original():
    original, patched = _models()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for rel in (None, torch.randn(1, 2, 5, 5, dtype=torch.float64)):
        torch.testing.assert_close(torch.jit.script(patched)(x, rel, None), torch.jit.script(original)(x, rel, None))


@pytest.mark.parametrize("test", ["if shared_rel_pos_bias is not None and N > 1:", "if N > 1:"],
                         ids=["another test as well", "another test"])
def test_a_mask_under_another_test_keeps_its_facts_assumed(test):
    finding = _finding(BEIT.replace("if shared_rel_pos_bias is not None:", test))
    assert finding.fix_safety == "unsafe" and "fully-masked-rows" in {
        f["name"] for f in finding.extra["facts"]["assumed"]}


# -- optimize: the masks the run saw present are passed to SDPA where that patch verifies --------------------------
WORKLOAD = BEIT.replace("from torch import nn\n", "from torch import nn\n\nimport advisor\n") + '''

def workload(seed=0):
    """Every call adds a relative bias and a padding mask that keeps at least one key per row."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 64, 16, generator=generator)
    rel = torch.randn(1, 2, 64, 64, generator=generator)
    pad = torch.zeros(2, 1, 1, 64)
    pad[0, ..., 40:] = float("-inf")
    return advisor.Workload(Attention().eval(), (x, rel, pad))
'''


def test_optimize_tries_the_patch_that_passes_the_masks_it_saw_and_keeps_the_guarded_one_behind(tmp_path, capsys):
    import json

    from advisor.cli import main

    (tmp_path / "beit_run.py").write_text(WORKLOAD)
    main(["optimize", f"{tmp_path / 'beit_run.py'}:workload", "--format", "json", "--timing-budget", "0.5",
          "--report", str(tmp_path / "report")])
    observed, guarded = json.loads(capsys.readouterr().out)["patches"]
    assert observed["discharged"] == "observed" and observed["fix_safety"] == "unsafe"
    assert "attn_mask=" in observed["diff"] and observed["parity"] is not None, observed["reason"]
    assert {f["name"] for f in observed["facts"]["observed"]} == {"fully-masked-rows"}
    assert guarded["fix_safety"] == "safe"
    assert "if shared_rel_pos_bias is None and attn_mask is None:" in guarded["diff"]
    if observed["verdict"] == "verified":  # preferred: the guarded patch would only ever run the original here
        assert guarded["verdict"] == "not-run" and observed["id"] in guarded["reason"]
    else:
        assert guarded["verdict"] != "not-run"
