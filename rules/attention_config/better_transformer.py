"""ADV603: a BetterTransformer conversion, which transformers no longer needs."""

from __future__ import annotations

from advisor.contracts.site_rule import SiteRule
from advisor.contracts.rule import positive
from advisor.rules.attention_config._links import HF_SDPA


def check(site):
    if site.method == "to_bettertransformer" or site.dotted.endswith("BetterTransformer.transform"):
        return [site.match(RULE)]
    return []


RULE = SiteRule(
    code="ADV603", kind="hf-attn-implementation",
    title="BetterTransformer conversion: transformers runs SDPA natively",
    summary="`to_bettertransformer()` / `BetterTransformer.transform()`: transformers runs SDPA natively",
    fix="none", fix_safety="unsafe", fix_summary="report",
    what="Finds model.to_bettertransformer() and optimum's BetterTransformer.transform(model).",
    why="Both are deprecated: transformers runs torch's scaled_dot_product_attention natively "
        "(attn_implementation=\"sdpa\", the default where the model family supports it).",
    fix_doc="No automatic fix: load the model with attn_implementation=\"sdpa\" and drop the conversion.",
    examples=(
        positive('from transformers import AutoModel\nmodel = AutoModel.from_pretrained("x")\n'
                 'model = model.to_bettertransformer()\n'),
    ),
    references=("https://huggingface.co/docs/optimum/bettertransformer/overview", HF_SDPA),
    tokens=('bettertransformer',), check=check,
)
