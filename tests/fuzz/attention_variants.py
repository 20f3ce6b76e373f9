"""Hypothesis strategies that write hand-written attention modules as source text, the way public projects do.

A `Variant` is one choice per axis (Q·K^T product, K transpose, scale placement and spelling, mask kind,
polarity, fill and application, softmax spelling, dropout, value product, output layout, dtype) plus at most one
`hazard`: a neighbour of the supported forms that changes what a rewrite must prove (fully masked rows, non-bool
masks, tensor scales, loops, aliasing, dynamic dispatch, ...). `render(variant)` writes a small runnable module
whose `make(seed)` returns `(model, inputs)`; `FAMILIES` groups the hazards by the class of fault they probe
(a letter), so a test can expect one family to be clean and another to hold a known bug.

Shapes are tiny (batch 2, 2 heads of 4 channels, 5 queries, 5 or 7 keys) so that thousands of variants run in
minutes; left padding of 3 keys together with a causal mask fully masks some query rows, on purpose.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from hypothesis import strategies as st

BATCH, HEADS, HEAD_DIM, QUERIES, PAST, BUFFER = 2, 2, 4, 5, 2, 16
DIM = HEADS * HEAD_DIM
LEFT_PAD = 3  # keys 0..2 of batch row 1 are padding: with a causal mask, its first query rows see nothing

LAYOUTS = ("heads", "folded", "channel")  # (B,H,L,D) / (B*H,L,D) / channel-major (B,H,D,L)
PRODUCTS = {
    "heads": ("at", "matmul", "method", "einsum", "einsum_keyfirst", "einops"),
    "folded": ("at", "matmul", "bmm", "baddbmm", "einsum"),
    "channel": ("at", "einsum"),
}
K_TRANSPOSES = ("t_neg", "t_neg_rev", "t_pos", "permute", "mT", "pre")
SCALE_PLACES = ("scores_mul", "scores_div", "q_pre", "q_pre_inplace", "split", "none", "if_flag")
SCALE_SPELLINGS = ("pow", "sqrt", "size", "attr", "attr_or", "literal", "custom_attr", "local")
MASKS = ("none", "causal_buffer", "causal_bool_buffer", "causal_local", "causal_drop_local", "key_padding",
         "additive", "hf_extended")
APPLIES = ("masked_fill", "masked_fill_", "where_keep", "where_drop")
POLARITIES = ("eq0", "invert", "logical_not")
FILLS = ("-inf", "finfo_min", "neg_finfo_max", "-1e4", "-1e9")
SOFTMAXES = ("F", "method", "torch", "module", "dim_pos", "fp32_dtype", "float_upcast", "log_exp")
DROPOUTS = ("none", "module", "functional", "module_zero", "sequential")
VALUE_PRODUCTS = {
    "heads": ("at", "matmul", "einsum", "channel_major"),
    "folded": ("at", "bmm", "matmul"),
    "channel": ("at", "einsum"),
}
OUTPUTS = {
    "heads": ("transpose_reshape", "transpose_view", "permute_flatten", "rearrange"),
    "folded": ("view_transpose_reshape", "reshape_transpose_reshape"),
    "channel": ("reshape_transpose",),  # `.view` of the output: the view_after_rewrite family
}
NAMES = (("scores", "attn"), ("att", "att"), ("sim", "attn"), ("dots", "attn"), ("w", "w"), ("attn_weights", "probs"),
         ("x", "x"))


@dataclass(frozen=True)
class Variant:
    layout: str = "heads"
    kv: str = "self"  # "self": keys are the queries' tokens (S == L); "cache": past tokens first (S > L)
    product: str = "at"
    k_transpose: str = "t_neg"
    letters: str = "bhijd"  # einsum letters for batch, heads, query, key, channel
    spec_form: str = "plain"  # plain | concat | fstring: how an einsum spec string is spelled
    scale_place: str = "scores_mul"
    scale_spelling: str = "pow"
    mask: str = "none"
    mask_dtype: str = "bool"  # bool | int64 | float (keep masks); float dtype name for additive masks
    mask_rank: str = "full"  # full | key_vector | query_rows (additive: (B,1,1,S) / (S,) / (B,1,L,S))
    left_padding: bool = False
    apply: str = "masked_fill"
    polarity: str = "eq0"
    fill: str = "-inf"
    mask_guarded: bool = False  # mask applied under `if mask is not None:`
    causal_too: bool = False  # a causal mask on top of a padding mask (two masks)
    softmax: str = "F"
    dropout: str = "none"
    value_product: str = "at"
    output: str = "transpose_reshape"
    dtype: str = "float32"
    names: tuple[str, str] = ("scores", "attn")
    operand_cast: bool = False  # `q.float() @ k.float().mT` (`.double()` in float64), the weights cast back to v's
    helpers: str = "none"  # none | scores | value | both: the score or value product returned by a method of the class
    hazard: str = "none"

    @property
    def scores(self) -> str:
        return self.names[0]

    @property
    def weights(self) -> str:
        return self.names[1]


# --------------------------------------------------------------------------------------------------------------
# Rendering


class _Source:
    """Lines of the generated module's parts, filled in by the axis writers below."""

    def __init__(self) -> None:
        self.imports: list[str] = ["import math", "import torch", "import torch.nn as nn",
                                   "import torch.nn.functional as F"]
        self.init: list[str] = []
        self.params: list[str] = ["x"]
        self.body: list[str] = []
        self.methods: list[str] = []
        self.extra_classes: list[str] = []
        self.make_inputs: list[str] = []  # expressions, in forward's parameter order after x
        self.make_lines: list[str] = []
        self.model_class = "Attention"

    def use_einops(self) -> None:
        if "import einops" not in self.imports:
            self.imports.append("import einops")


def render(v: Variant) -> str:
    """The source text of a module computing attention as `v` says."""
    src = _Source()
    ndim = 3 if v.layout == "folded" else 4
    _write_projections(v, src)
    _write_scale_init(v, src)
    q, k = _write_prescale(v, src)
    _write_scores(v, src, q, k)
    _write_scale_on_scores(v, src)
    _write_mask(v, src, ndim)
    _write_softmax(v, src)
    _write_dropout(v, src)
    out = _write_value_product(v, src)
    _write_output(v, src, out)
    _apply_hazard(v, src)
    return _assemble(v, src)


def _assemble(v: Variant, src: _Source) -> str:
    lines = [f'"""Generated attention variant: {_describe(v)}"""', "", *src.imports, "", ""]
    lines += ["class Attention(nn.Module):",
              f"    def __init__(self, dim={DIM}, heads={HEADS}, qk_scale=None):",
              "        super().__init__()",
              "        self.heads = heads",
              "        self.head_dim = dim // heads",
              "        self.to_q = nn.Linear(dim, dim)",
              "        self.to_k = nn.Linear(dim, dim)",
              "        self.to_v = nn.Linear(dim, dim)",
              "        self.proj = nn.Linear(dim, dim)"]
    lines += ["        " + line for line in src.init]
    lines += ["", f"    def forward(self, {', '.join(src.params)}):"]
    lines += ["        " + line for line in src.body]
    for method in src.methods:
        lines += [""] + ["    " + line if line else "" for line in method.splitlines()]
    lines += ["", ""]
    for extra in src.extra_classes:
        lines += extra.splitlines() + ["", ""]
    dtype = f"torch.{v.dtype}"
    lines += ["def make(seed=0):",
              "    torch.manual_seed(seed)",
              f"    model = {src.model_class}().to({dtype})",
              f"    x = torch.randn({BATCH}, {QUERIES}, {DIM}, dtype={dtype})"]
    if v.kv == "cache":
        lines.append(f"    past = torch.randn({BATCH}, {PAST}, {DIM}, dtype={dtype})")
    lines += ["    " + line for line in src.make_lines]
    inputs = ["x"] + src.make_inputs
    lines += [f"    return model, ({', '.join(inputs)},)", ""]
    return "\n".join(lines)


