"""FlexAttention's view of a proved block: what the scores go through between Q·K^T and softmax, as a `score_mod`
(an elementwise function of the score and of the indices b, h, q_idx, kv_idx) and a `mask_mod` (a function of the
indices alone).

The roles come from the SDPA proof (`scale`, `mask_terms`): the factors before a soft-cap are flex_attention's
`scale`; the soft-cap is `tanh(score) * cap`; a keep mask (True = attend, -inf fill) is a `mask_mod`; an added
mask is `score + bias`; a finite fill is `where(masked, fill, score)`. A mask whose value depends only on the
query and key positions (`index_forms`: arange comparisons, tril/triu of ones) is computed per index, and its
BlockMask is cached per shape; any other mask or bias is a captured tensor, broadcast to (B, H, L, S) before the
call and read at the indices (gradients reach it, as they reach the original's). What FlexAttention cannot take
is a refusal naming it; it never changes the SDPA proof.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.patterns import masks as mk
from advisor.patterns.attention.attn_mask import fresh_name, term_mask
from advisor.patterns.attention.candidate import Candidate, in_inlined, statement_of
from advisor.patterns.attention.guards import span_of, holds_at
from advisor.patterns.attention.index_forms import Extent, index_form
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import FlexPlan, MaskTerm, Refusal
from advisor.patterns.attention.tensor_facts import rank_bounds, weights_rank
from advisor.patterns.facts import FactSheet
from advisor.patterns.ops import int_value
from advisor.static.codegen import atomic, joined, parenthesized
from advisor.static.dataflow import Definition, contains_call
from advisor.static.walk import walk

MASK_TENSOR_FACTS = ("mask-rank", "mask-dtype")  # about the tensor SDPA would be passed as attn_mask
INDICES = (cst.Name("b"), cst.Name("h"), cst.Name("q_idx"), cst.Name("kv_idx"))


def flex_roles(c: Candidate) -> None:
    """`match.flex`, or `match.flex_refusal` saying which step FlexAttention cannot take."""
    try:
        c.match.flex = _plan(c)
    except Refusal as refusal:
        c.match.flex_refusal = str(refusal)


def _plan(c: Candidate) -> FlexPlan:
    match = c.match
    torch_name = c.parsed.module_aliases.get("torch")
    if torch_name is None:
        raise Refusal("the module does not import torch, which the score_mod calls")
    if match.scripted:
        raise Refusal("the function is compiled by TorchScript, which compiles neither the nested score_mod and "
                      "mask_mod functions nor the flex helper")
    if match.row_fixup is not None and match.row_fixup.conditional:
        raise Refusal("a finite fill applied under `if`: the flex patch does not make its fully masked rows uniform "
                      "as the original does (the SDPA patch does)")
    conditional = bool(match.hoisted) or any(term.guard is not None or term.number_paths is not None
                                             for term in match.masks)
    if any(term.reshape is not None for term in match.masks):
        raise Refusal("a mask is applied to a reshaped view of the scores, which the flex patch does not take")
    facts = FactSheet()  # a mask applied on some paths reaches flex as SDPA's: the SDPA row fact holds as it is
    facts.facts = [fact for fact in match.facts.facts if fact.name != mk.ROWS or conditional]
    plan = FlexPlan(score=None, mask=None, mask_key=None, captures=[], followed=[], removed=[], key_values=[],
                    no_dropout=None, extent_check=None, span=[], optional_mask=None,
                    names=(fresh_name(c, "_flex_score_mod"), fresh_name(c, "_flex_mask_mod")), facts=facts)
    score: cst.BaseExpression = match.softcap if match.softcap is not None else cst.Name("score")
    keeps: list[cst.BaseExpression] = []
    extents: list[Extent] = []
    computed = True  # every mask_mod part reads indices and constants only
    if match.is_causal:  # the SDPA proof showed is_causal (top-left) is exact
        keeps.append(parse_template_expression("q_idx >= kv_idx"))
        facts.proved("flex-index-mask", "the causal mask is `q_idx >= kv_idx`",
                     "the SDPA proof's is_causal: a lower triangle aligned top-left")
    if conditional:
        score = _conditional_mask(c, plan, score)
    for term in [] if match.is_causal or conditional else match.masks:
        read, is_computed = _term_read(c, plan, term, extents)
        if term.kind in ("keep", "causal"):
            keeps.append(read)
            computed &= is_computed
        elif term.kind == "float":
            score = cst.BinaryOperation(score, cst.Add(), atomic(read))
        else:  # finite fill: the original's value where masked, as `masked_fill` writes it
            score = cst.Call(cst.Attribute(cst.Name(torch_name), cst.Name("where")),
                             [cst.Arg(read), cst.Arg(term.fill), cst.Arg(score)])
    if not (isinstance(score, cst.Name) and score.value == "score"):
        plan.score = score
    if keeps:
        plan.mask = joined(cst.BitAnd, [atomic(part) for part in keeps])
        plan.mask_key = _mask_key(c, plan.key_values) if computed else None
    if not plan.captures:  # no mask tensor reaches flex_attention: the SDPA proof's facts about one do not apply
        facts.facts = [fact for fact in facts.facts if fact.name not in MASK_TENSOR_FACTS]
    _check_reads_once(c, plan)
    _flex_facts(c, plan, conditional)
    if match.dropout_p is not None:
        _no_dropout_guard(c, plan)
    else:
        plan.removed = _unread_mask_statements(c, plan.followed)
    if extents:
        _extent_guard(c, plan, extents)
    return plan


def _no_dropout_guard(c: Candidate, plan: FlexPlan) -> None:
    """flex_attention has no dropout: the patch runs where the original's dropout probability is 0 (evaluation,
    or a zero rate) and the original block elsewhere, checked before the block (`dropout_p == 0`)."""
    match = c.match
    output_statement = statement_of(c.parsed, match.output_node)
    span = span_of(c, output_statement)
    if span is None or contains_call(match.dropout_p) or not holds_at(c, span[0], output_statement,
                                                                       [match.dropout_p]):
        raise Refusal("dropout is applied to the weights, which flex_attention has no argument for, and whether it "
                      "runs cannot be checked before the block")
    plan.no_dropout = parse_template_expression("{p} == 0", p=parenthesized(match.dropout_p))
    plan.span = span
    statement = f"no dropout runs on the weights (`{c.parsed.code(plan.no_dropout)}`)"
    plan.facts.assumed("flex-dropout", statement, "flex_attention has no dropout")
    plan.facts.guard("flex-dropout", c.parsed.code(plan.no_dropout))


def _extent_guard(c: Candidate, plan: FlexPlan, extents: list[Extent]) -> None:
    """Computed masks are the original's only where their positions span the scores' axes (`index_forms`): the
    patch checks each length against the scores' size (`n == q.size(-2)`, ints only) and runs the original block
    where one differs. The mask statements it drops move inside the checked statements where the check can be
    read before them (the original branch keeps them), else they stay."""
    match = c.match
    output_statement = statement_of(c.parsed, match.output_node)
    sizes = {"q": parse_template_expression("{q}.size(-2)", q=atomic(match.query)),
             "kv": parse_template_expression("{k}.size(-2)", k=atomic(match.key))}
    checks = list({c.parsed.code(cst.Comparison(atomic(n), [cst.ComparisonTarget(cst.Equal(), sizes[axis])])):
                   cst.Comparison(atomic(n), [cst.ComparisonTarget(cst.Equal(), sizes[axis])])
                   for n, axis in extents}.values())
    reads = [n for n, _ in extents] + [match.query, match.key] + \
        ([match.dropout_p] if plan.no_dropout is not None else [])
    # the guard's span stays as it is where the SDPA proof's run-time checks apply to the flex patch too
    unguarded = match.flag_test is None and not any(fact.name in match.guard_checks
                                                    for fact in plan.facts.assumptions)
    for removed in ([plan.removed] if unguarded and plan.removed else []) + [[]]:
        span = span_of(c, output_statement, [statement_of(c.parsed, node) for node in removed])
        if span is not None and holds_at(c, span[0], output_statement, reads):
            break
    else:
        raise Refusal("a position mask's lengths cannot be checked against the scores' sizes before the block")
    plan.removed, plan.span = removed, span
    plan.extent_check = joined(cst.And, checks)
    code = c.parsed.code(plan.extent_check)
    plan.facts.assumed("flex-index-extent", f"the position masks span the scores' axes (`{code}`)",
                       "an `arange` or a triangle's side of another length broadcasts or raises in the original")
    plan.facts.guard("flex-index-extent", code)


def _pure_length(node: cst.BaseExpression) -> bool:
    """A length the check may evaluate again: names, attributes, subscripts, numbers and `.size(...)` of them."""
    class _Calls(cst.CSTVisitor):
        pure = True

        def visit_Call(self, call: cst.Call) -> None:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "size"
                    and all(int_value(arg.value) is not None for arg in call.args)):
                self.pure = False

    calls = _Calls()
    walk(node, calls)
    return calls.pure


def _unread_mask_statements(c: Candidate, followed: list[Definition]) -> list[cst.CSTNode]:
    """The statements of `followed` (a computed mask's definitions: positions, comparisons, triangles of ones, no
    user call) that nothing but the block and each other reads: the mask_mod computes them, so the dense (L, S)
    mask is no longer built every step."""
    gone = {id(statement) for statement in c.match.removed}
    candidates = {d.id: d for d in followed if d.statement is not None and not in_inlined(c, d.statement)
                  and isinstance(c.parsed.parents.get(d.statement), cst.SimpleStatementLine)
                  and len(c.parsed.parents[d.statement].body) == 1}
    dropped: dict[int, cst.CSTNode] = {}
    changed = True
    while changed:
        changed = False
        for def_id, definition in candidates.items():
            if def_id in dropped:
                continue
            readers = [statement_of(c.parsed, read) for read in c.flow.reads.get(def_id, [])]
            if all(id(reader) in gone for reader in readers):
                dropped[def_id] = statement_of(c.parsed, definition.statement)
                gone.add(id(dropped[def_id]))
                changed = True
    return list(dropped.values())


def _term_read(c: Candidate, plan: FlexPlan, term: MaskTerm,
               extents: list[Extent]) -> tuple[cst.BaseExpression, bool]:
    """The term's value at (b, h, q_idx, kv_idx): computed from the indices where its form allows and its lengths
    can be checked (`extents` gets them), else read from the tensor broadcast to the scores' shape. A finite term's
    value is its masked (True = masked) expression."""
    tensor = term.expression if term.kind == "finite" else term_mask(c, term)
    computed = index_form(c, tensor)
    text = short(c.parsed, term.source if term.source is not None else tensor)
    if computed is not None and not (all(_pure_length(n) for n, _ in computed[3]) and not any(
            contains_call(_receiver_chain(node)) for node in (c.match.query, c.match.key))):
        computed = None
    if computed is not None:
        computed, followed, scalars, lengths = computed
        extents.extend(lengths)
        plan.followed.extend(followed)
        plan.key_values.extend(scalars)
        plan.facts.proved("flex-index-mask", f"`{text}` depends only on the query and key positions",
                          "built from `arange` positions (from 0, step 1), tril/triu of ones, comparisons and "
                          "Python numbers: the mask_mod computes it at each (q_idx, kv_idx)")
        return computed, True
    name = fresh_name(c, "_flex_tensor")
    shape = parse_template_expression("({q}.size(0), {q}.size(1), {q}.size(-2), {k}.size(-2))",
                                      q=atomic(c.match.query), k=atomic(c.match.key))
    torch_name = c.parsed.module_aliases["torch"]
    plan.captures.append((name, cst.Call(cst.Attribute(cst.Name(torch_name), cst.Name("broadcast_to")),
                                         [cst.Arg(tensor), cst.Arg(shape)])))
    plan.facts.proved("flex-captured", f"`{text}` is read at (b, h, q_idx, kv_idx) of its broadcast to the scores' "
                      f"shape", "broadcast_to gives exactly the values the original's broadcasting uses (and raises "
                      "where it would); gradients reach the tensor through the captured read")
    return cst.Subscript(cst.Name(name), [cst.SubscriptElement(cst.Index(index)) for index in INDICES]), False


def _conditional_mask(c: Candidate, plan: FlexPlan, score: cst.BaseExpression) -> cst.BaseExpression:
    """Masks applied only on some paths: SDPA's one `attn_mask` (None where no mask applies, see `attn_mask`),
    captured once; a sole keep mask is the mask_mod where it is not None, else the sum is added in the score_mod."""
    match = c.match
    name = fresh_name(c, "_flex_tensor")
    tensor = cst.Name(name)
    shape = parse_template_expression("({q}.size(0), {q}.size(1), {q}.size(-2), {k}.size(-2))",
                                      q=atomic(match.query), k=atomic(match.key))
    torch_name = c.parsed.module_aliases["torch"]
    plan.captures.append((name, match.attn_mask))
    plan.captures.append((name, parse_template_expression(
        "None if {t} is None else {torch}.broadcast_to({t}, {shape})", t=tensor, torch=cst.Name(torch_name),
        shape=shape)))
    read = cst.Subscript(tensor, [cst.SubscriptElement(cst.Index(index)) for index in INDICES])
    plan.optional_mask = tensor
    plan.facts.proved("flex-captured", f"`{c.parsed.code(match.attn_mask)}` (None where no mask applies) is read at "
                      f"(b, h, q_idx, kv_idx) of its broadcast to the scores' shape", "as SDPA's attn_mask: the values "
                      "the original's broadcasting uses; gradients reach the tensor through the captured read")
    if len(match.masks) == 1 and match.masks[0].kind in ("keep", "causal"):
        plan.mask = read
        return score
    return parse_template_expression("{s} if {t} is None else {s} + {read}", s=atomic(score), t=tensor, read=read)


def _mask_key(c: Candidate, values: list[cst.BaseExpression]) -> cst.BaseExpression:
    """The BlockMask cache key: this block's function and line, and the values of the Python numbers the mask reads
    by name (a changed window builds a new BlockMask)."""
    name = cst.SimpleString(f'"{c.match.function}:{c.match.line}"')
    unique = list({c.parsed.code(value): value for value in values}.values())
    if not unique:
        return name
    return cst.Tuple([cst.Element(part) for part in [name, *unique]])


def _check_reads_once(c: Candidate, plan: FlexPlan) -> None:
    """The broadcast shape reads q and k a second time: only plain names, attributes and method calls, which
    evaluate to the same tensor again and run no user code."""
    if not plan.captures:
        return
    for node in (c.match.query, c.match.key):
        if contains_call(_receiver_chain(node)):
            raise Refusal(f"`{short(c.parsed, node)}` calls a function, and the flex patch would read it twice")


def _receiver_chain(node: cst.BaseExpression) -> cst.BaseExpression:
    """The innermost receiver of a chain of method calls and attributes (`q.transpose(1, 2)` -> `q`)."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                not any(contains_call(arg.value) for arg in node.args):
            node = node.func.value
        elif isinstance(node, cst.Attribute):
            node = node.value
        else:
            return node


