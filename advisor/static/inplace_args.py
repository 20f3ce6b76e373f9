"""Calls told to write their input in place by an argument: `inplace=True`, or `inplace` at its position in a
torch.nn layer's constructor or a torch.nn.functional function. Read by the attention layout walk and by the
copy removals, which must both see `F.dropout(h, p, training, True)` as a write of `h`, and by the checks of
writes into q, k and v and of reads that leave a tensor alone (`F.relu(qkv, True)`: breaker round 33)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule

# where `inplace` is passed by position: a torch.nn layer's constructor (`nn.ReLU(True)`, `nn.Dropout(0.1, True)`)
# and a torch.nn.functional function, its input first (`F.relu(x, True)`, `F.dropout(x, 0.1, True, True)`)
INPLACE_POSITIONS = {
    **dict.fromkeys(("ReLU", "ReLU6", "SELU", "SiLU", "Mish", "Hardswish", "Hardsigmoid"), 0),
    **dict.fromkeys(("LeakyReLU", "ELU", "CELU", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                     "FeatureAlphaDropout"), 1),
    **dict.fromkeys(("Threshold", "Hardtanh", "RReLU"), 2),
    **dict.fromkeys(("relu", "relu6", "selu", "silu", "mish", "hardswish", "hardsigmoid"), 1),
    **dict.fromkeys(("leaky_relu", "elu", "celu"), 2),
    **dict.fromkeys(("threshold", "hardtanh", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                     "feature_alpha_dropout"), 3),
    "rrelu": 4,
}


def inplace_keyword(call: cst.Call) -> bool:
    """`inplace=` given anything but a literal False."""
    return any(arg.keyword is not None and arg.keyword.value == "inplace" and not is_false(arg.value)
               for arg in call.args)


def inplace_argument(parsed: "ParsedModule", call: cst.Call) -> bool:
    """An `inplace` argument not visibly False: by keyword, or at its position (INPLACE_POSITIONS), or possibly
    in unpacked arguments (`nn.Dropout(*args)`, `nn.Dropout(**{"p": 0.1, "inplace": True})`: breaker round 36)."""
    if inplace_keyword(call):
        return True
    dotted = parsed.imported_name(call.func) or ""
    family, _, name = dotted.rpartition(".")
    position = INPLACE_POSITIONS.get(name) if family in ("torch.nn", "torch.nn.functional") else None
    if position is not None and any(arg.star for arg in call.args):
        return True
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    return position is not None and len(positional) > position and not is_false(positional[position])


def is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"
