"""Generated attention programs whose additive mask is a module-level tensor of the same file (issue 16): how many
get a safe patch (held to the original's outputs and gradients), an unsafe one, a refusal, no finding.

    python benchmarks/module_mask_programs.py --examples 200 [--seed S] [--hazards] [--out DIR]

Prints the counts, the facts left assumed on unsafe patches (by name) and the refusal reasons; with `--hazards`,
only programs under which no patch may be safe (a rebound or written global, values that can mask a whole row).
Writes each counterexample (a safe patch that changed a value, or a safe patch of a hazardous program) to DIR and
exits 1 when there is one.
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

from fuzz.differential import COUNTEREXAMPLE, SAFE_OK, analyze, check  # noqa: E402
from fuzz.module_masks import programs, render  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hazards", action="store_true", help="only programs under which no patch may be safe")
    parser.add_argument("--out", default="module-mask-counterexamples")
    args = parser.parse_args(argv)
    out = Path(args.out)
    counts: collections.Counter[str] = collections.Counter()
    assumed: collections.Counter[str] = collections.Counter()
    refusals: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()

    @hypothesis_seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(programs(hazard=True if args.hazards else None))
    def run(program):
        source = render(program)
        outcome = check(source, as_file=True)
        counts["generated"] += 1
        counts[outcome.status] += 1
        group = "no hazard" if program.hazard == "none" else "hazard"
        counts[(group, outcome.status)] += 1
        counts[group] += 1
        wrong = outcome.status == COUNTEREXAMPLE or outcome.status == SAFE_OK and program.hazard != "none"
        if wrong:
            counts["wrong"] += 1
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{counts['generated']:04d}_{outcome.kind or 'hazard-called-safe'}.py").write_text(
                f"# {outcome.detail}\n".replace("\n", " ").rstrip() + "\n" + source, encoding="utf-8")
        if outcome.status != SAFE_OK:
            for finding in analyze(source, as_file=True).findings:
                if finding.patch is None:
                    refusals[finding.reason or "?"] += 1
                for fact in (finding.extra.get("facts") or {}).get("assumed", []):
                    assumed[fact["name"]] += 1

    run()
    elapsed = time.perf_counter() - started
    print(f"{counts['generated']} programs in {elapsed:.0f} s, seed {args.seed}"
          f"{', hazards only' if args.hazards else ''}")
    statuses = ("safe-ok", "unsafe-only", "refused", "no-finding", "invalid", COUNTEREXAMPLE)
    print(f"  {'':16s} {'all':>6s} {'no hazard':>10s} {'hazard':>7s}")
    for key in statuses:
        print(f"  {key:16s} {counts[key]:6d} {counts[('no hazard', key)]:10d} {counts[('hazard', key)]:7d}")
    print(f"  {'programs':16s} {counts['generated']:6d} {counts['no hazard']:10d} {counts['hazard']:7d}")
    print(f"  wrong (a safe patch that changed a value, or a safe patch of a hazardous program): {counts['wrong']}")
    print("facts left assumed (findings):")
    for name, number in assumed.most_common():
        print(f"  {number:5d}  {name}")
    print("refusal reasons:")
    for reason, number in refusals.most_common():
        print(f"  {number:5d}  {reason[:150]}")
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
