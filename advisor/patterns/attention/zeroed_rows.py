"""Weights zeroed where the mask masks, after the softmax (ESPnet's, WeNet's and icefall's attention):

    scores = scores.masked_fill(mask, -inf)          # or finfo(scores.dtype).min, -1e4
    attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)

On a row that keeps a key the masked weights are 0 already (exp(fill - max) is 0), so the second fill changes
nothing; on a row masked everywhere the original's weights (NaN under -inf, uniform under a finite fill) become 0,
which is what SDPA gives a row its boolean mask masks everywhere. The second fill is then no step of its own, and
`fully-masked-rows` is proved for that mask: SDPA's output and gradients are the original's on every row
(measured in tests/static/test_zeroed_rows.py, fp32 and fp64, -inf, `finfo.min` and -1e4 fills). It holds only where
the zeroing mask is the one mask of the block, applied by `masked_fill` with the same polarity: the same expression,
calling nothing and reading the same bindings, none rebound between the two fills, before any transpose of the
weights; another mask (a causal one beside it) would leave a row the zeroing does not reach. A finite fill must be
one no float dtype overflows (the original's masked_fill raises on `-1e9` in float16; the boolean mask would not).
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import masks as mk
from advisor.patterns.attention.candidate import Candidate, defined_between, statement_of
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.patterns.attention.uniform_rows import OWN, fill_of
from advisor.patterns.values import FLOAT_MAX
from advisor.static.dataflow import loaded_names
from advisor.static.walk import descendants

FILLS = ("masked_fill", "masked_fill_")


def zeroed_mask_term(c: Candidate) -> MaskTerm | None:
    """The mask term whose masked keys `c.zeroing` zeroes after the softmax (None without a zeroing); a Refusal
    where the zeroing is not provably that mask's."""
    if c.zeroing is None:
        return None
    zero_mask = c.zeroing.params["mask"]
    refusal = Refusal(f"the attention weights pass through `{short(c.parsed, c.zeroing.node)}` before the value "
                      "product, whose mask is not provably the one mask the scores are filled with (SDPA applies "
                      "nothing between its softmax and its value product)")
    terms = c.match.masks
    if len(terms) != 1:
        raise refusal
    term = terms[0]
    if term.fill_kind == mk.ADDITIVE or term.learned or term.optional or not term.nodes or \
            not _filled_by_masked_fill(c, term.nodes[0]) or \
            term.guard is not None and not c.parsed.within(c.zeroing.node, term.guard.body):
        raise refusal  # a fill under an `if` with its zeroing in the same branch (the other one has no mask)
    masked = term.nodes[0]
    if c.parsed.code(masked).strip() != c.parsed.code(zero_mask).strip() or descendants(zero_mask, (cst.Call,)):
        raise refusal  # a call gives another tensor each time (`torch.rand(...) > 0.5` twice: breaker round 34)
    if term.fill_kind == mk.FINITE and not _fits_every_float(c, term):
        raise Refusal(f"the fill `{short(c.parsed, term.fill)}` overflows float16, where the original's "
                      "masked_fill raises and the patch (a boolean mask) would not")
    for first, second in zip(loaded_names(masked), loaded_names(zero_mask)):
        if c.flow.reaching.get(first) != c.flow.reaching.get(second) or \
                defined_between(c, second, statement_of(c.parsed, masked), c.zeroing.node,
                                start_at_end=True) is not None:
            raise refusal
    return term


def zeroed_rows_reason(c: Candidate, term: MaskTerm) -> str:
    return (f"`{short(c.parsed, c.zeroing.node)}` sets the weights of the keys `{short(c.parsed, term.nodes[0])}` "
            "masks to 0 after the softmax: a row that keeps a key has 0 there already, and a row masked everywhere "
            "becomes 0, as SDPA makes it; the patch passes SDPA that mask")


def _fits_every_float(c: Candidate, term: MaskTerm) -> bool:
    """The finite fill is its own tensor's dtype's extreme, or a number float16 holds: the original's masked_fill
    never raises on it (breaker round 34: -1e9 on float16 scores raises there; a boolean mask does not)."""
    fill = fill_of(c, term)
    return fill == OWN or isinstance(fill, float) and abs(fill) <= FLOAT_MAX["float16"]


def _filled_by_masked_fill(c: Candidate, masked: cst.BaseExpression) -> bool:
    """`masked` is the mask argument of a `masked_fill` (True = masked), not a `where` condition."""
    arg = c.parsed.parents.get(masked)
    call = c.parsed.parents.get(arg) if isinstance(arg, cst.Arg) else None
    return isinstance(call, cst.Call) and (
        isinstance(call.func, cst.Attribute) and call.func.attr.value in FILLS or
        isinstance(call.func, cst.Name) and call.func.value in FILLS)

