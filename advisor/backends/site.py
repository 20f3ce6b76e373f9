"""What a static scan knows about the SDPA call a proved attention block becomes, and the backend plan for it.

Only what the rewrite itself passes is known statically (mask kind, causal form, dropout, a broadcast K/V head
axis); dtype, device, rank and head dim are left unknown, so the verdicts say what must hold at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from advisor.backends.bottom_right_causal import is_bottom_right_causal
from advisor.backends.eligibility import SiteFacts, Verdict, backend_eligibility, to_json
from advisor.patterns.attention import AttentionMatch
from advisor.patterns.einsum import ELLIPSIS, EinsumMismatch, parse_spec
from advisor.patterns.ops import OpReader, int_value
from advisor.patterns.facts import Fact, ASSUMED
from advisor.static.module_index import ParsedModule
from advisor.static.walk import walk

NOT_ON_GPU = "emitted code for this backend has not been run on a GPU by advisor"


@dataclass
class BackendPlan:
    """The verdicts for one site, and what `--backend` gets there: `emitted` may fall back to "sdpa" (with
    the reason); a flash wrap whose conditions are not known statically carries them as an assumed fact."""

    requested: str
    emitted: str
    verdicts: dict[str, Verdict]
    reason: str | None = None
    assumptions: list[Fact] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        emission = {"requested": self.requested, "emitted": self.emitted, "reason": self.reason}
        if self.emitted != "sdpa":
            emission["gpu_verified"] = False
        return {"backends": to_json(self.verdicts), "emission": emission}


def site_facts(parsed: ParsedModule, match: AttentionMatch) -> SiteFacts:
    mask, conditional, causal_guard = _mask_kind(parsed, match)
    dropout = None if match.dropout_p is None else parsed.code(match.dropout_p)
    return SiteFacts(mask=mask, mask_conditional=conditional, causal_guard=causal_guard, dropout=dropout,
                     bottom_right_causal=is_bottom_right_causal(parsed, match),
                     kv_heads="broadcast" if _broadcast_heads(match) else None, rank=_rank(parsed, match),
                     transposed=tuple(parsed.code(node) for node in (match.query, match.key, match.value)
                                      if _last_two_swapped(node)))


def plan_backend(parsed: ParsedModule, match: AttentionMatch, requested: str = "sdpa") -> BackendPlan:
    facts = site_facts(parsed, match)
    verdicts = backend_eligibility(facts)
    verdicts["flex"] = Verdict(True, "flex_attention takes every step of the scores") if match.flex is not None \
        else Verdict(False, match.flex_refusal or "not analysed")
    if requested == "sdpa":
        return BackendPlan(requested, "sdpa", verdicts)
    if requested == "flex":
        if match.flex is None:
            return BackendPlan(requested, "sdpa", verdicts, reason=f"kept SDPA: flex not eligible ({match.flex_refusal})")
        return BackendPlan(requested, "flex", verdicts, reason=NOT_ON_GPU)
    key = "sdpa-flash" if requested == "flash" else "flash-attn"
    verdict = verdicts[key]
    if key == "flash-attn" and match.flash_attn_refusal is not None:
        return BackendPlan(requested, "sdpa", verdicts, reason=f"kept SDPA: {match.flash_attn_refusal}")
    if key == "flash-attn" and (facts.mask not in ("none", "causal") or facts.mask_conditional):
        # the helper call passes no attn_mask: a mask built under an `if` would be dropped wherever it is built
        return BackendPlan(requested, "sdpa", verdicts, reason=f"kept SDPA: flash_attn_func takes no mask, and this "
                           f"site passes a {facts.mask} mask{' built under an `if`' if facts.mask_conditional else ''}")
    if verdict.eligible is False:
        return BackendPlan(requested, "sdpa", verdicts, reason=f"kept SDPA: {key} not eligible ({verdict.reason})")
    if requested == "flash" and facts.transposed:  # pinning flash on a strided input raises instead of falling back
        return BackendPlan(requested, "sdpa", verdicts, reason=f"kept SDPA: {', '.join(facts.transposed)} passed "
                           "transposed; the flash kernel needs last-dim stride 1, and pinning it would raise")
    assumptions = []
    if requested == "flash" and verdict.eligible is None:  # sdpa_kernel(FLASH_ATTENTION) raises when it cannot run
        assumptions.append(Fact("flash-eligible", "the CUDA flash kernel accepts this call at run time", ASSUMED,
                                verdict.reason))
    return BackendPlan(requested, requested, verdicts, reason=NOT_ON_GPU, assumptions=assumptions)


def _mask_kind(parsed: ParsedModule, match: AttentionMatch) -> tuple[str, bool, str | None]:
    """(mask kind as SDPA receives it, built only under an `if`, the guard of a lone conditional causal mask)."""
    if match.is_causal:
        return "causal", False, None
    if match.attn_mask is None:
        return "none", False, None
    terms = match.masks
    kinds = {"keep" if term.kind == "causal" else term.kind for term in terms}
    kind = "bool" if kinds == {"keep"} else "float"
    guarded = [term for term in terms if term.guard is not None]
    if not guarded:
        return kind, False, None
    lone = terms[0] if len(terms) == 1 else None
    causal_guard = None
    if lone is not None and lone.kind == "causal" and lone.reshape is None and _in_body(parsed, lone):
        causal_guard = parsed.code(lone.guard.test)
    return kind, True, causal_guard


def _in_body(parsed: ParsedModule, term) -> bool:
    """The term is applied in its guard's `if` body (not an `else`): the guard's test is when it applies."""
    node = term.statement
    while node is not None:
        parent = parsed.parents.get(node)
        if parent is term.guard:
            return node is term.guard.body
        node = parent
    return False


def _rank(parsed: ParsedModule, match: AttentionMatch) -> int | None:
    """The rank SDPA's inputs will have, where the block's products fix it: `bmm`/`baddbmm` take 3-D tensors
    only, and an einsum's output (..., query, key) has the rank the rewrite gives q. None when not fixed."""
    collector = _ProductCollector(OpReader(parsed, None))
    for node in [*match.removed, match.output_node]:
        walk(node, collector)
    return collector.ranks.pop() if len(collector.ranks) == 1 else None


