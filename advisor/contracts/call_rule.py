"""The rule type of the copies and casts family: a rule about one call, run by advisor.fixes.copy_cast_fix. Kept
apart from that engine so that loading the rule units (every `advisor` verb lists the codes) imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from advisor.contracts.rule import Rule


@dataclass(frozen=True)
class CallRule(Rule):
    """A rule about one call. `prove(parsed, call)` returns the rewrite the source alone proves equal, or None;
    `join(JoinRequest)` plans the fix of a runtime finding of this code. `redundant_call` names the call its
    runtime detector reports as redundant (a line's calls are all redundant when the findings of every rule naming
    that call cover every call that ran there)."""

    prove: Callable | None = None
    join: Callable | None = None
    redundant_call: str | None = None