def _describe(v: Variant) -> str:
    defaults = Variant()
    changed = [f"{f.name}={getattr(v, f.name)!r}" for f in dataclasses.fields(v)
               if getattr(v, f.name) != getattr(defaults, f.name)]
    return "Variant(" + ", ".join(changed) + ")"


def _write_projections(v: Variant, src: _Source) -> None:
    body = src.body
    body.append("B, L, C = x.shape")
    if v.kv == "cache":
        src.params.append("past")
        src.make_inputs.append("past")
        body.append("kv_in = torch.cat([past, x], dim=1)")
    else:
        body.append("kv_in = x")
    body += ["S = kv_in.shape[1]", "H = self.heads", "D = C // H",
             "q, k, v = self.to_q(x), self.to_k(kv_in), self.to_v(kv_in)"]
    if v.layout == "heads":
        if v.output == "rearrange":
            src.use_einops()
            body += ["q = einops.rearrange(q, 'b n (h d) -> b h n d', h=H)",
                     "k = einops.rearrange(k, 'b n (h d) -> b h n d', h=H)",
                     "v = einops.rearrange(v, 'b n (h d) -> b h n d', h=H)"]
        else:
            body += ["q = q.view(B, L, H, D).transpose(1, 2)",
                     "k = k.view(B, S, H, D).transpose(1, 2)",
                     "v = v.view(B, S, H, D).transpose(1, 2)"]
    elif v.layout == "folded":
        body += ["q = q.view(B, L, H, D).transpose(1, 2).reshape(B * H, L, D)",
                 "k = k.view(B, S, H, D).transpose(1, 2).reshape(B * H, S, D)",
                 "v = v.view(B, S, H, D).transpose(1, 2).reshape(B * H, S, D)"]
    else:  # channel-major, as in conv attention blocks: (B, H, D, L)
        body += ["q = q.transpose(1, 2).reshape(B, H, D, L)",
                 "k = k.transpose(1, 2).reshape(B, H, D, S)",
                 "v = v.transpose(1, 2).reshape(B, H, D, S)"]


# Scale ---------------------------------------------------------------------------------------------------------

def _scale_value_expr(v: Variant, power: str) -> str:
    """An expression for D**power (power '-0.5' or '-0.25') in the variant's spelling."""
    s = v.scale_spelling
    quarter = power == "-0.25"
    if s == "pow":
        return f"D ** {power}"
    if s == "sqrt":
        return "1.0 / math.sqrt(math.sqrt(D))" if quarter else "1.0 / math.sqrt(D)"
    if s == "size":
        dim = "-2" if v.layout == "channel" else "-1"
        return f"q.size({dim}) ** {power}" if not quarter else f"q.shape[{dim}] ** -0.25"
    if s == "literal":
        return "0.7071067811865476" if quarter else "0.5"  # D = 4
    if s in ("attr", "attr_or"):
        return "self.scale_q" if quarter else "self.scale"
    if s == "local":
        return "scale ** 0.5" if quarter else "scale"
    return "self.scale"  # custom_attr: a scale that is not 1/sqrt(D)


def _write_scale_init(v: Variant, src: _Source) -> None:
    if v.scale_spelling == "attr":
        src.init.append("self.scale = self.head_dim ** -0.5")
        src.init.append("self.scale_q = self.head_dim ** -0.25")
    elif v.scale_spelling == "attr_or":
        src.init.append("self.scale = qk_scale or self.head_dim ** -0.5")
        src.init.append("self.scale_q = self.scale ** 0.5")
    elif v.scale_spelling == "custom_attr":
        src.init.append("self.scale = 0.3")
        src.init.append("self.scale_q = 0.3 ** 0.5")
    if v.scale_place == "if_flag":
        src.init.append("self.scaled = True")


def _write_prescale(v: Variant, src: _Source) -> tuple[str, str]:
    if v.scale_spelling == "local":
        src.body.append("scale = 1.0 / math.sqrt(D)")
    if v.scale_place == "q_pre":
        src.body.append(f"q = q * {_scale_value_expr(v, '-0.5')}")
    elif v.scale_place == "q_pre_inplace":
        src.body.append(f"q *= {_scale_value_expr(v, '-0.5')}")
    elif v.scale_place == "split":
        factor = _scale_value_expr(v, "-0.25")
        src.body += [f"q = q * {factor}", f"k = k * {factor}"]
    return "q", "k"


def _write_scale_on_scores(v: Variant, src: _Source) -> None:
    s = v.scores
    if v.product == "baddbmm" or v.scale_place in ("q_pre", "q_pre_inplace", "split", "none"):
        return
    if v.scale_place == "scores_div":
        divisor = {"pow": "D ** 0.5", "sqrt": "math.sqrt(D)", "size": "math.sqrt(q.size(-1))", "literal": "2.0",
                   "attr": "(1.0 / self.scale)", "attr_or": "(1.0 / self.scale)",
                   "custom_attr": "(1.0 / self.scale)", "local": "(1.0 / scale)"}[v.scale_spelling]
        if v.layout == "channel" and v.scale_spelling == "size":
            divisor = "math.sqrt(q.size(-2))"
        src.body.append(f"{s} = {s} / {divisor}")
    elif v.scale_place == "if_flag":
        src.body += ["if self.scaled:", f"    {s} = {s} * {_scale_value_expr(v, '-0.5')}"]
    else:
        src.body.append(f"{s} = {s} * {_scale_value_expr(v, '-0.5')}")


# Q.K^T ---------------------------------------------------------------------------------------------------------

def _spec(v: Variant, lhs: str, rhs: str, out: str) -> str:
    if v.spec_form == "concat":
        return f'"{lhs}," "{rhs}->{out}"'
    if v.spec_form == "fstring":
        return 'f"{batch}' + lhs[1:] + ',{batch}' + rhs[1:] + '->{batch}' + out[1:] + '"'
    return f'"{lhs},{rhs}->{out}"'


def _k_transposed(v: Variant, src: _Source, k: str) -> str:
    t, three = v.k_transpose, v.layout == "folded"
    if t == "pre":
        src.body.append(f"k_t = {k}.transpose(-2, -1)")
        return "k_t"
    return {"t_neg": f"{k}.transpose(-2, -1)", "t_neg_rev": f"{k}.transpose(-1, -2)",
            "t_pos": f"{k}.transpose(1, 2)" if three else f"{k}.transpose(2, 3)",
            "permute": f"{k}.permute(0, 2, 1)" if three else f"{k}.permute(0, 1, 3, 2)",
            "mT": f"{k}.mT"}[t]


