"""The order of the proof: for each softmax of a function, a fresh candidate is screened, then each role is
proved in turn by its module; the first role that cannot be proved ends the candidate with its reason.

A bug of ours on one block becomes that block's "internal error" reason rather than losing the file's other
matches. The if/else twin of a matched softmax is claimed by that match and not tried again.
"""

from __future__ import annotations

import libcst as cst

from advisor.contracts.emitted_names import FLEX_HELPER_NAME, is_flex_prelude_function
from advisor.patterns import scope
from advisor.patterns.attention import anchors, flags, products, scores, weights
from advisor.patterns.attention.attn_mask import assemble_mask
from advisor.patterns.attention.block_checks import check_bindings, check_escapes, check_reads, check_scope
from advisor.patterns.attention.candidate import Candidate, FunctionScope, in_inlined, statement_of
from advisor.patterns.attention.guards import plan_guards, refuse_unguarded_modules
from advisor.patterns.attention.helpers import dotted_name
from advisor.patterns.attention.layout import layout_role
from advisor.patterns.attention.lengths import kv_length_fact
from advisor.patterns.attention.operand_ranks import operand_rank_fact
from advisor.patterns.attention.proof_steps import ProofOrderError, run_steps, step
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import AttentionMatch, Refusal
from advisor.patterns.attention.scale import scale_and_mask_roles
from advisor.patterns.attention.score_mods import flex_roles
from advisor.patterns.attention.nan_keys import nan_key_fact
from advisor.patterns.attention.tensor_facts import mask_and_dtype_facts
from advisor.patterns.attention.tensor_scale import fold_into_query
from advisor.patterns.attention.uniform_rows import keep_term, plan_row_fixup
from advisor.patterns.attention.zeroed_rows import zeroed_mask_term, zeroed_rows_reason
from advisor.patterns.masks import ROWS
from advisor.patterns.ops import Op, OpReader
from advisor.static.module_index import ClassInfo, ParsedModule


