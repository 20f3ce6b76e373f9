"""The rule type of the copies and casts family: a rule about one call, run by advisor.fixes.copy_cast_fix. Kept
apart from that engine so that loading the rule units (every `advisor` verb lists the codes) imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from advisor.contracts.family import Screen
from advisor.contracts.rule import Rule


@dataclass(frozen=True)
class CallRule(Rule):
    """A rule about one call. `prove(parsed, call)` returns the rewrite the source alone proves equal, or None;
    `join(JoinRequest)` plans the fix of a runtime finding of this code. `redundant_call` names the call its
    runtime detector reports as redundant (a line's calls are all redundant when the findings of every rule naming
    that call cover every call that ran there). `methods` are what the family's screen looks for: a statement
without a call of one of them holds no static finding of this rule."""

    prove: Callable | None = None
    methods: tuple[str, ...] = ()  # `prove` rewrites a call only where one of these methods is called (`x.float()`)
    join: Callable | None = None
    redundant_call: str | None = None


def method_screen(rules: tuple[CallRule, ...]) -> Screen | None:
    """The screen of a family of call rules: the methods their proofs rewrite; no screen (the rules' tokens decide)
    when a rule that proves names none, so a rule added without `methods` is never skipped."""
    if any(rule.prove is not None and not rule.methods for rule in rules):
        return None
    return Screen(methods=tuple(dict.fromkeys(method for rule in rules for method in rule.methods)))
