"""torch's parameter names for the operations attention is written with, and one binder from a call's arguments to
them, so `F.softmax(input=s, dim=-1)`, `torch.bmm(input=a, mat2=b)` and `s.softmax(-1)` read alike.

A Tensor method takes the function's parameters without `input`, which is its receiver (`x.where(c, y)` is
`torch.where(c, x, y)`), so one table serves both spellings.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst


@dataclass(frozen=True)
class Signature:
    positional: tuple[str, ...]  # may be given by position or by keyword, in this order
    keyword_only: tuple[str, ...] = ()


TORCH = {
    "matmul": Signature(("input", "other"), ("out",)),
    "bmm": Signature(("input", "mat2"), ("out",)),
    "baddbmm": Signature(("input", "batch1", "batch2"), ("beta", "alpha", "out")),
    "softmax": Signature(("input", "dim", "dtype")),
    "log_softmax": Signature(("input", "dim", "dtype")),
    "exp": Signature(("input",), ("out",)),
    "tanh": Signature(("input",), ("out",)),
    "dropout": Signature(("input", "p", "train")),
    "masked_fill": Signature(("input", "mask", "value")),
    "where": Signature(("condition", "input", "other"), ("out",)),
    "add": Signature(("input", "other"), ("alpha", "out")),
    "mul": Signature(("input", "other"), ("out",)),
    "div": Signature(("input", "other"), ("rounding_mode", "out")),
    "transpose": Signature(("input", "dim0", "dim1")),
    "permute": Signature(("input", "dims")),
}

FUNCTIONAL = {  # torch.nn.functional's own signatures where they differ from torch's
    "softmax": Signature(("input", "dim", "_stacklevel", "dtype")),
    "log_softmax": Signature(("input", "dim", "_stacklevel", "dtype")),
    "dropout": Signature(("input", "p", "training", "inplace")),
}


def signature_of(family: str, name: str) -> Signature | None:
    """The signature of `torch.<name>` or `torch.nn.functional.<name>` (family as in the dotted name)."""
    if family == "torch.nn.functional" and name in FUNCTIONAL:
        return FUNCTIONAL[name]
    return TORCH.get(name)


def bind(call: cst.Call, signature: Signature,
         receiver: cst.BaseExpression | None = None) -> dict[str, cst.BaseExpression] | None:
    """The call's arguments by parameter name (a method's receiver as `input`); None when they do not fit the
    signature (too many, unknown or repeated names, `*args`/`**kwargs`), as Python would raise or as cannot be
    read. Parameters left out are absent, so each op decides which it needs."""
    names = signature.positional
    bound: dict[str, cst.BaseExpression] = {}
    if receiver is not None:
        if "input" not in names:
            return None
        bound["input"] = receiver
        names = tuple(name for name in names if name != "input")
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or len(positional) > len(names):
        return None
    bound.update(zip(names, (a.value for a in positional)))
    allowed = set(signature.positional) | set(signature.keyword_only)
    for arg in call.args:
        if arg.keyword is not None:
            name = arg.keyword.value
            if name not in allowed or name in bound:
                return None
            bound[name] = arg.value
    return bound
