"""One mask term per masking op of the score chain, in SDPA's polarity (True = attend, or added floats).

`masked_fill(m, fill)` and `where(c, s, fill)` become boolean keep masks when the fill is -inf, finite masks
(masked expression plus fill) when it is a large negative number, and `is_causal` candidates when the mask is a
lower triangle of ones (see `causal`); an added tensor is a float mask. A mask applied while the scores were
viewed in another shape is reshaped to SDPA's.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import call_site_facts as sf
from advisor.patterns import masks as mk
from advisor.patterns.attention.attn_mask import DTYPE_KEEPING_VIEWS
from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.attention.causal import added_keeps_first_key, is_causal_keep, keeps_first_key, \
    keeps_first_key_bottom_right
from advisor.patterns.attention.learned_bias import learned_reading
from advisor.patterns.attention.module_terms import module_term
from advisor.patterns.attention.rendering import Replace, at_home, short
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.patterns.attention.tensor_facts import roots
from advisor.patterns.ops import Op, number_value
from advisor.static.codegen import atomic, method
from advisor.static.dataflow import loaded_names


def mask_term(c: Candidate, op: Op, guard: cst.If | None) -> MaskTerm:
    if op.name == "add":
        mask = op.operands[1] if op.params["chain_operand"] is op.operands[0] else op.operands[0]
        table, rebound = learned_reading(c, mask) or (None, None)
        module = module_term(op)
        table = table or (module.table if module else None)
        return MaskTerm("float", at_home(c, mask), guard=guard, nodes=[mask], source=mask, in_place=op.inplace,
                        keeps_first_key=added_keeps_first_key(c, mask), number_paths=op.params.get("number_paths"),
                        optional=op.params.get("optional", False), learned=None if rebound else table,
                        learned_rebound=(table, rebound) if rebound else None,
                        rank=module.rank if module else None,
                        module=(op.node.func.attr.value, module.classes, op.node.func) if module else None,
                        tables=tuple(cst.Attribute(op.node.func, cst.Name(t)) for t in module.tables) if module else ())
    if op.name == "masked_fill":
        masked, fill = op.params["mask"], op.params["fill"]
        keep_given = False
    else:  # where(condition, scores, fill) keeps where True; where(condition, fill, scores) masks
        condition = op.params["condition"]
        chain_first = op.params["chain_operand"] is op.operands[0]
        fill = op.operands[1] if chain_first else op.operands[0]
        masked, keep_given = condition, chain_first
    source = op.params.get("source", masked)  # the tensor the original passes (`b` of GPT-2's `s * b - F * (1 - b)`)
    kind = c.values.fill_kind(fill)
    if kind is None:
        raise Refusal(f"the mask fill value `{short(c.parsed, fill)}` is not provably -inf or a large negative "
                      f"number")
    keep = at_home(c, masked) if keep_given else _negate(masked)
    nodes = [masked]  # the fill is not emitted for boolean and causal masks
    fill_kind = mk.NEGINF if kind == "neginf" else mk.FINITE
    if is_causal_keep(c, masked, keep_given):
        return MaskTerm("causal", keep, fill=fill, guard=guard, nodes=nodes,
                        fill_kind=fill_kind, source=source, keeps_first_key=True)
    first = keeps_first_key(c, masked, keep_given)
    bottom_right = not first and keeps_first_key_bottom_right(c, masked, keep_given)
    subject = _dtype_subject(c, masked, op.name == "where")
    if kind == "neginf":
        return MaskTerm("keep", keep, guard=guard, nodes=nodes, fill_kind=fill_kind, source=source,
                        keeps_first_key=first, bottom_right=bottom_right, dtype_subject=subject)
    masked_only = _negate(masked) if keep_given else at_home(c, masked)
    return MaskTerm("finite", masked_only, fill=_fill_at_home(c, fill), guard=guard, nodes=[masked],
                    fill_kind=fill_kind, source=source, keeps_first_key=first, bottom_right=bottom_right, keep=keep,
                    dtype_subject=subject)


def _dtype_subject(c: Candidate, masked: cst.BaseExpression, where: bool) -> tuple[cst.BaseExpression, str] | None:
    """The tensor whose dtype the patch needs (MaskTerm.dtype_subject), unless the source shows it. `masked_fill`
    takes only a bool mask, so the patch raises wherever the original does, except where it drops a `~`: `~m` of a
    float raises, while SDPA adds a float `m`. `where` also takes a uint8 condition (as bool), which SDPA rejects,
    and the patch passes the condition (or its operand under `~`) where `where` raised on a float one."""
    inverted = isinstance(masked, cst.UnaryOperation) and isinstance(masked.operator, cst.BitInvert)
    if not (where or inverted):
        return None
    subject = masked.expression if inverted else masked
    while isinstance(subject, cst.Subscript) or isinstance(subject, cst.Call) and \
            isinstance(subject.func, cst.Attribute) and subject.func.attr.value in DTYPE_KEEPING_VIEWS:
        subject = subject.value if isinstance(subject, cst.Subscript) else subject.func.value  # same dtype
    if sf.SiteScope(c.parsed, subject).not_float(subject, bool_only=where):
        return None
    return subject, sf.BOOL if where else sf.NOT_FLOAT


def reshape_term(c: Candidate, term: MaskTerm) -> None:
    """A mask added while the scores were viewed as (b, h, L, S) and viewed back to (b*h, L, S)
    becomes `mask.expand(b, h, L, S).reshape(b*h, L, S)`: the same values in SDPA's layout."""
    (_, expand), (_, collapse) = c.chain.views
    shapes = [expand.params["shape"], collapse.params["shape"]]
    if term.kind == "causal":
        term.kind = "keep"
    inferred = any(number_value(dim) == -1 for dim in shapes[0])  # expand() cannot infer a size
    term.reshape = ([at_home(c, d) for d in shapes[0]], [at_home(c, d) for d in shapes[1]], inferred)
    term.nodes.extend(dim for shape in shapes for dim in shape)