def _write_scores(v: Variant, src: _Source, q: str, k: str) -> None:
    s, p = v.scores, v.product
    b, h, i, j, d = v.letters
    if v.operand_cast:
        cast = "double" if v.dtype == "float64" else "float"
        q, k = f"{q}.{cast}()", f"{k}.{cast}()"
    if v.spec_form == "fstring":
        src.body.append(f'batch = "{b}"')
    if v.layout == "channel":
        if p == "einsum":
            expr = f"torch.einsum({_spec(v, b + h + d + i, b + h + d + j, b + h + i + j)}, {q}, {k})"
        else:
            expr = f"{q}.transpose(-2, -1) @ {k}"
    elif p == "einsum":
        lead = b + h if v.layout == "heads" else b
        expr = f"torch.einsum({_spec(v, lead + i + d, lead + j + d, lead + i + j)}, {q}, {k})"
    elif p == "einsum_keyfirst":
        expr = f"torch.einsum({_spec(v, b + h + j + d, b + h + i + d, b + h + i + j)}, {k}, {q})"
    elif p == "einops":
        src.use_einops()
        expr = f'einops.einsum({q}, {k}, "{b} {h} {i} {d}, {b} {h} {j} {d} -> {b} {h} {i} {j}")'
    elif p == "baddbmm":
        kt = _k_transposed(v, src, k)
        alpha = _scale_value_expr(v, "-0.5") if v.scale_place not in ("none", "q_pre", "q_pre_inplace", "split") \
            else "1.0"
        expr = (f"torch.baddbmm(torch.empty({q}.shape[0], {q}.shape[1], {k}.shape[1], dtype={q}.dtype, "
                f"device={q}.device), {q}, {kt}, beta=0, alpha={alpha})")
    else:
        kt = _k_transposed(v, src, k)
        expr = {"at": f"{q} @ {kt}", "matmul": f"torch.matmul({q}, {kt})", "method": f"{q}.matmul({kt})",
                "bmm": f"torch.bmm({q}, {kt})"}[p]
    src.body.append(f"{s} = {_in_helper(src, expr, '_attn_scores', ('q', 'k', 'k_t', 'batch'))}"
                    if v.helpers in ("scores", "both") else f"{s} = {expr}")


def _in_helper(src: _Source, expr: str, name: str, candidates: tuple[str, ...]) -> str:
    """`expr` returned by a method `name` of the class that takes the locals it reads; the call that replaces it."""
    params = [n for n in candidates if re.search(rf"(?<![.\w]){n}(?!\w)", expr)]
    src.methods.append(f"def {name}(self, {', '.join(params)}):\n    return {expr}")
    return f"self.{name}({', '.join(params)})"


# Masks ---------------------------------------------------------------------------------------------------------

def _fill_expr(v: Variant) -> str:
    s = v.scores
    return {"-inf": 'float("-inf")', "finfo_min": f"torch.finfo({s}.dtype).min",
            "neg_finfo_max": f"-torch.finfo({s}.dtype).max", "-1e4": "-1e4", "-1e9": "-1e9",
            "finfo16_min": "torch.finfo(torch.float16).min", "int_bias": "-10000.0"}[v.fill]


def _drop_from_keep(v: Variant, keep: str) -> str:
    keep = f"({keep})" if " " in keep else keep
    if v.polarity == "eq0":
        return f"{keep} == 0"
    if v.polarity == "invert":
        return f"~{keep}"
    return f"{keep}.logical_not()"


def _apply_bool(v: Variant, src: _Source, keep: str | None, drop: str | None) -> None:
    """Apply a boolean mask given as keep (True = attend) or drop (True = masked) expression."""
    s, fill = v.scores, _fill_expr(v)
    if keep is None:
        keep = f"~({drop})" if v.polarity != "logical_not" else f"({drop}).logical_not()"
    if drop is None:
        drop = _drop_from_keep(v, keep)
    lines = {"masked_fill": [f"{s} = {s}.masked_fill({drop}, {fill})"],
             "masked_fill_": [f"{s}.masked_fill_({drop}, {fill})"],
             "where_keep": [f"{s} = torch.where({keep}, {s}, {fill})"],
             "where_drop": [f"{s} = torch.where({drop}, {fill}, {s})"]}[v.apply]
    src.body += lines


def _key_mask_view(v: Variant, name: str, ndim: int) -> str:
    """The (B, S) key mask reshaped to broadcast over the scores."""
    if ndim == 3:
        return f"{name}.repeat_interleave(H, dim=0)[:, None, :]"
    return f"{name}[:, None, None, :]"


def _make_key_mask(v: Variant, src: _Source, dtype: str) -> None:
    pad = LEFT_PAD if v.left_padding else 0
    keys = QUERIES + (PAST if v.kv == "cache" else 0)
    src.make_lines.append(f"key_keep = torch.ones({BATCH}, {keys}, dtype=torch.{dtype})")
    if pad:
        src.make_lines.append(f"key_keep[1, :{pad}] = 0")
    else:
        src.make_lines.append("key_keep[1, -2:] = 0")


def _causal_slice(v: Variant, ndim: int) -> str:
    rows = "S - L:S, :S" if v.kv == "cache" else ":L, :L"
    return f"[:, :, {rows}]" if ndim == 4 else f"[{rows}]"


def _write_causal(v: Variant, src: _Source, ndim: int, kind: str) -> None:
    if kind == "causal_buffer":
        view = f".view(1, 1, {BUFFER}, {BUFFER})" if ndim == 4 else ""
        src.init.append(f'self.register_buffer("bias", torch.tril(torch.ones({BUFFER}, {BUFFER})){view})')
        m = f"self.bias{_causal_slice(v, ndim)}"
        keep = f"{m} == 1" if v.polarity == "invert" else None
        drop = None if keep else f"{m} == 0"
        _apply_bool(v, src, keep, drop)
    elif kind == "causal_bool_buffer":
        src.init.append(f'self.register_buffer("causal", torch.ones({BUFFER}, {BUFFER}, dtype=torch.bool).tril(),'
                        ' persistent=False)')
        _apply_bool(v, src, f"self.causal{_causal_slice(v, 2)}", None)
    elif kind == "causal_local":
        src.body.append("keep = torch.ones(L, S, dtype=torch.bool, device=x.device).tril(diagonal=S - L)")
        _apply_bool(v, src, "keep", None)
    else:  # causal_drop_local
        src.body.append("future = torch.triu(torch.ones(L, S, device=x.device, dtype=torch.bool), "
                        "diagonal=S - L + 1)")
        _apply_bool(v, src, None, "future")


