"""Operands of the ranks the products take: `bmm` and `baddbmm` raise unless both factors are 3-D, an einsum
without `...` unless each operand has one dim per subscript. SDPA takes any batch dims and broadcasts them, so
where the source does not state a rank the patch checks it (`q.dim() == 3`) and runs the original, which raises,
where it fails (breaker round 19b: 4-D operands of a `bmm` block gave values after the patch). matmul broadcasts
as SDPA does: its operands need the fact only where the patch undoes a permute or a transpose counted from the
front that states the key's rank (`k.permute(0, 1, 3, 2)` raises on a 3-D k).
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.patterns import einsum as es
from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.attention.products import spec, strip_factors
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.tensor_facts import rank_bounds
from advisor.patterns.ops import int_value

OPERAND_RANK = "operand-rank"
FIXED_RANK = {"bmm": 3, "baddbmm": 3}
# methods that keep a tensor's rank: the check reads the rank under them (no cast or copy made to read it)
RANK_KEEPING = frozenset({"float", "half", "double", "bfloat16", "to", "type_as", "contiguous", "detach", "clone",
                          "transpose", "swapaxes", "swapdims", "permute"})


def operand_rank_fact(c: Candidate) -> None:
    """Record whether every product operand provably has the rank its product takes."""
    required = required_ranks(c)
    if not required:
        return
    statement = "the products' operands have the ranks they take (" + ", ".join(
        f"`{short(c.parsed, node)}`: {rank}" for node, rank in required) + ")"
    unproved = unproved_ranks(c)
    if not unproved:
        c.match.facts.proved(OPERAND_RANK, statement, "the source states each rank (a view, reshape, permute or "
                                                      "rearrange, or a split of one)")
    else:
        c.match.facts.assumed(OPERAND_RANK, statement, f"the rank of `{short(c.parsed, unproved[0][0])}` is not "
                                                       "stated: the original raises on another, SDPA broadcasts it")


def required_ranks(c: Candidate) -> list[tuple[cst.BaseExpression, int]]:
    """(operand, the rank its product takes) for the score and value products that fix ranks; their Python-number
    factors stripped (a scalar keeps the rank)."""
    required = []
    for op, operands in ((c.core, c.core.operands), (c.weights.output, [c.weights.value_node])):
        if op.name in FIXED_RANK:
            required += [(node, FIXED_RANK[op.name]) for node in operands]
        elif op.name == "einsum":
            inputs, _ = spec(c, op)
            required += [(node, len(axes)) for node, axes in zip(op.operands, inputs)
                         if any(node is operand for operand in operands) and es.ELLIPSIS not in axes]
    if c.core.name == "matmul":  # a `k.permute(0, 1, 3, 2)` or `k.transpose(2, 3)` the patch undoes states k's rank
        stated = _transposed_rank(c, strip_factors(c, c.core.operands[1])[0])
        required += [stated] if stated is not None else []
    return [(strip_factors(c, node)[0], rank) for node, rank in required]


def _transposed_rank(c: Candidate, node: cst.BaseExpression) -> tuple[cst.BaseExpression, int] | None:
    """(the tensor, its rank) where a permute of n dims, or a transpose of two dims counted from the front, gives
    the key as matmul takes it: the original raises on another rank (breaker round 20), SDPA broadcasts."""
    op = c.reader.read(node)
    if op is None or op.name not in ("permute", "transpose"):
        return None
    dims = [int_value(d) for d in op.params["dims"]]
    if None in dims or op.name == "transpose" and min(dims) < 0:
        return None
    return op.operands[0], len(dims) if op.name == "permute" else max(dims) + 1


def unproved_ranks(c: Candidate) -> list[tuple[cst.BaseExpression, int]]:
    ranks = rank_bounds(c)
    return [(node, rank) for node, rank in required_ranks(c) if ranks.bounds(node) != (rank, rank)]


def rank_check(node: cst.BaseExpression, rank: int) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(t, `t.dim() == rank`), read under the methods around `t` that keep its rank."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in RANK_KEEPING:
        node = node.func.value
    return node, parse_template_expression(f"{{t}}.dim() == {rank}", t=node)
