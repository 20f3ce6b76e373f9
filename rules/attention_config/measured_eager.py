"""ADV604: a profiled transformers model ran eager attention (advisor.hf.eager_profile measures it and points at the
user line that chose it)."""

from __future__ import annotations

from advisor.contracts.site_rule import SiteRule
from advisor.rules.attention_config._links import HF_ATTENTION

RULE = SiteRule(
    code="ADV604", kind="hf-attn-implementation", title="transformers model ran eager attention (measured)",
    summary="a profiled transformers model ran eager attention: reported at the user line that chose it (or built "
            "the model), costed by the library's eager attention",
    fix="attn-implementation-sdpa", fix_safety="unsafe", fix_summary="ADV601's patch when that line set it",
    what="A profiled transformers model ran its eager attention path (matmul + softmax in the library's modeling "
         "file).",
    why="As ADV601; its cost is the measured time of the library's eager attention.",
    fix_doc="The fix belongs in the user's code, not the library: the finding points at the line that set "
            "attn_implementation=\"eager\" (with ADV601's patch), or, when nothing set it, at the line that built "
            "the model and says why transformers chose eager.",
    example='model = AutoModel.from_pretrained("x")  # a family without SDPA support: transformers picks eager',
    detectors=("runtime",), references=(HF_ATTENTION,),
)