def _write_mask(v: Variant, src: _Source, ndim: int) -> None:
    m = v.mask
    if m == "none":
        return
    if m.startswith("causal"):
        _write_causal(v, src, ndim, m)
        return
    if m == "key_padding":
        src.params.append("key_keep")
        src.make_inputs.append("key_keep")
        _make_key_mask(v, src, v.mask_dtype)
        if v.causal_too:
            _write_causal(v, src, ndim, "causal_local")
        if v.mask_rank == "query_rows":
            src.make_lines += [f"query_keep = torch.ones({BATCH}, {QUERIES}, dtype=torch.bool)",
                               "query_keep[0, :2] = False"]
            src.params.append("query_keep")
            src.make_inputs.append("query_keep")
            qk = "query_keep[:, None, :, None]" if ndim == 4 else "query_keep.repeat_interleave(H, dim=0)[:, :, None]"
            src.body.append(f"pad_keep = {_key_mask_view(v, 'key_keep', ndim)}.bool() & {qk}")
            keep = "pad_keep"
        elif v.mask_rank == "key_vector":
            keep = "key_keep[0]"
        else:
            keep = _key_mask_view(v, "key_keep", ndim)
        if v.mask_dtype != "bool" and v.apply == "where_keep":
            keep = f"{keep}.bool()"
        if v.mask_guarded:
            src.params = [p if p not in ("key_keep", "query_keep") else p + "=None" for p in src.params]
            before = len(src.body)
            _apply_bool(v, src, keep, None)
            src.body[before:] = ["if key_keep is not None:"] + ["    " + line for line in src.body[before:]]
        else:
            _apply_bool(v, src, keep, None)
        return
    if m == "additive":
        src.params.append("mask")
        src.make_inputs.append("mask")
        shape = {"full": f"{BATCH}, 1, 1, S_", "key_vector": "S_", "query_rows": f"{BATCH}, 1, {QUERIES}, S_"}[
            v.mask_rank]
        keys = QUERIES + (PAST if v.kv == "cache" else 0)
        shape = shape.replace("S_", str(keys))
        if ndim == 3 and v.mask_rank != "key_vector":
            shape = {"full": f"{BATCH * HEADS}, 1, {keys}", "query_rows": f"{BATCH * HEADS}, {QUERIES}, {keys}"}[
                v.mask_rank]
        fill = {"-inf": 'float("-inf")', "finfo_min": f"torch.finfo(torch.{v.dtype}).min", "-1e4": "-1e4",
                "-1e9": "-1e9", "neg_finfo_max": f"-torch.finfo(torch.{v.dtype}).max",
                "finfo16_min": "torch.finfo(torch.float16).min"}[v.fill]
        mdtype = v.mask_dtype if v.mask_dtype not in ("bool", "float") else v.dtype
        if mdtype in ("bool", "int64"):
            src.make_lines.append(f"mask = torch.rand({shape}) > 0.3")
            src.make_lines += ["mask[..., 0] = True", f"mask = mask.to(torch.{mdtype})"]
        else:
            src.make_lines += [f"mask = torch.zeros({shape}, dtype=torch.{v.dtype})",
                               f"mask = mask.masked_fill(torch.rand({shape}) < 0.3, {fill})",
                               "mask[..., 0] = 0.0", f"mask = mask.to(torch.{mdtype})"]
        if v.causal_too:
            _write_causal(v, src, ndim, "causal_local")
        line = f"{v.scores} += mask" if v.apply == "masked_fill_" else f"{v.scores} = {v.scores} + mask"
        if v.mask_guarded:
            src.params[-1] += "=None"
            src.body += ["if mask is not None:", "    " + line]
        else:
            src.body.append(line)
        return
    # hf_extended: an int/bool tokenizer mask turned into an additive bias in forward
    src.params.append("attention_mask")
    src.make_inputs.append("key_keep")
    _make_key_mask(v, src, v.mask_dtype)
    if v.causal_too:
        _write_causal(v, src, ndim, "causal_local")
    view = _key_mask_view(v, "attention_mask", ndim)
    if v.fill == "int_bias":  # an integer bias: eager promotion adds it, SDPA takes no int mask
        src.body.append(f"bias = (1 - {view}) * -10000")
    else:
        src.body.append(f"bias = (1.0 - {view}.to({v.scores}.dtype)) * {_fill_expr(v)}")
    src.body.append(f"{v.scores} = {v.scores} + bias")


# Softmax, dropout ---------------------------------------------------------------------------------------------

def _write_softmax(v: Variant, src: _Source) -> None:
    s, w = v.scores, v.weights
    last = "2" if v.layout == "folded" else "3"
    expr = {"F": f"F.softmax({s}, dim=-1)", "method": f"{s}.softmax(dim=-1)", "torch": f"torch.softmax({s}, -1)",
            "module": f"self.softmax({s})", "dim_pos": f"F.softmax({s}, dim={last})",
            "fp32_dtype": f"F.softmax({s}, dim=-1, dtype=torch.float32).to(q.dtype)",
            "float_upcast": f"{s}.float().softmax(dim=-1).type_as({s})",
            "log_exp": f"{s}.log_softmax(dim=-1).exp()", "wrong_dim": f"F.softmax({s}, dim=-2)"}[v.softmax]
    if v.softmax == "module":
        src.init.append("self.softmax = nn.Softmax(dim=-1)")
    src.body.append(f"{w} = {expr}")
    if v.operand_cast:
        src.body.append(f"{w} = {w}.to(v.dtype)")


def _write_dropout(v: Variant, src: _Source) -> None:
    w, d = v.weights, v.dropout
    if d == "none":
        return
    if d in ("module", "module_zero"):
        src.init.append(f"self.attn_drop = nn.Dropout({'0.0' if d == 'module_zero' else '0.1'})")
        src.body.append(f"{w} = self.attn_drop({w})")
    elif d == "functional":
        src.init.append("self.drop_p = 0.1")
        src.body.append(f"{w} = F.dropout({w}, p=self.drop_p, training=self.training)")
    else:  # sequential: softmax module and dropout in one nn.Sequential
        src.init.append("self.attend = nn.Sequential(nn.Identity(), nn.Dropout(0.1))")
        src.body.append(f"{w} = self.attend({w})")


# Value product, output -----------------------------------------------------------------------------------------

def _write_value_product(v: Variant, src: _Source) -> str:
    w, p = v.weights, v.value_product
    b, h, i, j, d = v.letters
    if v.layout == "channel":
        expr = (f"torch.einsum({_spec(v, b + h + i + j, b + h + d + j, b + h + d + i)}, {w}, v)" if p == "einsum"
                else f"v @ {w}.transpose(-2, -1)")
    elif p == "einsum":
        expr = f"torch.einsum({_spec(v, b + h + i + j, b + h + j + d, b + h + i + d)}, {w}, v)"
    elif p == "channel_major":
        expr = f"(v.transpose(-2, -1) @ {w}.transpose(-2, -1)).transpose(-2, -1)"
    else:
        expr = {"at": f"{w} @ v", "matmul": f"torch.matmul({w}, v)", "bmm": f"torch.bmm({w}, v)"}[p]
    if v.helpers in ("value", "both"):
        expr = _in_helper(src, expr, "_attn_mix", (w, "v", "batch"))
    src.body.append(f"out = {expr}")
    return "out"


def _write_output(v: Variant, src: _Source, out: str) -> None:
    o = v.output
    line = {"transpose_reshape": f"{out} = {out}.transpose(1, 2).reshape(B, L, C)",
            "transpose_view": f"{out} = {out}.transpose(1, 2).contiguous().view(B, L, C)",
            "permute_flatten": f"{out} = {out}.permute(0, 2, 1, 3).flatten(2)",
            "rearrange": f"{out} = einops.rearrange({out}, 'b h n d -> b n (h d)')",
            "view_transpose_reshape": f"{out} = {out}.view(B, H, L, D).transpose(1, 2).reshape(B, L, C)",
            "reshape_transpose_reshape": f"{out} = {out}.reshape(B, H, L, D).transpose(1, 2).reshape(B, L, C)",
            "reshape_transpose": f"{out} = {out}.reshape(B, C, L).transpose(1, 2)",
            "view_transpose": f"{out} = {out}.view(B, C, L).transpose(1, 2)"}[o]
    src.body += [line, f"return self.proj({out})"]


# Hazards -------------------------------------------------------------------------------------------------------

def _index_of(body: list[str], prefix: str) -> int:
    for index, line in enumerate(body):
        if line.startswith(prefix):
            return index
    raise ValueError(prefix)


