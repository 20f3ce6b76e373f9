"""The call-site rule engine of the copies and casts family (advisor.rules.copies_casts): each rule is a
`CallRule` (advisor.contracts.call_rule) that proves a rewrite of one call from the source (`prove`), joins a runtime
finding of its code to the call it measured (`join`), or both; this module runs them over a file and turns their
plans into findings with fixes. Each finding says how safe its patch is and why.

A runtime finding names a file and a line; the fix needs the call. A join takes the one call on that line that
can have produced it (two `.contiguous()` calls on one line cannot be told apart: no patch, and the reason says
so). Runtime evidence counts as proof only when every call that ran on the line was redundant; what a removed copy
could still change (aliasing, layout read by code the profile did not see) is proved statically or named as an
assumption, which makes the patch unsafe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from advisor.contracts.detected import Detected
from advisor.contracts.finding import Finding, display_path
from advisor.fixes.aliasing import layout_or_escape, writes_in_place, written_by_a_callee
from advisor.contracts.call_rule import CallRule
from advisor.contracts.evidence import FileEvidence, RuntimeHit
from advisor.patterns import copy_cast_roles as roles
from advisor.patterns import scope
from advisor.patterns.attention.anchors import is_guarded_fallback
from advisor.patterns.facts import FactSheet
from advisor.registry import load_rules
from advisor.rewrite.apply import RewriteFailed, SourceEdit, render
from advisor.static.module_index import ParsedModule
from advisor.static.project import tensor_method_definitions
from advisor.static.walk import walk


NESTED = "overlaps another copy/cast fix in the same expression; run fix again"  # `fix --apply` runs again itself


@dataclass
class Plan:
    """What one rule makes of one call: the rewrite (None: no patch, `reason` says why), and the facts it rests on."""

    rule: str
    site: roles.Site | None
    line: int
    rewrite: roles.Rewrite | None = None
    facts: FactSheet = field(default_factory=FactSheet)
    reason: str | None = None  # why there is no patch
    hit: RuntimeHit | None = None


@dataclass(frozen=True)
class JoinRequest:
    """A runtime finding to join to source: the file, the calls on the finding's line, the file's evidence, and
    the family's rules (to count the redundant calls other rules measured on the same line)."""

    parsed: ParsedModule
    sites: list[roles.Site]
    evidence: FileEvidence
    hit: RuntimeHit
    rules: tuple[CallRule, ...]

    def plan(self) -> Plan:
        return Plan(self.hit.rule, None, self.hit.line)

    def one(self, wanted: Callable[[cst.Call], bool], what: str) -> tuple[roles.Site | None, str | None]:
        """The one call on the line that can be the measured op, or why there is not exactly one."""
        found = [site for site in self.sites if wanted(site.call)]
        line = self.hit.line
        if len(found) == 1:
            return found[0], None
        if not found:
            return None, f"no {what} call on line {line} in this source (was the file edited after profiling?)"
        return None, f"{len(found)} {what} calls on line {line}: the profile cannot tell them apart"

    def not_every_call(self, name: str, kind: str) -> str | None:
        """Why the runtime findings on the line do not cover every `.name()` call that ran there, or None. `kind`
        is the `redundant_call` of the rules whose findings count."""
        line = self.hit.line
        counted = [rule.code for rule in self.rules if rule.redundant_call == kind]
        ran, redundant = self.evidence.observed[(line, name)], self.evidence.calls(line, *counted)
        if ran and redundant == ran:
            return None
        return f"only {redundant} of the {ran} `.{name}()` calls on line {line} were redundant"


def copy_cast_findings(parsed: ParsedModule, evidence: FileEvidence | None, earlier: list[Finding],
                       rules: tuple[CallRule, ...]) -> list[Detected]:
    """Each finding of `rules` with its fix. Within the span of an earlier attention finding a static finding is
    left to it (the attention rule reports the block), a runtime one is reported without a patch where the
    attention rewrite replaces it. The original a guarded attention patch keeps under its `else:` is no static
    finding either, as it is no attention finding: fixing a fixed file offers nothing."""
    covered = [(f.line, f.end_line, f.rule, f.fixable) for f in earlier if f.kind == "attention"]
    sites = roles.sites(parsed)
    plans = _static_plans(parsed, sites, rules)
    if evidence is not None:
        plans = _merged(plans, _runtime_plans(parsed, sites, evidence, rules))
    results, taken = [], []
    # where two fixes overlap, the one proved without assumptions (safe) takes the expression first
    for plan in sorted(plans, key=lambda p: (p.line, bool(p.facts.assumptions), p.rule)):
        span = _covering(covered, plan)
        if plan.hit is None and (span is not None or is_guarded_fallback(parsed, plan.site.call)):
            continue
        if span is not None and span[3]:
            plan.rewrite, plan.reason = None, f"inside the attention block at lines {span[0]}-{span[1]}, which the " \
                                              f"{span[2]} rewrite replaces"
        if plan.rewrite is not None and any(_overlaps(parsed, plan.rewrite.node, node) for node in taken):
            plan.rewrite, plan.reason = None, NESTED
        if plan.rewrite is not None:
            taken.append(plan.rewrite.node)
        results.append(_finding(parsed, plan))
    return results


