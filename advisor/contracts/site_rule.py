"""The rule type of the attention-configuration family: a rule about one call or assignment in the user's own code,
run by advisor.hf.config_rules. Kept apart from that engine so that loading the rule units imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from advisor.contracts.rule import Rule


@dataclass(frozen=True)
class SiteRule(Rule):
    """`check(site)` (an advisor.hf.config_rules.Site: a call or an assignment, with where it is) returns this
    rule's matches there, each with its one-expression fix or the reason it has none."""

    check: Callable | None = None