def _apply_hazard(v: Variant, src: _Source) -> None:
    h, body, s, w = v.hazard, src.body, v.scores, v.weights
    if h == "none":
        return
    value_at = _index_of(body, "out = ")
    if h == "return_weights":
        body[-1] = f"return self.proj(out), {w}"
    elif h == "store_weights":
        body.insert(value_at + 1, f"self.last_attn = {w}")
    elif h == "entropy_loss":
        body.insert(value_at + 1, f"self.entropy = -({w} * ({w} + 1e-9).log()).sum(-1).mean()")
    elif h == "write_q_after_scores":
        body.insert(_softmax_at(body) , "q = q.clone()")
        body.insert(_softmax_at(body), "q.mul_(2.0)")
    elif h == "write_v_between":
        body.insert(value_at, "v = v.clone()")
        body.insert(value_at + 1, "v[..., 0] = 0.0")
    elif h == "del_key":
        body.insert(_softmax_at(body), "del k")
    elif h == "no_grad_scores":
        at = _index_of(body, f"{s} = ")
        body[at] = "with torch.no_grad():\n            " + body[at]
    elif h == "store_key":
        body.insert(value_at, "self.mem_k = k")
    elif h == "write_causal_init":  # prefix-LM: the first keys are visible to every query
        at = _index_of(src.init, 'self.register_buffer("bias"')
        src.init.insert(at + 1, "self.bias[..., :2] = 1")
    elif h == "write_causal_local":
        at = _index_of(body, "keep = torch.ones(L, S")
        body.insert(at + 1, "keep[:, :2] = True")
    elif h == "else_scale":
        src.init.append("self.unscaled = False")
        at = _softmax_at(body)
        body[at:at] = ["if self.unscaled:", "    pass", "else:", f"    {s} = {s} * 0.5"]
    elif h in ("param_scale", "buffer_scale", "temperature", "logit_scale"):
        init = {"param_scale": "self.temp = nn.Parameter(torch.tensor(0.5))",
                "buffer_scale": 'self.register_buffer("temp", torch.tensor(0.5))',
                "temperature": "self.temp = nn.Parameter(torch.full((self.heads, 1, 1), 0.5))",
                "logit_scale": "self.logit_scale = nn.Parameter(torch.tensor(math.log(2.0)))"}[h]
        src.init.append(init)
        factor = "self.logit_scale.exp()" if h == "logit_scale" else "self.temp"
        body.insert(_softmax_at(body), f"{s} = {s} * {factor}")
    elif h in TENSOR_SCALE_FOLDS:
        _write_tensor_scale_fold(v, src)
    elif h == "local_param_scale":
        src.init.append("self.scale_param = nn.Parameter(torch.tensor(0.5))")
        body.insert(0, "scale = self.scale_param")
        body.insert(_softmax_at(body), f"{s} = {s} * scale")
    elif h == "scale_argument":
        src.params.append("scale=1.0")
        src.make_inputs.append("torch.tensor(0.5)")
        body.insert(_softmax_at(body), f"{s} = {s} * scale")
    elif h == "residual_loop":  # RealFormer-style: the previous iteration's weights join the scores
        first = _index_of(body, f"{s} = ")
        block = body[first:value_at + 1]
        del body[first:value_at + 1]
        looped = ["prev = None", "for _ in range(2):"] + ["    " + line for line in block]
        looped.insert(2 + _softmax_at(block), "    if prev is not None:")
        looped.insert(3 + _softmax_at(block), f"        {s} = {s} + prev")
        looped.append(f"    prev = {w}")
        looped.append("    v = v + out")
        body[first:first] = looped
    elif h == "weights_before_loop":
        at = value_at
        term = f"(v * (step + 1)) @ {w}.transpose(-2, -1)" if v.layout == "channel" else f"{w} @ (v * (step + 1))"
        body[at:at + 1] = ["acc = 0", "for step in range(2):", f"    acc = acc + {term}",
                           "    v = v + 1.0", "out = acc"]
    elif h == "shared_dropout_weights":
        again = f"(v * 2.0) @ {w}.transpose(-2, -1)" if v.layout == "channel" else f"{w} @ (v * 2.0)"
        body[value_at:value_at + 1] = [body[value_at], f"out = out + {again}"]
    elif h == "out_buffer":
        body[value_at] = ("out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=v.dtype); "
                          f"torch.bmm({w}, v, out=out)")
    elif h == "static_helper":
        at = _index_of(body, f"{s} = ")
        body[at] = f"{s} = self.similarity(q, k)"
        src.methods.append(f"@staticmethod\ndef similarity(q, k):\n    return {_plain_product(v)}")
    elif h == "subclass_override":
        at = _index_of(body, f"{s} = ")
        body[at] = f"{s} = self.similarity(q, k)"
        src.methods.append(f"def similarity(self, q, k):\n    return {_plain_product(v)}")
        src.extra_classes.append("class BiasedAttention(Attention):\n"
                                 "    def similarity(self, q, k):\n"
                                 "        return super().similarity(q, k) + 0.25 * torch.tanh(super().similarity(q, k))")
        src.model_class = "BiasedAttention"
    elif h == "hook_point":
        src.init.append("self.attn_hook = nn.Identity()")
        body.insert(value_at, f"{w} = self.attn_hook({w})")
        src.make_lines.append("model.attn_hook.register_forward_hook(lambda mod, args, out: out * 0.5)")
    elif h == "two_blocks":
        first = _index_of(body, f"{s} = ")
        block = body[first:value_at + 1]
        body[value_at + 1:value_at + 1] = ["out1 = out"] + block + ["out = out + out1"]
    elif h == "chained_assign":
        at = _index_of(body, f"{s} = ")
        body[at] = body[at].replace(f"{s} = ", f"{s} = logits = ", 1)
        body.insert(_index_of(body, "return "), "out = out + logits.mean() * 0.0")
    elif h == "mixed_dtype_scores":
        at = _index_of(body, "k_t = " if any(line.startswith("k_t = ") for line in body) else f"{s} = ")
        body.insert(at, "q, k = q.float(), k.float()")
        body.insert(_softmax_at(body) + 1, f"{w} = {w}.to(v.dtype)")
    elif h == "mixed_dtype_value":
        body[value_at] = body[value_at].replace(f"{w}", f"{w}.float()", 1).replace(" v", " v.float()") \
            .replace("(v", "(v.float()").replace(", v)", ", v.float())")
        body.insert(value_at + 1, "out = out.to(x.dtype)")
    elif h in SWAPS:  # a helper applied to every module replaces dropout (and softmax) modules by computed names
        bind = SWAPS[h]
        softmax = "" if h == "strip_dropout" else ("\n        elif isinstance(child, nn.Softmax):\n"
                                                  f"            {bind.format(new='nn.Softmax(dim=-2)')}")
        src.extra_classes.append("def swap_modules(module):\n"
                                 "    for name, child in list(module.named_children()):\n"
                                 "        if isinstance(child, nn.Dropout):\n"
                                 f"            {bind.format(new='nn.Identity()')}" + softmax)
        src.make_lines += ["model.eval()", "model.apply(swap_modules)"]  # the new Identity is in training mode
    elif h in BUFFER_WRITES:  # the causal buffer becomes a band after the constructor
        view = f".view(1, 1, {BUFFER}, {BUFFER})" if "view(1, 1" in "".join(src.init) else ""
        band = f"(torch.tril(torch.ones({BUFFER}, {BUFFER})) - torch.tril(torch.ones({BUFFER}, {BUFFER}), " \
               f"diagonal=-3)){view}"
        write = BUFFER_WRITES[h].format(band=band)
        if h == "buffer_data_make":
            src.make_lines.append(write)
        else:
            src.methods.append(f"def set_window(self, name=\"bias\"):\n    {write}")
            src.make_lines.append("model.set_window()")
    elif h in GLOBAL_HOOKS:  # a hook on every module, registered by make()
        imported, register = GLOBAL_HOOKS[h]
        if imported:
            src.imports.append(imported)
        src.make_lines.append(register)
    elif h in ("global_weights", "global_weights_copy"):  # weights kept in a global that another function reads
        src.extra_classes.append("LAST = None\n\n\ndef attention_map():\n    return LAST")
        body.insert(0, "global LAST")
        if h == "global_weights":  # the weights' own name is the global one, from the softmax to the product
            value_at = _index_of(body, "out = ")
            at = _softmax_at(body)
            body[at] = body[at].replace(f"{w} = ", "LAST = ", 1)
            body[at + 1:value_at + 1] = [re.sub(rf"\b{w}\b", "LAST", line) for line in body[at + 1:value_at + 1]]
        else:
            body.insert(_index_of(body, "out = ") + 1, f"LAST = {w}")
        body[-1] = body[-1] + ", attention_map()"
    elif h == "make_writes_causal":  # the same writes, from outside the class (the file's make())
        src.make_lines.append("model.bias[..., :2] = 1")
    elif h == "make_replaces_softmax":
        src.make_lines.append("model.softmax = nn.Softmax(dim=-2)")
    elif h == "make_sets_tensor_scale":
        src.make_lines.append("model.scale = torch.tensor(0.3, requires_grad=True)")
    elif h in HIGHER_ORDER:
        _write_higher_order(h, src)
    else:
        raise ValueError(f"unknown hazard {h}")