def _static_plans(parsed: ParsedModule, sites: list[roles.Site], rules: tuple[CallRule, ...]) -> list[Plan]:
    provers = [rule for rule in rules if rule.prove is not None]
    plans = []
    for site in sites:
        for rule in provers:
            rewrite = rule.prove(parsed, site.call)
            if rewrite is not None:
                plan = Plan(rule.code, site, call_line(parsed, site.call), rewrite)
                plan.facts.proved("equal-values", "the rewrite computes the same tensor", rewrite.proof)
                _assumptions(plan.facts, rewrite)
                _receiver_fact(parsed, plan.facts, rewrite.node)
                plans.append(plan)
    return plans


TENSOR_RECEIVER = "the receiver of the rewritten calls is a tensor"


def _receiver_fact(parsed: ParsedModule, facts: FactSheet, node: cst.CSTNode) -> None:
    """`tensor-receiver`: accepted (a static proof reads calls, not types), unless a class of the file or of the
    scanned tree defines a method of a name the rewrite reads (`def contiguous(self)`): its objects would run it."""
    called: set[str] = set()

    class Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Attribute):
                called.add(call.func.attr.value)

    walk(node, Calls())
    defined = [site for site in tensor_method_definitions(parsed.path, parsed.source) +
               list(parsed.project.tensor_methods if parsed.project is not None else ()) if site.code in called]
    overridden = scope.ops_overridden(parsed)
    if defined:
        site = defined[0]
        facts.assumed("tensor-receiver", TENSOR_RECEIVER, f"`{display_path(site.path)}` defines a method "
                      f"`{site.code}` (line {site.line}): an object of that class may be the receiver")
    elif overridden is not None:  # a tensor subclass's `.float()` may dequantize (breaker round 22)
        facts.assumed("tensor-receiver", TENSOR_RECEIVER, f"{overridden}: a tensor subclass or mode may give "
                      "the calls the rewrite removes or fuses effects of their own")
    else:
        facts.accepted("tensor-receiver", TENSOR_RECEIVER, "a static proof reads calls, not types: an object of a "
                       "class outside the scanned tree whose own .float()/.contiguous()/.clone() does something "
                       "else is not seen")


def _runtime_plans(parsed: ParsedModule, sites: list[roles.Site], evidence: FileEvidence,
                   rules: tuple[CallRule, ...]) -> list[Plan]:
    by_line: dict[int, list[roles.Site]] = {}
    for site in sites:
        by_line.setdefault(call_line(parsed, site.call), []).append(site)
    joins = {rule.code: rule.join for rule in rules if rule.join is not None}
    plans = []
    for line, hits in sorted(evidence.hits.items()):
        for hit in hits:
            if hit.rule in joins:
                plan = joins[hit.rule](JoinRequest(parsed, by_line.get(line, []), evidence, hit, rules))
                plan.hit = hit
                plans.append(plan)
    return plans


def call_line(parsed: ParsedModule, call: cst.Call) -> int:
    """The line Python attributes a call to (and the profiler with it): that of the method name for
    `x.name(...)`, so a chain split over lines puts each call on its own line."""
    return parsed.line(call.func.attr if isinstance(call.func, cst.Attribute) else call)


def _merged(static: list[Plan], runtime: list[Plan]) -> list[Plan]:
    """A runtime plan for the call a static proof already covers keeps the static proof and adds the cost."""
    proved = {(p.rule, p.rewrite.node): p for p in static}
    kept = list(static)
    for plan in runtime:
        twin = proved.get((plan.rule, plan.rewrite.node)) if plan.rewrite is not None else None
        if twin is not None:
            twin.hit, twin.line = plan.hit, plan.line
        else:
            kept.append(plan)
    return kept


# accepted on every copy removal: autograd may save the un-copied tensor (`h * w` saves h), now a view of the input
# the caller still holds (breaker round 17)
INPUT_WRITES = "input-writes"
INPUT_WRITES_WHY = ("without the copy, what autograd saves from it for the backward may be a view of the copy's "
                    "input: a caller refilling that input in place with torch before `backward()` makes the backward "
                    "raise (a loud failure); a write that bypasses autograd's version counter (through `.numpy()`, "
                    "`.data` or DLPack) gives other gradients, as it does for any tensor autograd saved")


