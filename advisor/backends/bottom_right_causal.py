"""A mask that is causal aligned to the bottom-right corner: a lower-triangular buffer sliced `[..., S - L:S, :S]`
(GPT-2's `self.bias[:, :, key_length - query_length:key_length, :key_length]`, a KV cache).

SDPA's `is_causal` is top-left aligned, so the matcher passes such a mask as a boolean `attn_mask`, which the
flash kernels refuse. `torch.nn.attention.bias.causal_lower_right(L, S)` (and flash_attn's own `causal=True`)
state the same mask and keep the flash kernels eligible. Every row keeps at least one key, so a finite fill
(finfo.min) and -inf give the same result here.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.attention import AttentionMatch
from advisor.patterns.attention.causal import triangle
from advisor.patterns.ops import CAST_METHODS
from advisor.static.module_index import ParsedModule

CASTS = (*CAST_METHODS, "bool", "byte", "int", "long")


def is_bottom_right_causal(parsed: ParsedModule, match: AttentionMatch) -> bool:
    if len(match.masks) != 1:
        return False
    term = match.masks[0]
    if term.guard is not None or term.reshape is not None or term.kind not in ("keep", "finite") or not term.nodes:
        return False
    node = term.nodes[0]
    keeps = (term.kind == "keep") == term.expression.deep_equals(node)  # True = attend, as the buffer's ones
    if not keeps:
        return False
    sliced = _through_name(parsed, match, _strip_casts(node))
    return sliced is not None and _bottom_right_slice(parsed, match, _strip_casts(sliced))


def _strip_casts(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in CASTS:
        node = node.func.value
    return node


def _through_name(parsed: ParsedModule, match: AttentionMatch, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """A local name's only assigned value (the mask built one statement earlier), else the node itself."""
    if not isinstance(node, cst.Name):
        return node
    function = _function(parsed, match)
    if function is None:
        return None
    definitions = parsed.flow(function[0]).definitions_of(node)
    if len(definitions) != 1 or definitions[0].kind != "assign" or definitions[0].index is not None:
        return None
    return definitions[0].value


def _bottom_right_slice(parsed: ParsedModule, match: AttentionMatch, node: cst.BaseExpression) -> bool:
    """`self.<buffer>[:, ..., A - B:A, :A]` where the class builds the buffer as a square lower triangle."""
    if not (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute)
            and isinstance(node.value.value, cst.Name) and node.value.value.value == "self" and len(node.slice) >= 2):
        return False
    *leading, rows, columns = node.slice
    if not all(isinstance(e.slice, cst.Slice) and e.slice.lower is None and e.slice.upper is None for e in leading):
        return False
    rows, columns = rows.slice, columns.slice
    if not (isinstance(rows, cst.Slice) and isinstance(columns, cst.Slice) and rows.step is None
            and columns.step is None and columns.lower is None and rows.upper is not None
            and isinstance(rows.lower, cst.BinaryOperation) and isinstance(rows.lower.operator, cst.Subtract)):
        return False
    end = _text(parsed, rows.upper)
    if end != _text(parsed, rows.lower.left) or columns.upper is None or end != _text(parsed, columns.upper):
        return False
    function = _function(parsed, match)
    owner = function[1] if function else None
    built = owner.only_value(node.value.attr.value) if owner is not None else None
    return built is not None and triangle(parsed, built) == "lower"


def _function(parsed: ParsedModule, match: AttentionMatch):
    return parsed.function_named(match.function)


def _text(parsed: ParsedModule, node: cst.CSTNode) -> str:
    return parsed.code(node).replace(" ", "")
