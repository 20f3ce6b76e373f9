"""Fully masked rows made exact where every mask replaces the scores with one finite fill.

`masked_fill(m, F)` and `where(keep, s, F)` replace a masked score by F, so a query row masked everywhere is F at
every key: the original's weights there are exactly uniform (its output the mean of v). SDPA given the keep mask
gives such a row 0 (safe softmax), and given F as a float mask softmax(s + F). The patch opens those rows to every
key and zeroes their query instead: with `rows = keep.any(-1, keepdim=True)` it passes `torch.where(rows, q, 0)` and
`keep | ~rows`, so SDPA's scores on such a row are 0 and its weights uniform (dropout applied to them as the
original applies it), and q and k get no gradient from the row, as `masked_fill` passes none. No host sync and no
branch on data; the masks broadcast as before (`any` over a broadcast key axis is the same for every copy).

Only where the row is constant in the original: every term a finite fill of one value (an added term, or a second
fill of another value, breaks it), in a statement that evaluates its value product every time it runs. Fills
applied under an `if` (`if exists(mask): s = s.masked_fill(~mask, -1e9)`; MPT's padding and causal fills, each under
its own `if`) have their keep masks bound where the original fills, to a name that starts as None and is ANDed with
each later fill's: a run that fills gets the fixup of the fills it ran, one that does not gets q and no mask, as the
original softmaxes the plain scores (not where TorchScript compiles the function, which would type the
name at its first assignment). `masked_fill` raises on a fill beyond the scores'
dtype (-1e9 in float16); the patch no longer fills, so those dtypes are recorded for a guard.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from advisor.patterns import masks as mk
from advisor.patterns import scope
from advisor.patterns.attention.attn_mask import fresh_name, metadata_translated, term_mask
from advisor.patterns.attention.candidate import Candidate, in_inlined
from advisor.patterns.attention.result import MaskTerm, RowFixup
from advisor.patterns.attention.tensor_facts import cast_target
from advisor.patterns.values import FLOAT_MAX
from advisor.static.codegen import atomic, joined

OWN = "own"  # a fill that is its own tensor's dtype's extreme (`torch.finfo(scores.dtype).min`): it always fits
NARROW = ("float16", "bfloat16", "float32")  # dtypes a fill may overflow (float64 holds every Python float)
# evaluated only on some paths, or in another scope than the statement: a name bound before it may not be read there
CONDITIONAL = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.IfExp, cst.BooleanOperation)


def plan_row_fixup(c: Candidate) -> RowFixup | None:
    """The fixup of the block's masks, or None where a fully masked row is not provably constant in the original
    (the row fact then stays as `masks.record_row_facts` judges it)."""
    terms = c.match.masks
    if not terms or all(term.keeps_first_key or term.bottom_right for term in terms) or \
            any(not _replaces(term) for term in terms):
        return None  # causal triangles keep key 0 in every row (bottom-right ones where S >= L: a shape guard)
    torch_name = c.parsed.module_aliases.get("torch")
    fills = [fill_of(c, term) for term in terms]
    if torch_name is None or None in fills or len(set(fills)) > 1 or not _evaluated_once(c):
        return None
    conditional = any(term.guard is not None for term in terms)
    if conditional and (len({id(term.statement) for term in terms}) < len(terms) or
                        any(in_inlined(c, term.statement) for term in terms) or
                        scope.is_scripted(c.parsed, c.home, c.owner)):
        return None  # the keep mask is bound where the original fills: one statement each, in the function edited
    unfit = () if fills[0] == OWN else tuple(name for name in NARROW if abs(fills[0]) > FLOAT_MAX[name])
    if (unfit or fills[0] == OWN) and _cast_before_a_fill(c):
        return None  # the scores' dtype at the fill is not visibly the query's
    overflowed = _overflowed_after(c, fills[0])
    if overflowed is None:
        return None
    unfit += tuple(name for name in overflowed if name not in unfit)
    keeps = [term_mask(c, keep_term(c, term)) for term in terms]
    keep = keeps[0] if len(keeps) == 1 else joined(cst.BitAnd, [atomic(keep) for keep in keeps])
    return RowFixup(torch_name, keep, fresh_name(c, "attn_keep"), fresh_name(c, "attn_rows"), unfit, conditional,
                    tuple(keeps))


def _replaces(term: MaskTerm) -> bool:
    """A finite fill with its keep mask, applied wherever the block runs or under an `if`."""
    return term.fill_kind == mk.FINITE and term.number_paths is None and \
        not term.optional and not term.learned and (term.keep is not None or term.kind in ("causal", "keep"))


def keep_term(c: Candidate, term: MaskTerm) -> MaskTerm:
    """The term as a keep mask (True = attend) in SDPA's layout, its reads of the scores' metadata reading q, k."""
    keep = term.keep if term.kind == "finite" else term.expression
    return dataclasses.replace(term, kind="keep", expression=metadata_translated(c, keep))


def fill_of(c: Candidate, term: MaskTerm) -> float | str | None:
    """The fill's number, OWN for its own tensor's dtype's extreme, None when the source does not show it."""
    value = c.values.fill_value(term.fill)
    if isinstance(value, (int, float)):
        return float(value)
    query = c.leaf_nodes[0]
    if value is query and not _cast_before_a_fill(c):  # `finfo(scores.dtype)` read from the query (`_fill_at_home`)
        return OWN
    if not isinstance(value, cst.Name) or _cast_before_a_fill(c):
        return None
    reaching = c.flow.reaching.get(value)
    chain = {definition.id for definition in c.chain.definitions}
    same_query = isinstance(query, cst.Name) and query.value == value.value and reaching == c.flow.reaching.get(query)
    return OWN if reaching and (reaching <= chain or same_query) else None


def _overflowed_after(c: Candidate, fill: float | str) -> tuple[str, ...] | None:
    """The query dtypes whose fill a cast of the scores after it makes -inf (`finfo(s.dtype).min` of float64 scores
    in `softmax(s.float())`): the original's fully masked rows are NaN there, so a guard runs the original. None
    where such a cast's target is not a literal float dtype, or the fill overflows it whatever the query's dtype."""
    if fill != OWN and abs(fill) <= FLOAT_MAX["float16"]:
        return ()  # fits every float dtype a cast could give
    targets = []
    for op in c.dtype_changes:
        if op in c.weights.casts or op in c.product_casts:
            continue  # the weights' casts come after the softmax; the operands' before every fill
        target = cast_target(c, op)
        if target not in FLOAT_MAX:
            return None
        targets.append(FLOAT_MAX[target])
    if not targets:
        return ()
    if fill == OWN:
        return tuple(name for name in (*NARROW, "float64") if FLOAT_MAX[name] > min(targets))
    return None if abs(fill) > min(targets) else ()


def _cast_before_a_fill(c: Candidate) -> bool:
    """A cast between Q·K^T and a fill (`q.float() @ k.mT`, `s.float().masked_fill(...)`): the scores there may not
    have the query's dtype. Casts after every fill (`softmax(s.float())`, the weights') leave it the query's."""
    return bool(c.product_casts) or any(op.params.get("cast_before") for op, _ in c.chain.ops
                                        if op.name not in ("mul", "div", "view", "tanh"))


def _evaluated_once(c: Candidate) -> bool:
    """The value product runs whenever its statement does, in that statement's scope: the fixup's names, bound
    just before it, hold there what the call reads."""
    node = c.weights.output.node
    while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        if isinstance(node, CONDITIONAL):
            return False
        node = c.parsed.parents.get(node)
        if node is None:
            return False
    return True
