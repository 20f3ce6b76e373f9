"""What an `attn_mask` must satisfy beyond polarity: rank, and what happens to fully masked query rows.

SDPA rejects a 1-D mask on 4-D inputs, and a mask of more dims than the scores (eager broadcasting accepts both,
the second giving a higher-rank output), so a mask needs 2 to n dims for n-D scores (any up to n for 3-D ones).

A query row whose every key is masked differs between the original and SDPA: with `-inf` fills the original's
softmax gives NaN and SDPA's gives 0 (the one accepted divergence: no working model reads a NaN); with a finite
fill (`finfo.min`, `-1e4`) the original gives uniform weights (the mean of V) and SDPA, which adds the fill to
the scores, does not, unless the fill swallows them. An added float mask of values the source does not show is
the same case (HF's `(1 - m) * finfo.min` on a padded sample swallows the row: the original's weights are uniform,
SDPA's fused backward gives other gradients, and the mask cast to a bf16 query overflows to -inf). So a finite
fill or an added mask is exact only where no row is fully masked, which the source proves only for causal masks:
a lower triangle of ones sliced from its first column keeps key 0 in every row. Where every mask is one finite fill,
the patch makes the fully masked rows uniform as the original does (`attention.uniform_rows`): proved. An added
bias read from a learned table is a score term, not a mask (`attention.learned_bias`): its fact is accepted, the
other masks judged alone.
"""

from __future__ import annotations

import re
from typing import Callable

import libcst as cst

from advisor.patterns.facts import FactSheet
from advisor.patterns.ops import SHAPE_ONLY_ARGUMENT, OpReader, int_value, literal_string
from advisor.static.module_index import ClassInfo, ParsedModule

NEGINF, FINITE, ADDITIVE = "neginf", "finite", "additive"  # how a term masks: fill -inf, finite fill, added
RANK_KEEPING = {"bool", "to", "float", "half", "type_as", "type", "contiguous", "clone", "logical_not", "long",
                "int", "byte", "detach", "tril", "triu", "fill_", "tril_", "triu_", "transpose"}
CREATORS = {f"torch.{name}" for name in ("ones", "zeros", "empty", "full", "randn", "rand", "randint")}
RANK_KEEPING_FUNCTIONS = {"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.tril", "torch.triu",
                          "torch.logical_not", "torch.clone", "torch.nn.functional.normalize",
                          "torch.nn.functional.pad"}
# einops' functions of a pattern: the output has its right side's axes (the input must have the left side's, or
# they raise)
EINOPS_PATTERNS = {"einops.rearrange", "einops.repeat", "einops.reduce"}
ROWS = "fully-masked-rows"
FINITE_FILL = "finite-fill"  # a masked key's weight: 0 in SDPA, exp(fill - row max) in the original
REPLACED_SCORES = "replaced-scores"  # masked_fill/where discards a masked score; SDPA adds its mask, keeping a NaN
AUTOCAST_FILL = "autocast-fill"  # a fill autocast's dtype cannot hold: the original raises, the guard reads q's
REPLACED_STATEMENT = ("the scores a mask replaces are numbers: q and k, and masks added before it, hold no NaN or inf "
                      "at masked positions")


Bounds = tuple[int, int | None]  # (fewest, most) dims; most is None when unbounded
UNKNOWN: Bounds = (0, None)


