"""How scan time grows with the number of attention blocks in one file: prints blocks, seconds, and seconds per
block, measured in this one run (linear scaling keeps the last column flat).

    python benchmarks/scan_scaling.py [--blocks 100 200 400 1000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
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
    parser.add_argument("--blocks", type=int, nargs="+", default=[100, 200, 400, 1000])
    parser.add_argument("--profile", action="store_true", help="print the top functions for the largest size")
    args = parser.parse_args()
    print(f"{'blocks':>7} {'seconds':>9} {'ms/block':>9} {'findings':>9}")
    for count in args.blocks:
        source = module_with_blocks(count)
        start = time.perf_counter()
        result = analyze_source(source, "model.py")
        elapsed = time.perf_counter() - start
        assert len(result.findings) == count and result.fixed != source
        print(f"{count:>7} {elapsed:>9.2f} {1000 * elapsed / count:>9.1f} {len(result.findings):>9}", flush=True)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(analyze_source, module_with_blocks(args.blocks[-1]), "model.py")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
