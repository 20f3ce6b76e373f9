"""Interleaved A/B timing of two live workers, and the statistics the verdicts rest on.

Rounds alternate which side goes first (ABBA...), so drift of a shared machine lands on both sides alike. Each side
runs unprofiled, synchronised steps inside its own worker (`Worker.time`). Each round gives one paired ratio,
median(A steps) / median(B steps) of steps that ran side by side; the speedup is the median of those ratios and its
95% confidence interval a percentile bootstrap of that median over rounds (2,000 resamples, fixed seed).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from advisor.verify.messages import Time

WARMUP_STEPS = 2
ROUND_US = 20_000.0  # steps per round: about this much work per side, at least one step
MIN_ROUNDS, MAX_ROUNDS = 12, 80
RESAMPLES = 2000


@dataclass
class Paired:
    rounds_a: list[list[float]]  # per round, the step times of side A (microseconds)
    rounds_b: list[list[float]]

    @property
    def a(self) -> list[float]:
        return [t for r in self.rounds_a for t in r]

    @property
    def b(self) -> list[float]:
        return [t for r in self.rounds_b for t in r]

    def ratios(self) -> list[float]:
        return [statistics.median(a) / statistics.median(b) for a, b in zip(self.rounds_a, self.rounds_b)]

    def speedup(self) -> float:
        return statistics.median(self.ratios())

    def speedup_ci(self) -> tuple[float, float]:
        rng, ratios = random.Random(0), self.ratios()
        return _percentiles([statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES)])


def summary(samples: list[float], peak_bytes: int | None) -> dict:
    """median, IQR, a bootstrap 95% interval of the median, the peak memory and the raw samples (us)."""
    quartiles = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
    rng = random.Random(1)
    medians = [statistics.median(rng.choices(samples, k=len(samples))) for _ in range(RESAMPLES // 4)]
    return {"median_us": round(statistics.median(samples), 3), "iqr_us": round(quartiles[2] - quartiles[0], 3),
            "ci_us": [round(v, 3) for v in _percentiles(medians)], "peak_bytes": peak_bytes,
            "samples_us": [round(t, 3) for t in samples]}


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[int(0.025 * (len(ordered) - 1))], ordered[int(0.975 * (len(ordered) - 1))]


def interleave(a, b, budget_s: float) -> Paired:
    """Time workers `a` and `b` (WorkerProcess) in alternating rounds within about `budget_s` seconds."""
    step_a = min(a.call(Time(2, WARMUP_STEPS)).us)
    step_b = min(b.call(Time(2, WARMUP_STEPS)).us)
    per_round = max(1, int(ROUND_US / max(step_a, step_b, 1.0)))
    round_us = per_round * (step_a + step_b)
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(budget_s * 1e6 / round_us)))
    paired = Paired([], [])
    for r in range(rounds):
        order = ((a, paired.rounds_a), (b, paired.rounds_b))
        for worker, into in (order if r % 2 == 0 else order[::-1]):
            into.append(worker.call(Time(per_round)).us)
    return paired
