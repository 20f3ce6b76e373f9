"""Facts from the run: an attention rewrite's assumed facts that held on every recorded call of its block.

A profile (or `optimize`'s original side, on each of its parity inputs) records what every call of a hand-written
attention block saw (advisor.fixes.evidence.BlockCall). Calls are joined to the static finding by file and span:
the score and value products' lines lie within the finding's lines. Each assumed fact that has an observation is
checked on every joined call; it becomes `observed` only when it held on all of them (a disagreeing call leaves it
assumed), and never proved: the patch stays unsafe for `fix`, and `optimize` verifies it on that workload.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from advisor.fixes.evidence import BlockCall
from advisor.patterns.facts import FactSheet


def _qkv_dtype(call: BlockCall) -> bool:
    return call.query == call.key == call.value


def _mask_dtype(call: BlockCall) -> bool:
    """Strict: an added mask of exactly the query's dtype is what SDPA adds unchanged."""
    return all(mask.dtype == call.query for mask in call.masks if mask.how == "additive")


def _mask_rank(call: BlockCall) -> bool:
    return all(2 <= mask.ndim <= call.scores_ndim and not mask.grew for mask in call.masks)


def _no_fully_masked_row(call: BlockCall) -> bool:
    return call.fully_masked_rows == 0  # None (unknown) never discharges it


def _scale_is_number(call: BlockCall) -> bool:
    return not call.tensor_scale


# fact name -> (what must hold on one call, what the run showed when it held on all)
OBSERVERS: dict[str, tuple[Callable[[BlockCall], bool], Callable[[list[BlockCall]], str]]] = {
    "qkv-dtype": (_qkv_dtype, lambda calls: f"q, k and v were {_distinct(c.query for c in calls)}"),
    "mask-dtype": (_mask_dtype, lambda calls: "every added mask had the query's dtype "
                   f"({_distinct(m.dtype for c in calls for m in c.masks if m.how == 'additive') or 'none ran'})"),
    "mask-rank": (_mask_rank, lambda calls: "every mask had 2 to the scores' dims "
                  f"({_distinct(str(m.ndim) for c in calls for m in c.masks) or 'none ran'})"),
    "fully-masked-rows": (_no_fully_masked_row, lambda calls: "no query row was fully masked"),
    "scale-is-number": (_scale_is_number, lambda calls: "every scale factor was a Python number"),
}


def calls_in(calls: list[BlockCall], path: str, line: int, end_line: int) -> list[BlockCall]:
    """The recorded calls of the block a static finding spans (same file, both products' lines inside it)."""
    real = os.path.realpath(path)
    return [c for c in calls if c.path == real and line <= c.line <= end_line and line <= c.end_line <= end_line]


def discharge(facts: FactSheet, calls: list[BlockCall]) -> None:
    """Mark observed each assumed fact with an observation that held on every call (there is at least one)."""
    if not calls:
        return
    for fact in facts.assumptions:
        observer = OBSERVERS.get(fact.name)
        if observer is not None and all(observer[0](call) for call in calls):
            facts.observe(fact.name, f"held on all {len(calls)} recorded call(s) of the run: {observer[1](calls)}")


def disagreements(facts: FactSheet, calls: list[BlockCall]) -> list[str]:
    """The assumed facts a recorded call contradicted, each with how many calls (for the reason shown)."""
    found = []
    for fact in facts.assumptions:
        observer = OBSERVERS.get(fact.name)
        if observer is not None and calls:
            failed = sum(not observer[0](call) for call in calls)
            if failed:
                found.append(f"{fact.name} was not seen to hold on {failed} of {len(calls)} recorded call(s)")
    return found


def _distinct(values) -> str:
    return ", ".join(sorted(set(values)))
