"""Hand-written attention: the static matcher (advisor.patterns.attention) proves each role of a block and the fix
(advisor.fixes.attention_fix) writes one scaled_dot_product_attention call; the runtime detectors see the same block,
SDPA's fallback to its math kernel, and masks rebuilt every step, in a profile or a trace."""

from __future__ import annotations

from advisor.contracts.family import Family, Screen
from advisor.contracts.rule import Rule, negative, positive, workload_module

SDPA_DOCS = "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html"

BLOCK = '''import torch


def attend(q, k, v):
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    weights = scores.softmax(dim=-1)
    return weights @ v
'''

MANUAL = "w = (x @ x.transpose(-2, -1) / 4).softmax(-1)\nreturn w @ x"


def _profiled(body: str):
    return workload_module(body, (2, 4, 64, 16))


SAFE = Rule(
    code="ADV101", kind="attention", title="Hand-written attention can be one scaled_dot_product_attention call",
    summary="attention: every role proved", fix="sdpa", fix_safety="safe", fix_summary="safe: one SDPA call",
    what="Finds a hand-written attention block (scores = Q K^T, scale, mask, softmax, dropout, @ V) whose every "
         "role the matcher proved.",
    why="The block materialises the L x S score tensor several times and runs 5-8 kernels. "
        "torch.nn.functional.scaled_dot_product_attention computes the same function in one call and dispatches to "
        "fused flash / memory-efficient kernels when the inputs allow, which saves time and O(L*S) memory.",
    fix_doc="Replaces the block by one SDPA call. Safe when every role (Q, K, V, scale, mask polarity and fill, "
            "softmax dimension, dropout) is proved equal, the attention weights are not used outside the block, "
            "and nothing in the scanned tree differentiates it twice or in forward mode (SDPA's fused kernels "
            "cannot); a fact the proof had to assume makes the fix unsafe and is named in the finding.",
    detectors=("static",),
    examples=(
        positive(BLOCK, fixed='''import torch


def attend(q, k, v):
    if k.shape[-2:-1] == v.shape[-2:-1]:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).contiguous()
    else:
        scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        weights = scores.softmax(dim=-1)
        return weights @ v
'''),
        negative('''import torch


def classify(logits):
    return logits.softmax(dim=-1).argmax(-1)
'''),
    ),
    references=(SDPA_DOCS, "https://pytorch.org/tutorials/intermediate/scaled_dot_product_attention_tutorial.html"),
)

ESCAPING = Rule(
    code="ADV102", kind="attention", title="Hand-written attention whose weights leave the block",
    summary="attention whose weights leave the block (returned, stored)", fix="sdpa-drop-weights",
    fix_safety="unsafe",
    fix_summary="unsafe, only with `--unsafe-fixes`: SDPA computes the output, `None` goes where the weights went",
    what="Finds a hand-written attention block that SDPA could compute, but whose attention probabilities are also "
         "returned, stored or reused.",
    why="As ADV101: the score tensor is materialised several times and the block runs several kernels instead of "
        "one fused call.",
    fix_doc="Unsafe, applied only with --unsafe-fixes: SDPA computes the output and None goes where the weights "
            "went, as PyTorch-native SDPA paths in transformers do; callers that read the weights break.",
    examples=(
        positive('''def attend(q, k, v):
    weights = (q @ k.transpose(-2, -1)).softmax(dim=-1)
    return weights @ v, weights
''', unsafe=True, fixed='''import torch.nn.functional as F
def attend(q, k, v):
    if k.shape[-2:-1] == v.shape[-2:-1]:
        return F.scaled_dot_product_attention(q, k, v, scale=1.0).contiguous(), None
    else:
        weights = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return weights @ v, weights
'''),
    ),
    references=("https://huggingface.co/docs/transformers/main/en/attention_interface",),
)

UNPROVED = Rule(
    code="ADV103", kind="attention", title="Hand-written attention that cannot be proved equal to SDPA",
    summary="attention-like code that cannot be proved equal (heads mixed, head mask, other softmax dim, "
            "multiplicative mask, unknown fill, intermediate reused)",
    fix="none", fix_safety="unsafe", fix_summary="none; the reason is reported",
    what="Finds code that looks like attention where one role could not be proved: heads mixed around the softmax, "
         "a head mask on the weights, softmax over another dimension, an unsupported mask or scale.",
    why="The same cost as ADV101, if it is attention.",
    fix_doc="No fix: the finding gives the reason so a person can decide, because a wrong rewrite would silently "
            "change results.",
    examples=(
        positive('''def attend(q, k, v):
    weights = (q @ k.transpose(-2, -1)).softmax(dim=-2)
    return weights @ v
''', reason="softmax"),
    ),
    references=("https://github.com/pytorch/pytorch/blob/main/torch/_inductor/fx_passes/fuse_attention.py",),
)

