"""What the rewrite relies on about the tensors SDPA receives, proved from the source or recorded as assumed.

SDPA needs q, k and v of one dtype, additive masks no wider than the query (it casts them to q's dtype), and
masks of 2 to n dims for n-D scores; eager code accepts more. Each becomes a fact on the match (see
`patterns.facts`): proved when the source links the dtypes or bounds the rank, assumed otherwise, which makes
the patch unsafe. Fully masked rows are `patterns.masks`' business.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import masks as mk
from advisor.patterns import scope
from advisor.patterns.attention.attn_mask import plain_query
from advisor.patterns import call_site_facts as sf
from advisor.patterns.evaluated_masks import values_may_differ
from advisor.patterns.attention.causal import under_row_reads
from advisor.patterns.attention.candidate import Candidate, definition_of_value, flow_for, function_of, \
    parameter_claims, product_read
from advisor.patterns.attention.helpers import argument_of, helper_at, helper_return, returned_by
from advisor.patterns.attention.learned_bias import integer_index, values_of
from advisor.patterns.attention.products import has_cast, rank, spec
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.patterns.copy_cast_roles import cast_dtype, dtype_name
from advisor.patterns.dtypes import DtypeRoots
from advisor.patterns.ops import int_value, views_another_dtype
from advisor.patterns.module_values import module_value
from advisor.static.dataflow import UNDEFINED, Definition, loaded_names

LOADED_BUFFERS = "loaded-buffers"
FLOAT_QUERY = "floating-query"  # accepted: integer q and k, which a number scale makes float scores
QUERY_RANK = "query-rank"  # accepted: a 1-D query of unknown rank (matmul takes it; SDPA raises)
MASK_SIZES = "mask-sizes"  # accepted: a mask whose sizes grow the scores (the original broadcasts up; SDPA raises)


def roots(c: Candidate) -> DtypeRoots:
    """The candidate's dtype roots, built once its helpers are all entered."""
    if c.dtype_roots is None:
        c.dtype_roots = DtypeRoots(c.parsed, c.owner, c.reader, lambda node: flow_for(c, node),
                                   lambda name: argument_of(c, name), lambda call: helper_at(c, call),
                                   lambda node: function_of(c.parsed, node), c.values.is_scalar)
    return c.dtype_roots


def mask_and_dtype_facts(c: Candidate, ndim: int | None) -> None:
    """SDPA needs q, k, v of one dtype and masks of a rank and dtype it accepts; record what the source
    proves about them, and what fully masked rows do (see `masks`)."""
    _operand_ranks(c)
    v_like_q = _qkv_dtype_fact(c)
    _mask_dtype_facts(c, v_like_q)
    _mask_rank_fact(c, ndim)
    _precision_fact(c)
    masks = [term for term in c.match.masks if not term.learned]  # a learned bias is no mask (see `masks`)
    added = [term for term in masks if term.fill_kind == mk.ADDITIVE]
    every_added = added and len(added) == len(masks)
    small = _no_row_swallowed_claims(c, added) if every_added else ()
    bounded = _bounded_here(c, added) if every_added else None
    fixup = c.match.row_fixup
    mk.record_row_facts(c.parsed, c.match.facts, c.match.masks, small, bounded,
                        None if fixup is None else fixup.unfit, c.zeroed_rows)
    _loaded_buffer_fact(c, [t for t in masks if t.kind == "causal" or t.keeps_first_key] + (added if bounded else []))


def _attributes_read(c: Candidate, node: cst.BaseExpression, depth: int = 0) -> set[str]:
    """The attributes `node` reads, through the locals it reads (`mask = self.bias[...]`, then `mask`)."""
    paths = scope.attribute_paths(c.parsed, [node])
    for name in loaded_names(node) if depth < 4 else ():
        for definition in c.flow.definitions_of(name):
            if definition.kind == "assign" and definition.value is not None:
                paths |= _attributes_read(c, definition.value, depth + 1)
    return paths


