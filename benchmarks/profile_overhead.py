"""Print how much profiling costs relative to running the same steps unprofiled, side by side in one process.

For each bundled fixture: N unprofiled steps vs. what `advisor profile` adds for those N steps (N is what the
product profiles: the workload's steps, raised for very short steps to cover MIN_PROFILED_US) in eval mode
without --trace (profiler over N steps plus its warm-up step, event rebuild, one recorded step of the op
graph, attribution and detection). Runs alternate, and the median of the per-pair ratios is printed. The
profiler's one-time start-up (Kineto initialisation, paid once per process) is measured and printed apart.

    python benchmarks/profile_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.runtime.capture import (  # noqa: E402
    profile_steps,
    profiled_step_count,
    record_graph,
    records_details,
    time_steps,
)
from advisor.engine.runtime_engine import runtime_findings  # noqa: E402
from advisor.runtime.events import build, from_kineto  # noqa: E402
from advisor.runtime.runner import prepare  # noqa: E402
from advisor.runtime.time_attribution import attribute  # noqa: E402
from advisor.workload_loader import load_workload  # noqa: E402

FIXTURES = ("handwritten_attention.py", "copies_and_casts.py", "sdpa_fallback.py", "clean.py")


def profiled_cost(prepared, steps: int) -> float:
    start = time.perf_counter()
    detailed = records_details(prepared, None)
    prof = profile_steps(prepared, steps, None, detailed)
    events = list(build(from_kineto(prof.profiler.kineto_results, detailed=detailed),
                        prepared.device.type == "cuda"))
    graph = record_graph(prepared)
    runtime_findings(graph, prepared.device.type, attribute(events, graph, steps))
    return time.perf_counter() - start


def unprofiled_cost(prepared, steps: int) -> float:
    start = time.perf_counter()
    time_steps(prepared, steps)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'fixture':28} {'steps':>5} {'unprofiled':>11} {'profiled':>10} {'ratio':>6}")
    startup = None
    for name in FIXTURES:
        workload = load_workload(f"{ROOT / 'fixtures' / 'profile' / name}:workload")
        prepared = prepare(workload)
        for _ in range(3):
            prepared.step()
        steps = profiled_step_count(workload.steps, statistics.median(time_steps(prepared, workload.steps)))
        if startup is None:
            startup = profiled_cost(prepared, steps) - profiled_cost(prepared, steps)
        ratios, plain, profiled = [], [], []
        for _ in range(args.repeats):
            plain.append(unprofiled_cost(prepared, steps))
            profiled.append(profiled_cost(prepared, steps))
            ratios.append(profiled[-1] / plain[-1])
        print(f"{name:28} {steps:5d} {statistics.median(plain) * 1e3:9.1f}ms "
              f"{statistics.median(profiled) * 1e3:8.1f}ms {statistics.median(ratios):5.2f}x")
    print(f"one-time profiler start-up in this process: {startup * 1e3:.0f} ms (not in the ratios)")


if __name__ == "__main__":
    main()
