"""SDPA's one `attn_mask` (or `is_causal`), assembled from the mask terms in SDPA's polarity.

Unguarded terms combine in one expression (`&` of keep masks, `+` of float masks, else all as additive floats in
the query's dtype). Terms applied under `if`s are hoisted: evaluated where the original applied them, into one
fresh variable that starts as None (SDPA's "no mask") and accumulates each term. In a function TorchScript compiles,
that variable is annotated `torch.Tensor | None`: TorchScript types a variable at its first assignment, so a bare
None would refuse the tensor assigned later.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.patterns import scope
from advisor.patterns.attention import shifts
from advisor.patterns.attention.candidate import Candidate, in_inlined
from advisor.patterns.attention.causal import CAUSAL_EXTENT
from advisor.patterns.attention.rendering import Replace, at_home
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.patterns.ops import number_value, views_another_dtype
from advisor.static.codegen import assignment, atomic, joined, keyword, method, parenthesized
from advisor.static.dataflow import loaded_names


def assemble_mask(c: Candidate) -> None:
    """One `attn_mask` (or `is_causal`) equal to the original's masks in SDPA's polarity."""
    match = c.match
    terms = match.masks
    if not terms:
        return
    for term in terms:
        term.expression = metadata_translated(c, term.expression)
    fixup = match.row_fixup
    if fixup is not None and fixup.conditional:  # bound where the original fills, None where it does not
        match.attn_mask = _hoist(c, terms, list(fixup.keeps), cst.BitAnd, fixup.keep_name,
                                 _no_mask_yet(c, fixup.keep_name))
        return
    if fixup is not None:  # one finite fill: the keep mask, its fully masked rows made uniform
        match.attn_mask = fixup.keep
        return
    mixed = next((term for term in terms if term.number_paths is not None), None)
    if mixed is not None and len(terms) > 1:
        raise Refusal(f"`{c.parsed.code(mixed.source)}` is a Python number on one path and a tensor on another, "
                      f"and other masks are applied too")
    if len(terms) > 1 and any(term.optional for term in terms):
        raise Refusal("a mask that may be None is added beside other masks")
    if len(terms) == 1 and terms[0].kind == "causal" and terms[0].guard is None:
        match.is_causal = True
        match.facts.assumed(CAUSAL_EXTENT, "the causal triangle has the scores' (L, S) shape and at most their dims",
                            "a square triangle of another side broadcasts (a (1, 1) one keeps every key of a single "
                            "query, as in a decode step against a KV cache) or raises in the original, and one of "
                            "more dims broadcasts the scores up, where `is_causal` is always the scores' own "
                            "triangle")
        return
    if all(term.guard is None for term in terms):
        kinds = {"keep" if term.kind == "causal" else term.kind for term in terms}
        if len(terms) == 1:
            match.attn_mask = _sole_mask(c, terms[0])
        elif kinds == {"keep"}:
            match.attn_mask = joined(cst.BitAnd, [atomic(term_mask(c, term)) for term in terms])
        elif kinds == {"float"}:
            match.attn_mask = joined(cst.Add, [atomic(term_mask(c, term)) for term in terms])
        else:
            match.attn_mask = joined(cst.Add, [atomic(_additive(c, term)) for term in terms])
        return
    if len(terms) == 1 and (terms[0].guard, False) in _branches(c, terms[0].statement) and \
            _tests_not_none(c, terms[0].guard.test, term_mask(c, terms[0])):
        match.attn_mask = _sole_mask(c, terms[0])  # SDPA takes attn_mask=None as "no mask"
        return
    _hoist_masks(c, terms)


def metadata_translated(c: Candidate, mask: cst.BaseExpression) -> cst.BaseExpression:
    """The mask with its reads of the scores' metadata (`torch.ones(i, j, device=s.device)`) reading Q and K
    instead (see `block_checks.check_reads`): the emitted mask is a new expression, which the in-place renames of
    the original statements do not reach."""
    return mask.visit(Replace(c.match.renamed)) if c.match.renamed else mask


def _tests_not_none(c: Candidate, test: cst.BaseExpression, mask: cst.BaseExpression) -> bool:
    """`if mask is not None:` guards exactly the mask SDPA gets (spacing aside)."""
    return c.parsed.code(test).replace(" ", "") == f"{c.parsed.code(mask)}isnotNone"


def _hoist_masks(c: Candidate, terms: list[MaskTerm]) -> None:
    """Masks applied under `if`s are evaluated where the original applied them, into one variable that
    starts as None (SDPA's "no mask") and accumulates each term; several terms are added as floats."""
    name = fresh_name(c, "attn_mask")
    values = [_sole_mask(c, terms[0])] if len(terms) == 1 else [_additive(c, term) for term in terms]
    c.match.attn_mask = _hoist(c, terms, values, cst.Add, name, _no_mask_yet(c, name))


def _hoist(c: Candidate, terms: list[MaskTerm], values: list[cst.BaseExpression], operator: type[cst.BaseBinaryOp],
           name: str, init: cst.BaseSmallStatement) -> cst.Name:
    """Each term's value (an additive mask, or a finite fill's keep mask) bound to `name` where the original
    applies the term, combined by `operator` with the terms bound before it on the same run; `name` starts as
    None above the first where that one is conditional. Returns the name SDPA reads."""
    match = c.match
    if len({id(term.statement) for term in terms}) != len(terms):
        raise Refusal("two conditional masks are applied in one statement")
    if any(in_inlined(c, term.statement) for term in terms):
        raise Refusal("a conditional mask is applied inside a helper, and helpers are never edited")
    variable = cst.Name(name)
    first = terms[0]
    if first.guard is not None:  # the variable must exist when that `if` is not taken
        match.hoist_anchor = first.guard
        match.hoist_init = cst.SimpleStatementLine([init])
    for position, (term, value) in enumerate(zip(terms, values)):
        if position == 0 or all(_exclusive(c, term.statement, earlier.statement) for earlier in terms[:position]):
            bound = value  # the first on every path that reaches it (another branch of an `if`)
        elif first.guard is None:  # assigned unconditionally by the first term
            bound = cst.BinaryOperation(variable, operator(), atomic(value))
        else:
            bound = cst.IfExp(test=cst.Comparison(variable, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]),
                              body=atomic(value), orelse=cst.BinaryOperation(variable, operator(), atomic(value)))
        match.hoisted[term.statement] = assignment(name, bound)
        term.nodes = []  # evaluated in place: their names need not stay bound until the SDPA call
    return variable


