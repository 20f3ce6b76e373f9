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
from advisor.patterns.attention.candidate import MAX_REBINDINGS, Candidate, one_assigned_value
from advisor.patterns.attention.causal import added_keeps_first_key, is_causal_keep, keeps_first_key, \
    keeps_first_key_bottom_right
from advisor.patterns.attention.learned_bias import learned_reading
from advisor.patterns.attention.module_terms import module_term
from advisor.patterns.attention.rendering import Replace, at_home, short
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.patterns.attention.tensor_facts import rank_bounds, roots, term_rank
from advisor.patterns.dtypes import EINOPS
from advisor.patterns.ops import Op, number_value, views_another_dtype
from advisor.static.codegen import atomic, nonzero
from advisor.static.dataflow import loaded_names

DTYPE_KEEPING_FUNCTIONS = frozenset(EINOPS | {"torch.nn.functional.pad", "torch.unsqueeze", "torch.reshape",
                                              "torch.transpose", "torch.permute"})


def mask_term(c: Candidate, op: Op, guard: cst.If | None) -> MaskTerm:
    if op.name == "add":
        mask = op.operands[1] if op.params["chain_operand"] is op.operands[0] else op.operands[0]
        table, rebound, checked_tables = learned_reading(c, mask) or (None, None, ())
        module = module_term(op)
        table = table or (module.table if module else None)
        return MaskTerm("float", at_home(c, mask), guard=guard, nodes=[mask], source=mask, in_place=op.inplace,
                        keeps_first_key=added_keeps_first_key(c, mask), number_paths=op.params.get("number_paths"),
                        optional=op.params.get("optional", False), learned=None if rebound else table,
                        learned_rebound=(table, rebound) if rebound else None, checked_tables=checked_tables,
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
    keep = at_home(c, masked) if keep_given else _negate(at_home(c, masked))  # a helper's parameter as passed
    nodes = [masked]  # the fill is not emitted for boolean and causal masks
    fill_kind = mk.NEGINF if kind == "neginf" else mk.FINITE
    if is_causal_keep(c, masked, keep_given):
        return MaskTerm("causal", keep, fill=fill, guard=guard, nodes=nodes,
                        fill_kind=fill_kind, source=source, keeps_first_key=True)
    first = keeps_first_key(c, masked, keep_given)
    bottom_right = not first and keeps_first_key_bottom_right(c, masked, keep_given)
    subject, integer = _dtype_subject(c, masked, op.name == "where", kind != "neginf")
    if kind == "neginf":
        return MaskTerm("keep", keep, guard=guard, nodes=nodes, fill_kind=fill_kind, source=source,
                        keeps_first_key=first, bottom_right=bottom_right, dtype_subject=subject,
                        integer_subject=integer)
    masked_only = _negate(at_home(c, masked)) if keep_given else at_home(c, masked)
    return MaskTerm("finite", masked_only, fill=_fill_at_home(c, fill), guard=guard, nodes=[masked],
                    fill_kind=fill_kind, source=source, keeps_first_key=first, bottom_right=bottom_right, keep=keep,
                    dtype_subject=subject, integer_subject=integer)


def _dtype_subject(c: Candidate, masked: cst.BaseExpression, where: bool, finite: bool) \
        -> tuple[tuple[cst.BaseExpression, str] | None, tuple[cst.BaseExpression, str] | None]:
    """(MaskTerm.dtype_subject, MaskTerm.integer_subject): the tensor that must be bool for the patch to raise
    wherever the original does, unless the source shows it is. `masked_fill` takes only a bool mask, and so does
    SDPA's boolean attn_mask, except where the patch drops a `~` (`~m` of a float raises; SDPA would add the float
    `m`) or passes the mask through `torch.where` (a finite fill's float mask), which also takes uint8. `where(c,
    ...)` itself takes a uint8 `c`. A dropped `~` needs only no float where the mask reaches SDPA as it is (a finite
    fill's keep mask, attention.uniform_rows): an integer `m` makes SDPA raise too."""
    inverted = isinstance(masked, cst.UnaryOperation) and isinstance(masked.operator, cst.BitInvert)
    if not (where or inverted or finite):
        return None, None
    subject = _dtype_origin(c, masked.expression if inverted else masked)
    scope = sf.SiteScope(c.parsed, subject)
    if scope.not_float(subject, bool_only=True):
        return None, None
    through_where = "passes the mask through `torch.where`, which also takes uint8"
    if inverted and not where and scope.not_float(subject):
        return None, (subject, f"`masked_fill` raises unless its mask is bool, but the patch {through_where}")
    patch = "drops the `~` (`~` of an integer is an integer; of a float it raises, and SDPA would add the float)" \
        if inverted else through_where
    why = "`where()` also takes a uint8 condition, which SDPA rejects, and raises on a float one, which SDPA would " \
        "add" if where else f"`masked_fill` raises unless its mask is bool, but the patch {patch}"
    return (subject, why), None


def _dtype_origin(c: Candidate, node: cst.BaseExpression) -> cst.BaseExpression:
    """The read whose dtype `node` has: under indexing and views, and back through names rebound by them
    (`mask = rearrange(mask, 'b j -> b 1 1 j')`, `mask = mask[:, None, None, :]`), so that a parameter reshaped
    before use is checked, or proved at its call sites, as the caller passes it."""
    for _ in range(MAX_REBINDINGS):
        node = _view_base(c, node)
        value = one_assigned_value(c, node) if isinstance(node, cst.Name) else None
        below = _view_base(c, value) if value is not None else None
        if below is None or below is value:  # not a name bound once to a view of another tensor
            return node
        node = below
    return node


def _view_base(c: Candidate, node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor under indexing, view methods and einops' `rearrange`/`repeat`, which keep its dtype."""
    while True:
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in DTYPE_KEEPING_VIEWS and not views_another_dtype(node):
            node = node.func.value
        elif isinstance(node, cst.Call) and node.args and node.args[0].keyword is None and \
                c.parsed.imported_name(node.func) in DTYPE_KEEPING_FUNCTIONS:
            node = node.args[0].value
        else:
            return node


def enclosing_views(c: Candidate, position: int) -> tuple[Op, Op] | None:
    """The view-and-back pair of the score chain that the op applied at `position` sits inside (CLIP views its
    folded scores as (b, h, L, S) and back once per mask it adds), or None."""
    views = c.chain.views
    for (start, expand), (end, collapse) in zip(views[::2], views[1::2]):
        if start < position < end:
            return expand, collapse
    return None


def reshape_term(c: Candidate, term: MaskTerm, views: tuple[Op, Op]) -> None:
    """A mask added while the scores were viewed as (b, h, L, S) and viewed back to (b*h, L, S)
    becomes `mask.expand(b, h, L, S).reshape(b*h, L, S)`: the same values in SDPA's layout. Where `expand` cannot
    take it, the mask is broadcast against a tensor of the view's shape and viewed back, as the original does: a
    view shape with a -1, or a mask that may have more dims than the view (the original broadcasts the scores up
    and views them back wherever the extra dims are 1: a batch of one; `expand` raises: breaker round 56)."""
    expand, collapse = views
    shapes = [expand.params["shape"], collapse.params["shape"]]
    if term.kind == "causal":
        term.kind = "keep"
    most = term_rank(rank_bounds(c), term)[1] if term.source is not None else None
    broadcast = any(number_value(dim) == -1 for dim in shapes[0]) or most is None or most > len(shapes[0])
    term.reshape = ([at_home(c, d) for d in shapes[0]], [at_home(c, d) for d in shapes[1]], broadcast)
    term.nodes.extend(dim for shape in shapes for dim in shape)


def _fill_at_home(c: Candidate, fill: cst.BaseExpression) -> cst.BaseExpression:
    """`torch.finfo(scores.dtype).min` reads an intermediate that the rewrite removes: read the query."""
    chain_ids = {d.id for d in c.chain.definitions}
    replaced = {}
    for name in loaded_names(fill):
        if c.flow.reaching.get(name, frozenset()) <= chain_ids and c.flow.reaching.get(name):
            if not roots(c).same_given_addends(_added_masks(c), name, c.leaf_nodes[0]):
                raise Refusal(f"the mask fill reads `{name.value}`, whose dtype after a cast is not provably "
                              f"the query's")
            replaced[name] = c.leaf_nodes[0]
            c.absorbed.add(name)
    if replaced and not isinstance(c.leaf_nodes[0], (cst.Name, cst.Attribute)):
        raise Refusal("the mask fill reads the scores' dtype and the query is not a plain name")
    return fill.visit(Replace(replaced)) if replaced else fill


def _added_masks(c: Candidate) -> list[cst.BaseExpression]:
    """The additive masks applied so far: a sum with one has the scores' dtype under its `mask-dtype` fact (no
    float wider than the query), which `tensor_facts` records for each (proved, guarded or assumed)."""
    return [term.source for term in c.match.masks if term.kind == "float" and term.source is not None]


def _negate(node: cst.BaseExpression) -> cst.BaseExpression:
    """The complement of a boolean mask (masked_fill and where raise on any other), written as simply as its
    form allows: `m == 0` becomes `m != 0` (not `m < 0.5` into `m >= 0.5`: a NaN fails both), `~m` becomes `m`,
    which is exact where m is not a float (see `_dtype_subject`); `m.logical_not()` is bool whatever m is."""
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and not node.lpar:
        target = node.comparisons[0]
        # `==` and `!=` are complements for every value; `<` and `>=` are not for NaN (both False), so an ordering
        # is negated with `~` below
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if flipped is not None:
            return cst.Comparison(node.left, [cst.ComparisonTarget(flipped(), target.comparator)])
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return node.expression
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "logical_not" \
            and not node.args:  # `m` may be an int or float 0/1 mask: its complement's complement is `m != 0`
        return nonzero(node.func.value)
    return cst.UnaryOperation(cst.BitInvert(), atomic(node))