class RankBounds:
    """Bounds on the rank of a mask expression. `known_rank(node)` is the exact rank when the source states
    it, `reaching_values(name)` the values assigned to a read (or None), `returned(call)` what a helper of
    this file returns (or None), `is_scalar(node)` proves a Python number (rank 0), `integer(node)` an integer
    tensor or int (indexing by it reads one dim and gives the index's dims), `followed(node)` the values a call of a
    helper with several returns, or a read of a memo, may give (or None)."""

    def __init__(self, parsed: ParsedModule, owner: ClassInfo | None, reader: OpReader,
                 known_rank: Callable[[cst.BaseExpression], int | None],
                 reaching_values: Callable[[cst.Name], list[cst.BaseExpression] | None],
                 returned: Callable[[cst.Call], cst.BaseExpression | None],
                 is_scalar: Callable[[cst.BaseExpression], bool],
                 integer: Callable[[cst.BaseExpression], bool] = lambda node: False,
                 followed: Callable[[cst.BaseExpression], list[cst.BaseExpression] | None] = lambda node: None) -> None:
        self.parsed, self.owner, self.reader, self.is_scalar = parsed, owner, reader, is_scalar
        self.known_rank, self.reaching_values, self.returned = known_rank, reaching_values, returned
        self.integer, self.followed = integer, followed
        self._following: set[cst.CSTNode] = set()

    def bounds(self, node: cst.BaseExpression, depth: int = 0) -> Bounds:
        if depth > 12:
            return UNKNOWN
        known = self.known_rank(node)
        if known is not None:
            return known, known
        values = self.followed(node) if node not in self._following else None
        if values is not None:  # one of the values a helper returns or a memo holds
            self._following.add(node)
            found = _union([self.bounds(value, depth + 1) for value in values])
            self._following.discard(node)
            return found
        if self.is_scalar(node):
            return 0, 0
        below = lambda child: self.bounds(child, depth + 1)  # noqa: E731
        if isinstance(node, cst.Name):
            values = self.reaching_values(node)
            return _union([below(value) for value in values]) if values else UNKNOWN
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self" \
                and self.owner is not None:
            built = self.owner.shape_values(node.attr.value)  # element writes keep the rank
            if built is None:
                return UNKNOWN
            return _union([below(value) for value in built])
        if isinstance(node, cst.Attribute) and node.attr.value in ("T", "mT", "H", "mH"):  # transposes keep rank
            return below(node.value)
        if isinstance(node, cst.Subscript):
            return _subscript_bounds(node, below(node.value), self._gathered)
        if isinstance(node, cst.UnaryOperation):
            return below(node.expression)
        if isinstance(node, cst.Comparison):
            return broadcast_bounds([below(node.left)] + [below(c.comparator) for c in node.comparisons])
        if isinstance(node, cst.BinaryOperation):
            return broadcast_bounds([below(node.left), below(node.right)])
        if isinstance(node, cst.Call):
            return self._call_bounds(node, below)
        return UNKNOWN

    def _gathered(self, index: cst.BaseExpression) -> int | None:
        """The rank of an integer index (a tensor, or a loop counter: 0), when the source states it."""
        if not self.integer(index):
            return None
        low, high = self.bounds(index)
        return low if low == high else None

    def _call_bounds(self, node: cst.Call, below: Callable[[cst.BaseExpression], Bounds]) -> Bounds:
        args = [a for a in node.args if a.keyword is None and a.star != "**"]  # `**dd` passes keywords only
        dotted = self.parsed.imported_name(node.func) or ""
        if dotted in CREATORS and args and not any(a.star for a in args):
            sizes = args[:1] if dotted == "torch.full" else args[-1:] if dotted == "torch.randint" else args
            if len(sizes) == 1 and isinstance(sizes[0].value, (cst.Tuple, cst.List)):
                return _exact(len(sizes[0].value.elements))
            return _exact(len(sizes)) if dotted not in ("torch.full", "torch.randint") else UNKNOWN
        if dotted in RANK_KEEPING_FUNCTIONS and args:
            return below(args[0].value)
        if dotted in EINOPS_PATTERNS and len(args) >= 2:
            axes = pattern_output_axes(literal_string(args[1].value))
            return UNKNOWN if axes is None else _exact(axes)
        if isinstance(node.func, cst.Attribute):
            method, receiver = node.func.attr.value, node.func.value
            if method in ("new_empty", "new_zeros", "new_ones", "new_full") and args and not any(a.star for a in args):
                sizes = args[0].value
                if isinstance(sizes, (cst.Tuple, cst.List)):
                    return _exact(len(sizes.elements))
                varargs = method != "new_full" and (len(args) > 1 or int_value(sizes) is not None)
                return _exact(len(args)) if varargs else UNKNOWN  # one name may hold a whole size
            if method in ("unsqueeze", "unsqueeze_"):
                low, high = below(receiver)
                return low + 1, None if high is None else high + 1
            if method in ("view", "reshape", "expand") and args and not any(a.star for a in args):
                if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
                    return _exact(len(args[0].value.elements))
                return _exact(len(args)) if len(args) > 1 or int_value(args[0].value) is not None else UNKNOWN
            if method in RANK_KEEPING:
                return below(receiver)
            if method == "masked_fill" and args:  # broadcast against its mask (breaker round 36)
                return broadcast_bounds([below(receiver), below(args[0].value)])
            if method in SHAPE_ONLY_ARGUMENT and len(args) == 1 and not args[0].star:
                return below(args[0].value)
        op = self.reader.read(node)
        if op is not None and op.name == "where":
            return broadcast_bounds([below(operand) for operand in op.operands])
        if op is not None and op.name in ("matmul", "bmm"):  # of operands of 2 dims or more: their broadcast rank
            found = [below(operand) for operand in op.operands]
            return broadcast_bounds(found) if all(low >= 2 for low, _ in found) else UNKNOWN
        returned = self.returned(node)
        return below(returned) if returned is not None else UNKNOWN


