"""What making fully masked rows exact costs: advisor's patch of a finite-fill padding mask (the keep mask with its
fully masked rows opened and their query zeroed, see `advisor/patterns/attention/uniform_rows.py`) next to the
same SDPA call with the keep mask alone, side by side.

`masked_fill(mask == 0, -1e9)` on a (B, 1, 1, S) padding mask, one sample all padding. The rows are timed
alternately with torch.utils.benchmark in one process (fixed threads), forward without grad and forward plus
backward; the "SDPA alone" row gives the fully padded sample 0 instead of the mean of v (wrong there), which is
what the fixup costs to avoid.

    python benchmarks/uniform_rows.py [--seq 512] [--threads 2] [--rounds 5]
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
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(mask == 0, -1e9)
    return scores.softmax(dim=-1) @ v
'''


def sdpa_alone(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask != 0)


def functions() -> dict[str, object]:
    result = analyze_source(SOURCE, "attend.py")
    (finding,) = result.findings
    assert finding.fix_safety == "safe" and "attn_rows" in result.fixed, finding.reason
    original, patched = {}, {}
    exec(compile(SOURCE, "attend.py", "exec"), original)
    exec(compile(result.fixed, "attend_fixed.py", "exec"), patched)
    return {"original (eager)": original["attend"], "SDPA + row fixup (advisor)": patched["attend"],
            "SDPA alone (keep mask)": sdpa_alone}


def _backward(f, q, k, v, mask):
    f(q, k, v, mask).sum().backward()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, args.seq, 64, generator=generator) for _ in range(3))
    mask = (torch.rand(2, 1, 1, args.seq, generator=generator) > 0.1).long()
    mask[1] = 0  # a sample all padding: every query row of it is fully masked
    cases = functions()
    with torch.no_grad():
        reference = cases["original (eager)"](q, k, v, mask)
        errors = {name: float((f(q, k, v, mask) - reference).abs().max()) for name, f in cases.items()}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    modes = {"forward, no grad": ("with torch.no_grad(): f(q, k, v, mask)", dict(zip("qkv", (q, k, v)))),
             "forward + backward": ("backward(f, q, k, v, mask)", dict(zip("qkv", leaves)))}
    print(f"B=2 H=8 L=S={args.seq} D=64 float32, padding mask (sample 1 all padding), {args.threads} threads, "
          f"medians of {args.rounds} alternating rounds")
    for mode, (statement, tensors) in modes.items():
        timers = {name: benchmark.Timer(statement, globals=dict(f=f, mask=mask, backward=_backward, torch=torch,
                                                                 **tensors), num_threads=args.threads)
                  for name, f in cases.items()}
        medians: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):  # alternate, so drift on a shared machine hits every row alike
            for name, timer in timers.items():
                medians[name].append(timer.blocked_autorange(min_run_time=0.3).median)
        base = sorted(medians["SDPA alone (keep mask)"])[args.rounds // 2]
        print(f" {mode}")
        for name in cases:
            runs = sorted(medians[name])
            middle = runs[args.rounds // 2]
            print(f"  {name:28s} median {middle * 1e3:8.3f} ms  (min {runs[0] * 1e3:.3f}, max {runs[-1] * 1e3:.3f})"
                  f"  x{middle / base:5.3f} of SDPA alone  max abs err vs original {errors[name]:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
