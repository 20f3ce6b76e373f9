"""The long profile of the attention fuzzer: generate many hand-written attention variants, hold every safe patch
advisor offers to the original's outputs and gradients, and count what happened.

    python benchmarks/fuzz_attention.py --examples 10000 [--seed S] [--family NAME ...] [--out DIR] [--minutes M]

Prints counts (generated, safe patches checked, unsafe-only, refused, no finding, invalid variants, and
counterexamples by family and kind) and the throughput; writes each counterexample's source, advisor's rewrite and
what went wrong to DIR (default: fuzz-counterexamples/). Exits 1 when there is a counterexample.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for entry in (ROOT, ROOT / "tests"):
    sys.path.insert(0, str(entry))

from hypothesis import HealthCheck, Phase, given, seed as hypothesis_seed, settings  # noqa: E402

from fuzz.attention_variants import FAMILIES, render, tagged_variants  # noqa: E402
from fuzz.differential import COUNTEREXAMPLE, check  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES),
                        help="only these families (repeatable; default: all, chosen uniformly)")
    parser.add_argument("--out", default="fuzz-counterexamples")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop generating after this long (the counts cover what ran)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = sorted(args.family or FAMILIES)
    strategy = tagged_variants(families)
    counts: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    deadline = started + args.minutes * 60 if args.minutes else None

    @hypothesis_seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(named):
        if deadline is not None and time.perf_counter() > deadline:
            return  # out of time: hypothesis still draws the remaining examples, cheaply
        family, variant = named
        try:
            source = render(variant)
            outcome = check(source)
        except Exception as exc:  # noqa: BLE001 - a bug of the fuzzer itself must not end the run
            counts["generated"] += 1
            counts["fuzzer errors"] += 1
            (out / f"fuzzer_error_{counts['generated']:05d}.txt").write_text(f"{exc!r}\n{variant!r}\n")
            return
        counts["generated"] += 1
        counts[outcome.status] += 1
        counts["safe patches checked"] += outcome.safe_patches
        counts["unsafe patches run"] += any(note.startswith("unsafe patch") for note in outcome.notes)
        failures = [note for note in outcome.notes if note.startswith("unsafe patch fails")]
        if failures:
            counts["unsafe patches that fail to run"] += 1
            (out / f"unsafe_fails_{counts['generated']:05d}_{family}.py").write_text(
                f"# {failures[0]}\n".replace("\n", " ").rstrip() + "\n" + source, encoding="utf-8")
        if outcome.status == COUNTEREXAMPLE:
            label = f"{family} ({FAMILIES[family][0]}) / {outcome.kind}"
            by_class[label] += 1
            _write_counterexample(out, counts["generated"], family, source, outcome)
        if counts["generated"] % 250 == 0:
            rate = counts["generated"] / (time.perf_counter() - started)
            print(f"  {counts['generated']} generated, {counts[COUNTEREXAMPLE]} counterexamples, {rate:.1f}/s",
                  file=sys.stderr, flush=True)

    run()
    elapsed = time.perf_counter() - started
    print(f"generated {counts['generated']} variants in {elapsed:.0f} s ({counts['generated'] / elapsed:.1f}/s), "
          f"seed {args.seed}, families: {', '.join(families)}")
    for key in ("safe patches checked", "safe-ok", "unsafe-only", "refused", "no-finding", "invalid",
                "unsafe patches run", "unsafe patches that fail to run", "fuzzer errors", COUNTEREXAMPLE):
        print(f"  {key:32s} {counts[key]}")
    for label, number in sorted(by_class.items()):
        print(f"    {number:6d}  {label}")
    if counts[COUNTEREXAMPLE]:
        print(f"counterexample sources in {out}/")
    return 1 if counts[COUNTEREXAMPLE] else 0


def _write_counterexample(out: Path, number: int, family: str, source: str, outcome) -> None:
    header = f"# {family} / {outcome.kind}: {outcome.detail}\n".replace("\n", " ").rstrip() + "\n"
    (out / f"{number:05d}_{family}_{outcome.kind}.py").write_text(header + source, encoding="utf-8")
    if outcome.fixed is not None:
        (out / f"{number:05d}_{family}_{outcome.kind}.fixed.py").write_text(outcome.fixed, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
