"""Attention configuration in the user's own code: Hugging Face settings that force the eager attention path, and
the deprecated SDPA kernel context manager. One module per rule, each a `SiteRule` (advisor.contracts.site_rule)
whose `check` reads one call or assignment (advisor.hf.config_rules walks them); fixes are one-expression edits.
ADV604 is the same setting measured: after a profile, the family's post-profile hook (advisor.hf.eager_profile) finds a
transformers model that ran eager attention."""

from __future__ import annotations

from advisor.contracts.family import Family, unit_rules

RULES = unit_rules(__name__)


def _detect(context, rules):
    from advisor.hf.findings import config_findings

    return config_findings(context.parsed, rules, context.tree.autograd if context.tree is not None else None)


def _after_profile(model, target, ranked, rules):
    from advisor.hf.eager_profile import EagerAttentionRules, with_eager_attention_finding
    from advisor.rules.attention import MEASURED
    from advisor.rules.attention_config.eager_attention import RULE as EAGER
    from advisor.rules.attention_config.measured_eager import RULE as MEASURED_EAGER

    return with_eager_attention_finding(model, target, ranked, EagerAttentionRules(MEASURED_EAGER, EAGER, MEASURED))


# prefilter: the rules' tokens; no screen, since an import anywhere in the file can name the callable a rule looks
# for; never in library files, which advisor.hf.config_rules does not report
FAMILY = Family(name="attention_config", rules=RULES, static=_detect, post_profile=_after_profile,
                library_files=False)