# Code around the module that differentiates it twice or in forward mode: `higher_order(model, inputs)` returns what
# it computes, so the differential check runs it on the original and on the patch (tests/fuzz/differential.py).
HIGHER_ORDER = {
    "gradient_penalty": ("import torch.autograd",
                         "(g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)\n"
                         "return torch.autograd.grad(g.pow(2).sum(), x)[0]"),
    "double_backward_positional": ("from torch.autograd import grad as g",
                                   "(first,) = g(f(x).pow(2).sum(), x, None, True, True)\n"
                                   "first.sum().backward()\nreturn x.grad"),
    "forward_ad": ("import torch.autograd.forward_ad as fwAD",
                   "with fwAD.dual_level():\n"
                   "    return fwAD.unpack_dual(f(fwAD.make_dual(x.detach(), torch.ones_like(x)))).tangent"),
    "func_jvp": ("from torch.func import jvp", "return jvp(f, (x.detach(),), (torch.ones_like(x),))[1]"),
    "func_hessian": ("import torch.func", "return torch.func.hessian(lambda x: f(x).pow(2).sum())(x.detach())"),
    "nested_grad": ("from torch.func import grad", "return grad(lambda x: grad(lambda x: f(x).pow(2).sum())(x).sum())"
                                                   "(x.detach())"),
    "functional_hvp": ("import torch.autograd.functional as AF",
                       "return AF.hvp(lambda x: f(x).pow(2).sum(), x.detach(), torch.ones_like(x))[1]"),
}


def _write_higher_order(h: str, src: _Source) -> None:
    imports, body = HIGHER_ORDER[h]
    src.imports.append(imports)
    src.extra_classes.append(
        "def higher_order(model, inputs):\n"
        "    x, rest = inputs[0].detach().clone().requires_grad_(True), inputs[1:]\n\n"
        "    def f(x):\n"
        "        out = model(x, *rest)\n"
        "        return out[0] if isinstance(out, tuple) else out\n\n"
        + "\n".join("    " + line for line in body.splitlines()))


SWAPS = {"swap_setattr": "setattr(module, name, {new})", "swap_modules_dict": "module._modules[name] = {new}",
         "swap_add_module": "module.add_module(name, {new})",
         "strip_dropout": "setattr(module, name, {new})"}  # dropout only, to nn.Identity (an export helper)
BUFFER_WRITES = {"buffer_data_method": "self.bias.data = {band}", "buffer_copy_method": "self.bias.data.copy_({band})",
                 "buffer_setattr_method": "setattr(self, name, {band})",
                 "buffer_register_method": "self.register_buffer(name, {band})",
                 "buffer_data_make": "model.bias.data = {band}"}
_HALVED = "isinstance(m, (nn.Dropout, nn.Softmax))"
GLOBAL_HOOKS = {
    "global_forward_hook": ("", "torch.nn.modules.module.register_module_forward_hook("
                                f"lambda m, args, out: out * 0.5 if {_HALVED} else out)"),
    "global_pre_hook": ("from torch.nn.modules.module import register_module_forward_pre_hook as before_every_module",
                        f"before_every_module(lambda m, args: (args[0] * 0.5,) if {_HALVED} else None)"),
    "global_backward_hook": ("import torch.nn.modules.module as module_hooks",
                             "module_hooks.register_module_full_backward_hook(lambda m, gin, gout: "
                             f"tuple(None if g is None else g * 0.5 for g in gin) if {_HALVED} else None)"),
}


# tensor scales SDPA gets folded into q. name -> (what __init__ adds, the factor, how it is applied);
# "arg:" factors are forward arguments whose value make() passes. Shapes of size 1 in the key axis fold; a pairwise
# (L, S) factor is a multiplicative mask (refused, or the guard runs the original); one after a mask is refused.
TENSOR_SCALE_FOLDS = {
    "fold_heads": ("self.temp = nn.Parameter(torch.rand(self.heads, 1, 1) + 0.5)", "self.temp", "mul"),
    "fold_heads_4d": ("self.temp = nn.Parameter(torch.full((1, self.heads, 1, 1), 0.7))", "self.temp", "mul"),
    "fold_vector_index": ("self.temp = nn.Parameter(torch.rand(self.heads) + 0.5)", "self.temp[:, None, None]",
                          "mul"),
    "fold_vector_view": ("self.temp = nn.Parameter(torch.rand(self.heads) + 0.5)", "self.temp.view(-1, 1, 1)",
                         "mul"),
    "fold_cosine": ("self.logit_scale = nn.Parameter(torch.log(3 * torch.ones((self.heads, 1, 1))))",
                    "torch.clamp(self.logit_scale, max=math.log(100.0)).exp()", "mul"),
    "fold_buffer_0d": ('self.register_buffer("temp", torch.tensor(0.7))', "self.temp", "mul"),
    "fold_row_norm": ("", "q.norm(dim=-1, keepdim=True)", "mul"),
    "fold_div": ("self.temp = nn.Parameter(torch.rand(self.heads, 1, 1) + 0.5)", "self.temp", "div"),
    "fold_inplace": ("self.temp = nn.Parameter(torch.rand(self.heads, 1, 1) + 0.5)", "self.temp", "inplace"),
    "fold_flag": ("self.temp = nn.Parameter(torch.rand(self.heads, 1, 1) + 0.5)", "self.temp", "flag"),
    "fold_local": ("self.temp = nn.Parameter(torch.rand(self.heads, 1, 1) + 0.5)", "temp", "local"),
    "fold_arg_heads": ("", f"arg:torch.rand({HEADS}, 1, 1) + 0.5", "mul"),
    "fold_arg_0d": ("", "arg:torch.tensor(0.7, dtype=torch.float64)", "mul"),
    "fold_arg_number": ("", "arg:0.7", "mul"),
    "fold_arg_pairwise": ("", "arg:pairwise", "mul"),
    "fold_param_pairwise": ("pairwise", "self.temp", "mul"),
    "fold_after_mask": ("self.temp = nn.Parameter(torch.rand(self.heads, 1, 1) + 0.5)", "self.temp", "late"),
}


