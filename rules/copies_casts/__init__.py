"""Copies and casts: one module per rule, each a `CallRule` (advisor.fixes.copy_cast_fix) holding its docs, examples,
static proof, runtime join and op-graph detector. Adding a rule to this family is adding a module here.

The findings are proved redundant from the source, or measured by a profile (`fix --profile`) and joined to the
call on that line. Each fix states its safety and why. A rule that can be seen in a Chrome trace has a `trace`
(ADV205 and ADV305 have nothing else, since a trace cannot tell a needed copy apart)."""

from __future__ import annotations

from advisor.contracts.call_rule import method_screen
from advisor.contracts.family import Family, unit_rules

RULES = unit_rules(__name__)


def _detect(context, rules):
    from advisor.fixes.copy_cast_fix import copy_cast_findings

    return copy_cast_findings(context.parsed, context.evidence, context.earlier, rules)


# the static detector runs where a call of a method some rule proves occurs; a profile's evidence for the file
# bypasses that
FAMILY = Family(name="copies_casts", rules=RULES, static=_detect, uses_evidence=True, screen=method_screen(RULES))
