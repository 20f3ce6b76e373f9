"""Attention configuration in the user's own code (advisor.hf.config_rules): Hugging Face settings that force the
eager attention path, and the deprecated SDPA kernel context manager; fixes are one-expression edits. ADV604 is
the same setting measured: a profiled transformers model that ran eager attention (advisor.hf.runtime)."""

from __future__ import annotations

from advisor.registry import Family, Rule, negative, positive

HF_ATTENTION = "https://huggingface.co/docs/transformers/main/en/attention_interface"
HF_SDPA = "https://huggingface.co/docs/transformers/main/en/perf_infer_gpu_one#pytorch-scaled-dot-product-attention"

EAGER = Rule(
    code="ADV601", kind="hf-attn-implementation", title="transformers model loaded with eager attention",
    summary="transformers model loaded with `attn_implementation=\"eager\"` (from_pretrained, from_config, configs, "
            "`_attn_implementation =`, `set_attn_implementation`)",
    fix="attn-implementation-sdpa", fix_safety="unsafe",
    fix_summary="`\"sdpa\"`: safe for a concrete class declaring SDPA support and no `output_attentions=True` in the "
                "file, else unsafe",
    what="Finds attn_implementation=\"eager\" in from_pretrained, from_config, a model config, "
         "config._attn_implementation or set_attn_implementation.",
    why="Every attention layer of the model then runs the hand-written matmul + softmax path: the L x S weights are "
        "materialised in every layer. \"sdpa\" runs torch's scaled_dot_product_attention (flash / memory-efficient "
        "kernels) with the same function; on a CUDA script in fp16/bf16, \"flash_attention_2\" is faster still.",
    fix_doc="Replaces \"eager\" by \"sdpa\" in the user's own code, never in library files. Safe only when the "
            "loaded class is a concrete transformers class that declares SDPA support and nothing in the file asks "
            "for the attention weights (output_attentions=True); otherwise unsafe, saying which it could not prove.",
    examples=(
        positive('from transformers import LlamaForCausalLM\n'
                 'm = LlamaForCausalLM.from_pretrained("x", attn_implementation="eager")\n',
                 fixed='from transformers import LlamaForCausalLM\n'
                       'm = LlamaForCausalLM.from_pretrained("x", attn_implementation="sdpa")\n'),
        negative('from transformers import AutoModel\n'
                 'm = AutoModel.from_pretrained("x", attn_implementation="sdpa")\n'),
        negative('def f(db):\n    db.connect(attn_implementation="eager")\n'),
    ),
    references=(HF_ATTENTION, HF_SDPA),
)

OUTPUT_ATTENTIONS = Rule(
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
)

BETTER_TRANSFORMER = Rule(
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
)

MEASURED_EAGER = Rule(
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

SDP_KERNEL = Rule(
    code="ADV701", kind="deprecated-api",
    title="torch.backends.cuda.sdp_kernel is deprecated: use torch.nn.attention.sdpa_kernel",
    summary="deprecated `torch.backends.cuda.sdp_kernel(...)`", fix="sdpa-kernel", fix_safety="safe",
    fix_summary="safe: `sdpa_kernel([...])` with the same backend list",
    what="Finds torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=..., "
         "enable_cudnn=...).",
    why="It emits a FutureWarning and will be removed; it is implemented as torch.nn.attention.sdpa_kernel over the "
        "list of the enabled backends.",
    fix_doc="Safe: the call becomes sdpa_kernel([...]) with the same backends (and the import it needs). Flags that "
            "are not literal True/False get no fix (the list would depend on run-time values).",
    examples=(
        positive('import torch\n\n\ndef run(f):\n    with torch.backends.cuda.sdp_kernel(enable_math=False):\n'
                 '        return f()\n',
                 fixed='import torch\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n\n\ndef run(f):\n'
                       '    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, '
                       'SDPBackend.CUDNN_ATTENTION]):\n        return f()\n'),
    ),
    references=("https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html",),
)


def _detect(context):
    from advisor.hf.findings import config_findings

    return config_findings(context.parsed)


FAMILY = Family(
    name="attention_config", rules=(EAGER, OUTPUT_ATTENTIONS, BETTER_TRANSFORMER, MEASURED_EAGER, SDP_KERNEL),
    prefilter=("attn_implementation", "output_attentions", "sdp_kernel", "bettertransformer"),
    static=_detect,  # ADV604 is measured on the model itself (advisor.hf.runtime, run by the profile pipeline)
)
