"""The order of the proof: for each softmax of a function, a fresh candidate is screened, then each role is
proved in turn by its module; the first role that cannot be proved ends the candidate with its reason.

A bug of ours on one block becomes that block's "internal error" reason rather than losing the file's other
matches. The if/else twin of a matched softmax is claimed by that match and not tried again.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import scope
from advisor.patterns.attention import anchors, flags, products, scores, weights
from advisor.patterns.attention.attn_mask import assemble_mask
from advisor.patterns.attention.block_checks import check_bindings, check_escapes, check_reads, check_scope
from advisor.patterns.attention.candidate import Candidate, FunctionScope, in_inlined, statement_of
from advisor.patterns.attention.guards import plan_guards
from advisor.patterns.attention.helpers import dotted_name
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import AttentionMatch, Refusal
from advisor.patterns.attention.scale import scale_and_mask_roles
from advisor.patterns.attention.score_mods import flex_roles
from advisor.patterns.attention.tensor_facts import mask_and_dtype_facts
from advisor.patterns.attention.tensor_scale import fold_into_query
from advisor.patterns.ops import Op, OpReader
from advisor.static.module_index import ClassInfo, ParsedModule


def find_attention(parsed: ParsedModule) -> list[AttentionMatch]:
    matches: list[AttentionMatch] = []
    for function, owner, name in parsed.functions:
        if not anchors.mentions_softmax(parsed, owner.node if owner is not None else function):
            continue
        matches.extend(_match_function(parsed, function, owner, name))
    return matches


def _match_function(parsed: ParsedModule, function: cst.FunctionDef, owner: ClassInfo | None,
                    name: str) -> list[AttentionMatch]:
    shared = FunctionScope(parsed, function, owner, name, OpReader(parsed, owner))
    results, claimed = [], set()
    for softmax in anchors.softmaxes(shared.reader, function):
        if statement_of(parsed, softmax.node) in claimed:
            continue  # the twin softmax of an if/else already matched with its sibling
        match = _match(shared, softmax)
        if match is not None:
            results.append(match)
            claimed.update(match.removed)
    return results


def _match(shared: FunctionScope, softmax: Op) -> AttentionMatch | None:
    """The block as the function runs, or, where its weights leave it or it is refused, as the function runs with
    a flag off that asks for the weights (`if output_attentions:`), when that proof keeps them inside."""
    match = _attempt(Candidate.start(shared), softmax)
    if match is None or match.output_node is not None and not match.escapes:
        return match
    for off in flags.flag_worlds(shared, softmax):
        flagged = _attempt(Candidate.start(shared, off), softmax)
        if flags.stays_inside(flagged):
            return flagged
    return match


def _attempt(c: Candidate, softmax: Op) -> AttentionMatch | None:
    """One candidate: None when it does not look like attention, else a match or the reason there is none."""
    if not anchors.looks_like_attention(c, softmax):
        return None
    statement = statement_of(c.parsed, softmax.node)
    if anchors.is_guarded_fallback(c.parsed, statement):
        return None
    match = AttentionMatch(c.scope.name, c.parsed.line(statement), c.parsed.end_line(statement))
    c.match, c.softmax = match, softmax
    try:
        _prove(c)
    except Refusal as refusal:
        leaves = anchors.weights_leave(c, softmax)
        match.reason = str(refusal) if leaves is None or leaves in str(refusal) else f"{refusal}; also, {leaves}"
        match.output_node = None
    except (RecursionError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug of ours on one block must not lose the file's others
        match.reason = f"internal error while proving this block ({type(exc).__name__}: {exc}); please report it"
        match.output_node, match.removed = None, []
    match.note = anchors.sdpa_on_other_branch(c.parsed, statement, c.owner)
    return match


def _prove(c: Candidate) -> None:
    match, softmax, parsed = c.match, c.softmax, c.parsed
    if softmax.params.get("unread"):
        raise Refusal(anchors.unread_softmax(c, softmax))
    twin = anchors.twin_softmax(c, softmax)
    if twin is not None:
        c.chain.twin, c.chain.twin_input = twin
    core = scores.peel_scores(c, softmax.operands[0])
    ndim = products.core_roles(c, core)
    products.check_softmax_dim(c, softmax, ndim)
    stages = softmax.params.get("stages", [])[1:] if softmax.name == "sequential" else []
    dropouts = [stage for stage in stages if stage.name == "dropout"]
    if len(dropouts) != len(stages):
        raise Refusal("the softmax module is followed by a module that is not dropout")
    if (softmax.params["stages"][0] if softmax.name == "sequential" else softmax).params.get("dtype") is not None:
        c.dtype_changes.append(softmax)
    c.weights = path = weights.follow_weights(c, softmax.node, ndim)
    buffer = scope.out_argument(path.output.node)
    if buffer is not None:
        raise Refusal(f"the value product writes into `out={short(parsed, buffer)}`, which SDPA cannot fill")
    dropouts += path.dropouts
    match.escapes = path.escapes
    weights.value_roles(c, core)
    weights.dropout_role(c, dropouts)
    scale_and_mask_roles(c)
    consumed = c.chain.definitions + path.definitions
    check_reads(c, consumed, c.chain.reads | path.reads | c.absorbed)
    assemble_mask(c)
    mask_and_dtype_facts(c, ndim)
    output_statement = statement_of(parsed, path.output.node)
    match.output_node = path.output.node
    kept = {output_statement} | set(match.hoisted)
    match.removed = _unique([d.statement for d in consumed
                             if d.statement not in kept and not in_inlined(c, d.statement)])
    if any(in_inlined(c, node) for node in match.renamed):
        raise Refusal("a helper reads the scores' shape or dtype, and helpers are never edited")
    match.function = dotted_name(c, c.home)
    lines = [parsed.line(s) for s in match.removed] + [parsed.line(output_statement)]
    match.line, match.end_line = min(lines), parsed.end_line(output_statement)
    check_bindings(c, output_statement)
    check_scope(c, output_statement, consumed)
    weights.layout_role(c)
    check_escapes(c)
    fold_into_query(c, ndim)
    flags.plan_flag(c, output_statement)
    plan_guards(c, output_statement)
    flex_roles(c)


def _unique(items: list) -> list:
    seen, out = set(), []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out