def _exclusive(c: Candidate, one: cst.CSTNode, other: cst.CSTNode) -> bool:
    """No run executes both: they lie in different branches of one `if` (an `elif` is in its `else:`)."""
    sides = dict(_branches(c, one))
    return any(node in sides and sides[node] != side for node, side in _branches(c, other))


def _branches(c: Candidate, node: cst.CSTNode) -> list[tuple[cst.If, bool]]:
    """(an `if` holding `node`, whether in its `else:`), innermost first."""
    found = []
    parent = c.parsed.parents.get(node)
    while parent is not None:
        if isinstance(parent, cst.If) and node is not parent.test:
            found.append((parent, node is parent.orelse))
        node, parent = parent, c.parsed.parents.get(parent)
    return found


def _no_mask_yet(c: Candidate, name: str) -> cst.BaseSmallStatement:
    """`name: torch.Tensor | None = None`: TorchScript types a variable by its first binding, so a plain `name =
    None` later bound to a tensor fails to compile, and a user may script the function from outside the scanned
    tree (SDPA's attn_mask is `Optional[Tensor]` there too; Python never evaluates a local variable's annotation).
    A plain `name = None` where torch is not imported as a module, unless TorchScript is seen compiling it."""
    torch_name = c.parsed.module_aliases.get("torch")
    if torch_name is None and not scope.is_scripted(c.parsed, c.home, c.owner):
        return assignment(name, cst.Name("None"))
    if torch_name is None:
        raise Refusal("the function is compiled by TorchScript, where the merged mask variable must be annotated "
                      "`torch.Tensor | None`, and torch is not imported as a module")
    annotation = parse_template_expression("{torch}.Tensor | None", torch=cst.Name(torch_name))
    return cst.AnnAssign(cst.Name(name), cst.Annotation(annotation), cst.Name("None"))


def _sole_mask(c: Candidate, term: MaskTerm) -> cst.BaseExpression:
    """The one mask SDPA gets; an added value that is a Python number on some paths (`bias = 0.0`) is a shift
    there, which softmax ignores (see `shifts`), so SDPA gets no mask on those paths."""
    mask = term_mask(c, term)
    if term.kind == "float":
        c.match.facts.accepted(MASK_WRITES, "the float mask is not written in place between the forward and its "
                               "backward, nor an inference tensor", "SDPA's fused kernels save the mask they are "
                               "given for the backward, while the original's `scores + mask` saves nothing of it: a "
                               "mask buffer refilled in place before `backward()` (micro-batches sharing one), or a "
                               "mask cached under `torch.inference_mode()` (an `lru_cache` helper filled by a "
                               "validation pass), makes the patched backward raise, a loud failure; the forward's "
                               "values are the original's")
    if term.number_paths is None:
        return mask
    shifts.drop_shift(c, term.source, term.number_paths)
    torch_name, _ = _torch_and_query(c)
    return parse_template_expression("{mask} if isinstance({value}, {torch}.Tensor) else None",
                                     mask=atomic(mask), value=term.expression, torch=torch_name)


