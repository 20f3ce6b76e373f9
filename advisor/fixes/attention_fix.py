"""The attention rules' fix: a proved block becomes one scaled_dot_product_attention call (or the flash variants
`--backend` asks for), as node edits for the rewrite layer (advisor.rewrite.apply)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from advisor.backends.site import plan_backend
from advisor.contracts.detected import Detected
from advisor.contracts.emitted_names import MODULE_CHECK_HELPER
from advisor.contracts.finding import Finding, display_path
from advisor.contracts.rule import Rule
from advisor.contracts.evidence import BlockCall
from advisor.fixes.observed import calls_in, discharge, masks_held
from advisor.patterns.attention import AttentionMatch, find_attention
from advisor.patterns.attention.autograd_order import autograd_order_fact
from advisor.patterns.attention.guards import settle_guards
from advisor.patterns.call_site_facts import WEIGHTS_DROPPED, settle_dropped_weights, settle_from_call_sites, \
    weights_dropped
from advisor.rewrite.apply import NodeEdits, RewriteFailed, render
from advisor.rewrite.backends import flash_attn_call, flash_attn_helper, helper_name, kernel_names
from advisor.rewrite.flex import flex_call, flex_statements, prelude as flex_prelude
from advisor.rewrite.guard import guarded, module_check_helper, module_check_statements
from advisor.rewrite.sdpa_call import functional_name, row_fixup_statements, sdpa_call
from advisor.patterns.attention.candidate import function_of
from advisor.static.dataflow import UNDEFINED, Definition, bound_names
from advisor.static.module_index import ParsedModule
from advisor.static.tree_facts import TreeContext, TreeFacts
from advisor.static.walk import walk


def attention_edits(parsed: ParsedModule, match: AttentionMatch, drop_weights: bool,
                    backend: str = "sdpa") -> NodeEdits:
    """The block's output replaced by the call, the statements it no longer needs removed, its hoisted and
    renamed names written; `drop_weights` puts None where the weights escaped (the unsafe ADV102 fix, or a safe one
    where every caller drops them: `call_site_facts.settle_dropped_weights`). Raises
    RewriteFailed when the requested backend's code cannot be written here."""
    functional = functional_name(parsed)
    target = plan_backend(parsed, match, backend).emitted if backend != "sdpa" else "sdpa"
    statement = _enclosing_statement(parsed, match.output_node)
    indent = parsed.positions[statement.body[0] if isinstance(statement, cst.SimpleStatementLine)
                              else statement].start.column
    edits = NodeEdits()
    imports: list[str] = []
    if target == "flex":
        definitions = flex_prelude(parsed)
        if isinstance(definitions, str):
            raise RewriteFailed(f"cannot emit the flex helper: {definitions}")
        call = flex_call(parsed.module, match, indent)
        edits.definitions = definitions
        edits.insert_before[statement] = flex_statements(match)
    elif target == "flash-attn":
        helper = helper_name(parsed)
        call = flash_attn_call(parsed.module, match, helper, indent)
        edits.definitions = flash_attn_helper(helper, functional.prefix)
    else:
        call = sdpa_call(parsed.module, match, functional.prefix, indent + 4 * (target == "flash"))
        fixup = row_fixup_statements(match)
        if fixup:
            edits.insert_before[statement] = fixup
    if target == "flash":
        flash = kernel_names(parsed)
        if isinstance(flash, str):
            raise RewriteFailed(f"cannot emit the flash kernel context: {flash}")
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            raise RewriteFailed("the flash kernel context needs the SDPA call in a statement of its own")
        edits.wrap[statement] = flash.flash_context()
        if flash.import_line is not None:
            imports.append(flash.import_line)
    edits.replace[match.output_node] = call
    edits.remove = set(match.removed)
    if target == "flex" and (match.guard is None or match.flex.extent_check is not None):
        edits.remove |= set(match.flex.removed)  # outside the span of a guard the original block would read them
    edits.replace.update(match.hoisted)
    if match.hoist_anchor is not None:
        anchor = _enclosing_statement(parsed, match.hoist_anchor)
        edits.insert_before[anchor] = (match.hoist_init,)
    edits.replace.update(match.renamed)
    _drop_stale_deletions(parsed, match, edits)
    edits.unwrap, edits.take = set(match.unwrap), set(match.take)
    if drop_weights:
        edits.replace.update({node: cst.Name("None") for node in match.escapes if node not in edits.replace})
    if functional.import_line is not None:
        imports.append(functional.import_line)
    edits.imports = tuple(imports)
    test, span = match.guard, match.guard_span
    flex_checks = [check for check in (match.flex.no_dropout, match.flex.extent_check) if check is not None] \
        if target == "flex" else []
    for check in flex_checks:  # no dropout (flex has none), computed masks' extents: the original elsewhere
        test = check if test is None else cst.BooleanOperation(test, cst.And(), check)
        span = match.flex.span
    if any(line not in span for line in match.guard_lifted):
        raise RewriteFailed("a statement the check reads lies outside the statements it guards")
    above = ()
    if match.module_check is not None:  # deleted module calls: their check, computed above the `if`
        torch_name = parsed.module_aliases["torch"]
        above = module_check_statements(torch_name, match.module_check)
        if MODULE_CHECK_HELPER not in parsed.module_functions:
            edits.definitions = edits.definitions + (module_check_helper(torch_name),)
    if test is not None:  # guarded facts: the SDPA path where the check holds, the original elsewhere
        return guarded(parsed, edits, test, span, match.guard_lifted, above)
    return edits


