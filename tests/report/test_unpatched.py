"""Found, not patched: every optimize report lists the measured findings no patch ran for, with their
share of the measured op time and the reason (refused, unsafe and why, SDPA already on another branch)."""

import json
from pathlib import Path

from advisor.cli import main

MODEL = '''
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=2, fused=False):
        super().__init__()
        self.heads, self.scale, self.fused_attn, self.gate = heads, (dim // heads) ** -0.5, fused, 1.0
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = {softmax}
            {keep}
            x = attn @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


def workload(seed=0):
    g = torch.Generator().manual_seed(seed)
    return Attention(), torch.randn(2, 64, 32, generator=g)
'''


def optimize(tmp_path: Path, capsys, softmax: str, keep: str = "pass") -> tuple[int, dict, str, Path]:
    path = tmp_path / "model.py"
    path.write_text(MODEL.format(softmax=softmax, keep=keep))
    report = tmp_path / "report"
    code = main(["optimize", f"{path}:workload", "--timing-budget", "0.5", "--report", str(report)])
    text = capsys.readouterr().out
    return code, json.loads((report / "result.json").read_text()), text, report


def test_refused_attention_is_listed_with_its_share_and_reason_in_every_report_format(tmp_path, capsys):
    code, result, text, report = optimize(tmp_path, capsys, "attn.softmax(dim=-1) * self.gate")
    assert code == 0 and result["patches"] == []
    [entry] = result["unpatched"]
    assert entry["rule"] == "ADV110" and entry["function"] == "Attention.forward" and entry["share"] > 0.05
    assert entry["static_rule"] == "ADV103" and entry["patch"] is None
    assert "multiplied by `self.gate`" in entry["reason"]
    assert "the other branch of `if self.fused_attn` already calls scaled_dot_product_attention: enable it" \
        in entry["reason"]
    share = f"{entry['share']:.1%}"
    for rendered in (text, (report / "report.md").read_text(), (report / "report.html").read_text()):
        flat = " ".join(rendered.replace("│", " ").split())  # a table cell's lines, joined
        assert "found, not patched" in flat.lower() and share in flat and "enable it" in flat, rendered
    assert f"nothing to patch; 1 measured finding not patched (largest {share} of op time)" in " ".join(text.split())


def test_an_unsafe_patch_left_unrun_is_listed_with_why_and_how_to_run_it(tmp_path, capsys):
    code, result, _, _ = optimize(tmp_path, capsys, "attn.softmax(dim=-1)", keep="self.saved = attn")
    [patch] = result["patches"]
    [entry] = result["unpatched"]
    assert patch["verdict"] == "not-run" and entry["patch"] == patch["id"] and entry["static_rule"] == "ADV102"
    assert "used outside the block" in entry["reason"] and "--unsafe-fixes" in entry["reason"]