MEASURED = Rule(
    code="ADV110", kind="attention", title="Hand-written attention measured at run time",
    summary="attention measured at runtime", fix="none", fix_safety="unsafe", fix_summary="see ADV101",
    what="The profiler (or a trace) saw a matmul, scale/mask ops, softmax and a second matmul with V in the user's "
         "code.",
    why="The L x S score tensor is written and read several times per call; the measured time of the whole block is "
        "its cost.",
    fix_doc="The rewrite is the static rules' job (ADV101-ADV103 report the same file and lines).",
    example="scores = q @ k.transpose(-2, -1) * scale\nweights = scores.softmax(-1)\nout = weights @ v  # in forward",
    detectors=("runtime",), references=(SDPA_DOCS,), threshold_share=0.01,
    examples=(positive(_profiled(MANUAL), workload=True),
              negative(_profiled("return F.scaled_dot_product_attention(x, x, x)"), workload=True)),
)

MATH_FALLBACK = Rule(
    code="ADV401", kind="sdpa-fallback", title="scaled_dot_product_attention ran the math kernel",
    summary="SDPA ran the math kernel (with the reason)", fix="none", fix_safety="unsafe", fix_summary="report",
    what="A scaled_dot_product_attention call that ran the math implementation (separate matmul, softmax and "
         "dropout kernels).",
    why="SDPA silently falls back to its math implementation, with no memory saving, when no fused kernel accepts "
        "the arguments: dropout on the CPU flash kernel, an explicit mask or float32 on the CUDA flash kernel, a "
        "last-dim stride other than 1, 3-D inputs.",
    fix_doc="No automatic fix; the finding names the reason the fused kernels refused the call.",
    example="F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # float32 on CUDA: no flash kernel",
    detectors=("runtime",), references=(SDPA_DOCS,), threshold_share=0.01,
    examples=(positive(_profiled("return F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)"), workload=True),
              negative(_profiled("return F.scaled_dot_product_attention(x, x, x)"), workload=True)),
)

MASK_REBUILT = Rule(
    code="ADV501", kind="mask-rebuild", title="Attention mask rebuilt on every forward",
    summary="mask rebuilt every forward", fix="none", fix_safety="unsafe", fix_summary="report",
    what="A causal or padding mask built from ones/full/arange and tril/triu inside forward.",
    why="It allocates and fills an S x S tensor on every call (in every layer when the block builds it).",
    fix_doc="No automatic fix: build it once (register_buffer and slice it), or let SDPA apply causality with "
            "is_causal=True.",
    example="mask = torch.tril(torch.ones(T, T))  # in forward, every step",
    detectors=("runtime",),
    examples=(positive(_profiled("T = x.shape[-2]\nmask = torch.tril(torch.ones(T, T))\n"
                                 "w = (x @ x.mT).masked_fill(mask == 0, float('-inf')).softmax(-1)\nreturn w @ x"),
                       workload=True),
              negative(_profiled("return F.scaled_dot_product_attention(x, x, x, is_causal=True)"), workload=True)),
    references=("https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_buffer",),
    threshold_share=0.005,
)


def _detect(context, rules):
    from advisor.fixes.attention_fix import AttentionRules, attention_findings

    blocks = context.evidence.blocks if context.evidence is not None else []
    return attention_findings(context.parsed, context.backend, AttentionRules(SAFE, ESCAPING, UNPROVED), blocks,
                              context.tree, masks_passed=context.unsafe_fixes,
                              observed_masks=context.observed_masks)


def _graph(op_graph, device, rules):
    from advisor.runtime.detect import attention_graph, mask_rebuild_graph, sdpa_fallback_graph

    return (attention_graph.detect(op_graph, device, MEASURED)
            + sdpa_fallback_graph.detect(op_graph, device, MATH_FALLBACK)
            + mask_rebuild_graph.detect(op_graph, device, MASK_REBUILT))


def _trace(view, rules):
    from advisor.runtime.trace_attention import attention_hits, mask_rebuilt_hits, math_fallback_hits

    yield from attention_hits(view, MEASURED)
    yield from math_fallback_hits(view, MATH_FALLBACK)
    yield from mask_rebuilt_hits(view, MASK_REBUILT)


FAMILY = Family(
    name="attention", rules=(SAFE, ESCAPING, UNPROVED, MEASURED, MATH_FALLBACK, MASK_REBUILT),
    prefilter=("softmax",),  # every attention matcher anchors on a softmax
    # ... and runs only in a function that says softmax, or whose class does (anchors.mentions_softmax)
    screen=Screen(words=("softmax",)),
    static=_detect, graph=_graph, trace=_trace,
)