def _known_rank(c: Candidate) -> int | None:
    """The scores' rank where the source fixes it (bmm's 3-D operands, an einsum's spec); a refusal where it is not
    4 (flex_attention takes (batch, heads, sequence, head dim) only)."""
    known = weights_rank(c) or (c.layout.ndim if c.layout is not None else None)
    if known is not None and known != 4:
        raise Refusal(f"the scores are {known}-D{' (heads folded into the batch)' if known == 3 else ''}, and "
                      f"flex_attention takes (batch, heads, sequence, head dim) only")
    return known


def _flex_facts(c: Candidate, plan: FlexPlan, conditional: bool) -> None:
    """What the flex patch relies on beyond the SDPA proof's facts: how a fully masked row comes out (a mask applied
    on some paths keeps SDPA's fact), the rank flex_attention takes, and its backward on the device."""
    facts, terms = plan.facts, [] if conditional else c.match.masks
    neginf = [term for term in terms if term.kind in ("keep", "causal")]
    if c.match.is_causal or (neginf and all(term.keeps_first_key for term in neginf)):
        facts.proved(mk.ROWS, "no query row is fully masked", "every mask keeps the first key of every row (causal)")
    elif neginf:
        facts.accepted(mk.ROWS, "a fully masked query row gives 0 where the original gives NaN",
                       "flex_attention returns 0 for a row its mask_mod masks everywhere (torch 2.13, measured), the "
                       "original's softmax of a row of -inf NaN, which no working model reads")
    elif terms:
        facts.proved(mk.ROWS, "a fully masked query row comes out as in the original",
                     "finite fills and added values go through the score_mod as the original applies them, so a "
                     "row masked everywhere keeps the original's finite scores")
    statement = "q, k and v are 4-D (batch, heads, sequence, head dim), the only layout flex_attention takes"
    if _known_rank(c) == 4 or all(rank_bounds(c).bounds(leaf) == (4, 4) for leaf in c.leaf_nodes[:2]):
        facts.proved("flex-rank", statement, "the product's operands are built with 4 dims (or its einsum spec "
                     "has 4 output axes)")
    else:
        facts.assumed("flex-rank", statement, "the rank of the product's operands is not fixed by the source")
    facts.proved("flex-backward", "gradients flow through the call on every device",
                 "where torch 2.13's flex_attention has no backward (CPU, MPS: it raises when q, k or v requires "
                 "grad) the helper runs its dense path, which has autograd")