def _write_tensor_scale_fold(v: Variant, src: _Source) -> None:
    init, factor, how = TENSOR_SCALE_FOLDS[v.hazard]
    s, body = v.scores, src.body
    keys = QUERIES + PAST if v.kv == "cache" else QUERIES
    if init == "pairwise":
        init = f"self.temp = nn.Parameter(torch.rand({QUERIES}, {keys}) + 0.5)"
    if init:
        src.init.append(init)
    if factor.startswith("arg:"):
        value = factor[4:]
        src.params.insert(1, "temp")  # before any parameter with a default
        src.make_inputs.insert(0, f"torch.rand({QUERIES}, {keys}, dtype=torch.{v.dtype}) + 0.5" if value == "pairwise"
                               else f"({value}).to(torch.{v.dtype})" if value.startswith("torch.rand") else value)
        factor = "temp"
    if how == "local":
        body.insert(0, "temp = self.temp")
    scaled = {"mul": f"{s} = {s} * {factor}", "div": f"{s} = {s} / {factor}", "inplace": f"{s} *= {factor}",
              "local": f"{s} = {s} * {factor}", "late": f"{s} = {s} * {factor}"}.get(how)
    at = _softmax_at(body) if how == "late" else _index_of(body, f"{s} = ") + 1
    if how == "flag":
        src.init.append("self.use_temp = True")
        body[at:at] = ["if self.use_temp:", f"    {s} = {s} * {factor}"]
    else:
        body.insert(at, scaled)


def _softmax_at(body: list[str]) -> int:
    """The line that computes the weights (every softmax spelling names a softmax)."""
    for index, line in enumerate(body):
        if "softmax" in line and "=" in line:
            return index
    raise ValueError("no softmax line")


def _plain_product(v: Variant) -> str:
    if v.layout == "channel":
        return "q.transpose(-2, -1) @ k"
    return "q @ k.transpose(-2, -1)"


# --------------------------------------------------------------------------------------------------------------
# Strategies

HAZARD_NEEDS_PLAIN_PRODUCT = {"static_helper", "subclass_override"}
FP64_OVERFLOWING_FILLS = ("finfo_min", "neg_finfo_max")


@st.composite
def core_variants(draw, *, fp32_masks_only: bool = True) -> Variant:
    """The forms the matcher claims to support, combined freely, with no fully masked row and no hazard."""
    layout = draw(st.sampled_from(LAYOUTS))
    product = draw(st.sampled_from(PRODUCTS[layout]))
    scale_place = draw(st.sampled_from(SCALE_PLACES))
    mask = draw(st.sampled_from(MASKS))
    apply = draw(st.sampled_from(APPLIES))
    polarity = draw(st.sampled_from(POLARITIES))
    if mask == "causal_buffer" and polarity == "logical_not":
        polarity = "eq0"
    letters = "".join(draw(st.permutations("bhijdxyz"))[:5])
    dtype = draw(st.sampled_from(("float32", "float64")))
    fill = draw(st.sampled_from(FILLS))
    if dtype == "float64" and fill in FP64_OVERFLOWING_FILLS:
        dtype = "float32"  # a family of its own (fp64_finfo_fill): its masks are built in float32
    mask_dtype = "bool"
    if mask in ("key_padding", "hf_extended"):
        mask_dtype = draw(st.sampled_from(("bool", "int64") if mask == "key_padding" else ("bool", "int64",
                                                                                           dtype)))
        if mask_dtype == "int64" and polarity != "eq0":
            polarity = "eq0"
    mask_rank = "full"
    if mask == "additive":
        mask_dtype = dtype
        mask_rank = draw(st.sampled_from(("full", "query_rows")))  # (B,1,1,S) or (B,1,L,S), first key kept
    return Variant(
        layout=layout, kv=draw(st.sampled_from(("self", "cache"))), product=product,
        k_transpose=draw(st.sampled_from(K_TRANSPOSES)), letters=letters,
        spec_form=draw(st.sampled_from(("plain", "plain", "concat", "fstring"))),
        scale_place=scale_place, scale_spelling=draw(st.sampled_from(SCALE_SPELLINGS)),
        mask=mask, mask_dtype=mask_dtype, mask_rank=mask_rank, apply=apply, polarity=polarity, fill=fill,
        mask_guarded=draw(st.booleans()) if mask in ("key_padding", "additive") else False,
        causal_too=draw(st.booleans()) if mask in ("key_padding", "additive", "hf_extended") else False,
        softmax=draw(st.sampled_from(SOFTMAXES)), dropout=draw(st.sampled_from(DROPOUTS)),
        value_product=draw(st.sampled_from(VALUE_PRODUCTS[layout])),
        output=draw(st.sampled_from(OUTPUTS[layout])), dtype=dtype, names=draw(st.sampled_from(NAMES)),
        operand_cast=layout != "channel" and draw(st.sampled_from((False, False, False, True))),
        helpers=draw(st.sampled_from(("none", "none", "scores", "value", "both"))))


def _with(base: st.SearchStrategy, **fixed) -> st.SearchStrategy:
    """The base strategy with some axes fixed (each value a strategy or a constant)."""
    def combine(draw):
        variant = draw(base)
        values = {k: draw(s) if isinstance(s, st.SearchStrategy) else s for k, s in fixed.items()}
        return dataclasses.replace(variant, **values)
    return st.composite(combine)()


def _fully_masked(base_fill: st.SearchStrategy) -> st.SearchStrategy:
    """Left padding under a causal mask (two masks), or padded query rows: some rows see no key at all."""
    def build(draw):
        variant = dataclasses.replace(draw(core_variants()), fill=draw(base_fill), mask_dtype="bool")
        if draw(st.booleans()):
            return dataclasses.replace(variant, mask=draw(st.sampled_from(("key_padding", "hf_extended"))),
                                       left_padding=True, causal_too=True, mask_rank="full")
        return dataclasses.replace(variant, mask="key_padding", mask_rank="query_rows", causal_too=False,
                                   mask_guarded=False)
    return st.composite(build)()


def _low_precision() -> st.SearchStrategy:
    """The core forms in bf16/fp16 (fills that fit in fp16; additive masks in the model's dtype)."""
    def build(draw):
        variant = draw(core_variants())
        dtype = draw(st.sampled_from(("bfloat16", "float16")))
        fill = variant.fill if variant.fill != "-1e9" else "-1e4"
        mask_dtype = dtype if variant.mask == "additive" else variant.mask_dtype
        return dataclasses.replace(variant, dtype=dtype, fill=fill, mask_dtype=mask_dtype)
    return st.composite(build)()


