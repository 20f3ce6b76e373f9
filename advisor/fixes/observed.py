"""Facts from the run: an attention rewrite's assumed facts that held on every recorded call of its block.

A profile (or `optimize`'s original side, on each of its parity inputs) records what every call of a hand-written
attention block saw (advisor.contracts.evidence.BlockCall). Calls are joined to the static finding by file and span:
the score and value products' lines lie within the finding's lines. Each assumed fact that has an observation is
checked on every joined call; it becomes `observed` only when it held on all of them (a disagreeing call leaves it
assumed), and never proved: the patch stays unsafe for `fix`, and `optimize` verifies it on that workload.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from advisor.contracts.evidence import BlockCall
from advisor.patterns.facts import FactSheet


def _qkv_dtype(call: BlockCall) -> bool:
    return call.query == call.key == call.value


def _mask_dtype(call: BlockCall) -> bool:
    """Strict: an added mask of exactly the query's dtype is what SDPA adds unchanged, and a bool fill mask is what
    SDPA reads as one (where() also runs on a uint8 condition, which SDPA rejects)."""
    return all(mask.dtype == call.query if mask.how == "additive" else mask.dtype == "bool"
               for mask in call.masks if mask.how in ("additive", "fill"))


def _mask_rank(call: BlockCall) -> bool:
    return all(2 <= mask.ndim <= call.scores_ndim and not mask.grew for mask in call.masks)


def _no_fully_masked_row(call: BlockCall) -> bool:
    return call.fully_masked_rows == 0  # None (unknown) never discharges it


def _kv_length(call: BlockCall) -> bool:
    return call.kv_lengths_agree is True  # None (not read) never discharges it


def _batches(call: BlockCall) -> bool:
    return call.batches_agree is True  # None (not read) never discharges it


def _scale_is_number(call: BlockCall) -> bool:
    return not call.tensor_scale


class Observer(NamedTuple):
    holds: Callable[[BlockCall], bool]  # on one call
    seen: Callable[[list[BlockCall]], str]  # what the run showed, when it held on every call


OBSERVERS: dict[str, Observer] = {  # fact name -> its observation
    "qkv-dtype": Observer(_qkv_dtype, lambda calls: f"q, k and v were {_distinct(c.query for c in calls)}"),
    "mask-dtype": Observer(_mask_dtype, lambda calls: "every added mask had the query's dtype and every filling "
                           f"one was bool ({_distinct(m.dtype for m in _masks(calls)) or 'none ran'})"),
    "mask-rank": Observer(_mask_rank, lambda calls: "every mask had 2 to the scores' dims "
                          f"({_distinct(str(m.ndim) for m in _masks(calls)) or 'none ran'})"),
    "fully-masked-rows": Observer(_no_fully_masked_row, lambda calls: "no query row was fully masked"),
    "kv-length": Observer(_kv_length, lambda calls: "v had as many rows as there were keys"),
    "bmm-batch": Observer(_batches, lambda calls: "q, k and v had one batch size"),
    "scale-is-number": Observer(_scale_is_number, lambda calls: "every scale factor was a Python number"),
}


def calls_in(calls: list[BlockCall], path: str, line: int, end_line: int) -> list[BlockCall]:
    """The recorded calls of the block a static finding spans (same file, both products' lines inside it)."""
    real = os.path.realpath(path)
    return [c for c in calls if c.path == real and line <= c.line <= end_line and line <= c.end_line <= end_line]


def discharge(facts: FactSheet, calls: list[BlockCall]) -> list[str]:
    """Mark observed each assumed fact with an observation that held on every call; return, for the reason shown,
    those a call did not show to hold, each with on how many calls."""
    failures = []
    for name in dict.fromkeys(fact.name for fact in facts.assumptions) if calls else ():
        observer = OBSERVERS.get(name)
        if observer is None:
            continue
        failed = sum(not observer.holds(call) for call in calls)
        if failed:
            failures.append(f"{name} was not seen to hold on {failed} of {len(calls)} recorded call(s)")
        else:
            facts.observe(name, f"held on all {len(calls)} recorded call(s) of the run: {observer.seen(calls)}")
    return failures


def masks_held(facts: FactSheet, calls: list[BlockCall]) -> bool:
    """Every recorded call applied a mask, and every assumed fact about masks that the run observes held on each:
    the patch that passes the masks to SDPA is then what `optimize` tries (see attention.guards.settle_guards)."""
    names = {fact.name for fact in facts.assumptions} & {"fully-masked-rows", "mask-dtype", "mask-rank"}
    return bool(calls) and all(call.masks and all(OBSERVERS[name].holds(call) for name in names) for call in calls)


def _masks(calls: list[BlockCall]):
    return (mask for call in calls for mask in call.masks)


def _distinct(values) -> str:
    return ", ".join(sorted(set(values)))