def pattern_output_axes(pattern: str | None) -> int | None:
    """The number of axes right of an einops pattern's `->` (`'b j -> b 1 1 j'`: 4; a parenthesised group, `()`
    too, is one axis); None for no pattern, one with an ellipsis (its axes are the input's), or parentheses einops
    rejects (nested or unbalanced)."""
    if pattern is None or pattern.count("->") != 1 or "..." in pattern or "…" in pattern:
        return None
    words = re.sub(r"\([^()]*\)", " () ", pattern.split("->")[1]).split()
    return None if any(word != "()" and ("(" in word or ")" in word) for word in words) else len(words)


def _exact(rank: int) -> Bounds:
    return rank, rank


def _union(options: list[Bounds]) -> Bounds:
    """One of several values: its rank is within the widest bounds."""
    highs = [high for _, high in options]
    return min(low for low, _ in options), None if None in highs else max(highs)


def broadcast_bounds(operands: list[Bounds]) -> Bounds:
    """Broadcasting gives the largest rank of its operands."""
    highs = [high for _, high in operands]
    return max(low for low, _ in operands), None if None in highs else max(highs)


def _subscript_bounds(node: cst.Subscript, base: Bounds,
                      gathered: Callable[[cst.BaseExpression], int | None] = lambda index: None) -> Bounds:
    """`m[:, None, None, :]`: rank(m) - integers + Nones, and m has at least as many dims as are indexed; one
    integer tensor index of known rank r (`table[:, idx]`, a gather) reads one dim and gives r."""
    indexed = nones = integers = given = 0
    tensors = 0
    for element in node.slice:
        index = element.slice
        if isinstance(index, cst.Slice):
            indexed += 1
        elif isinstance(index.value, cst.Name) and index.value.value == "None":
            nones += 1
        elif isinstance(index.value, cst.Ellipsis):
            continue
        elif int_value(index.value) is not None:
            indexed += 1
            integers += 1
        elif tensors == 0 and gathered(index.value) is not None:
            tensors = 1
            indexed += 1
            integers += 1
            given = gathered(index.value)
        else:
            return UNKNOWN  # a boolean or computed index, or several tensors: advanced indexing, rank unknown
    low, high = base
    low = max(low, indexed)
    return low - integers + nones + given, None if high is None else high - integers + nones + given


