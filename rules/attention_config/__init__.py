"""Attention configuration in the user's own code: Hugging Face settings that force the eager attention path, and
the deprecated SDPA kernel context manager. One module per rule, each a `SiteRule` (advisor.contracts.site_rule) whose
`check` reads one call or assignment (advisor.hf.config_rules walks them); fixes are one-expression edits. ADV604
is the same setting measured: a profiled transformers model that ran eager attention (advisor.hf.runtime)."""

from __future__ import annotations

from advisor.contracts.family import Family, unit_rules

RULES = unit_rules(__name__)


def _detect(context):
    from advisor.hf.findings import config_findings

    return config_findings(context.parsed, RULES)


FAMILY = Family(name="attention_config", rules=RULES, static=_detect)  # prefilter: the rules' tokens