def _drop_stale_deletions(parsed: ParsedModule, match: AttentionMatch, edits: NodeEdits) -> None:
    """`del w, s` of names only the removed statements bound (a memory idiom after the block): the patch never
    binds them, so those targets go, and the statement where none is left (`del` of an unbound name raised
    UnboundLocalError on every call). A name that may be unbound there keeps its `del`, which the original raises
    at too."""
    function = function_of(parsed, match.output_node)
    if function is None:
        return
    flow = parsed.flow(function)
    removed = set(match.removed) | {small for line in match.removed if isinstance(line, cst.SimpleStatementLine)
                                    for small in line.body}
    for node in parsed.nodes_of(cst.Del):
        env = flow.env_before.get(node)
        if env is None or node in removed:
            continue
        targets = list(node.target.elements) if isinstance(node.target, (cst.Tuple, cst.List)) else \
            [cst.Element(node.target)]

        def stale(element: cst.BaseElement) -> bool:
            ids = env.get(element.value.value, frozenset({UNDEFINED})) if isinstance(element.value, cst.Name) \
                else frozenset({UNDEFINED})
            return UNDEFINED not in ids and all(_unbound_by_patch(parsed, match, removed, flow.definitions[i])
                                                for i in ids)

        kept = [element for element in targets if not stale(element)]
        if not kept:
            edits.remove.add(node)
        elif len(kept) < len(targets):
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            edits.replace[node] = node.with_changes(
                target=kept[0].value if len(kept) == 1 else node.target.with_changes(elements=kept))


def _unbound_by_patch(parsed: ParsedModule, match: AttentionMatch, removed: set[cst.CSTNode],
                      definition: Definition) -> bool:
    """Whether the patch no longer runs the definition's binding: its statement is removed, or written anew as a
    mask bound under another name (`if m is not None: s = s.masked_fill(...)` hoisted to `attn_mask = ...`;
    breaker round 14: a `del s` after a guarded patch raised UnboundLocalError on the SDPA path)."""
    node = definition.statement
    while node is not None:
        if node in removed:
            return True
        if node in match.hoisted:
            return definition.name not in _names_bound_in(match.hoisted[node])
        node = parsed.parents.get(node)
    return False


def _names_bound_in(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class Bindings(cst.CSTVisitor):
        def visit_Assign(self, statement: cst.Assign) -> None:
            found.update(name.value for name in bound_names(statement))

        def visit_AnnAssign(self, statement: cst.AnnAssign) -> None:
            found.update(name.value for name in bound_names(statement))

        def visit_AugAssign(self, statement: cst.AugAssign) -> None:
            found.update(name.value for name in bound_names(statement))

    walk(node, Bindings())
    return found


def _enclosing_statement(parsed: ParsedModule, node: cst.CSTNode) -> cst.CSTNode:
    """The statement of a block that holds `node`: an `elif` is part of its first `if`, where a statement can go."""
    while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) or \
            isinstance(parsed.parents.get(node), cst.If) and parsed.parents[node].orelse is node:
        node = parsed.parents[node]
    return node


@dataclass(frozen=True)
class AttentionRules:
    """The attention unit's static rules: every role proved (safe), weights that leave the block (escaping), a
    role not proved (unproved)."""

    safe: Rule
    escaping: Rule
    unproved: Rule