def _loaded_buffer_fact(c: Candidate, read_for_values: list[MaskTerm]) -> None:
    """A proof that read a buffer's values where the class registers it (a causal triangle, a bounded mask)
    holds for what a state dict loads into it only if that is the same: accepted, and said, for a persistent
    buffer (a checkpoint this model saved holds what it built)."""
    if c.owner is None:
        return
    persistent = c.owner.persistent_buffers
    names = sorted({path.split(".")[1] for term in read_for_values if term.source is not None
                    for path in _attributes_read(c, term.source)
                    if path.startswith("self.") and path.split(".")[1] in persistent})
    if names:
        buffers = ", ".join(f"`self.{name}`" for name in names)
        c.match.facts.accepted(LOADED_BUFFERS, f"a state dict loaded into {buffers} holds what the class builds",
                               "the proof reads the values `register_buffer` stores, and the buffer is persistent "
                               "(saved in checkpoints and loaded back by `load_state_dict`): a checkpoint this model "
                               "saved holds the same values; register it with `persistent=False` to leave it out")


def _no_row_swallowed_claims(c: Candidate, added: list[MaskTerm]) -> tuple:
    """What every call must pass for the added masks of parameters to swallow no row: small values, or, where the
    block reads the mask's rows as they are (views, casts and slices that keep them, `causal.under_row_reads`), small
    values or a causal additive mask; () when one mask is not a parameter."""
    claims = []
    for term in added:
        values = _values_of(term.source)
        check = sf.KEEPS_A_KEY if under_row_reads(term.source) is values else sf.SMALL
        found = parameter_claims(c, [values], check, [term.guard])
        if not found:
            return ()
        claims.extend(found)
    return tuple(claims)


def _values_of(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor whose values `node` holds, some of them, or casts of them (`mask[None, None]`, `mask.expand(...)`,
    `mask.to(q.dtype)`): what a bound on values needs proved."""
    while True:
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in sf.KEEP_VALUES and not views_another_dtype(node):
            node = node.func.value
        else:
            return node


def _bounded_here(c: Candidate, terms: list[MaskTerm]) -> str | None:
    """Why the added masks' values are small where the block reads them (a module-level `torch.randn(...)`, a
    local `torch.zeros(...)`), read as call sites are (`call_site_facts.SiteScope`); None when one is not."""
    if values_may_differ(c.parsed):
        return None
    for term in terms:
        bounds = sf.SiteScope(c.parsed, term.source).interval(term.source)
        if bounds is None or max(abs(bounds[0]), abs(bounds[1])) > sf.SMALL_LIMIT:
            return None
    return f"{sf.SHOWS[sf.SMALL]}; shown where it is built{_definitions(c, terms)}"


def _definitions(c: Candidate, terms: list[MaskTerm]) -> str:
    """` (MASK = torch.randn(5, 5), line 9)`: the module-level definitions the masks read, for the fact's reason."""
    sites = [f"`{name.value} = {short(c.parsed, found.value)}`, line {found.line}"
             for term in terms for name in loaded_names(term.source)
             if (found := module_value(c.parsed, name.value)) is not None]
    return f" ({'; '.join(dict.fromkeys(sites))}: bound once at module level, never written or handed on in this " \
           f"file; assumes no other module writes it)" if sites else ""


def _precision_fact(c: Candidate) -> None:
    """Casts inside the block go away with it: SDPA computes in the inputs' dtype. A float32 (or float64) upcast, or
    a cast back to a tensor's dtype, loses nothing SDPA keeps: its kernels accumulate half and bfloat16 in float32,
    and for float64 inputs the patch skips a float32 rounding of the original, a documented divergence. A cast to
    float16 or bfloat16 inside the block rounds more than the inputs' dtype may: the patch could be more precise
    than the original by more than the tolerance, so that is assumed not to matter (unsafe)."""
    narrowing = [op for op in c.dtype_changes if cast_target(c, op) in ("float16", "bfloat16")]
    statement = "the casts inside the block change no value beyond the inputs' dtype's rounding"
    if narrowing:
        c.match.facts.assumed("precision", statement, f"`{short(c.parsed, narrowing[0].node)}` rounds to "
                              f"{cast_target(c, narrowing[0])}, which the patch does not")
    elif c.dtype_changes:
        c.match.facts.accepted("precision", statement, f"`{short(c.parsed, c.dtype_changes[0].node)}` widens "
                               "or casts back; on float64 inputs the original rounds through float32 there and the "
                               "patch does not (more precise by float32 rounding, and finite where values beyond "
                               "float32's range make the original inf or NaN)")


def cast_target(c: Candidate, op) -> str | None:
    """The dtype a cast or softmax(dtype=) names literally (float32, float16, ...); None when it follows a tensor."""
    if op.name == "cast":
        return cast_dtype(c.parsed, op.node)
    stage = op.params["stages"][0] if op.name == "sequential" else op
    return dtype_name(c.parsed, stage.params["dtype"]) if stage.params.get("dtype") is not None else None


