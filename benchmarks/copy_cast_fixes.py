"""What the copy/cast fixes buy: forward time of fixtures/profile/copies_and_casts.py before and after
`advisor fix --profile` (safe fixes only, attention rules left out), side by side in one process.

The fixture is profiled once, its runtime findings are joined to its source, and the fixed text is loaded as a
second module with the same weights. Both are timed alternately with torch.utils.benchmark (eval, no grad, fixed
threads). Prints median times, the ratio, the max abs difference and how many copy ops each runs per step.

    python benchmarks/copy_cast_fixes.py [--seq 256] [--threads 2]
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

from advisor.engine.profiling import evidence_from_report, profile_workload  # noqa: E402
from advisor.runtime.recorder import OpRecorder  # noqa: E402
from advisor.engine.static import analyze_source  # noqa: E402
from advisor.workload_loader import load_workload  # noqa: E402

FIXTURE = ROOT / "fixtures" / "profile" / "copies_and_casts.py"
COPIES = frozenset({"clone", "_to_copy", "copy_"})


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_ops(model, x) -> int:
    with torch.no_grad(), OpRecorder(model) as recorder:
        model(x)
    graph = recorder.result().graph
    return sum(1 for _, data in graph.nodes(data=True) if data["op"] in COPIES)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = f"{FIXTURE}:workload"
    workload = load_workload(target)
    workload.steps = 2
    evidence = evidence_from_report(profile_workload(workload, target))
    source = FIXTURE.read_text()
    fixed = analyze_source(source, str(FIXTURE), select=["ADV2", "ADV3"], runtime=evidence).fixed
    with tempfile.TemporaryDirectory() as folder:
        fixed_path = Path(folder) / "copies_and_casts_fixed.py"
        fixed_path.write_text(fixed)
        original = load(FIXTURE, "copycast_bench_original").Mixer().eval()
        rewritten = load(fixed_path, "copycast_bench_fixed").Mixer().eval()
    rewritten.load_state_dict(original.state_dict())
    x = torch.randn(4, args.seq, 128)
    with torch.no_grad():
        diff = (original(x) - rewritten(x)).abs().max().item()
    timers = {name: benchmark.Timer("with torch.no_grad(): model(x)", globals={"model": model, "x": x, "torch": torch},
                                    num_threads=args.threads)
              for name, model in (("original", original), ("fixed", rewritten))}
    runs = {name: [] for name in timers}
    for _ in range(5):  # alternate, so drift in machine load hits both sides alike
        for name, timer in timers.items():
            runs[name].append(timer.blocked_autorange(min_run_time=0.3).median * 1e3)
    median = {name: sorted(times)[len(times) // 2] for name, times in runs.items()}
    print(f"torch {torch.__version__}, CPU, {args.threads} threads, batch 4, seq {args.seq}, fp32, eval")
    print(f"original {median['original']:.3f} ms, fixed {median['fixed']:.3f} ms, "
          f"speedup {median['original'] / median['fixed']:.2f}x, max |diff| {diff:.2e}")
    print(f"copy ops per forward: original {copy_ops(original, x)}, fixed {copy_ops(rewritten, x)}")


if __name__ == "__main__":
    main()
