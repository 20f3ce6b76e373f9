"""A cold scan of one file holding an attention block and one long line, at two line lengths, side by side in one
run: prints the seconds of each (CPU of this process, the scan run in it) and their ratio against the ratio of the
lengths. Linear text screens keep the two ratios close; a regular expression that backtracks over a long word made
a 50 KB string literal take 20 s and 100 KB 107 s (breaker round 52).

    python benchmarks/long_lines.py [--lengths 10000 100000] [--kinds word base64 data prose dotted]
"""

from __future__ import annotations

import argparse
import base64
import random
import tempfile
import time
from pathlib import Path

from advisor.engine.static import scan_paths

BLOCK = '''import math
import torch
import torch.nn as nn


class Attn(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return s.softmax(dim=-1) @ v


'''


def long_line(kind: str, length: int) -> str:
    """One module-level statement of about `length` characters: a string of one word character, base64 text, a list
    of numbers, a comment of prose, or a string of a dotted chain."""
    rng = random.Random(0)
    if kind == "word":
        return 'BLOB = "' + "a" * length + '"'
    if kind == "base64":
        return 'BLOB = "' + base64.b64encode(rng.randbytes(length * 3 // 4)).decode() + '"'
    if kind == "data":
        return "TABLE = [" + ", ".join(f"{rng.random():.6f}" for _ in range(length // 10)) + "]"
    if kind == "prose":
        return "# " + " ".join(rng.choice(["for", "x", "in", "the", "getattr", "vars", "self", "model"])
                               for _ in range(length // 5))
    if kind == "dotted":
        return 'CHAIN = "' + ".".join(["a"] * (length // 2)) + '"'  # in a string: as code, Python's parser recurses
    raise ValueError(kind)


def scan_seconds(text: str) -> float:
    """CPU seconds of a cold scan of one file holding `text`."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.py"
        path.write_text(text)
        start = time.process_time()
        result = scan_paths([str(path)], jobs=1, patches=True, fixed=False, cache=False)
        seconds = time.process_time() - start
        assert len(result.findings) == 1 and not result.errors, (result.findings, result.errors)
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs=2, default=[10_000, 100_000])
    parser.add_argument("--kinds", nargs="+", default=["word", "base64", "data", "prose", "dotted"])
    args = parser.parse_args()
    short, long = args.lengths
    scan_seconds(BLOCK)  # lazy imports out of the first figure
    print(f"{'kind':>8} {f'{short} chars s':>16} {f'{long} chars s':>17} {'ratio':>7} {'length ratio':>13}")
    for kind in args.kinds:
        first = scan_seconds(BLOCK + long_line(kind, short) + "\n")
        second = scan_seconds(BLOCK + long_line(kind, long) + "\n")
        print(f"{kind:>8} {first:>16.2f} {second:>17.2f} {second / first:>7.1f} {long / short:>13.1f}", flush=True)


if __name__ == "__main__":
    main()
