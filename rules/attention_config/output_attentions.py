"""ADV602: output_attentions=True on an inference path, which forces eager attention."""

from __future__ import annotations

from advisor.contracts.site_rule import SiteRule
from advisor.lazy import lazy_import
from advisor.contracts.rule import negative, positive
from advisor.rules.attention_config._links import HF_ATTENTION

config = lazy_import("advisor.hf.config_rules")


def check(site):
    """A call under no_grad/inference_mode, a loader or `generate` that asks for the attention weights."""
    if config.is_true(site.keyword("output_attentions")) and \
            (site.is_loader or site.method == "generate" or site.in_inference):
        return [site.match(RULE, reasons=("returning attention weights forces the eager path; drop "
                                          "output_attentions=True where they are not used",))]
    return []


RULE = SiteRule(
    code="ADV602", kind="hf-attn-implementation",
    title="output_attentions=True on an inference path forces eager attention",
    summary="`output_attentions=True` on an inference path (no_grad/inference_mode, generate, loaders) forces eager",
    fix="none", fix_safety="unsafe", fix_summary="report",
    what="Finds output_attentions=True in a call under torch.no_grad / inference_mode, in generate(), or in "
         "from_pretrained/from_config.",
    why="Fused attention kernels (SDPA's flash and memory-efficient kernels, flash_attn) never form the attention "
        "weights, so asking a transformers model for them makes it run the eager path in every layer.",
    fix_doc="No automatic fix: drop the argument where the weights are not used; advisor does not remove it because "
            "the weights may be read from the outputs elsewhere.",
    examples=(
        positive('import torch\nfrom transformers import AutoModel\nmodel = AutoModel.from_pretrained("x")\n'
                 'with torch.no_grad():\n    out = model(ids, output_attentions=True)\n'),
        negative('from transformers import AutoModel\nmodel = AutoModel.from_pretrained("x")\n'
                 'out = model(ids, output_attentions=False)\n'),
    ),
    references=(HF_ATTENTION,),
    tokens=('output_attentions',), check=check,
)
