"""Hypothesis strategy that writes runnable attention programs whose additive mask is a module-level tensor built in
the same file, in the shapes PyTorch's Inductor attention matcher looks for (torch/_inductor/fx_passes/
fuse_attention.py: scale by mul or div, K through `transpose` or `permute`, `matmul`/`@`/`bmm`, dropout of p=0, a
float32 softmax upcast).

A `Program` is one choice per axis: how the mask is built (a random draw, zeros, a finite fill, a causal triangle
turned additive, a bool, a comparison times a constant), how it is shaped where it is used (`[None, None]`,
`.expand`, `.to`), where it is used (read as a global by a function or by `forward`, passed in by calls, one of
them at module level, a parameter's default, a buffer registered from it), its name (`MASK`, or `mask` as the
parameter that takes it is named), the pattern's spelling, and at most one
`hazard` (the global rebound, written in place directly or through an alias, stored as a parameter, or values that
can mask a whole row) under which no patch may be called safe. `render(program)` writes a module whose `make(seed)`
returns `(model, inputs)` for the differential harness (`fuzz.differential.check`); the mask is drawn after
`torch.manual_seed(0)`, so the original and the patched copy of a program hold the same mask.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import strategies as st

BATCH, HEADS, LENGTH, HEAD_DIM = 2, 2, 5, 4
DIM = HEADS * HEAD_DIM

# how the module-level mask is built: name -> (expression over SHAPE, whether it is 2-D (L, L) only)
DEFINITIONS = {
    "randn": "torch.randn({shape})",
    "zeros": "torch.zeros({shape})",
    "rand_scaled": "torch.rand({shape}) * -{constant}",
    "comparison": "(torch.rand({shape}) > 0.5) * -{constant}",
    "comparison_float": "(torch.rand({shape}) < 0.3).float() * -{constant}",
    "bool": "torch.rand({shape}) > 0.5",
    "causal_fill": "torch.zeros({L}, {L}).masked_fill(torch.tril(torch.ones({L}, {L})) == 0, {fill})",
    "causal_where": "torch.where(torch.tril(torch.ones({L}, {L})).bool(), 0.0, {fill})",
    "full_finite": "torch.full(({shape}), -1e4)",
    # no form of their own: computed (advisor.patterns.evaluated_masks)
    "padding_cat": "torch.cat([torch.zeros({L}, {L} - 2), torch.full(({L}, 2), {fill})], dim=-1)",
    "padding_keys": "torch.zeros({L}, {L}).masked_fill(torch.arange({L}) >= {L} - 2, {fill})",
    "band": "torch.zeros({L}, {L}).masked_fill((torch.arange({L})[:, None] - torch.arange({L})[None, :]).abs() > 1, "
            "{fill})",
}
SQUARE_ONLY = {"causal_fill", "causal_where", "padding_cat", "padding_keys", "band"}  # built (L, L): shaped by the use
FILLS = ("-1e4", "-1e9", 'float("-inf")', "torch.finfo(torch.float32).min")
SHAPES = ("2d", "4d", "none_index", "expand", "to_half", "to_default")
# where the mask is read: a global read by a function or by `forward`, a function's parameter given it by its calls,
# a submodule's `forward` parameter defaulting to it, a `forward` parameter given it by a local instance
# (`attend = Attend().eval()` then `attend(q, k, v, MASK)`), or a buffer registered from it
USES = ("fn_global", "forward_global", "fn_param", "forward_default", "local_instance", "buffer")
IN_CLASS = {"forward_default": "mask", "local_instance": "mask", "buffer": "self.mask"}  # how the read spells it
SCALES = ("mul", "div", "div_method", "div_sqrt")
K_TRANSPOSES = ("transpose", "permute")
PRODUCTS = ("matmul", "at", "bmm")
SOFTMAXES = ("torch", "method", "upcast")
DROPOUTS = ("none", "functional", "module")
NAMES = ("MASK", "mask")
HAZARDS = ("none", "rebound_global", "subscript_write", "inplace_method", "alias_write", "parameter",
           "random_neginf", "random_finite", "finfo_full")


@dataclass(frozen=True)
class Program:
    definition: str = "randn"
    constant: str = "2.0"
    fill: str = "-1e4"
    shape: str = "4d"
    use: str = "fn_global"
    scale: str = "mul"
    k_transpose: str = "transpose"
    product: str = "matmul"
    softmax: str = "torch"
    dropout: str = "none"
    hazard: str = "none"
    name: str = "MASK"  # the global's name; `mask` is also the name of the parameter the callee takes it as


def programs(hazard: bool | None = None) -> st.SearchStrategy[Program]:
    """Programs of every axis; `hazard` True draws only hazardous ones, False none, None either (half each)."""
    drawn = st.sampled_from(HAZARDS[1:])
    hazards = drawn if hazard else st.just("none") if hazard is False else st.one_of(st.just("none"), drawn)
    return st.builds(Program, definition=st.sampled_from(tuple(DEFINITIONS)),
                     constant=st.sampled_from(("1.0", "5.0", "10.0")), fill=st.sampled_from(FILLS),
                     shape=st.sampled_from(SHAPES), use=st.sampled_from(USES), scale=st.sampled_from(SCALES),
                     k_transpose=st.sampled_from(K_TRANSPOSES), product=st.sampled_from(PRODUCTS),
                     softmax=st.sampled_from(SOFTMAXES), dropout=st.sampled_from(DROPOUTS),
                     hazard=hazards, name=st.sampled_from(NAMES))


def render(p: Program) -> str:
    """The source text of the program `p` describes."""
    folded = p.product == "bmm"
    definition, use = _mask(p, folded)
    lines = ['"""Generated: ' + repr(p) + '"""', "import math", "", "import torch", "import torch.nn as nn",
             "import torch.nn.functional as F", "", "torch.manual_seed(0)", f"MASK = {definition}"]
    lines += _hazard_at_module_level(p)
    lines += ["", ""]
    takes_mask = p.use == "fn_param"
    mask_read = use.replace("MASK", "mask") if takes_mask else use.replace("MASK", IN_CLASS.get(p.use, "MASK"))
    core = _core(p, mask_read, folded, in_module=p.use in ("forward_global", "buffer"))
    if p.use in ("forward_global", "buffer"):
        attend = "".join(f"        {line}\n" for line in core)
    elif p.use in ("forward_default", "local_instance"):
        params = "q, k, v, mask=MASK" if p.use == "forward_default" else "q, k, v, mask"
        lines += ["class Attend(nn.Module):", f"    def forward(self, {params}):"] + \
            [f"        {line}" for line in core] + ["", ""]
        if p.use == "local_instance":
            lines += ["def attend_all(q, k, v):", "    attend = Attend().eval()", "    return attend(q, k, v, MASK)",
                      "", ""]
        attend = "        out = self.attend(q, k, v)\n" if p.use == "forward_default" else \
            "        out = attend_all(q, k, v)\n"
    else:
        params = "q, k, v, mask" if takes_mask else "q, k, v"
        lines += [f"def attend({params}):"] + [f"    {line}" for line in core] + ["", ""]
        attend = f"        out = attend(q, k, v{', MASK' if takes_mask else ''})\n"
    lines += _model(p, folded, attend)
    if takes_mask:  # a module-level call passes the mask too (as Inductor's test programs run their function)
        shape = f"{BATCH * HEADS}, {LENGTH}, {HEAD_DIM}" if folded else f"{BATCH}, {HEADS}, {LENGTH}, {HEAD_DIM}"
        lines += ["", "", f"_Q = torch.randn({shape})", "EXAMPLE = attend(_Q, _Q, _Q, MASK)"]
    lines += ["", "", "def make(seed=0):", "    torch.manual_seed(seed)",
              f"    return Model(), (torch.randn({BATCH}, {LENGTH}, {DIM}),)", ""]
    text = "\n".join(lines)
    return text if p.name == "MASK" else re.sub(r"\bMASK\b", p.name, text)


def _mask(p: Program, folded: bool) -> tuple[str, str]:
    """The module-level definition, and the expression that reads it where the scores get it."""
    kind = {"random_neginf": "random_neginf", "random_finite": "random_finite",
            "finfo_full": "finfo_full"}.get(p.hazard, p.definition)
    square = f"{LENGTH}, {LENGTH}"
    full = f"1, {LENGTH}, {LENGTH}" if folded else f"1, 1, {LENGTH}, {LENGTH}"
    shape = square if p.shape in ("2d", "none_index", "expand") or folded and p.shape == "4d" else full
    if kind == "random_neginf":
        definition = f'torch.zeros({square}).masked_fill(torch.rand({square}) > 0.5, float("-inf"))'
    elif kind == "random_finite":
        definition = f"torch.zeros({square}).masked_fill(torch.rand({square}) > 0.5, -1e4)"
    elif kind == "finfo_full":
        definition = f"torch.full(({square}), torch.finfo(torch.float32).min).triu(1) * (torch.rand({square}) > 0.4)"
    else:
        definition = DEFINITIONS[kind].format(shape=shape, constant=p.constant, fill=p.fill, L=LENGTH)
    if kind in SQUARE_ONLY or kind.startswith("random") or kind == "finfo_full":
        shape = square
    use = "MASK"
    if p.shape == "none_index" and not folded:
        use = "MASK[None, None]"
    elif p.shape == "expand":
        use = f"MASK.expand({BATCH * HEADS}, {LENGTH}, {LENGTH})" if folded else \
            f"MASK.expand({BATCH}, {HEADS}, {LENGTH}, {LENGTH})"
    elif p.shape == "to_half":
        definition = f"({definition}).to(torch.float16)"
    elif p.shape == "to_default":
        use = "MASK.to(q.dtype)"
    return definition, use


def _hazard_at_module_level(p: Program) -> list[str]:
    if p.hazard == "rebound_global":
        return ["", "", "def use_large_mask():", "    global MASK", f"    MASK = torch.full(({LENGTH}, {LENGTH}), -1e9)"]
    if p.hazard == "subscript_write":
        return ["MASK[..., 0] = -1e9"]
    if p.hazard == "inplace_method":
        return ["MASK.logical_not_()" if p.definition == "bool" else "MASK.mul_(1e3)"]
    if p.hazard == "alias_write":
        return ["_SHARED = MASK", "_SHARED.fill_(-1e4)"]
    return []


def _core(p: Program, mask: str, folded: bool, in_module: bool) -> list[str]:
    """The attention statements, reading q, k, v and the mask expression `mask`; they end in `out = ...` (in a
    function, `return out`)."""
    key = "k.transpose(-2, -1)" if p.k_transpose == "transpose" else \
        ("k.permute(0, 2, 1)" if folded else "k.permute(0, 1, 3, 2)")
    product = {"matmul": f"torch.matmul(q, {key})", "at": f"q @ {key}", "bmm": f"torch.bmm(q, {key})"}[p.product]
    scaled = {"mul": f"{product} * 0.5", "div": f"{product} / 2.0", "div_method": f"({product}).div(2.0)",
              "div_sqrt": f"{product} / math.sqrt({HEAD_DIM})"}[p.scale]
    lines = [f"scores = {scaled}", f"scores = scores + {mask}"]
    if p.use in IN_CLASS and p.dropout == "module":  # `Attend` has no dropout module
        p = Program(**{**p.__dict__, "dropout": "functional"})
    if p.softmax == "torch":
        lines.append("attn = torch.softmax(scores, dim=-1)")
    elif p.softmax == "method":
        lines.append("attn = scores.softmax(dim=-1)")
    else:
        lines.append("attn = F.softmax(scores.float(), dim=-1).type_as(scores)")
    if p.dropout == "functional" or p.dropout == "module" and not in_module:
        lines.append("attn = F.dropout(attn, p=0.0, training=False)")
    elif p.dropout == "module":
        lines.append("attn = self.dropout(attn)")
    value = "torch.bmm(attn, v)" if folded else ("attn @ v" if p.product == "at" else "torch.matmul(attn, v)")
    lines.append(f"out = {value}")
    if not in_module:
        lines.append("return out")
    return lines


def _model(p: Program, folded: bool, attend: str) -> list[str]:
    init = ["        self.dropout = nn.Dropout(0.0)"]
    if p.use == "forward_default":
        init.append("        self.attend = Attend()")
    if p.use == "buffer":
        init.append('        self.register_buffer("mask", MASK)')
    if p.hazard == "parameter":
        init.append("        self.bias = nn.Parameter(MASK, requires_grad=MASK.is_floating_point())")
    heads = f"{BATCH * HEADS}, {LENGTH}, {HEAD_DIM}"
    split = [f"        q, k, v = self.qkv(x).view({BATCH}, {LENGTH}, 3, {HEADS}, {HEAD_DIM}).permute(2, 0, 3, 1, 4)"]
    if folded:
        split.append(f"        q, k, v = q.reshape({heads}), k.reshape({heads}), v.reshape({heads})")
    merge = f"out.view({BATCH}, {HEADS}, {LENGTH}, {HEAD_DIM}).transpose(1, 2)" if folded else "out.transpose(1, 2)"
    return ["class Model(nn.Module):", "    def __init__(self):", "        super().__init__()",
            f"        self.qkv = nn.Linear({DIM}, {3 * DIM})", *init, "",
            "    def forward(self, x):", *split, attend.rstrip("\n"),
            f"        return {merge}.reshape({BATCH}, {LENGTH}, {DIM})"]