def weights_dtype(c: Candidate) -> str | None:
    """The dtype the weights reach the value product in where the block names it (`softmax(s, -1,
    dtype=torch.float32) @ v`, `w.float() @ v`, `s.float().softmax(-1) @ v`): the last such change before it is
    a literal one. None where they keep the scores' dtype or are cast back to a tensor's (`.type_as(q)`)."""
    last = _last_dtype_change(c)
    return cast_target(c, last) if last is not None else None


def _last_dtype_change(c: Candidate):
    """The cast or softmax(dtype=) nearest the value product (the score chain's casts are listed from softmax
    back, then softmax's own, then the weights' in order)."""
    score_casts = [op for op in c.dtype_changes if op is not c.softmax and op not in c.weights.casts]
    last = c.weights.casts[-1:] or [op for op in c.dtype_changes if op is c.softmax] or score_casts[:1]
    return last[0] if last else None


def _qkv_dtype_fact(c: Candidate) -> bool:
    """Record whether q, k and v provably share a dtype; returns whether v's dtype root is q's or k's. Where the
    weights reach the value product in a dtype the block names, the original raises unless v has it, and with
    it the fact is that all three have that dtype (a guard checks it; SDPA would run, not raise, on others)."""
    match, output, value_node = c.match, c.weights.output, c.weights.value_node
    dtypes = roots(c)
    query, key = c.leaf_nodes[0], c.leaf_nodes[1]
    weights = next(o for o in output.operands if o is not value_node)
    v_like_q = dtypes.same(value_node, query) or dtypes.same(value_node, key)
    statement = "q, k and v have one dtype"
    if any(has_cast(node) for node in (query, key, value_node)):  # SDPA gets them as written: say which
        statement = f"`{short(c.parsed, query)}`, `{short(c.parsed, key)}` and `{short(c.parsed, value_node)}` " \
                    f"have one dtype"
    named = weights_dtype(c)
    unlinked = c.product_casts and not dtypes.same(query, key)
    if unlinked and named is None:
        match.facts.assumed("qkv-dtype", statement, f"q and k are cast before their product "
                            f"(`{short(c.parsed, c.product_casts[0].node)}`), so it does not tie their dtypes")
    elif named is not None:
        match.facts.assumed("qkv-dtype", f"q, k and v have dtype {named}", f"the weights reach the value product "
                            f"as {named} (`{short(c.parsed, _last_dtype_change(c).node)}`), where the original "
                            f"raises unless v is {named}; SDPA would not")
    elif v_like_q:
        match.facts.proved("qkv-dtype", statement, "q and v come from one tensor, or one input through Linear "
                                                   "layers (which raise on another dtype)")
    elif dtypes.same(weights, query) or dtypes.same(weights, key):
        match.facts.proved("qkv-dtype", statement, "the weights reach the value product in the query's dtype, "
                                                   "and the value product raises unless v has theirs")
        promoting = _promoting_factor(c)
        if promoting is not None and not dtypes.is_floating(query):
            match.facts.accepted(FLOAT_QUERY, "q and k are floating tensors", f"`{short(c.parsed, promoting)}` "
                                 f"makes integer scores float32, so the original also runs on integer q and k (on "
                                 f"the CPU only: no GPU multiplies them), with float v, where SDPA raises: a loud "
                                 f"failure on inputs no attention takes, not another value")
    elif _float_masks(c) and not c.dtype_changes:
        match.facts.proved("qkv-dtype", statement, "the value product gives v the scores' dtype, which is the "
                                                   "query's given the mask-dtype fact")
    else:
        match.facts.assumed("qkv-dtype", statement, f"the weights are cast "
                            f"(`{short(c.parsed, c.dtype_changes[-1].node)}`) before the value product, and "
                            f"nothing links v's dtype to q's" if c.dtype_changes else
                            "nothing links v's dtype to q's")
    return v_like_q


def _promoting_factor(c: Candidate) -> cst.BaseExpression | None:
    """A scale factor that turns integer scores into float ones (`/ d`, `* 0.125`; not `* 2`): only a float query
    keeps its dtype through it, which the source does not show."""
    return next((factor for kind, factor in c.factors if kind == "div" or int_value(factor) is None), None)


