"""How scan time grows with the number of attention blocks in one file: prints blocks, seconds (wall and this
process's CPU), milliseconds per block and the ratio to the first size, medians of --repeat rounds measured in this
one run, the sizes interleaved in each round (linear scaling keeps ms/block flat; issue 19 asks 800 blocks in at
most 8x the time of 100). CPU seconds are the steadier figure on a loaded machine.

    python benchmarks/scan_scaling.py [--blocks 100 400 800] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import statistics
import time
from pathlib import Path

from advisor.engine.static import analyze_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"


def module_with_blocks(count: int) -> str:
    """`count` copies of nanoGPT's attention class (renamed) in one module, under one set of imports."""
    source = FIXTURE.read_text()
    header, rest = source.split("\n\nclass ", 1)
    block = "class " + rest.split("\n\ndef make", 1)[0]
    copies = [re.sub(r"\bCausalSelfAttention\b", f"Attention{index}", block) for index in range(count)]
    return header + "\n\n" + "\n\n\n".join(copies) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[100, 400, 800])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each figure is the median")
    parser.add_argument("--profile", action="store_true", help="print the top functions for the largest size")
    args = parser.parse_args()
    sources = {count: module_with_blocks(count) for count in args.blocks}
    analyze_source(module_with_blocks(1), "model.py")  # lazy imports and process-wide caches out of the first size
    wall: dict[int, list[float]] = {count: [] for count in args.blocks}
    cpu: dict[int, list[float]] = {count: [] for count in args.blocks}
    for _ in range(args.repeat):
        for count, source in sources.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            result = analyze_source(source, "model.py")
            wall[count].append(time.perf_counter() - start)
            cpu[count].append(time.process_time() - start_cpu)
            assert len(result.findings) == count and result.fixed != source
    first = args.blocks[0]
    print(f"{'blocks':>7} {'wall s':>8} {'cpu s':>8} {'cpu ms/block':>13} {'wall ratio':>11} {'cpu ratio':>10}"
          f"   (medians of {args.repeat})")
    for count in args.blocks:
        w, c = statistics.median(wall[count]), statistics.median(cpu[count])
        print(f"{count:>7} {w:>8.2f} {c:>8.2f} {1000 * c / count:>13.1f} "
              f"{w / statistics.median(wall[first]):>11.2f} {c / statistics.median(cpu[first]):>10.2f}", flush=True)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(analyze_source, sources[args.blocks[-1]], "model.py")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