def record_row_facts(parsed: ParsedModule, facts: FactSheet, terms: list, added_claims: tuple = (),
                     bounded: str | None = None, uniform: tuple[str, ...] | None = None,
                     zeroed: str | None = None) -> None:
    """The fully-masked-row fact of the masks a rewrite passes to SDPA (see the module docstring). `added_claims`:
    what every call must pass for added masks of parameters to swallow no row (values the call sites may show);
    `bounded`: why every mask is added and its values, visible where it is built, are too small to swallow a row;
    `uniform`: every mask is one finite fill whose fully masked rows the patch makes uniform
    (`attention.uniform_rows`), with the float dtypes the fill overflows; `zeroed`: why the original zeroes the
    weights of every masked key after its softmax, so that a fully masked row is 0 in both (`attention.zeroed_rows`)."""
    if not terms:
        return
    at = next((i for i, term in enumerate(terms) if term.fill_kind != ADDITIVE and not term.learned), None)
    if at is not None:
        replacing = terms[at]
        applied = parsed.code(replacing.statement or replacing.expression).strip().splitlines()[0]
        added = any(term.fill_kind == ADDITIVE for term in terms[:at])
        facts.accepted(REPLACED_SCORES, REPLACED_STATEMENT, f"`{applied}` "
                       "discards whatever a masked score is, while SDPA adds its mask to the score (a boolean one as "
                       "-inf), which keeps a NaN: a NaN or inf key at a padded position gives the patch NaN rows "
                       "where the original has none" + ("; SDPA also adds the masks added before it, where a value "
                                                        "of +inf, or one that cancels the fill (`finfo.max` against "
                                                        "`finfo.min`), gives a masked key weight (breaker round 56)"
                                                        if added else ""))
    finite = next((term for term in terms if term.fill_kind == FINITE), None)
    if finite is not None:
        facts.accepted(FINITE_FILL, f"a key the finite fill `{parsed.code(finite.fill)}` masks weighs 0, as in "
                       f"the original", "SDPA gives it 0; the original exp(fill - row max), which underflows to 0 "
                       "wherever the row's largest kept score exceeds the fill by more than about 104 (float32, "
                       "bfloat16) or 745 (float64)")
    if zeroed is not None:
        facts.proved(ROWS, "a fully masked query row comes out as in the original: 0", zeroed)
        return
    if uniform is not None:
        _record_uniform_rows(parsed, facts, terms[0].fill, uniform)
        return
    learned = [term for term in terms if term.learned]
    if learned:
        facts.accepted(ROWS, "no learned bias swallows a query row's scores",
                       f"`{parsed.code(learned[0].source)}` is read from the learned table `{learned[0].learned}` (an "
                       f"`nn.Parameter` no code here fills with a mask value): a score term, which SDPA adds as the "
                       f"original does; only entries about 2^24 times a row's scores (fp32), which no trained table "
                       f"holds, would swallow the row and give SDPA's fused backward other gradients")
        terms = [term for term in terms if not term.learned]
        if not terms:
            return
    if all(term.keeps_first_key for term in terms):
        facts.proved(ROWS, "no query row is fully masked", "every mask is a lower triangle of ones sliced from "
                     "its first column (causal), which keeps the first key of every row")
        return
    if all(term.keeps_first_key or term.bottom_right for term in terms):
        facts.assumed(ROWS, "no query row is fully masked", "a causal triangle aligned bottom-right "
                      "(`ones(L, S).triu(S - L + 1)`) keeps key 0 in every row only where there are at least as many "
                      "keys as queries")
        return
    finite = [term for term in terms if term.fill_kind == FINITE]
    if finite:
        facts.assumed(ROWS, "no query row is fully masked",
                      f"a row masked everywhere by the finite fill `{parsed.code(finite[0].fill)}` is uniform in the "
                      f"original, and in SDPA only where the fill swallows the scores (fp32 `finfo.min` does, "
                      f"fp16's or `-1e4` do not), even then with other gradients for that row (SDPA's backward "
                      f"recomputes the weights from a log-sum-exp the fill swallowed too); nothing proves every row "
                      f"keeps a key")
        return
    rebound = next((term for term in terms if term.learned_rebound), None)
    if rebound is not None:
        table, why = rebound.learned_rebound
        facts.assumed(ROWS, "no query row is fully masked",
                      f"`{parsed.code(rebound.source)}` reads the learned table `{table}` as its class builds it "
                      f"(a score term), but {why}, so an instance's table, index or memo may be another value, "
                      f"a mask among them")  # no call site can show an attribute's value: no claims
        return
    if bounded is not None:
        facts.proved(ROWS, "no query row is fully masked", bounded)
        return
    added = [term for term in terms if term.fill_kind == ADDITIVE]
    if added:
        codes = [" ".join(parsed.code(term.source).split()) for term in added if term.source is not None]
        names = ", ".join(dict.fromkeys(f"`{code}`" for code in codes if len(code) <= 60))  # a name, not a formula
        facts.assumed(ROWS, "no query row is fully masked",
                      f"the values of the added mask{f' {names}' if names else ''} are not visible here: where they "
                      "swallow a whole row's scores (a "
                      "padded sample under `(1 - m) * finfo.min`), the original's weights are uniform while SDPA's "
                      "fused backward gives other gradients, and a mask cast to a bf16/fp16 query turns fp32 "
                      "`finfo.min` into -inf (rows of 0); nothing proves every row keeps a key", added_claims)
        return
    facts.accepted(ROWS, "a fully masked query row gives 0 where the original gives NaN",
                   "SDPA's softmax returns 0 for a row of -inf and the original NaN, which no working model reads")


UNIFORM = "a fully masked query row comes out as in the original: uniform weights, the mean of v"


def _record_uniform_rows(parsed: ParsedModule, facts: FactSheet, fill: cst.BaseExpression,
                         unfit: tuple[str, ...]) -> None:
    why = (f"every mask replaces the scores with the one finite fill `{parsed.code(fill)}` (masked_fill/where), so "
           f"a row masked everywhere is constant and the original's weights there are exactly uniform; the patch "
           f"passes SDPA the boolean keep mask with such rows opened to every key and their query zeroed "
           f"(`where(rows, q, 0)`, `keep | ~rows`, rows = `keep.any(-1, keepdim=True)`), so SDPA's weights there "
           f"are uniform too (softmax of zeros; dropout drops them as it drops the original's) and q and k get no "
           f"gradient from the row, as masked_fill passes none (the other rows: {FINITE_FILL})")
    if unfit:
        facts.assumed(ROWS, UNIFORM, f"{why}; the fill overflows {', '.join(unfit)} (the original's masked_fill "
                      f"raises, or a cast before its softmax makes the fill -inf and its fully masked rows NaN), so "
                      f"the original must run there")
    autocast = [dtype for dtype in unfit if dtype in ("float16", "bfloat16")]
    if autocast:
        facts.accepted(AUTOCAST_FILL, f"the fill `{parsed.code(fill)}` fits the scores' dtype wherever q's does",
                       f"under `torch.autocast` to {' or '.join(autocast)} q keeps its own dtype while Q·K^T gives "
                       f"{autocast[0]} scores, so the original's masked_fill raises where the guard, which reads q's "
                       f"dtype, takes the SDPA path: a program that raised runs (breaker round 37); TorchScript "
                       f"cannot compile the check of autocast's dtype, and it raises on meta tensors")
    else:
        facts.proved(ROWS, UNIFORM, why)