def _float_masks(c: Candidate) -> list[MaskTerm]:
    """The additive masks whose dtype the original does not tie to the scores' (baddbmm's input it does)."""
    return [term for term in c.match.masks if term.kind == "float" and not term.same_dtype]


WIDER_MASK = "wider-mask-raises"


def _mask_dtype_facts(c: Candidate, v_like_q: bool) -> None:
    """SDPA casts a float mask to q's dtype; eager code would promote the scores to a wider mask's dtype."""
    match = c.match
    for term in match.masks:
        if term.same_dtype:
            match.facts.proved("mask-dtype", f"the additive input `{short(c.parsed, term.source)}` has the query's "
                               f"dtype", "baddbmm raises unless its input has its batches' dtype")
    for term in match.masks:
        if term.dtype_subject is not None:
            subject, why = term.dtype_subject
            match.facts.assumed("mask-dtype", f"the mask `{short(c.parsed, subject)}` is a bool tensor",
                                f"{why}; its dtype is not visible here",
                                parameter_claims(c, [subject], sf.BOOL, [term.guard]))
    for term in _float_masks(c):
        mask_statement = f"the additive mask `{short(c.parsed, term.source)}` is not a float wider than the query"
        if plain_query(c) is None:
            match.facts.assumed("mask-dtype", f"the additive mask `{short(c.parsed, term.source)}` is a float of "
                                f"the query's dtype", "the query is not a plain name to cast the mask to")
        elif roots(c).same(term.source, c.leaf_nodes[0]):
            match.facts.proved("mask-dtype", mask_statement, "it is cast to the query's dtype where it is added")
        elif sf.SiteScope(c.parsed, term.source).not_float(term.source):
            match.facts.proved("mask-dtype", mask_statement, f"a bool or integer tensor where it is built"
                               f"{_definitions(c, [term])}")
        elif c.dtype_changes:
            match.facts.assumed("mask-dtype", mask_statement, "a cast in the block hides its dtype (SDPA gets it "
                                "cast to q's dtype, which changes a wider float mask)")
        elif term.in_place:
            match.facts.proved("mask-dtype", mask_statement, "added in place, so the original rounds the sum to "
                               "the scores' dtype (the query's) where SDPA rounds the mask: equal up to that "
                               "one rounding")
        elif v_like_q:
            match.facts.proved("mask-dtype", mask_statement, "a wider mask would make the weights, and so v, "
                               "wider than q, but v and q share a dtype (SDPA gets the mask cast to q's dtype)")
            match.facts.accepted(WIDER_MASK, "a mask wider than q makes the original raise, not the patch",
                                 "with a float mask wider than q (float64 against float32) the original's weights "
                                 "are wider than v and its value product raises; the patch casts the mask to q's "
                                 "dtype and returns values (breaker round 22): a program that raised runs")
        else:
            match.facts.assumed("mask-dtype", mask_statement, "its dtype is not visible here (SDPA gets it cast "
                                "to q's dtype, which changes a wider float mask)",
                                parameter_claims(c, [term.source], sf.NOT_FLOAT, [term.guard]))