def _fill_at_home(c: Candidate, fill: cst.BaseExpression) -> cst.BaseExpression:
    """`torch.finfo(scores.dtype).min` reads an intermediate that the rewrite removes: read the query."""
    chain_ids = {d.id for d in c.chain.definitions}
    replaced = {}
    for name in loaded_names(fill):
        if c.flow.reaching.get(name, frozenset()) <= chain_ids and c.flow.reaching.get(name):
            if not roots(c).same(name, c.leaf_nodes[0]):
                raise Refusal(f"the mask fill reads `{name.value}`, whose dtype after a cast is not provably "
                              f"the query's")
            replaced[name] = c.leaf_nodes[0]
            c.absorbed.add(name)
    if replaced and not isinstance(c.leaf_nodes[0], (cst.Name, cst.Attribute)):
        raise Refusal("the mask fill reads the scores' dtype and the query is not a plain name")
    return fill.visit(Replace(replaced)) if replaced else fill


def _negate(node: cst.BaseExpression) -> cst.BaseExpression:
    """The complement of a boolean mask (masked_fill and where raise on any other), written as simply as its
    form allows: `~m` becomes `m`, which is exact where m is not a float (see `_dtype_subject`); `m.logical_not()`
    is bool whatever m is."""
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and not node.lpar:
        target = node.comparisons[0]
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.LessThan: cst.GreaterThanEqual,
                   cst.GreaterThanEqual: cst.LessThan, cst.GreaterThan: cst.LessThanEqual,
                   cst.LessThanEqual: cst.GreaterThan}.get(type(target.operator))
        if flipped is not None:
            return cst.Comparison(node.left, [cst.ComparisonTarget(flipped(), target.comparator)])
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return node.expression
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "logical_not" \
            and not node.args:  # `m` may be an int or float 0/1 mask: its complement's complement is `m.bool()`
        return method(node.func.value, "bool")
    return cst.UnaryOperation(cst.BitInvert(), atomic(node))
