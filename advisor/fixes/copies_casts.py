"""Copy and cast findings with their fixes (ADV201-ADV204, ADV301-ADV304): static proofs, and runtime findings
joined to the source call they measured. Each finding says how safe its patch is and why.

A runtime finding names a file and a line; the fix needs the call. The join takes the one call on that line
that can have produced it (two `.contiguous()` calls on one line cannot be told apart: no patch, and the reason
says so). Runtime evidence counts as proof only when every call that ran on the line was redundant; what a
removed copy could still change (aliasing, layout read by code the profile did not see) is proved statically
or named as an assumption, which makes the patch unsafe."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from advisor.engine.static import Detected
from advisor.findings import Finding
from advisor.fixes.aliasing import layout_or_escape, reads_of_assignment, writes_in_place
from advisor.fixes.evidence import FileEvidence, RuntimeHit
from advisor.patterns import copies_casts as roles
from advisor.patterns.facts import FactSheet
from advisor.registry import load_rules
from advisor.rewrite.apply import RewriteFailed, SourceEdit, render
from advisor.rules import copies_casts as units
from advisor.static.module_index import ParsedModule

ALREADY_CONTIGUOUS, STRIDED_OK = units.ALREADY_CONTIGUOUS.code, units.STRIDED_OK.code
UNDONE, COPY_COPY = units.UNDONE.code, units.COPY_COPY.code
SAME_DTYPE, ROUND_TRIP = units.SAME_DTYPE.code, units.ROUND_TRIP.code
PARAM_CAST, SOFTMAX_UPCAST = units.PARAM_CAST.code, units.SOFTMAX_UPCAST.code
TRANSPOSES = frozenset({"transpose", "permute", "t"})


@dataclass
class _Plan:
    rule: str
    site: roles.Site | None
    line: int
    rewrite: roles.Rewrite | None = None
    facts: FactSheet = field(default_factory=FactSheet)
    reason: str | None = None  # why there is no patch
    hit: RuntimeHit | None = None


def copy_cast_findings(parsed: ParsedModule, evidence: FileEvidence | None, earlier: list[Finding]) -> list[Detected]:
    """Each copy/cast finding with its fix. Within the span of an earlier attention finding a static finding is
    left to it (the attention rule reports the block), a runtime one is reported without a patch where the
    attention rewrite replaces it."""
    covered = [(f.line, f.end_line, f.rule, f.fixable) for f in earlier if f.kind == "attention"]
    sites = roles.sites(parsed)
    plans = _static_plans(parsed, sites)
    if evidence is not None:
        plans = _merged(plans, _runtime_plans(parsed, sites, evidence))
    results, taken = [], []
    # where two fixes overlap, the one proved without assumptions (safe) takes the expression first
    for plan in sorted(plans, key=lambda p: (p.line, bool(p.facts.assumptions), p.rule)):
        span = _covering(covered, plan)
        if span is not None and plan.hit is None:
            continue
        if span is not None and span[3]:
            plan.rewrite, plan.reason = None, f"inside the attention block at lines {span[0]}-{span[1]}, which the " \
                                              f"{span[2]} rewrite replaces"
        if plan.rewrite is not None and any(_overlaps(parsed, plan.rewrite.node, node) for node in taken):
            plan.rewrite, plan.reason = None, "overlaps another copy/cast fix in the same expression; run fix again"
        if plan.rewrite is not None:
            taken.append(plan.rewrite.node)
        results.append(_finding(parsed, plan))
    return results


def _static_plans(parsed: ParsedModule, sites: list[roles.Site]) -> list[_Plan]:
    proofs = ((ALREADY_CONTIGUOUS, roles.contiguous_of_contiguous), (COPY_COPY, roles.folded_copies),
              (SAME_DTYPE, roles.cast_of_same_cast), (SOFTMAX_UPCAST, roles.softmax_with_dtype))
    plans = []
    for site in sites:
        for rule, prove in proofs:
            rewrite = prove(parsed, site.call)
            if rewrite is not None:
                plan = _Plan(rule, site, call_line(parsed, site.call), rewrite)
                plan.facts.proved("equal-values", "the rewrite computes the same tensor", rewrite.proof)
                plan.facts.accepted("tensor-receiver", "the receiver of the rewritten calls is a tensor",
                                    "a static proof reads calls, not types: an object of another class whose "
                                    "own .float()/.contiguous()/.clone() does something else is not seen")
                plans.append(plan)
    return plans


def _runtime_plans(parsed: ParsedModule, sites: list[roles.Site], evidence: FileEvidence) -> list[_Plan]:
    by_line: dict[int, list[roles.Site]] = {}
    for site in sites:
        by_line.setdefault(call_line(parsed, site.call), []).append(site)
    plans = []
    for line, hits in sorted(evidence.hits.items()):
        for hit in hits:
            join = _JOINS.get(hit.rule)
            if join is not None:
                plan = join(parsed, by_line.get(line, []), evidence, hit)
                plan.hit = hit
                plans.append(plan)
    return plans


def call_line(parsed: ParsedModule, call: cst.Call) -> int:
    """The line Python attributes a call to (and the profiler with it): that of the method name for
    `x.name(...)`, so a chain split over lines puts each call on its own line."""
    return parsed.line(call.func.attr if isinstance(call.func, cst.Attribute) else call)


def _merged(static: list[_Plan], runtime: list[_Plan]) -> list[_Plan]:
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


def _one(sites: list[roles.Site], line: int, wanted, what: str) -> tuple[roles.Site | None, str | None]:
    """The one call on the line that can be the measured op, or why there is not exactly one."""
    found = [site for site in sites if wanted(site.call)]
    if len(found) == 1:
        return found[0], None
    if not found:
        return None, f"no {what} call on line {line} in this source (was the file edited after profiling?)"
    return None, f"{len(found)} {what} calls on line {line}: the profile cannot tell them apart"


def _every_call(evidence: FileEvidence, line: int, name: str, hit_rules: tuple[str, ...]) -> str | None:
    """Why the runtime proof does not cover every call that ran on the line, or None."""
    ran, redundant = evidence.observed[(line, name)], evidence.calls(line, *hit_rules)
    if ran and redundant == ran:
        return None
    return f"only {redundant} of the {ran} `.{name}()` calls on line {line} were redundant"


def _contiguous_removal(parsed, sites, evidence, hit, rule_check, redundant_rules, proof,
                        result_of=lambda call: call) -> _Plan:
    """ADV201/202/203: remove the one `.contiguous()` on the line; the aliasing and layout obligations of
    `result_of(call)` (what carries the copy's memory on) are discharged statically (and by the recorded step's
    in-place ops) or named as assumptions."""
    plan = _Plan(hit.rule, None, hit.line)
    site, plan.reason = _one(sites, hit.line, rule_check, "`.contiguous()`")
    if site is None:
        return plan
    plan.site = site
    every = _every_call(evidence, hit.line, "contiguous", redundant_rules)
    if every is not None:
        plan.reason = every
        return plan
    call = site.call
    plan.rewrite = roles.Rewrite(call, roles.removed_call(parsed, call), proof)
    plan.facts.proved("equal-values", "removing a copy never changes values", proof)
    _aliasing_facts(parsed, site, result_of(call), evidence, plan.facts)
    return plan


def _aliasing_facts(parsed, site: roles.Site, result: cst.CSTNode, evidence: FileEvidence, facts: FactSheet) -> None:
    statement = "the un-copied result's layout and memory are not observed"
    reason = layout_or_escape(parsed, site.function_node, result)
    if reason is None:
        facts.proved("layout-unobserved", statement, "every use reads values only")
    else:
        facts.assumed("layout-unobserved", statement, reason)
    statement = "nothing writes the shared memory in place"
    reason = writes_in_place(parsed, site.function_node)
    first, last = parsed.line(site.function_node), parsed.end_line(site.function_node)
    measured = sorted(line for line in evidence.mutating_lines if first <= line <= last)
    if reason is None and measured:
        reason = f"an op called at line {measured[0]} wrote a tensor in place in the profiled step"
    if reason is None:
        facts.proved("no-inplace", statement, "no in-place write in the function, none measured in its calls")
    else:
        facts.assumed("no-inplace", statement, reason)


def _already_contiguous(parsed, sites, evidence, hit) -> _Plan:
    return _contiguous_removal(parsed, sites, evidence, hit, roles.is_contiguous_call,
                               (ALREADY_CONTIGUOUS, STRIDED_OK),
                               "the tensor was contiguous in every profiled call, where `.contiguous()` returns it")


def _strided_ok(parsed, sites, evidence, hit) -> _Plan:
    return _contiguous_removal(parsed, sites, evidence, hit, roles.is_contiguous_call,
                               (ALREADY_CONTIGUOUS, STRIDED_OK),
                               "every op reading the copy accepts strided input (views replayed on meta tensors)")


def _undone(parsed, sites, evidence, hit) -> _Plan:
    plan = _contiguous_removal(parsed, sites, evidence, hit, lambda call: _transpose_back(parsed, call) is not None,
                               (ALREADY_CONTIGUOUS, UNDONE),
                               "the copy's layout is transposed away at once; the values are the same without it",
                               result_of=lambda call: _transpose_back(parsed, call))
    if plan.site is None and any(roles.is_contiguous_call(site.call) for site in sites):
        plan.reason = (f"the `.contiguous()` on line {hit.line} is not transposed back, in its expression or as the "
                       "only use of the name it is assigned to")
    return plan


def _transpose_back(parsed: ParsedModule, call: cst.Call) -> cst.Call | None:
    """The transpose that undoes the layout of `x.transpose(...).contiguous()`: in the same expression, or as the
    only use of the one name the copy is assigned to (`y = x.mT.contiguous()` then `z = y.mT`); else None."""
    inner = roles.method(call.func.value)
    if not (roles.is_contiguous_call(call) and inner is not None and inner[1] in TRANSPOSES):
        return None
    reader = call
    assign = parsed.parents.get(call)
    if isinstance(assign, cst.Assign) and assign.value is call:
        function = parsed.innermost(assign, cst.FunctionDef)
        flow = parsed.flow(function) if function is not None else None
        reads = reads_of_assignment(flow, assign) if flow is not None else None
        # its one read must see this assignment alone (a read of it sees it; one definition means only it)
        if not reads or len(reads) != 1 or len(flow.definitions_of(reads[0])) != 1 or flow.sees_undefined(reads[0]):
            return None
        reader = reads[0]
    outer = parsed.parents.get(reader)
    caller = parsed.parents.get(outer)
    if isinstance(outer, cst.Attribute) and outer.value is reader and outer.attr.value in TRANSPOSES and \
            isinstance(caller, cst.Call) and caller.func is outer:
        return caller
    return None


def _proved_on_line(parsed, sites, hit, prove, missing: str) -> _Plan:
    """A runtime finding whose fix is a static proof: the one call on the line that the proof rewrites."""
    plan = _Plan(hit.rule, None, hit.line)
    proved = [(site, prove(parsed, site.call)) for site in sites]
    proved = [(site, rewrite) for site, rewrite in proved if rewrite is not None]
    if len(proved) != 1:
        plan.reason = missing if not proved \
            else f"{len(proved)} such calls on line {hit.line}: the profile cannot tell them apart"
        return plan
    plan.site, plan.rewrite = proved[0]
    plan.facts.proved("equal-values", "the rewrite computes the same tensor", plan.rewrite.proof)
    return plan


def _copy_copy(parsed, sites, evidence, hit) -> _Plan:
    return _proved_on_line(parsed, sites, hit, roles.folded_copies,
                           "the two copies are not a `.contiguous()`/`.clone()` chain on this line")


def _same_dtype(parsed, sites, evidence, hit) -> _Plan:
    plan = _Plan(hit.rule, None, hit.line)
    dtype = hit.extra.get("evidence", {}).get("dtype")
    site, plan.reason = _one(sites, hit.line, lambda c: roles.cast_dtype(parsed, c) == dtype, f"cast to {dtype}")
    if site is None:
        return plan
    plan.site = site
    name = roles.method(site.call)[1]
    every = _every_call(evidence, hit.line, name, (SAME_DTYPE,))
    if every is not None:
        plan.reason = every
        return plan
    proof = f"the input was already {dtype} in every profiled call ({hit.calls}), where the cast returns it"
    plan.rewrite = roles.Rewrite(site.call, roles.removed_call(parsed, site.call), proof)
    plan.facts.assumed("dtype-fixed", f"the input is {dtype} in every call, not only the profiled ones",
                       f"observed in {hit.calls} call(s); its dtype follows the caller's inputs and the module's "
                       "dtype, which a caller can change")
    return plan


def _round_trip(parsed, sites, evidence, hit) -> _Plan:
    plan = _Plan(hit.rule, None, hit.line)
    data = hit.extra.get("evidence", {})
    source, middle = data.get("from"), data.get("to")

    def back_cast(call: cst.Call) -> bool:
        return roles.cast_dtype(parsed, call) == source and roles.cast_dtype(parsed, call.func.value) == middle

    site, plan.reason = _one(sites, hit.line, back_cast, f"{middle} -> {source} cast")
    if site is None:
        return plan
    plan.site = site
    inner = site.call.func.value
    plan.rewrite = roles.Rewrite(site.call, parsed.code(inner.func.value), "drops both casts")
    plan.facts.assumed("rounding-unneeded", f"the rounding to {middle} is not needed",
                       f"the round trip rounds every value to {middle}; without it the values change by up to that "
                       "rounding")
    plan.facts.assumed("dtype-fixed", f"the input is {source} in every call", f"observed in {hit.calls} call(s)")
    return plan


def _param_cast(parsed, sites, evidence, hit) -> _Plan:
    data = hit.extra.get("evidence", {})
    plan = _Plan(hit.rule, None, hit.line)
    plan.reason = (f"not hoisted: storing `{data.get('param')}` as {data.get('to')} changes the module's state "
                   "(its state_dict dtype, and what a later `.to()`/`.double()` of the module converts); create it "
                   f"in {data.get('to')} or cast the module once where it is built")
    return plan


def _softmax_upcast(parsed, sites, evidence, hit) -> _Plan:
    return _proved_on_line(parsed, sites, hit, roles.softmax_with_dtype,
                           "the upcast is not an argument of a softmax call on this line")


_JOINS = {ALREADY_CONTIGUOUS: _already_contiguous, STRIDED_OK: _strided_ok, UNDONE: _undone, COPY_COPY: _copy_copy,
          SAME_DTYPE: _same_dtype, ROUND_TRIP: _round_trip, PARAM_CAST: _param_cast,
          SOFTMAX_UPCAST: _softmax_upcast}


def _covering(covered: list[tuple[int, int, str, bool]], plan: _Plan) -> tuple[int, int, str, bool] | None:
    return next((span for span in covered if span[0] <= plan.line <= span[1]), None)


def _overlaps(parsed: ParsedModule, node: cst.CSTNode, other: cst.CSTNode) -> bool:
    """One node inside the other: their edits cannot both apply."""
    for inner, outer in ((node, other), (other, node)):
        while inner is not None:
            if inner is outer:
                return True
            inner = parsed.parents.get(inner)
    return False


def _finding(parsed: ParsedModule, plan: _Plan) -> Detected:
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
                      reason=reason, extra=extra)
    return Detected(finding, fix, edits)