def _mask_rank_fact(c: Candidate, ndim: int | None) -> None:
    """SDPA takes masks of 2 to n dims for n-D scores (any rank up to 3 for 3-D ones); eager broadcasting
    also takes a 1-D mask, and a mask of more dims (giving a higher-rank output)."""
    match = c.match
    sources = [term for term in match.masks if term.source is not None and term.reshape is None]
    if not sources:
        return
    if match.is_causal:
        _causal_rank(c, sources)
        return
    if all(_shaped_as_scores(c, term.source) for term in sources):
        match.facts.proved("mask-rank", "the mask has 2 to the scores' number of dims", "it is the scores' shape "
                           "(`expand_as`, `view_as` or `reshape_as` of the Q·K^T product)")
        return
    sized = next(term for term in sources if not _shaped_as_scores(c, term.source))
    match.facts.accepted(MASK_SIZES, "the mask's sizes broadcast to the scores' without growing them",
                         f"where a size of `{short(c.parsed, sized.source)}` exceeds the scores' (masks for more "
                         f"samples than the queries have, more mask rows than queries), the original broadcasts the "
                         f"scores up to a larger output and SDPA raises a shape error: a loud failure, not another "
                         f"value")
    ranks = rank_bounds(c)
    bounds = [term_rank(ranks, term) for term in sources]
    # the Q·K^T product broadcasts its batch dims: it has the rank of its larger operand
    leaves = [ranks.bounds(leaf) for leaf in c.leaf_nodes[:2]]
    low, high = (ndim, ndim) if ndim else mk.broadcast_bounds(leaves)
    # the most dims the weights can have, or the original raises: at the value product or after it
    upper = weights_rank(c) or _output_rank(c)
    statement = "the mask has 2 to the scores' number of dims"
    few = [term for term, (least, _) in zip(sources, bounds) if least < 2 and (high is None or high > 3)]
    many = [] if upper is not None and upper <= max(low, 2) else \
        [term for term, (_, most) in zip(sources, bounds) if most is None or most > max(low, 2)]
    if not few and not many:
        match.facts.proved("mask-rank", statement, "its indexing, reshaping or creation bounds its rank, and "
                           "the product's operands (or the value product) the scores'")
        return
    # what each call must pass instead: at least 2 dims where a 1-D mask is rejected, at most the scores' dims
    needed = (2 if high is None or high > 3 else 0,
              None if upper is not None and upper <= max(low, 2) else max(low, 2))
    unproved = _unique(few + many)
    claims = parameter_claims(c, [term.source for term in unproved], sf.RANK, [term.guard for term in unproved],
                              needed, c.leaf_nodes[:2])
    if few and few[0].learned_rebound:
        table, why = few[0].learned_rebound
        match.facts.assumed("mask-rank", statement, f"the rank of `{short(c.parsed, few[0].source)}` is not proved: "
                            f"it reads the learned table `{table}`, and {why}, so an instance's table, index or memo "
                            f"may have other ranks (SDPA rejects a 1-D mask on 4-D inputs)", claims)
    elif few:
        match.facts.assumed("mask-rank", statement, f"the rank of `{short(c.parsed, few[0].source)}` is not "
                            f"visible here, and SDPA rejects a 1-D mask on 4-D inputs", claims)
    else:
        match.facts.assumed("mask-rank", statement, f"`{short(c.parsed, many[0].source)}` may have more dims than "
                            f"the scores (eager broadcasting then gives a higher-rank output; SDPA raises)", claims)


def _shaped_as_scores(c: Candidate, node: cst.BaseExpression) -> bool:
    """XLM's `mask = (mask == 0).view(shape).expand_as(scores)` of the matmul product: the scores' rank exactly."""
    for _ in range(4):
        values = reaching_values(c, node) if isinstance(node, cst.Name) else [node]
        if not values or len(values) != 1:
            return False
        if values[0] is node:
            break
        node = values[0]
    shaped_as = node.args[0].value if isinstance(node, cst.Call) and node.args else None
    return isinstance(shaped_as, cst.Name) and scope.shape_argument(c.parsed, shaped_as) is node and \
        product_read(c, shaped_as) is not None


def _unique(terms: list[MaskTerm]) -> list[MaskTerm]:
    return [term for index, term in enumerate(terms) if all(term is not other for other in terms[:index])]


def _operand_ranks(c: Candidate) -> None:
    """SDPA takes q and k of at least 2 dims; matmul also takes a 1-D query (attention pooling with one learned
    vector, `nn.Parameter(torch.randn(d))`: breaker round 12), where the patch would raise."""
    ranks = rank_bounds(c)
    for role, leaf in zip(("query", "key"), c.leaf_nodes[:2]):
        most = ranks.bounds(leaf)[1]
        if most is not None and most < 2:
            raise Refusal(f"the {role} `{short(c.parsed, leaf)}` has one dim, which matmul takes and SDPA does not")
    query = c.leaf_nodes[0]
    if ranks.bounds(query)[0] < 2:
        c.match.facts.accepted(QUERY_RANK, "the query has at least 2 dims",
                               f"the rank of `{short(c.parsed, query)}` is not visible here: a 1-D query (one vector "
                               f"attending, which matmul takes) makes SDPA raise: a loud failure, not another value")


def _causal_rank(c: Candidate, sources: list[MaskTerm]) -> None:
    """`is_causal` drops the mask, whose leading dims are all 1; in the original a mask of more dims than the scores
    broadcasts them up (`tril(ones(T, T))[None, None, None]` gives 5-D weights: breaker round 12). Refused where the
    mask has more dims than the scores can have; where neither rank shows it, the causal-extent check compares them
    at run time (`causal_rank_unproved`)."""
    ranks = rank_bounds(c)
    most_scores = mk.broadcast_bounds([ranks.bounds(leaf) for leaf in c.leaf_nodes[:2]])[1]
    for term in sources:
        least = term_rank(ranks, term)[0]
        if most_scores is not None and least > most_scores:
            raise Refusal(f"the causal mask `{short(c.parsed, term.source)}` has more dims than the scores, which "
                          f"the original broadcasts up to them and `is_causal` does not")