def find_attention(parsed: ParsedModule) -> list[AttentionMatch]:
    """The attention blocks of the module's functions, but for the flex helper a patch pasted into it."""
    matches: list[AttentionMatch] = []
    patched = FLEX_HELPER_NAME in parsed.module_functions
    for function, owner, name in parsed.functions:
        if patched and owner is None and is_flex_prelude_function(name.split(".")[0]):  # nested defs too
            continue
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
    a flag off that asks for the weights (`if output_attentions:`), when that proof keeps them inside. A block
    whose masks together leave fully masked rows unproved, each under its own `if m is not None:` (a bias added,
    then a padding fill), is safe only where no mask is passed (`guards.settle_guards`): the path without one of
    them is preferred where it proves the rows with the others passed to SDPA."""
    match = _attempt(Candidate.start(shared), softmax)
    if match is None:
        return None
    proved = match.output_node is not None and not match.escapes
    if proved and not _rows_need_absent_masks(match):
        return match
    for off in flags.flag_worlds(shared, softmax):
        flagged = _attempt(Candidate.start(shared, off), softmax)
        if flags.stays_inside(flagged) and (not proved or _rows_proved_with_masks(flagged)):
            return _fewest_flags(shared, softmax, off, flagged)
    return match


def _rows_need_absent_masks(match: AttentionMatch) -> bool:
    """Several masks, under `if` statements, with the fully-masked-rows fact assumed: a safe patch runs SDPA only
    where none is passed. (With one mask, no path keeps a mask, and no other proof is tried.)"""
    return match.absent_under_if is not None and len(_masks(match)) > 1 and \
        any(fact.name == ROWS for fact in match.facts.assumptions)


def _rows_proved_with_masks(match: AttentionMatch) -> bool:
    return bool(_masks(match)) and not any(fact.name == ROWS for fact in match.facts.assumptions)


def _masks(match: AttentionMatch) -> list:
    """The mask terms that are masks (a learned bias, such as Swin's relative positions, is not: see `masks`)."""
    return [term for term in match.masks if not term.learned]


def _fewest_flags(shared: FunctionScope, softmax: Op, off: frozenset, match: AttentionMatch) -> AttentionMatch:
    """The proof with every flag turned off that need not be (BERT's `if self.is_decoder:` beside its head mask and
    `output_attentions`): the SDPA path then runs whatever those flags say."""
    for group in flags.by_flag(shared.parsed, off):
        if len(group) < len(off):
            fewer = _attempt(Candidate.start(shared, off - group), softmax)
            if flags.stays_inside(fewer):
                off, match = off - group, fewer
    return match


def _attempt(c: Candidate, softmax: Op) -> AttentionMatch | None:
    """One candidate: None when it does not look like attention, else a match or the reason there is none."""
    statement = statement_of(c.parsed, softmax.node)
    if not anchors.looks_like_attention(c, softmax):
        split = anchors.scores_from_caller(c, softmax)
        if split is None or split in c.scope.split_reported:
            return None  # not attention, or a softmax of a block already reported (`if mask: ... else: ...`)
        c.scope.split_reported.add(split)
        return AttentionMatch(c.scope.name, c.parsed.line(statement), c.parsed.end_line(statement), reason=split)
    if anchors.is_guarded_fallback(c.parsed, statement):
        return None
    match = AttentionMatch(c.scope.name, c.parsed.line(statement), c.parsed.end_line(statement))
    without = anchors.fallback_without_sdpa(c.parsed, statement, c.owner)
    if without is not None:
        match.reason = without
        return match
    c.match, c.softmax = match, softmax
    try:
        run_steps(PROOF, c)
    except Refusal as refusal:
        leaves = anchors.weights_leave(c, softmax)
        match.reason = str(refusal) if leaves is None or leaves in str(refusal) else f"{refusal}; also, {leaves}"
        match.output_node = None
    except (RecursionError, MemoryError, ProofOrderError):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug of ours on one block must not lose the file's others
        match.reason = f"internal error while proving this block ({type(exc).__name__}: {exc}); please report it"
        match.output_node, match.removed = None, []
    if c.home is not c.function and anchors.is_guarded_fallback(c.parsed, statement_of(c.parsed,
                                                                                   c.inlined[c.function][0])):
        return None  # the block's caller is the original a guarded patch keeps (a second pass changes nothing)
    match.note = anchors.sdpa_on_other_branch(c.parsed, statement, c.owner)
    return match


@step()
def softmax_is_read(c: Candidate) -> None:
    """The softmax's result is read (an unread one is refused with what it computes)."""
    if c.softmax.params.get("unread"):
        raise Refusal(anchors.unread_softmax(c, c.softmax))


@step(reads="flow", writes="chain.twin chain.twin_input")
def twin_softmax(c: Candidate) -> None:
    """The softmax of the other branch of an `if` that ends in one too (read as one block)."""
    twin = anchors.twin_softmax(c, c.softmax)
    if twin is not None:
        c.chain.twin, c.chain.twin_input = twin


@step(reads="chain.twin chain.twin_input home",
      writes=("absorbed chain.definitions chain.factor_guards chain.guard_negated chain.negated_factors "
              "chain.ops chain.reads core dtype_changes flow inlined match.facts values"))
def score_chain(c: Candidate) -> None:
    """The scores walked back to Q·K^T: the ops on the way, their guards, the casts, the helpers entered."""
    c.core = scores.peel_scores(c, c.softmax.operands[0])


@step(reads="chain.ops core flow inlined values",
      writes="dtype_changes factors has_ellipsis layout leaf_nodes match.key match.masks match.query ndim "
             "operands_as_written product_casts")
def core_roles(c: Candidate) -> None:
    """Q and K from Q·K^T (with baddbmm's factor and bias), the scores' rank, a softmax over the keys."""
    for op in [c.core, *(op for op, _ in c.chain.ops)]:  # `torch.bmm(q, k_t, out=scores)`: a buffer (round 33)
        buffer = scope.out_argument(op.node)
        if buffer is not None:
            raise Refusal(f"`{short(c.parsed, op.node)}` writes the scores into `out={short(c.parsed, buffer)}`, "
                          "which the patch would leave unwritten")
    c.ndim = products.core_roles(c, c.core)
    products.check_softmax_dim(c, c.softmax, c.ndim)


@step(writes="dtype_changes softmax_dropouts")
def softmax_stages(c: Candidate) -> None:
    """The modules of an `nn.Sequential` softmax: dropout only; a softmax `dtype=` is a cast."""
    softmax = c.softmax
    stages = softmax.params.get("stages", [])[1:] if softmax.name == "sequential" else []
    c.softmax_dropouts = [stage for stage in stages if stage.name == "dropout"]
    if len(c.softmax_dropouts) != len(stages):
        raise Refusal("the softmax module is followed by a module that is not dropout")
    if (softmax.params["stages"][0] if softmax.name == "sequential" else softmax).params.get("dtype") is not None:
        c.dtype_changes.append(softmax)


@step(reads="chain.twin ndim", writes="absorbed dtype_changes flow home inlined match.escapes values weights zeroing")
def weight_path(c: Candidate) -> None:
    """The weights walked forward to the value product: what they pass through, where they leave."""
    c.weights = path = weights.follow_weights(c, c.softmax.node, c.ndim)
    buffer = scope.out_argument(path.output.node)
    if buffer is not None:
        raise Refusal(f"the value product writes into `out={short(c.parsed, buffer)}`, which SDPA cannot fill")
    c.match.escapes = path.escapes


@step(reads="core flow has_ellipsis inlined layout values weights",
      writes="leaf_nodes match.output_methods match.value")
def value_roles(c: Candidate) -> None:
    """V, and the output's layout when the product is `V @ P^T`."""
    weights.value_roles(c, c.core)


@step(reads="operands_as_written product_casts weights",
      writes="dtype_changes leaf_nodes match.key match.query product_casts")
def operand_casts(c: Candidate) -> None:
    """Q·K^T's operands keep their float casts where v is cast alike (all three compute in that dtype)."""
    products.keep_casts_with_value(c)


@step(reads="flow home inlined softmax_dropouts values weights",
      writes="dropout_reads identity_ok inplace_dropout leaf_nodes match.dropout_p match.facts training_reads")
def dropout_role(c: Candidate) -> None:
    """SDPA's `dropout_p`, under the original's training flag."""
    weights.dropout_role(c, c.softmax_dropouts + c.weights.dropouts)


@step(reads=("chain.definitions chain.factor_guards chain.negated_factors chain.ops flow home inlined "
             "match.key match.query values"),
      writes=("absorbed chain.views dtype_roots factors leaf_nodes match.facts match.masks match.scale "
              "match.sdpa_refusal match.softcap positive_reads tensor_factors"))
def scale_and_masks(c: Candidate) -> None:
    """The score chain's ops as scale factors, mask terms and a soft-cap."""
    scale_and_mask_roles(c)


@step(reads=("absorbed chain.definitions chain.reads chain.views core flow home match.escapes match.key "
             "match.query values weights"),
      writes="consumed match.renamed")
def block_reads(c: Candidate) -> None:
    """Every read of a deleted intermediate is inside the block (or of the scores' shape, read from Q, K)."""
    c.consumed = c.chain.definitions + c.weights.definitions
    check_reads(c, c.consumed, c.chain.reads | c.weights.reads | c.absorbed)


@step(reads=("chain.definitions chain.ops dtype_changes flow home inlined leaf_nodes match.key match.query "
             "match.renamed product_casts values weights zeroing"),
      writes=("match.attn_mask match.facts match.hoist_anchor match.hoist_init match.hoisted "
              "match.is_causal match.masks match.row_fixup zeroed_rows"))
def mask(c: Candidate) -> None:
    """The mask terms as one `attn_mask` (or `is_causal`), evaluated where the original applied them; one finite
    fill as the keep mask, its fully masked rows made uniform as the fill made them (or 0, where the weights are
    zeroed after the softmax: attention.zeroed_rows)."""
    zeroed = zeroed_mask_term(c)
    if zeroed is not None:
        c.zeroed_rows = zeroed_rows_reason(c, zeroed)
    if zeroed is not None and zeroed.kind == "finite":  # SDPA gets the boolean keep mask: its masked rows give 0
        c.match.masks[0] = keep_term(c, zeroed)
    c.match.row_fixup = plan_row_fixup(c) if zeroed is None else None
    assemble_mask(c)


@step(reads=("chain.definitions dtype_changes factors flow has_ellipsis home inlined leaf_nodes match.is_causal "
             "match.masks match.row_fixup ndim product_casts values weights zeroed_rows"),
      writes="dtype_roots match.facts")
def mask_and_dtypes(c: Candidate) -> None:
    """Facts: q, k and v of one dtype, masks of a rank and dtype SDPA takes, what fully masked rows do, whether
    masked keys may be NaN."""
    mask_and_dtype_facts(c, c.ndim)
    nan_key_fact(c)


@step(reads="flow home inlined match.key match.value values", writes="match.facts")
def kv_length(c: Candidate) -> None:
    """Fact: k and v have one length (the original raises where they differ; SDPA's CPU kernels do not)."""
    kv_length_fact(c)


@step(reads="core flow home inlined leaf_nodes values weights", writes="dtype_roots match.facts")
def operand_rank(c: Candidate) -> None:
    """Fact: bmm's and einsum's operands have the ranks those take (the original raises on others, SDPA does not)."""
    operand_rank_fact(c)


@step(reads="consumed home inlined match.hoisted match.renamed weights",
      writes="match.end_line match.function match.line match.output_node match.removed output_statement")
def extent(c: Candidate) -> None:
    """The block's statements, its output, its lines and its function's dotted name."""
    match, parsed = c.match, c.parsed
    c.output_statement = output_statement = statement_of(parsed, c.weights.output.node)
    match.output_node = c.weights.output.node
    kept = {output_statement} | set(match.hoisted)
    match.removed = _unique([d.statement for d in c.consumed
                             if d.statement not in kept and not in_inlined(c, d.statement)])
    if any(in_inlined(c, node) for node in match.renamed):
        raise Refusal("a helper reads the scores' shape or dtype, and helpers are never edited")
    match.function = dotted_name(c, c.home)
    lines = [parsed.line(s) for s in match.removed] + [parsed.line(output_statement)]
    match.line, match.end_line = min(lines), parsed.end_line(output_statement)


@step(reads="chain.definitions flow home inlined leaf_nodes match.masks match.renamed output_statement")
def bindings(c: Candidate) -> None:
    """Every name the SDPA call reads holds, at the call, what the original read."""
    check_bindings(c, c.output_statement)


@step(reads=("chain.definitions consumed flow home identity_ok inlined leaf_nodes match.masks match.output_node "
             "match.removed output_statement weights"),
      writes="deleted_modules match.facts module_refusal")
def block_scope(c: Candidate) -> None:
    """Nothing around the block changes what it computes: scope, writes, dispatch, hooks."""
    check_scope(c, c.output_statement, c.consumed)


@step(reads="flow home inlined match.output_node", writes="match.facts match.output_methods")
def layout(c: Candidate) -> None:
    """`.contiguous()` where a reader of the output needs the original's strides."""
    layout_role(c)


@step(reads="chain.definitions flow home inlined match.escapes weights",
      writes="match.dropped match.reason match.unsafe_reason")
def escapes(c: Candidate) -> None:
    """The weights do not leave the block, or the reason (and the claim where callers drop them)."""
    check_escapes(c)


@step(reads=("chain.factor_guards chain.negated_factors chain.ops dtype_changes dtype_roots flow home inlined "
             "leaf_nodes ndim tensor_factors values weights"),
      writes="match.facts match.query tensor_scale_reads unfolded_query")
def tensor_scale(c: Candidate) -> None:
    """A tensor scale factor folded into q, with its broadcast and dtype facts."""
    fold_into_query(c, c.ndim)


@step(reads="flow home inlined match.hoist_anchor match.hoisted match.removed output_statement",
      writes="match.facts match.flag_test match.guard_checks match.guard_span match.take match.unwrap")
def flag(c: Candidate) -> None:
    """An `if <flag>:` that asks for the weights or picks a score path SDPA lacks: the SDPA path where it is off."""
    flags.plan_flag(c, c.output_statement)


@step(reads=("chain.factor_guards deleted_modules dropout_reads dtype_changes factors flow home inlined "
             "inplace_dropout leaf_nodes "
             "match.facts positive_reads product_casts tensor_factors unfolded_query "
             "match.hoist_anchor match.hoisted match.key match.masks match.query match.removed match.renamed "
             "match.value match.row_fixup match.take match.unwrap module_refusal output_statement "
             "tensor_scale_reads training_reads values weights core"),
      writes="match.absent_under_if match.guard_checks match.guard_lifted match.guard_span match.masks_absent")
def guards(c: Candidate) -> None:
    """A run-time check for each assumed metadata fact that can be checked (a deleted module the file may rebind:
    refused without one)."""
    plan_guards(c, c.output_statement)
    refuse_unguarded_modules(c)


@step(reads=("flow has_ellipsis home inlined layout leaf_nodes match.attn_mask match.dropout_p match.facts "
             "match.flag_test match.function match.guard_checks match.hoist_anchor match.hoisted "
             "match.is_causal match.key match.line match.masks match.output_node match.query match.removed "
             "match.row_fixup match.softcap match.take match.unwrap values weights"),
      writes="match.flash_attn_refusal match.flex match.flex_refusal match.scripted")
def flex(c: Candidate) -> None:
    """The proved roles as FlexAttention's `score_mod`/`mask_mod`, or why flex cannot take them; why the flash_attn
    helper cannot run here (TorchScript, torch.func's transforms)."""
    c.match.scripted = scope.is_scripted(c.parsed, c.home, c.owner)
    c.match.flash_attn_refusal = _flash_attn_refusal(c)
    flex_roles(c)


def _flash_attn_refusal(c: Candidate) -> str | None:
    if c.match.scripted:
        return "TorchScript may compile this function, and the flash_attn helper is Python only"
    transformed = scope.func_transformed(c.parsed)
    if transformed is not None:
        return f"{transformed}, whose transforms flash_attn_func's autograd.Function does not support"
    return None


# the order of the proof: each step may read what the steps before it produced (see proof_steps)
PROOF = (softmax_is_read, twin_softmax, score_chain, core_roles, softmax_stages, weight_path, value_roles,
         operand_casts, dropout_role, scale_and_masks, block_reads, mask, mask_and_dtypes, kv_length, operand_rank,
         extent, bindings, block_scope, layout, escapes, tensor_scale, flag, guards, flex)


def _unique(items: list) -> list:
    seen, out = set(), []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out
