"""What the SDPA rewrite buys: forward time of original vs rewritten fixture models, side by side.

For a few golden fixtures, the original module and advisor's rewrite are loaded from source, built at a
realistic size with the same weights, and timed alternately with torch.utils.benchmark in one process
(eval mode, no grad, fixed threads). Prints median times, the speedup ratio and the max abs difference.

    python benchmarks/attention_speedup.py [--seq 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.engine.static import analyze_source  # noqa: E402

# fixture -> (class name, constructor kwargs, input builder(seq))
CASES = {
    "01_nanogpt_causal.py": ("CausalSelfAttention", dict(n_embd=256, n_head=8, block_size=1024, dropout=0.0),
                             lambda seq: (torch.randn(4, seq, 256),)),
    "02_vit_softmax_module.py": ("Attention", dict(dim=256, heads=8, dim_head=32, dropout=0.0),
                                 lambda seq: (torch.randn(4, seq, 256),)),
    "10_hf_bert_additive_mask.py": ("BertSelfAttention", dict(hidden_size=256, num_attention_heads=8),
                                    lambda seq: (torch.randn(4, seq, 256), torch.zeros(4, 1, 1, seq))),
    "17_xtransformers_einsum4d_keypad.py": ("Attention", dict(dim=256, dim_head=32, heads=8, dropout=0.0),
                                            lambda seq: (torch.randn(4, seq, 256),
                                                         torch.ones(4, seq, dtype=torch.bool))),
}


def load(source: str, name: str, folder: Path):
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU, {args.threads} threads, batch 4, seq {args.seq}, fp32, eval")
    print(f"{'fixture':40s} {'original ms':>12s} {'rewritten ms':>13s} {'speedup':>8s} {'max |diff|':>11s}")
    with tempfile.TemporaryDirectory() as folder:
        for index, (fixture, (class_name, kwargs, make_inputs)) in enumerate(CASES.items()):
            path = ROOT / "fixtures" / "attention" / "positive" / fixture
            source = path.read_text()
            # 10 and 17 are unsafe patches (mask-rank, fully-masked-rows); these inputs satisfy both facts
            rewritten = analyze_source(source, str(path), unsafe_fixes=True).fixed
            assert rewritten != source, f"{fixture}: no patch"
            original_module = load(source, f"bench_original_{index}", Path(folder))
            rewritten_module = load(rewritten, f"bench_rewritten_{index}", Path(folder))
            torch.manual_seed(0)
            original = getattr(original_module, class_name)(**kwargs).eval()
            candidate = getattr(rewritten_module, class_name)(**kwargs).eval()
            candidate.load_state_dict(original.state_dict())
            inputs = make_inputs(args.seq)
            with torch.no_grad():
                diff = (original(*inputs) - candidate(*inputs)).abs().max().item()
                timers = [benchmark.Timer("model(*inputs)", globals={"model": m, "inputs": inputs},
                                          num_threads=args.threads) for m in (original, candidate)]
                rounds = [[], []]
                for _ in range(5):  # alternate, so drift on a noisy machine hits both sides alike
                    for side, timer in enumerate(timers):
                        rounds[side].append(timer.blocked_autorange(min_run_time=0.3).median)
            before, after = (sorted(r)[len(r) // 2] * 1e3 for r in rounds)
            print(f"{fixture:40s} {before:12.2f} {after:13.2f} {before / after:7.2f}x {diff:11.2e}")


if __name__ == "__main__":
    main()