def causal_rank_unproved(c: Candidate, term: MaskTerm) -> tuple[bool, int | None]:
    """Whether the source leaves open that a causal mask has more dims than the scores, and its most dims."""
    ranks = rank_bounds(c)
    least_scores = mk.broadcast_bounds([ranks.bounds(leaf) for leaf in c.leaf_nodes[:2]])[0]
    most = term_rank(ranks, term)[1]
    return most is None or most > max(least_scores, 2), most


def term_rank(ranks: mk.RankBounds, term: MaskTerm) -> tuple[int, int | None]:
    """A term's rank bounds: read where it is written (a bias module's class) or in this block."""
    return term.rank or ranks.bounds(term.source)


def rank_bounds(c: Candidate) -> mk.RankBounds:
    """Bounds on the rank of the block's tensors, as far as the source shows them."""
    return mk.RankBounds(c.parsed, c.owner, c.reader, lambda node: rank(c, node), lambda name: reaching_values(c, name),
                         lambda call: returned_by(c, call) or helper_return(c, call), c.values.is_scalar,
                         lambda index: integer_index(c, index), lambda node: values_of(c, node))


def _output_rank(c: Candidate) -> int | None:
    """The rank a `permute` of the output (through transposes, or one assignment) proves it has."""
    node = c.weights.output.node
    for _ in range(6):
        parent = c.parsed.parents.get(node)
        call = c.parsed.parents.get(parent) if isinstance(parent, cst.Attribute) else None
        if isinstance(call, cst.Call) and call.func is parent and parent.attr.value == "permute":
            dims = [int_value(a.value) for a in call.args]
            if len(dims) == 1 and isinstance(call.args[0].value, (cst.Tuple, cst.List)):
                dims = [int_value(e.value) for e in call.args[0].value.elements]
            return len(dims) if len(dims) > 1 and None not in dims else None
        if isinstance(call, cst.Call) and call.func is parent and parent.attr.value in ("transpose", "contiguous"):
            node = call
            continue
        definition = definition_of_value(c, node)
        reads = flow_for(c, node).reads_of(definition) if definition is not None else []
        if len(reads) != 1:
            return None
        node = reads[0]
    return None


def weights_rank(c: Candidate) -> int | None:
    """bmm takes 3-D operands only, and an einsum without an ellipsis operands of its spec's rank."""
    output = c.weights.output
    if output.name == "bmm":
        return 3
    if output.name == "einsum" and not c.has_ellipsis:
        (first, second), _ = spec(c, output)
        return len(first) if output.operands[0] is not c.weights.value_node else len(second)
    return None


def reaching_values(c: Candidate, name: cst.Name) -> list[cst.BaseExpression] | None:
    ids = flow_for(c, name).reaching.get(name)
    if ids == frozenset({UNDEFINED}):  # a global read: the module-level tensor, where nothing changes it
        found = module_value(c.parsed, name.value)
        return [found.value] if found is not None else None
    if not ids or UNDEFINED in ids:
        return None
    definitions = [flow_for(c, name).definitions[i] for i in ids]
    values = [_unpacked(d) if d.kind == "assign" else None for d in definitions]
    return None if None in values else values


def _unpacked(definition: Definition) -> cst.BaseExpression | None:
    """The value an assignment gives its name: the whole value, its element in `a, b = x, y`, or `x[i]` for
    `a, b = x.unbind(0)` (the same rank)."""
    value = definition.value
    if definition.index is None:
        return value
    unbound = _unbound(value)
    if unbound is not None:
        return cst.Subscript(unbound, [cst.SubscriptElement(cst.Index(cst.Integer(str(definition.index))))])
    if isinstance(value, (cst.Tuple, cst.List)) and definition.index < len(value.elements) and \
            not any(isinstance(e, cst.StarredElement) for e in value.elements):
        return value.elements[definition.index].value
    return None


def _unbound(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The tensor `x.unbind(d)` splits along one dim (d = 0 only, so that its pieces are `x[i]`)."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "unbind":
        args = [a for a in value.args]
        if not args or len(args) == 1 and int_value(args[0].value) == 0:
            return value.func.value
    return None