def _view_after_rewrite() -> st.SearchStrategy:
    """Channel-major attention with a mask whose output is `.view`-ed: the layout SDPA returns is not a matmul's."""
    def build(draw):
        variant = draw(core_variants())
        mask = draw(st.sampled_from(("additive", "causal_local", "key_padding")))
        return dataclasses.replace(variant, layout="channel", product=draw(st.sampled_from(PRODUCTS["channel"])),
                                   value_product=draw(st.sampled_from(VALUE_PRODUCTS["channel"])),
                                   output="view_transpose", mask=mask, mask_rank="full", helpers="none",
                                   mask_dtype=variant.dtype if mask == "additive" else "bool")
    return st.composite(build)()


def _hazard(*names: str) -> st.SearchStrategy:
    def build(draw):
        variant = draw(core_variants())
        hazard = draw(st.sampled_from(names))
        changes: dict = {"hazard": hazard, "helpers": "none"}  # hazards edit the block's text in forward
        if hazard in ("write_causal_init",):
            changes.update(mask="causal_buffer", kv="self", polarity="eq0")
        if hazard == "make_writes_causal" or hazard in BUFFER_WRITES:
            changes.update(mask="causal_buffer", kv="self", polarity="eq0")
        if hazard in SWAPS or hazard in GLOBAL_HOOKS:  # a module call the rewrite deletes
            changes.update(dropout=draw(st.sampled_from(("module", "sequential", variant.dropout))),
                           softmax=draw(st.sampled_from(("module", variant.softmax))))
            if changes["dropout"] not in ("module", "sequential") and changes["softmax"] != "module":
                changes.update(softmax="module")
        if hazard == "make_replaces_softmax":
            changes.update(softmax="module")
        if hazard == "make_sets_tensor_scale":
            changes.update(scale_place="scores_mul", scale_spelling="attr",
                           product=variant.product if variant.product != "baddbmm" else "bmm")
        if hazard == "write_causal_local":
            changes.update(mask="causal_local", kv="self")
        if hazard in HAZARD_NEEDS_PLAIN_PRODUCT:
            changes.update(product="at", scale_place="scores_mul")
        if hazard == "out_buffer":
            changes.update(layout="folded", value_product="bmm", product="bmm",
                           output=draw(st.sampled_from(OUTPUTS["folded"])))
        if hazard == "mixed_dtype_scores" or hazard == "mixed_dtype_value":
            changes.update(dtype="bfloat16", softmax=draw(st.sampled_from(("F", "method", "torch"))))
            if variant.layout == "channel" or variant.value_product == "channel_major":
                changes.update(layout="heads", product="at", value_product="at", output="transpose_reshape")
        if hazard in ("residual_loop", "two_blocks") and variant.mask != "none":
            changes.update(mask="none")
        if hazard == "residual_loop":
            changes.update(dropout="none", kv="self")
        if hazard in TENSOR_SCALE_FOLDS and (variant.layout != "heads" or variant.value_product == "channel_major"):
            changes.update(layout="heads", product=draw(st.sampled_from(PRODUCTS["heads"])), value_product="at",
                           output=draw(st.sampled_from(OUTPUTS["heads"])))
        if hazard == "temperature" and variant.layout == "folded":
            changes.update(hazard="param_scale")
        return dataclasses.replace(variant, **changes)
    return st.composite(build)()


# Family name -> (the class of fault it hunts, strategy). The test expects each family to be free of
# counterexamples, except those it marks as known bugs.
FAMILIES: dict[str, tuple[str, st.SearchStrategy]] = {
    "core": ("supported forms", core_variants()),
    "finite_fill_full_rows": ("A", _fully_masked(st.sampled_from(("finfo_min", "neg_finfo_max", "-1e4", "-1e9")))),
    "fp64_finfo_fill": ("A", _with(core_variants(), dtype="float64", fill=st.sampled_from(FP64_OVERFLOWING_FILLS),
                                   mask=st.sampled_from(("key_padding", "causal_local", "causal_drop_local")),
                                   mask_rank="full", mask_dtype="bool")),
    "finfo16_fill": ("A", _with(core_variants(), mask="key_padding", fill="finfo16_min", mask_dtype="bool",
                                mask_rank="full", dtype="float32", polarity="invert")),
    "inf_fill_full_rows": ("B", _fully_masked(st.just("-inf"))),
    "nonbool_polarity": ("C", _with(core_variants(), mask="key_padding", polarity="logical_not", mask_rank="full",
                                    mask_dtype=st.sampled_from(("int64", "float32")))),
    "additive_mask_dtype": ("D", st.one_of(
        _with(core_variants(), mask="additive", mask_dtype=st.sampled_from(("bool", "int64", "float16")),
              dtype="float32", fill="-1e4", mask_rank="full"),
        _with(core_variants(), mask="hf_extended", mask_dtype="int64", fill="int_bias"))),
    "additive_mask_rank": ("D", _with(core_variants(), mask="key_padding",
                                      mask_rank="key_vector", mask_dtype="bool")),
    "causal_written_in_init": ("E", _hazard("write_causal_init")),
    "causal_written_locally": ("E", _hazard("write_causal_local")),
    "else_scale": ("F", _hazard("else_scale")),
    "tensor_scale": ("G", _hazard("param_scale", "buffer_scale", "temperature", "logit_scale", "local_param_scale")),
    "scale_argument": ("G", _hazard("scale_argument")),
    "tensor_scale_fold": ("tensor scale", _hazard(*TENSOR_SCALE_FOLDS)),
    "residual_loop": ("H", _hazard("residual_loop")),
    "weights_before_loop": ("H", _hazard("weights_before_loop")),
    "no_grad_scores": ("I", _hazard("no_grad_scores")),
    "del_key": ("I", _hazard("del_key")),
    "writes_between": ("I", _hazard("store_key", "write_q_after_scores", "write_v_between")),
    "mixed_dtype": ("J", _hazard("mixed_dtype_scores", "mixed_dtype_value")),
    "static_helper": ("K", _hazard("static_helper")),
    "two_blocks": ("L", _hazard("two_blocks")),
    "view_after_rewrite": ("L", _view_after_rewrite()),
    "chained_assign": ("L", _hazard("chained_assign")),
    "out_buffer": ("M", _hazard("out_buffer")),
    "shared_weights": ("M", _hazard("shared_dropout_weights")),
    "subclass_override": ("N", _hazard("subclass_override")),
    "hook_point": ("N", _hazard("hook_point")),
    "higher_order_autograd": ("autograd", _hazard(*HIGHER_ORDER)),
    "written_outside_class": ("E/G/N", _hazard("make_writes_causal", "make_replaces_softmax", "make_sets_tensor_scale")),
    "escapes": ("ADV102", _hazard("return_weights", "store_weights", "entropy_loss")),
    "module_replaced": ("identity", _hazard(*SWAPS)),
    "buffer_written_later": ("identity", _hazard(*BUFFER_WRITES)),
    "global_hooks": ("identity", _hazard(*GLOBAL_HOOKS)),
    "global_weights": ("identity", _hazard("global_weights", "global_weights_copy")),
    "wrong_softmax_dim": ("hostile", _with(core_variants(), softmax="wrong_dim")),
    "low_precision": ("dtypes", _low_precision()),
}


def tagged_variants(families: list[str]) -> st.SearchStrategy:
    """(family name, variant) pairs: a family chosen uniformly among `families`, then one of its variants."""
    return st.sampled_from(families).flatmap(lambda name: FAMILIES[name][1].map(lambda v: (name, v)))