class _ProductCollector(cst.CSTVisitor):
    def __init__(self, reader: OpReader) -> None:
        self.reader, self.ranks = reader, set()

    def visit_Call(self, node: cst.Call) -> None:
        op = self.reader.read(node)
        if op is None:
            return
        if op.name in ("bmm", "baddbmm"):
            self.ranks.add(3)
        elif op.name == "einsum":
            try:
                _, output = parse_spec(op.params["spec"], op.params["einops"])
            except EinsumMismatch:
                self.ranks.add(None)
                return
            self.ranks.add(None if ELLIPSIS in output else len(output))


def _broadcast_heads(match: AttentionMatch) -> bool:
    """K and V passed with a size-1 head axis (`k.unsqueeze(1)`, multi-query einsum): SDPA broadcasts it, but
    without enable_gqa every fused kernel refuses the unequal head counts."""
    return all(_method_call(node) == ("unsqueeze", [1]) for node in (match.key, match.value))


def _last_two_swapped(node: cst.BaseExpression) -> bool:
    """`x.transpose(-2, -1)` / `x.transpose(-1, -2)` / `x.mT`: the rewrite's explicit K^T undo and
    channel-major inputs."""
    return isinstance(node, cst.Attribute) and node.attr.value == "mT" or \
        _method_call(node) in (("transpose", [-2, -1]), ("transpose", [-1, -2]))


def _method_call(node: cst.BaseExpression) -> tuple[str, list[int | None]] | None:
    """(method, integer arguments) when `node` is one method call on something, else None."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
        return None
    return node.func.attr.value, [int_value(arg.value) for arg in node.args]
