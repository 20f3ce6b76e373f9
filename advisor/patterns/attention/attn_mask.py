"""SDPA's one `attn_mask` (or `is_causal`), assembled from the mask terms in SDPA's polarity.

Unguarded terms combine in one expression (`&` of keep masks, `+` of float masks, else all as additive floats in
the query's dtype). Terms applied under `if`s are hoisted: evaluated where the original applied them, into one
fresh variable that starts as None (SDPA's "no mask") and accumulates each term.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.attention.candidate import Candidate, in_inlined
from advisor.patterns.attention.rendering import atom, render
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.static.dataflow import loaded_names


def assemble_mask(c: Candidate) -> None:
    """One `attn_mask` (or `is_causal`) equal to the original's masks in SDPA's polarity."""
    match = c.match
    terms = match.masks
    if not terms:
        return
    if len(terms) == 1 and terms[0].kind == "causal" and terms[0].guard is None:
        match.is_causal = True
        return
    if all(term.guard is None for term in terms):
        kinds = {"keep" if term.kind == "causal" else term.kind for term in terms}
        if len(terms) == 1:
            match.attn_mask = _term_code(c, terms[0])
        elif kinds == {"keep"}:
            match.attn_mask = " & ".join(atom(_term_code(c, term)) for term in terms)
        elif kinds == {"float"}:
            match.attn_mask = " + ".join(atom(_term_code(c, term)) for term in terms)
        else:
            match.attn_mask = " + ".join(atom(_additive_code(c, term)) for term in terms)
        return
    if len(terms) == 1 and c.parsed.code(terms[0].guard.test).replace(" ", "") == \
            f"{_term_code(c, terms[0])}isnotNone":
        match.attn_mask = _term_code(c, terms[0])  # SDPA takes attn_mask=None as "no mask"
        return
    _hoist_masks(c, terms)


def _hoist_masks(c: Candidate, terms: list[MaskTerm]) -> None:
    """Masks applied under `if`s are evaluated where the original applied them, into one variable that
    starts as None (SDPA's "no mask") and accumulates each term; several terms are added as floats."""
    match = c.match
    if len({id(term.statement) for term in terms}) != len(terms):
        raise Refusal("two conditional masks are applied in one statement")
    if any(in_inlined(c, term.statement) for term in terms):
        raise Refusal("a conditional mask is applied inside a helper, and helpers are never edited")
    variable = _fresh_name(c, "attn_mask")
    first = terms[0]
    if first.guard is not None:  # the variable must exist when that `if` is not taken
        match.hoist_anchor, match.hoist_init = first.guard, f"{variable} = None"
    for position, term in enumerate(terms):
        if len(terms) == 1:
            match.hoisted[term.statement] = f"{variable} = {_term_code(c, term)}"
        elif position == 0:
            match.hoisted[term.statement] = f"{variable} = {_additive_code(c, term)}"
        elif first.guard is None:  # assigned unconditionally by the first term
            match.hoisted[term.statement] = f"{variable} = {variable} + {atom(_additive_code(c, term))}"
        else:
            code = atom(_additive_code(c, term))
            match.hoisted[term.statement] = f"{variable} = {code} if {variable} is None else {variable} + {code}"
        term.nodes = []  # evaluated in place: their names need not stay bound until the SDPA call
    match.attn_mask = variable


def _additive_code(c: Candidate, term: MaskTerm) -> str:
    """The term as a float mask in the query's dtype, for adding to other terms."""
    code = _term_code(c, term)
    if term.kind in ("float", "finite"):
        return code
    torch_name, query = _torch_and_query(c)
    return f"{torch_name}.where({code}, 0.0, float(\"-inf\")).to({query}.dtype)"


def plain_query(c: Candidate) -> str | None:
    """The query as the SDPA call's site names it, when reading its dtype there costs nothing (a name or
    an attribute, never a call that would run twice)."""
    code = render(c, c.leaf_nodes[0])
    return code if isinstance(cst.parse_expression(code), (cst.Name, cst.Attribute)) else None


def _torch_and_query(c: Candidate) -> tuple[str, str]:
    torch_name, query = c.parsed.module_aliases.get("torch"), plain_query(c)
    if torch_name is None or query is None:
        raise Refusal("the masks must be merged into a float mask in the query's dtype, and torch is not "
                      "imported or the query is not a plain name")
    return torch_name, query


def _fresh_name(c: Candidate, base: str) -> str:
    used = {name.value for name in loaded_names(c.function)} | \
        {d.name for d in c.flow.definitions.values()} | c.scope.taken_names
    candidate, suffix = base, 0
    while candidate in used:
        suffix += 1
        candidate = f"{base}_{suffix}"
    c.scope.taken_names.add(candidate)  # another block of this function may hoist a mask too
    return candidate


def _term_code(c: Candidate, term: MaskTerm) -> str:
    code = _term_values(c, term)
    if term.reshape is None:
        return code
    expand, collapse, inferred = term.reshape
    if not inferred:
        return f"{atom(code)}.expand({expand}).reshape({collapse})"
    # `scores.view(-1, w, h, L, S) + mask`: broadcast against a tensor of the scores' shape instead
    query, key = atom(c.match.query), atom(c.match.key)
    shape = f"(*{query}.shape[:-1], {key}.shape[-2])"
    if term.kind in ("float", "finite"):
        return f"({query}.new_zeros({shape}).view({expand}) + {atom(code)}).view({collapse})"
    torch_name, _ = _torch_and_query(c)
    return f"({query}.new_ones({shape}, dtype={torch_name}.bool).view({expand}) & {atom(code)}).view({collapse})"


def _term_values(c: Candidate, term: MaskTerm) -> str:
    if term.kind == "float" and not term.same_dtype and plain_query(c):
        return f"{atom(term.code)}.to({plain_query(c)}.dtype)"  # eager promotion adds the same values
    if term.kind != "finite":
        return term.code
    # the 0-d zero in q's dtype makes `where` convert the fill to q's dtype, saturating like `.to` (a Python 0.0
    # would build a float32 tensor first, which cannot hold float64's finfo.min); `.to` covers a tensor fill
    torch_name, query = _torch_and_query(c)
    return f"{torch_name}.where({term.code}, {term.fill}, {query}.new_zeros(())).to({query}.dtype)"