def attention_findings(parsed: ParsedModule, backend: str, rules: AttentionRules, calls: list[BlockCall] = (),
                       tree: TreeContext | None = None, masks_passed: bool = False,
                       observed_masks: bool = False) -> list[Detected]:
    """Every attention match of the module as a finding of one of `rules`, with its fix where it has one; `calls`
    are what a run recorded at this file's attention blocks (their facts from the run, see `fixes.observed`).
    `tree`: the rest of the scanned tree (None: this file alone); where it has call sites, facts assumed about a
    parameter are proved where every call proves them, and its autograd requests decide the autograd-order fact.
    Masks each under its own `if m is not None:` are passed to SDPA (their facts assumed, or observed) with
    `masks_passed` (`--unsafe-fixes`), or with `observed_masks` (optimize) where `calls` saw them present with
    their facts holding on every call; else the patch is guarded by their absence (attention.guards.settle_guards),
    except under `--backend flex`, whose score_mod and mask_mod read the masks on every path.
    """
    tree = tree or TreeContext()
    autograd = tree.autograd if tree.autograd is not None else TreeFacts.of_file(parsed)
    if tree.calls is not None:
        tree.calls.adopt(parsed)  # before the matcher, which reads this file's calls through the tree too
    matches = find_attention(parsed)
    matches += blocks_behind_rebound_names(parsed, matches)
    for match in matches:
        choose_backend_proof(match, backend)
    if tree.calls is not None:
        for match in matches:
            settle_from_call_sites(tree.calls, parsed, match.facts)
            settle_dropped_weights(tree.calls, parsed, match)
    joined = [calls_in(list(calls), parsed.path, match.line, match.end_line) for match in matches]
    for match, seen in zip(matches, joined):  # what call sites left assumed about metadata is checked at run time
        flex_masks = backend == "flex" and match.flex is not None  # its score_mod reads the hoisted masks
        settle_guards(match, flex_masks or masks_passed or observed_masks and masks_held(match.facts, seen))
    return [_detected(parsed, match, backend, seen, autograd, rules) for match, seen in zip(matches, joined)]


def blocks_behind_rebound_names(parsed: ParsedModule, found: list[AttentionMatch]) -> list[AttentionMatch]:
    """Blocks read only where the file's imports are trusted, each refused with the reason: a star import of a
    module the scan cannot read, a second import of a name, or `exec`/`globals()` may bind `torch` or `F` anew,
    so no call the block makes is read as torch's (ParsedModule.rebound_by_imports) and it would go unreported."""
    rebound = parsed.rebound_by_imports
    if not rebound:
        return []
    trusting = ParsedModule(parsed.source, parsed.path, parsed.project, parsed.tree, trust_imports=True)
    unseen = [match for match in find_attention(trusting)
              if not any(match.line <= seen.end_line and seen.line <= match.end_line for seen in found)]
    for match in unseen:
        block = "\n".join(parsed.source.splitlines()[match.line - 1:match.end_line])
        names = [name for name in sorted(rebound & set(parsed.imports)) if re.search(rf"\b{re.escape(name)}\b", block)]
        match.reason = (f"{_rebinding(parsed)} may bind {', '.join(f'`{n}`' for n in names) or 'its names'} anew, "
                        f"so the block's calls are not proved to be the imported ones")
        match.output_node = None
    return unseen


def _rebinding(parsed: ParsedModule) -> str:
    """What in the file may bind its imported names anew, in words."""
    if parsed.binds_any_global:
        return "the file binds names through its namespace (`globals()`, `vars()`, `exec` or `eval`), which"
    if parsed.frames_elsewhere is not None:
        site = parsed.frames_elsewhere
        return (f"`{display_path(site.path)}` reaches a frame's or a function's globals (`{site.code}`, line "
                f"{site.line}), which")
    if parsed.every_star_import:
        star = parsed.every_star_import[0][1]
        return f"`{parsed.code(star).strip()}` (line {parsed.line(star)})"
    return "a second import of the name"


def choose_backend_proof(match: AttentionMatch, backend: str) -> None:
    """The proof the requested backend relies on: under `--backend flex` the flex facts; a block only
    FlexAttention can express (soft-capping) is refused for every other backend, and under flex when flex cannot
    take it either."""
    if match.output_node is None:
        return
    if backend == "flex" and match.flex is not None:
        match.facts = match.flex.facts
    elif match.sdpa_refusal is not None:
        if match.flex is not None:
            match.reason = f"{match.sdpa_refusal} (`--backend flex` would take it)"
        else:
            match.reason = f"{match.sdpa_refusal}, and FlexAttention cannot take it either: {match.flex_refusal}"
        match.output_node = None


