"""What a guard costs: advisor's guarded SDPA patch next to the same SDPA call without its check, side by side.

A block whose mask rank and q/k/v dtypes are not visible gets a guarded patch (`if <metadata check>: SDPA else:
the original`). Both calls, and the original eager block, are timed alternately with torch.utils.benchmark in one
process (no grad, fixed threads), on inputs that pass the check. The guard reads dtypes and ranks only, so the two
SDPA rows should agree within noise.

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, args.seq, 64, generator=generator) for _ in range(3))
    mask = torch.rand(2, 1, 1, args.seq, generator=generator) > 0.1
    cases = functions()
    reference = cases["original (eager)"](q, k, v, mask)
    timers = {name: benchmark.Timer("f(q, k, v, mask)", globals=dict(f=f, q=q, k=k, v=v, mask=mask),
                                    num_threads=args.threads) for name, f in cases.items()}
    medians: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        for _ in range(5):  # alternate, so drift on a shared machine hits every row alike
            for name, timer in timers.items():
                medians[name].append(timer.blocked_autorange(min_run_time=0.5).median)
        errors = {name: float((f(q, k, v, mask) - reference).abs().max()) for name, f in cases.items()}
    base = sorted(medians["unguarded SDPA"])[2]
    print(f"B=2 H=8 L=S={args.seq} D=64 float32, boolean key mask, {args.threads} threads")
    for name in cases:
        runs = sorted(medians[name])
        print(f"  {name:24s} median {runs[2] * 1e3:8.3f} ms  (min {runs[0] * 1e3:.3f}, max {runs[-1] * 1e3:.3f})"
              f"  x{runs[2] / base:5.3f} of unguarded  max abs err {errors[name]:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