def _additive(c: Candidate, term: MaskTerm) -> cst.BaseExpression:
    """The term as a float mask in the query's dtype, for adding to other terms."""
    mask = term_mask(c, term)
    if term.kind in ("float", "finite"):
        return mask
    _through_where(term)
    torch_name, query = _torch_and_query(c)
    return parse_template_expression('{torch}.where({mask}, 0.0, float("-inf")).to({query}.dtype)',
                                     torch=torch_name, mask=mask, query=query)


# accepted where a float mask reaches SDPA as the tensor the code holds (breaker round 15's U01)
MASK_WRITES = "mask-writes"


DTYPE_KEEPING_VIEWS = frozenset({"transpose", "permute", "view", "reshape", "contiguous", "unsqueeze", "flatten",
                                 "expand"})


def plain_query(c: Candidate) -> cst.BaseExpression | None:
    """The query as the SDPA call's site names it, when reading its dtype there costs nothing (a name or
    an attribute, never a call that would run twice; a view of it has its dtype)."""
    query = at_home(c, c.leaf_nodes[0])
    while isinstance(query, cst.Call) and isinstance(query.func, cst.Attribute) and \
            query.func.attr.value in DTYPE_KEEPING_VIEWS and not views_another_dtype(query):  # q's dtype
        query = query.func.value
    return query if isinstance(query, (cst.Name, cst.Attribute)) else None


def _through_where(term: MaskTerm) -> None:
    """The term's mask goes through `torch.where`, which takes a uint8 mask where the original's `masked_fill`
    raises: no integer mask may reach it (its integer subject must then be bool)."""
    if term.integer_subject is not None:
        term.dtype_subject = term.integer_subject


def _torch_and_query(c: Candidate) -> tuple[cst.Name, cst.BaseExpression]:
    torch_name, query = c.parsed.module_aliases.get("torch"), plain_query(c)
    if torch_name is None or query is None:
        raise Refusal("the masks must be merged into a float mask in the query's dtype, and torch is not "
                      "imported or the query is not a plain name")
    return cst.Name(torch_name), query


def fresh_name(c: Candidate, base: str) -> str:
    used = {name.value for name in loaded_names(c.function)} | \
        {d.name for d in c.flow.definitions.values()} | c.scope.taken_names
    candidate, suffix = base, 0
    while candidate in used:
        suffix += 1
        candidate = f"{base}_{suffix}"
    c.scope.taken_names.add(candidate)  # another block of this function may hoist a mask too
    return candidate


def term_mask(c: Candidate, term: MaskTerm) -> cst.BaseExpression:
    """The term in SDPA's polarity and layout."""
    mask = _term_values(c, term)
    if term.reshape is None:
        return mask
    expand, collapse, broadcast = term.reshape
    if not broadcast:
        return method(method(mask, "expand", *expand), "reshape", *collapse)
    # a mask that may have more dims than the view: broadcast against a tensor of the view's shape, as the original
    # broadcasts the viewed scores (`q.new_zeros([b, h, L, S]) + mask`); where the view infers a size
    # (`scores.view(-1, w, h, L, S)`), against the scores' shape viewed so. Sizes as a list, which TorchScript takes
    # (it cannot size a starred tuple of a shape), unless the file binds `list` itself
    query = atomic(c.match.query)
    inferred = any(number_value(size) == -1 for size in expand)
    shadowed = "list" in c.parsed.bound_names or "list" in c.parsed.imports
    template = "(*{query}.shape[:-1], {key}.shape[-2])" if shadowed else "list({query}.shape[:-1]) + [{key}.shape[-2]]"
    shape = parse_template_expression(template, query=query, key=atomic(c.match.key)) if inferred else \
        cst.List([cst.Element(size) for size in expand])
    if term.kind in ("float", "finite"):
        base, operator = method(query, "new_zeros", shape), cst.Add()
    else:
        torch_name, _ = _torch_and_query(c)
        base = method(query, "new_ones", shape, keyword("dtype", cst.Attribute(torch_name, cst.Name("bool"))))
        operator = cst.BitAnd()
    broadcast = cst.BinaryOperation(method(base, "view", *expand) if inferred else base, operator, atomic(mask))
    return method(parenthesized(broadcast), "view", *collapse)


def _term_values(c: Candidate, term: MaskTerm) -> cst.BaseExpression:
    if term.kind == "float" and not term.same_dtype and plain_query(c):
        return method(term.expression, "to", cst.Attribute(plain_query(c), cst.Name("dtype")))  # eager promotion
    if term.kind != "finite":  # adds the same values
        return term.expression
    _through_where(term)
    # the 0-d zero in q's dtype makes `where` convert the fill to q's dtype, saturating like `.to` (a Python 0.0
    # would build a float32 tensor first, which cannot hold float64's finfo.min); `.to` covers a tensor fill
    torch_name, query = _torch_and_query(c)
    return parse_template_expression("{torch}.where({mask}, {fill}, {query}.new_zeros(())).to({query}.dtype)",
                                     torch=torch_name, mask=term.expression, fill=term.fill, query=query)