def copy_removal(request: JoinRequest, wanted: Callable[[cst.Call], bool], proof: str,
                 result_of: Callable[[cst.Call], cst.CSTNode] = lambda call: call) -> Plan:
    """A runtime finding fixed by removing the one `.contiguous()` on its line that `wanted` accepts; the
    aliasing and layout obligations of `result_of(call)` (what carries the copy's memory on) are discharged
    statically (and by the recorded step's in-place ops) or named as assumptions."""
    plan = request.plan()
    site, plan.reason = request.one(wanted, "`.contiguous()`")
    if site is None:
        return plan
    plan.site = site
    every = request.not_every_call("contiguous", "contiguous")
    if every is not None:
        plan.reason = every
        return plan
    parsed, call = request.parsed, site.call
    plan.rewrite = roles.Rewrite(call, roles.removed_call(parsed, call), proof)
    plan.facts.proved("equal-values", "removing a copy never changes values", proof)
    _aliasing_facts(parsed, site, result_of(call), request.evidence, plan.facts)
    return plan


def _aliasing_facts(parsed, site: roles.Site, result: cst.CSTNode, evidence: FileEvidence, facts: FactSheet) -> None:
    statement = "the un-copied result's layout and memory are not observed"
    reason = layout_or_escape(parsed, site.function_node, result)
    if reason is None:
        facts.proved("layout-unobserved", statement, "every use reads values only")
    else:
        facts.assumed("layout-unobserved", statement, reason)
    statement = "nothing writes the shared memory in place"
    reason = writes_in_place(parsed, site.function_node) or \
        written_by_a_callee(parsed, site.function_node, site.call.func.value)
    first, last = parsed.line(site.function_node), parsed.end_line(site.function_node)
    measured = sorted(line for line in evidence.mutating_lines if first <= line <= last)
    if reason is None and measured:
        reason = f"an op called at line {measured[0]} wrote a tensor in place in the profiled step"
    if reason is None:
        facts.proved("no-inplace", statement, "no in-place write in the function, none measured in its calls")
    else:
        facts.assumed("no-inplace", statement, reason)
    facts.accepted(INPUT_WRITES, "nothing writes the copy's input in place between the forward and its backward",
                   INPUT_WRITES_WHY)


def proved_on_line(request: JoinRequest, prove: Callable, missing: str) -> Plan:
    """A runtime finding whose fix is a static proof: the one call on the line that `prove` rewrites."""
    plan = request.plan()
    proved = [(site, prove(request.parsed, site.call)) for site in request.sites]
    proved = [(site, rewrite) for site, rewrite in proved if rewrite is not None]
    if len(proved) != 1:
        plan.reason = missing if not proved \
            else f"{len(proved)} such calls on line {request.hit.line}: the profile cannot tell them apart"
        return plan
    plan.site, plan.rewrite = proved[0]
    plan.facts.proved("equal-values", "the rewrite computes the same tensor", plan.rewrite.proof)
    _assumptions(plan.facts, plan.rewrite)
    return plan


def _assumptions(facts: FactSheet, rewrite: roles.Rewrite) -> None:
    for name, statement, why in rewrite.assumes:
        facts.assumed(name, statement, why)


def _covering(covered: list[tuple[int, int, str, bool]], plan: Plan) -> tuple[int, int, str, bool] | None:
    return next((span for span in covered if span[0] <= plan.line <= span[1]), None)


def _overlaps(parsed: ParsedModule, node: cst.CSTNode, other: cst.CSTNode) -> bool:
    """One node inside the other: their edits cannot both apply."""
    for inner, outer in ((node, other), (other, node)):
        while inner is not None:
            if inner is outer:
                return True
            inner = parsed.parents.get(inner)
    return False


def _finding(parsed: ParsedModule, plan: Plan) -> Detected:
    rule = load_rules()[plan.rule]
    fix = SourceEdit(plan.rewrite.node, plan.rewrite.code).as_edits() if plan.rewrite is not None else None
    edits, reason = None, plan.reason
    if fix is not None:
        try:
            edits = render(parsed, fix)
        except RewriteFailed as exc:
            fix, reason = None, str(exc)
    assumed = plan.facts.assumptions
    if fix is not None and assumed:
        reason = "unproved: " + "; ".join(f"{fact.statement} ({fact.why})" for fact in assumed)
    node = plan.site.call if plan.site is not None else None
    extra = {"facts": plan.facts.to_json()}
    if plan.hit is not None:
        extra.update(plan.hit.extra)
        extra["measured_by"] = [plan.hit.rule]
    finding = Finding(rule=plan.rule, kind=rule.kind, path=parsed.path, line=plan.line,
                      end_line=max(plan.line, parsed.end_line(node) if node is not None else plan.line),
                      function=plan.site.function if plan.site is not None else plan.hit.function,
                      message=plan.hit.message if plan.hit is not None else rule.title, fixable=fix is not None,
                      fix_safety=("unsafe" if assumed else "safe") if fix is not None else rule.fix_safety,
                      reasons=(reason,) if reason is not None else (), extra=extra)
    return Detected(finding, fix, edits)