def _rule_for(match: AttentionMatch, rules: AttentionRules) -> Rule:
    if match.output_node is None:
        return rules.unproved
    return rules.escaping if match.escapes and not weights_dropped(match.facts) else rules.safe


def _detected(parsed: ParsedModule, match: AttentionMatch, backend: str, calls: list[BlockCall],
              tree_facts: TreeFacts, rules: AttentionRules) -> Detected:
    """The finding, and its fix's edits; both cost the size of the block. A patch whose proof left a fact assumed
    (or only observed on a run) is unsafe whatever the rule's default: it names those facts."""
    rule = _rule_for(match, rules)
    reasons, fix, edits = [match.reason] if match.reason is not None else [], None, None
    plan = plan_backend(parsed, match, backend) if match.output_node is not None else None
    if plan is not None:
        autograd_order_fact(match.facts, tree_facts, plan.verdicts if plan.emitted != "flex" else {})
        for fact in plan.assumptions:  # listed with the proof's own (`flash-eligible`), in every report
            match.facts.assumed(fact.name, fact.statement, fact.why)
    if rule is rules.escaping:  # the patch puts None where the weights went: what reads them there breaks
        match.facts.assumed(WEIGHTS_DROPPED, "nothing reads the attention weights where they leave the block (the "
                            "patch puts None there)", "SDPA returns no weights, and no call site proves them unread")
    fixable = match.output_node is not None and match.unsafe_reason is None
    if fixable:
        try:
            fix = attention_edits(parsed, match, drop_weights=bool(match.escapes), backend=backend)
            edits = render(parsed, fix)
        except RewriteFailed as exc:
            fixable, reasons, fix, edits = False, [str(exc)], None, None
        except Exception as exc:  # noqa: BLE001 - a bug of ours on one patch must not lose the file's findings
            fixable, fix, edits = False, None, None
            reasons = [f"internal error while rewriting this block ({type(exc).__name__}: {exc}); please report it"]
    elif match.unsafe_reason:
        reasons.append(match.unsafe_reason)
    safety = rule.fix_safety
    contradicted = discharge(match.facts, calls)
    assumed = match.facts.assumptions
    observed = match.facts.observations
    if assumed and match.output_node is not None:
        safety = "unsafe"
        unproved = "unproved: " + "; ".join(f"{fact.statement} ({fact.why})" for fact in assumed)
        if contradicted:
            unproved += f" (the run: {'; '.join(contradicted)})"
        reasons = [unproved] if rule is rules.safe else reasons + [unproved]
    elif observed and match.output_node is not None:
        safety = "unsafe"
        held = ("held on every recorded call of the run, not proved (`advisor optimize` verifies it on that "
                "workload): " + "; ".join(fact.statement for fact in observed))
        reasons = [held] if rule is rules.safe else reasons + [held]
    extra = {"roles": _roles(parsed, match), "facts": match.facts.to_json()} if match.output_node is not None else {}
    if observed and not assumed and rule is rules.safe and match.output_node is not None:
        extra["discharged"] = "observed"  # every unproved fact held on the run: `optimize` tries this patch
    if plan is not None:  # backend eligibility of the SDPA call and what --backend emitted
        extra.update(plan.to_json())
    if rule is rules.safe and not assumed and not observed and fixable:
        reasons = []  # a proved patch needs no reason; one that could not be written keeps why (RewriteFailed)
    if match.note:
        reasons.append(match.note)
    finding = Finding(rule=rule.code, kind=rule.kind, path=parsed.path, line=match.line, end_line=match.end_line,
                      function=match.function, message=rule.title, fixable=fixable, fix_safety=safety,
                      reasons=tuple(reasons), extra=extra)
    return Detected(finding, fix, edits)


def _roles(parsed: ParsedModule, match: AttentionMatch) -> dict[str, object]:
    """The roles as the SDPA call writes them (None where the call leaves the argument out)."""
    def text(node: cst.BaseExpression | None) -> str | None:
        return None if node is None else parsed.code(node)

    return {"query": text(match.query), "key": text(match.key), "value": text(match.value),
            "scale": text(match.scale) or "default", "mask": "causal" if match.is_causal else text(match.attn_mask),
            "dropout_p": text(match.dropout_p)}
