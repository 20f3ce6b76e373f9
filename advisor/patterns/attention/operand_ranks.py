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
from advisor.patterns.attention.candidate import Candidate, flow_for, one_assigned_value, seen_from_behind
from advisor.patterns.attention.lengths import SAME_SHAPE, SWAPS, block_shape_hazard, broadcasts_to_scores, \
    one_size
from advisor.patterns.attention.products import spec, strip_factors
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.tensor_facts import rank_bounds, roots
from advisor.static.dataflow import UNDEFINED
from advisor.patterns.ops import int_value

OPERAND_RANK, EINSUM_BROADCAST, BADDBMM_INPUT = "operand-rank", "einsum-broadcast", "baddbmm-input"
BMM_BATCH = "bmm-batch"
FIXED_RANK = {"bmm": 3, "baddbmm": 3}
# methods that keep a tensor's rank: the check reads the rank under them (no cast or copy made to read it)
RANK_KEEPING = SAME_SHAPE | SWAPS | {"permute"}


def operand_rank_fact(c: Candidate) -> None:
    """Record whether every product operand provably has the rank its product takes (and, for an einsum, the
    accepted difference where it broadcasts an axis of size 1)."""
    if c.core.name == "einsum":
        c.match.facts.accepted(EINSUM_BROADCAST, "each einsum axis has one size in both operands",
                               "an einsum broadcasts an axis of size 1 in one operand (a key head dim of 1 against "
                               "the query's 8: breaker round 20), where SDPA raises: a loud failure on inputs no "
                               "attention takes, not another value")
    _baddbmm_input_fact(c)
    _batch_fact(c)
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


def _baddbmm_input_fact(c: Candidate) -> None:
    """baddbmm raises unless its input has its factors' dtype, even at beta=0 (breaker round 20: float32 zeros
    with float64 q and k), and at beta=0 unless its shape broadcasts to the scores; the patch drops that input
    (beta=0) or passes it as a mask SDPA casts (and whose shape SDPA checks as baddbmm does)."""
    if c.core.name != "baddbmm":
        return
    bias, query = c.core.params["input"], c.leaf_nodes[0]
    sized = dropped_input_unsized(c)
    statement = f"baddbmm's input `{short(c.parsed, bias)}` has the query's dtype" + \
        (" and broadcasts to the scores (the patch drops it)" if dropped_input(c) else "")
    factors = (query, _sliced_from(query), c.leaf_nodes[1])
    if not sized and (any(roots(c).same(bias, factor) for factor in factors) or _dtype_read_of(c, bias, factors)):
        c.match.facts.proved(BADDBMM_INPUT, statement, "it is built in the query's dtype" +
                             (" and the scores' sizes" if dropped_input(c) else ""))
    else:
        c.match.facts.assumed(BADDBMM_INPUT, statement, "baddbmm raises on an input of another dtype, even at "
                                                        "beta=0, or of a shape that does not broadcast to the "
                                                        "scores, and the patch passes no such input to SDPA")


def batched_operands(c: Candidate) -> list[cst.BaseExpression]:
    """q, k and v as a block with a bmm or baddbmm product passes them (their Python-number factors stripped): those
    products raise unless both factors have one batch size, SDPA broadcasts a batch of 1 (breaker round 47: q of
    batch 6 against k and v of batch 1). Read for every block with such a product, whichever product it is: where
    the score product is a matmul, a batch its bmm value product would take from q or k alone stays unread."""
    if FIXED_RANK.keys().isdisjoint((c.core.name, c.weights.output.name)):
        return []
    return [strip_factors(c, node)[0] for node in (*c.core.operands, c.weights.value_node)]


def _batch_fact(c: Candidate) -> None:
    """Record whether q, k and v provably share their batch size (axis 0 of a 3-D operand, also read as -3), where
    a bmm or baddbmm product takes them."""
    operands = batched_operands(c)
    if not operands:
        return
    statement = "the bmm products' operands have one batch size (" + \
        ", ".join(f"`{short(c.parsed, node)}`" for node in operands) + ")"
    hazard = block_shape_hazard(c)
    if hazard is None and one_size(c, operands, (0, -3)):
        c.match.facts.proved(BMM_BATCH, statement, "their batch axes come from one size")
    else:
        c.match.facts.assumed(BMM_BATCH, statement, (f"{hazard}, so no size read in the file is proved" if hazard else
                                                     "nothing in the source ties their batch axes") +
                              ": where they differ the original raises, SDPA broadcasts a batch of 1")


def dropped_input(c: Candidate) -> bool:
    """Whether the patch drops baddbmm's input: its beta is 0 (products._baddbmm_terms)."""
    beta = c.core.params["beta"]
    return c.core.name == "baddbmm" and beta is not None and c.values.literal_number(beta) == 0


def dropped_input_unsized(c: Candidate) -> bool:
    """Whether the patch drops baddbmm's input and the source does not state sizes that broadcast to the scores
    (`torch.empty(q.shape[0], q.shape[1], k.shape[1])`): the original raises on another shape, even at beta=0."""
    return dropped_input(c) and not broadcasts_to_scores(c, c.core.params["input"], *c.core.operands)


def _dtype_read_of(c: Candidate, bias: cst.BaseExpression, factors) -> bool:
    """`torch.empty(..., dtype=query.dtype)` where `query` is a factor's name read with the same bindings (both
    reads see the same tensor, whatever dtype its definitions give it: diffusers' `query = query.float()` under
    `if self.upcast_attention:`)."""
    if isinstance(bias, cst.Name) and block_shape_hazard(c) is None:  # `b = torch.empty(...)`, its one definition
        assigned = one_assigned_value(c, bias)  # (no `.data =` or `set_` in the tree changes its dtype)
        bias = assigned if assigned is not None else bias
    dtype = next((a.value for a in getattr(bias, "args", ()) if a.keyword is not None and a.keyword.value == "dtype"),
                 None)
    if not (isinstance(dtype, cst.Attribute) and dtype.attr.value == "dtype" and isinstance(dtype.value, cst.Name)):
        return False
    seen = flow_for(c, dtype.value).reaching.get(dtype.value)
    return bool(seen) and UNDEFINED not in seen and not seen_from_behind(c, dtype.value) and any(
        isinstance(factor, cst.Name) and factor.value == dtype.value.value and
        flow_for(c, factor).reaching.get(factor) == seen and not seen_from_behind(c, factor) for factor in factors)


def _sliced_from(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor a multi-element or slicing index reads (`q` of `q[:, i:end]`): only a tensor takes one, and it
    keeps the dtype (a tuple of tensors would raise)."""
    while isinstance(node, cst.Subscript) and (len(node.slice) > 1 or
                                                any(isinstance(e.slice, cst.Slice) for e in node.slice)):
        node = node.value
    return node


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
