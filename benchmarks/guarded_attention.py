"""What a guard costs: advisor's guarded SDPA patch next to the same SDPA call without its check, side by side.

A block whose mask rank and q/k/v dtypes are not visible gets a guarded patch (`if <metadata check>: SDPA else:
the original`). Both calls, and the original eager block, are timed alternately with torch.utils.benchmark in one
process (no grad, fixed threads), on inputs that pass the check. The guard reads dtypes and ranks only, so the two
SDPA rows should agree within noise. A second table does the same for a module whose deleted dropout call is
guarded (`_advisor_module_runs_plain(self.attn_drop, (torch.nn.Dropout,))`: its exact class and no hooks, in a
file that registers hooks), against the same module's forward calling SDPA without the check.

    python benchmarks/guarded_attention.py [--seq 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.engine.static import analyze_source  # noqa: E402

SOURCE = '''
import math
import torch


def attend(q, k, v, mask):
    q, k = q.float(), k.float()
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1).to(v.dtype)
    return weights @ v
'''


def unguarded(q, k, v, mask):
    q, k = q.float(), k.float()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def functions() -> dict[str, object]:
    result = analyze_source(SOURCE, "attend.py")
    (finding,) = result.findings
    assert finding.fix_safety == "safe" and finding.extra["facts"]["guarded"], finding.reason
    original, patched = {}, {}
    exec(compile(SOURCE, "attend.py", "exec"), original)
    exec(compile(result.fixed, "attend_fixed.py", "exec"), patched)
    return {"original (eager)": original["attend"], "guarded SDPA (advisor)": patched["attend"],
            "unguarded SDPA": unguarded}


MODULE_SOURCE = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=512, heads=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.attn_drop = nn.Dropout(0.1)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * 0.125
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        return x.transpose(1, 2).reshape(B, N, C)


def save_maps(model, maps):
    return model.attn_drop.register_forward_hook(lambda m, a, o: maps.append(o))
'''


def module_cases(seq: int) -> dict[str, object]:
    """The eager module, advisor's guarded patch and the same patch without its check, on one input."""
    result = analyze_source(MODULE_SOURCE, "attention.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    guarded = {fact["name"] for fact in finding.extra["facts"].get("guarded", [])}
    assert finding.fix_safety == "safe" and "no-hooks" in guarded, finding.reason
    unchecked = result.fixed.replace("_advisor_modules_plain = False", "_advisor_modules_plain = True") \
        .replace("if not torch.jit.is_scripting():", "if False:")
    spaces = [{}, {}, {}]
    for space, source in zip(spaces, (MODULE_SOURCE, result.fixed, unchecked)):
        exec(compile(source, "attention.py", "exec"), space)
    torch.manual_seed(0)
    models = [space["Attention"]().eval() for space in spaces]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    x = torch.randn(2, seq, 512, generator=torch.Generator().manual_seed(0))
    names = ("original (eager)", "guarded SDPA (advisor)", "unguarded SDPA")
    return {name: (lambda model=model: model(x)) for name, model in zip(names, models)}


def mask_cases(seq: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, seq, 64, generator=generator) for _ in range(3))
    mask = torch.rand(2, 1, 1, seq, generator=generator) > 0.1
    return {name: (lambda f=f: f(q, k, v, mask)) for name, f in functions().items()}


def compare(title: str, cases: dict[str, object], threads: int) -> None:
    reference = cases["original (eager)"]()
    timers = {name: benchmark.Timer("f()", globals=dict(f=f), num_threads=threads) for name, f in cases.items()}
    medians: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        for _ in range(5):  # alternate, so drift on a shared machine hits every row alike
            for name, timer in timers.items():
                medians[name].append(timer.blocked_autorange(min_run_time=0.5).median)
        errors = {name: float((f() - reference).abs().max()) for name, f in cases.items()}
    base = sorted(medians["unguarded SDPA"])[2]
    print(title)
    for name in cases:
        runs = sorted(medians[name])
        print(f"  {name:24s} median {runs[2] * 1e3:8.3f} ms  (min {runs[0] * 1e3:.3f}, max {runs[-1] * 1e3:.3f})"
              f"  x{runs[2] / base:5.3f} of unguarded  max abs err {errors[name]:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        compare(f"B=2 H=8 L=S={args.seq} D=64 float32, boolean key mask, {args.threads} threads",
                mask_cases(args.seq), args.threads)
        compare(f"module forward: B=2 H=8 L=S={args.seq} D=64 float32, dropout module checked, {args.threads} threads",
                module_cases(args.seq), args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
