"""`advisor optimize` as one function: profile the original, build the patches of the files it executed, verify each
in its own patched worker (parity on several inputs, interleaved timing against the live original), combine the
verified ones (leave-one-out when the combination breaks parity), re-profile the combination, apply.

The result is an OptimizeReport (its `to_json()` is the JSON of `--format json`, and what every report renderer
reads); the workers are driven with the requests of `advisor.verify.messages`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from advisor.contracts.rule_choice import RuleChoice
from advisor.errors import AdvisorError
from advisor.contracts.finding import Finding, display_path
from advisor.contracts.evidence import RuntimeEvidence, add_block_calls, measured_lines, with_blocks
from advisor.fixes.observed import OBSERVERS
from advisor.results import OptimizeReport, PatchVerdict
from advisor.script import parse_command
from advisor.verify.report_folder import ReportFolder
from advisor.rewrite.patch import WriteRefused, unified_diff, write_atomically
from advisor.engine.static import FileResult, analyze_source, might_match
from advisor.static.call_sites import Tree
from advisor.static.discover import in_environment, is_library_file, read_source
from advisor.static.tree_facts import TreeContext, tree_wide_facts
from advisor.verify.overlay import original_path
from advisor.verify.messages import (AutogradRequests, Export, InputSet, Inputs, Load, Loaded, MemoryPeak,
                                     ModelState, Observe, OpTotal, PeakMemory, Profile, Profiled, Run, RunOutputs,
                                     StateKeys, Time)
from advisor.runtime.autocast_state import described, least_precise
from advisor.verify.parity import Comparison, compare
from advisor.verify.process import DEFAULT_TIMEOUT_S, WorkerFailed, WorkerProcess, start_worker
from advisor.verify.ab_timing import Paired, interleave, summary
from advisor.verify.unpatched import unpatched

VERIFIED, PARITY_FAILED, NO_GAIN, NOT_RUN = "verified", "parity-failed", "no-gain", "not-run"
# What the report folder will hold (with patched-*.log): checked for links before anything runs.
REPORT_NAMES = ("original.log", "trace_before.json", "trace_after.json", "patches", "result.json", "report.md",
                "report.html")
SDPA_OP_MARKERS = ("scaled_dot_product", "flash_attention", "efficient_attention")


@dataclass
class Options:
    target: str
    report_dir: str
    root: str = "."
    device: str | None = None
    dtype: str | None = None
    train: bool = False
    unsafe_fixes: bool = False
    backend: str = "sdpa"  # what attention patches target: sdpa, flash, flash-attn
    call_site_facts: bool = True  # the profiled files' calls may prove facts of the functions they call
    apply: bool = False
    force_readonly: bool = False  # --apply also rewrites read-only files
    review: Callable[[list[dict]], list[str]] | None = None  # --interactive: verified patches -> the ids to apply
    timeout_s: float = DEFAULT_TIMEOUT_S
    seeds: int = 3  # parity inputs: seeds of a TARGET function, or recorded calls of a script's model
    timing_budget_s: float = 4.0
    script: list[str] | None = None  # script mode: the command after `--` (target is then how it is shown)
    rules: RuleChoice = RuleChoice()  # [tool.advisor]'s select, ignore, exclude and per-file-ignores

    def load_request(self, state: ModelState | None = None) -> Load:
        """What a worker's `load` needs: the TARGET, or the script run to the model's Nth call (the patched side,
        given the original's `state`, only needs the model built, then takes the original's weights and inputs)."""
        return Load(self.target, self.device, self.dtype, self.train, state=state, script=self.script,
                    calls=self._script_calls(state), roots=(self.root,))

    def loading(self, state: ModelState | None = None) -> str | None:
        """How error messages name that request (None: by its name)."""
        if self.script is None:
            return None
        return f"running the script to its model's call {self._script_calls(state)}"

    def _script_calls(self, state: ModelState | None) -> int:
        return self.seeds if self.script is not None and state is None else 1


@dataclass
class PatchCandidate:
    """One patch: a finding of the static rules in a file the workload executed."""

    id: str
    finding: Finding
    source: str  # the file's text as read; --apply refuses to write if it changed since
    patched: str | None  # the text with only this patch applied (None: not runnable)
    reason: str | None = None  # why it is not run
    file: FileResult | None = None  # the analysis it came from, whose fixes patches of one file combine from
    exercised: bool = True  # whether the profile saw the patched lines run
    fallback_for: str | None = None  # the observed patch of the same block, tried first (this one runs if it fails)

    @property
    def path(self) -> str:
        return self.finding.path


@dataclass
class Trial:
    """A patched configuration (one patch, or several together) measured against the original."""

    ids: tuple[str, ...]
    worker: WorkerProcess | None = None
    parity: Comparison | None = None
    paired: Paired | None = None
    state_dict: StateKeys | None = None
    peak: MemoryPeak | None = None
    error: str | None = None
    overlay_root: str = ""

    @property
    def verdict(self) -> str:
        if self.error is not None or self.parity is None:
            return NOT_RUN
        if not self.parity.ok:
            return PARITY_FAILED
        return VERIFIED if self.paired.speedup_ci()[0] > 1.0 else NO_GAIN

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


@dataclass
class Session:
    options: Options
    progress: Callable[[str], None]
    report: ReportFolder
    original: WorkerProcess | None = None
    candidates: dict[str, PatchCandidate] = field(default_factory=dict)
    inputs: list[InputSet | None] = field(default_factory=list)  # None: the workload's own inputs
    references: list[RunOutputs] = field(default_factory=list)
    nondeterministic: str | None = None
    notes: list[str] = field(default_factory=list)
    observed: RuntimeEvidence | None = None  # what the attention blocks saw on every input, once asked
    autograd_requests: list[str] = field(default_factory=list)  # double backward / forward AD seen in one step

    def __post_init__(self):
        self.scratch = tempfile.mkdtemp(prefix="advisor-overlay-")

    # -- the original side ---------------------------------------------------------------------------------------
    def start_original(self) -> Loaded:
        o = self.options
        self.progress("starting the original workload")
        self.original = start_worker("original", o.timeout_s, self.progress,
                                     log_path=self.report.create("original.log"))
        self.info = self.original.call(o.load_request(), doing=o.loading())
        self.progress("profiling the original")
        self.profile_before = self.profile(self.original, "trace_before.json")
        self.state = self.original.call(Export())
        self.autograd_requests = self.original.call(AutogradRequests())
        self.inputs = [None]
        if self.info.autocast:
            self.notes.append(f"the model's calls ran under {described(self.info.autocast)}: every run of either side "
                              f"replays it, and parity allows {str(self.computed_in).replace('torch.', '')}'s "
                              "rounding")
        if self.info.captured:
            self.notes.append(self.info.captured)
            self.inputs += [self.original.call(Inputs(index)) for index in range(1, self.info.inputs)]
        elif self.info.accepts_seed:
            first = self.original.call(Inputs(0))
            seeded = [self.original.call(Inputs(seed)) for seed in range(1, o.seeds)]
            fresh = [inputs for inputs in seeded if not _same_inputs(inputs, first)]
            self.inputs += fresh
            if not fresh:  # promise breaker round 31: "3 seeds" of one input, reseeded with a constant
                self.notes.append("the TARGET function's `seed` argument did not change its inputs: parity is "
                                  "checked on its one input")
        else:
            self.notes.append("the TARGET function takes no `seed` argument: parity is checked on its one input")
        self.progress(f"reference outputs on {len(self.inputs)} input(s)")
        self.references = [self.run(self.original, inputs) for inputs in self.inputs]
        nans = sum(_nan_count(reference.tree()) for reference in self.references)
        if nans:
            self.notes.append(f"the original's outputs hold {nans} NaN value(s): compared position by position "
                              "(NaN on both sides counts as equal)")
        self._check_determinism()
        return self.info

    @property
    def computed_in(self):
        """The least precise dtype of the autocast regions the model's calls ran in (parity's tolerance), if any."""
        return least_precise(self.info.autocast)

    def profile(self, worker: WorkerProcess, trace_name: str) -> Profiled:
        """The worker's profile; its Chrome trace is written in this session's private folder, then copied into the
        report folder (which the profiler would write through a link)."""
        trace = os.path.join(self.scratch, trace_name)
        profiled = worker.call(Profile(trace))
        if os.path.exists(trace):
            self.report.copy_in(trace, trace_name)
        return profiled

    def observations(self) -> RuntimeEvidence:
        """What every call of each attention block saw on every parity input (facts from the run), recorded once."""
        if self.observed is None:
            self.progress("recording what the attention blocks see on each input")
            self.observed = RuntimeEvidence(self.options.target)
            try:
                for inputs in self.inputs:
                    add_block_calls(self.observed, self.original.call(
                        Observe() if inputs is None else Observe(inputs.args, inputs.kwargs)))
            except WorkerFailed as exc:
                if self.original.closed:
                    raise
                self.observed = RuntimeEvidence(self.options.target)  # no facts from a run only partly seen
                self.notes.append(f"what the attention blocks saw could not be recorded: {exc}")
        return self.observed

    def gradients_compared(self) -> bool:
        """Whether the reference passes had a gradient to compare (a parameter's or an input's): `--train` on a
        module with neither compares outputs only, and the reports say so rather than "+ grads"."""
        return any(reference.grads for reference in self.references)

    def run(self, worker: WorkerProcess, inputs: InputSet | None, rng_seed: int = 0) -> RunOutputs:
        args, kwargs = (None, None) if inputs is None else (inputs.args, inputs.kwargs)
        return worker.call(Run(args, kwargs, grads=self.options.train, rng_seed=rng_seed))

    def _check_determinism(self) -> None:
        """Patches are only judged on a model that repeats itself with the same inputs and RNG seed."""
        again = compare(self.references[0].tree(), self.run(self.original, None).tree(),
                        computed_in=self.computed_in)
        if not again.ok:
            self.nondeterministic = ("the original model is not deterministic: two runs on the same inputs and RNG "
                                     f"seed differ ({again.failures[0]}; max abs {again.max_abs_err:.3g})")
            return
        if not compare(self.references[0].tree(), self.run(self.original, None, rng_seed=1).tree(),
                       computed_in=self.computed_in).ok:
            self.notes.append("the model draws random numbers in eval mode: both sides are compared with the same "
                              "RNG seed")

    # -- patched sides -------------------------------------------------------------------------------------------
    def trial(self, ids: tuple[str, ...]) -> Trial:
        """Start a worker with these patches overlaid, check parity on every input, time it against the original."""
        o = self.options
        label = "+".join(ids)
        try:
            overlay = self.overlay(ids)
        except AdvisorError as exc:
            return Trial(ids, error=str(exc))
        self.progress(f"checking {label}")
        trial = Trial(ids, overlay_root=tempfile.mkdtemp(dir=self.scratch))
        try:
            trial.worker = start_worker(f"patched ({label})", o.timeout_s, self.progress, overlay=overlay,
                                        overlay_root=trial.overlay_root,
                                        log_path=self.report.create(f"patched-{label}.log"))
            loaded = trial.worker.call(o.load_request(self.state), doing=o.loading(self.state))
            trial.state_dict = loaded.state_dict
            trial.parity = Comparison()
            for inputs, reference in zip(self.inputs, self.references):
                trial.parity.merge(compare(reference.tree(), self.run(trial.worker, inputs).tree(),
                                           computed_in=self.computed_in))
            if trial.parity.outputs_compared == 0:  # breaker round 17: a custom output object, verified on nothing
                skipped = ", ".join(trial.parity.skipped) or "none"
                trial.parity.failures.append(f"no output tensor was compared (not compared: {skipped}): parity "
                                             "has no evidence")
            if trial.parity.ok:
                self.progress(f"timing {label} against the original")
                trial.paired = interleave(self.original, trial.worker, o.timing_budget_s)
                trial.peak = trial.worker.call(PeakMemory())
        except WorkerFailed as exc:
            if self.original.closed:
                raise
            trial.error, trial.parity = f"the patched side failed: {exc}", None
        if trial.verdict in (PARITY_FAILED, NOT_RUN):
            trial.close()
        return trial

    def by_file(self, ids: tuple[str, ...]) -> dict[str, list[PatchCandidate]]:
        """The chosen patches grouped by the file they patch (a file's patches are applied together)."""
        grouped: dict[str, list[PatchCandidate]] = {}
        for pid in ids:
            grouped.setdefault(self.candidates[pid].path, []).append(self.candidates[pid])
        return grouped

    def overlay(self, ids: tuple[str, ...]) -> dict[str, str]:
        """Patched text per file for a set of patches (one rewrite per file, as --apply would write it)."""
        return {path: combined_text(chosen) for path, chosen in self.by_file(ids).items()}

    def close(self) -> None:
        if self.original is not None:
            self.original.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.report.close()


def combined_text(chosen: list[PatchCandidate]) -> str:
    """The file with the chosen patches (all of one file) applied together by the rewrite layer."""
    if len(chosen) == 1:
        return chosen[0].patched
    first = chosen[0]
    if any(c.file is not first.file for c in chosen):  # a guarded fallback comes from the analysis without the run
        raise AdvisorError(f"{display_path(first.path)}: these patches come from two analyses of the file and are "
                           "not combined in one rewrite")
    applied = first.file.fixed_with([c.finding for c in chosen])
    if applied.problems or applied.text == first.source:
        why = "; ".join(applied.problems) or "no change"
        raise AdvisorError(f"{display_path(first.path)}: these patches cannot be combined in one rewrite ({why})")
    return applied.text


def collect_candidates(files: list[str], unsafe_fixes: bool, backend: str = "sdpa",
                       observations: Callable[[], RuntimeEvidence] | None = None,
                       call_site_facts: bool = True, autograd_requests: list[str] = (),
                       scripts: list[str] = (), rules: RuleChoice = RuleChoice(),
                       evidence: RuntimeEvidence | None = None) -> dict[str, PatchCandidate]:
    """Patches of the static rules over the files the profile saw running (attention findings with a patch, and
    the copies and casts `evidence`, the original's profile, measured: as `fix --profile` builds them; promise
    breaker round 32: optimize called those "no rewrite rule" while `fix --profile` patched them).
    Without --unsafe-fixes, a file with an unsafe attention patch is analysed again with `observations` (what its
    blocks saw on every input): a patch whose every unproved fact held there is tried too (`discharged`). With
    `call_site_facts`, those files' calls may prove facts of the functions they call. Those files and `scripts`
    (the script the command runs, which may run no op of its own) are the scanned tree for what is asked of
    autograd too, with `autograd_requests`: what the run was seen asking. `rules`: the configuration's choice of
    rules and files, as `scan` and `fix` read it (promise breaker round 31: an ignored rule's patch was applied)."""
    candidates: dict[str, PatchCandidate] = {}
    # hooks on every module, and what the files ask of autograd
    context = sorted({*files, *scripts})
    project, tree_facts = tree_wide_facts(context, call_site_facts)
    tree = TreeContext(project, tree_facts.with_observed(list(autograd_requests)),
                       Tree(context) if call_site_facts else None)
    for path in files:
        source = read_source(path)
        measured = evidence.for_path(path) if evidence is not None else None
        if not hasattr(source, "text") or not (might_match(source.text) or measured) or rules.excludes(path):
            continue
        select, ignore = rules.codes(path)
        result = _analyzed(source.text, path, unsafe_fixes, backend, evidence, tree, select=select, ignore=ignore)
        if result is None:
            continue
        static = result
        if observations is not None and not unsafe_fixes and any(_observable(f) for f in result.findings):
            result = _analyzed(source.text, path, unsafe_fixes, backend, with_blocks(evidence, observations()), tree,
                               True, select, ignore) or result
        # a safe patch guarded by its masks' absence, where the run saw them present: tried if the observed one fails
        guarded = {f.line: f for f in static.findings if result is not static and f.fix_safety == "safe" and
                   _observable(f)}
        for finding in result.findings:
            if not finding.patch:
                continue
            pid = f"P{len(candidates) + 1}"
            fallback = guarded.get(finding.line) if finding.extra.get("discharged") == "observed" else None
            if fallback is not None:
                fid = f"P{len(candidates) + 2}"
                candidates[pid] = PatchCandidate(pid, finding, source.text, result.fixed_with([finding]).text,
                                                 file=result)
                candidates[fid] = PatchCandidate(fid, fallback, source.text, static.fixed_with([fallback]).text,
                                                 file=static, fallback_for=pid)
                continue
            if finding.fix_safety != "safe" and not unsafe_fixes and finding.extra.get("discharged") != "observed":
                candidates[pid] = PatchCandidate(pid, finding, source.text, None,
                                            f"unsafe fix ({finding.reason or 'see the rule'}): rerun with "
                                            "--unsafe-fixes to verify it on these inputs")
                continue
            candidates[pid] = PatchCandidate(pid, finding, source.text, result.fixed_with([finding]).text, file=result)
    return candidates


def _analyzed(text: str, path: str, unsafe_fixes: bool, backend: str, runtime: RuntimeEvidence | None = None,
              tree: TreeContext | None = None, observed_masks: bool = False, select: list[str] | None = None,
              ignore: list[str] | None = None) -> FileResult | None:
    try:
        return analyze_source(text, path, unsafe_fixes=unsafe_fixes, backend=backend, runtime=runtime,
                              tree_context=tree, observed_masks=observed_masks, select=select, ignore=ignore)
    except Exception:  # noqa: BLE001 - a file we cannot analyse offers no patch; the scan verb reports why
        return None


def _observable(finding: Finding) -> bool:
    """An unsafe attention patch with an assumed fact the run can observe, or a safe one whose guard runs the
    original wherever a mask is present (`fully-masked-rows` guarded): where the run saw the masks present with
    their facts holding, the patch that passes them to SDPA is tried first."""
    facts = finding.extra.get("facts") or {}
    if finding.kind != "attention" or finding.patch is None:
        return False
    if finding.fix_safety == "safe":
        return any(fact["name"] == "fully-masked-rows" for fact in facts.get("guarded") or [])
    return finding.fix_safety == "unsafe" and any(fact["name"] in OBSERVERS for fact in facts.get("assumed") or [])


def set_aside_unexercised(candidates: dict[str, PatchCandidate], lines: list[list],
                          evidence: RuntimeEvidence | None = None) -> None:
    """Patches are built per file; one whose lines the profile never saw run (a class this configuration does not
    call) is not exercised by the workload: timing it would measure nothing, so it is never run. Seen run: a line
    that owns op time, or one where the profile's recorder saw a watched call or found a copy or cast (a
    `.contiguous()` of a contiguous tensor takes no time, but ran: promise round 33)."""
    ran: dict[str, set[int]] = {}
    for path, line in lines:
        ran.setdefault(path, set()).add(line)
    for path, found in (evidence.files.items() if evidence is not None else ()):
        ran.setdefault(path, set()).update({line for line, _ in found.observed} | set(found.hits))
    for candidate in candidates.values():
        f = candidate.finding
        seen = ran.get(os.path.realpath(f.path), set())
        candidate.exercised = any(f.line <= line <= (f.end_line or f.line) for line in seen)
        if not candidate.exercised:
            candidate.patched = None
            candidate.reason = (f"not exercised by this workload: the profile saw no op run on lines "
                                f"{f.line}-{f.end_line} ({f.function})")


def choose_final(session: Session, trials: dict[str, Trial], verified: list[str]) -> Trial | None:
    """All verified patches together; when that fails parity, leave one out at a time to find the culprit."""
    while verified:
        if len(verified) == 1:
            return trials[verified[0]]
        combination = session.trial(tuple(verified))
        if combination.verdict in (VERIFIED, NO_GAIN) and combination.parity.ok:
            return combination
        combination.close()
        culprit = None
        for pid in verified:
            rest = tuple(v for v in verified if v != pid)
            probe = trials[rest[0]] if len(rest) == 1 else session.trial(rest)
            if probe.parity is not None and probe.parity.ok:
                culprit = pid
                if len(rest) > 1:
                    probe.close()
                break
            if len(rest) > 1:
                probe.close()
        culprit = culprit or verified[-1]
        others = ", ".join(v for v in verified if v != culprit)
        trials[culprit].error = f"verified alone, but fails parity together with {others}"
        verified = [v for v in verified if v != culprit]
    return None


def script_files(command: list[str] | None) -> list[str]:
    """The script a script-mode command runs (`python train.py --steps 3`: train.py; none for `-m module`, which
    only the worker may look up): read for the tree's facts, since the script may ask autograd for double backward
    around a model of another file (breaker round 17: a gradient penalty in train.py, and the patch of model.py
    raised there)."""
    path = parse_command(command).path if command else None
    return [os.path.realpath(path)] if path is not None else []


def optimize(options: Options, progress: Callable[[str], None] = lambda _: None) -> OptimizeReport:
    report = ReportFolder(options.report_dir)
    try:
        report.check(REPORT_NAMES)
    except AdvisorError:
        report.close()
        raise
    session = Session(options, progress, report)
    trials: dict[str, Trial] = {}
    final = None
    try:
        info = session.start_original()
        session.candidates = collect_candidates(session.profile_before.files, options.unsafe_fixes,
                                                options.backend,
                                                session.observations if session.nondeterministic is None else None,
                                                options.call_site_facts, session.autograd_requests,
                                                script_files(options.script), options.rules,
                                                measured_lines(session.profile_before.evidence))
        set_aside_unexercised(session.candidates, session.profile_before.lines, session.profile_before.evidence)
        for pid, candidate in session.candidates.items():
            preferred = trials.get(candidate.fallback_for)
            if preferred is not None and preferred.verdict == VERIFIED:
                candidate.reason = (f"not run: {candidate.fallback_for}, the patch of this block that passes the "
                                    "masks the run saw to SDPA, verified (this one runs the original wherever they "
                                    "are present)")
            elif candidate.patched is not None and session.nondeterministic is None:
                trials[pid] = session.trial((pid,))
        verified = [pid for pid, t in trials.items() if t.verdict == VERIFIED]
        final = choose_final(session, trials, verified)
        for trial in trials.values():
            if trial is not final:
                trial.close()
        return _result(session, info, trials, final, progress)
    finally:
        if final is not None:
            final.close()
        for trial in trials.values():
            trial.close()
        session.close()


def _result(session: Session, info: Loaded, trials: dict[str, Trial], final: Trial | None,
            progress) -> OptimizeReport:
    o = session.options
    before_peak = session.original.call(PeakMemory())
    if final is not None:
        before = summary(final.paired.a, before_peak.bytes)
        after = summary(final.paired.b, final.peak.bytes)
        progress("profiling the patched side")
        profile_after = session.profile(final.worker, "trace_after.json")
    else:
        before = summary(session.original.call(Time(10, warmup=2)).us, before_peak.bytes)
        after = profile_after = None
    written = _apply_reviewed(session, trials, final) if final else {}
    ops_before = session.profile_before.ops
    ops_after = profile_after.ops if profile_after else []
    patches = [_patch_verdict(session, c, trials.get(pid), written.get(pid), final, ops_after, info.device)
               for pid, c in session.candidates.items()]
    return OptimizeReport(
        version=1, target=o.target,
        environment={"torch": torch.__version__, "device": info.device, "dtype": info.dtype,
                     "autocast": described(info.autocast) or None,
                     "threads": torch.get_num_threads(), "python": platform.python_version(),
                     "peak_memory_method": before_peak.method,
                     "sdpa_kernels": {"before": _sdpa_ops(ops_before), "after": _sdpa_ops(ops_after)}},
        mode="train" if o.train else "eval",
        before=before, after=after,
        speedup=round(final.paired.speedup(), 4) if final else None,
        speedup_ci=[round(v, 4) for v in final.paired.speedup_ci()] if final else None,
        speedup_method="median step time ratio; 95% percentile bootstrap over interleaved A/B rounds",
        patches=patches,
        unpatched=unpatched(session.profile_before.document["findings"], session.candidates, o.unsafe_fixes,
                            o.backend, o.rules),
        ops={"before": [op.to_json() for op in ops_before], "after": [op.to_json() for op in ops_after]},
        findings_before=session.profile_before.document["findings"],
        findings_after=_unmirrored(profile_after.document["findings"], final) if profile_after else [],
        traces={"before": os.path.join(o.report_dir, "trace_before.json"),
                "after": os.path.join(o.report_dir, "trace_after.json") if profile_after else None},
        report=None,
        state_dict=(final.state_dict if final else StateKeys()).to_json(),
        notes=session.notes + ([session.nondeterministic] if session.nondeterministic else []),
    )


def _apply_reviewed(session: Session, trials: dict[str, Trial], final: Trial) -> dict:
    """Apply the verified combination, or the part of it the reviewer accepts (--interactive). A part of several
    patches was never measured together: it is applied only after its own parity run passes. A patch verified on
    this workload alone is not asked about without --unsafe-fixes, since it would not be written (promise breaker
    round 31: `y` wrote nothing and said nothing); `apply_patches` gives it its reason."""
    o = session.options
    if not o.apply or o.review is None:
        return apply_patches(session, final.ids, o)
    held = tuple(pid for pid in final.ids if not o.unsafe_fixes and is_observed(session.candidates[pid].finding))
    asked = [pid for pid in final.ids if pid not in held]
    accepted = set(o.review([_review_item(session, pid, trials[pid]) for pid in asked])) if asked else set()
    ids = tuple(pid for pid in asked if pid in accepted)
    declined = {pid: (False, None, "declined at the --interactive prompt") for pid in asked if pid not in ids}
    if 1 < len(ids) < len(final.ids):
        session.progress("checking the parity of the accepted patches together")
        together = session.trial(ids)
        together.close()
        if not (together.parity is not None and together.parity.ok):
            why = together.error or "; ".join(together.parity.failures[:3])
            return declined | {pid: (False, None, f"the accepted patches fail parity together: {why}") for pid in ids}
    return declined | apply_patches(session, ids + held, o)


def _review_item(session: Session, pid: str, trial: Trial) -> dict:
    """What a reviewer sees of one verified patch: where, the diff, its measured numbers, and for one verified on
    this workload alone the facts it assumes (as every report labels it)."""
    finding = session.candidates[pid].finding
    assumes = [fact["name"] for fact in (finding.extra.get("facts") or {}).get("assumed") or []]
    return {"id": pid, "rule": finding.rule, "path": display_path(finding.path), "line": finding.line,
            "fix_safety": finding.fix_safety, "diff": finding.patch, "speedup": trial.paired.speedup(),
            "speedup_ci": trial.paired.speedup_ci(), "max_abs_err": trial.parity.max_abs_err,
            "label": f"verified on this workload; assumes: {', '.join(assumes)}" if is_observed(finding) else
            "verified"}


# breaker round 17: three recorded calls without a padded row, then the script's own later batches had one
OBSERVED_NOT_WRITTEN = ("verified on this workload, not proved: its facts held on the recorded calls only, and "
                        "`--apply` writes such a patch with `--unsafe-fixes` alone")


def is_observed(finding: Finding) -> bool:
    """An unsafe patch tried because its facts held on every recorded call (not proved for other inputs)."""
    return finding.extra.get("discharged") == "observed"


def apply_patches(session: Session, ids: tuple[str, ...], o: Options) -> dict[str, tuple[bool, str | None, str | None]]:
    """With --apply: each file's verified patches in one atomic write under --root (those verified on the workload
    alone, `is_observed`, only with --unsafe-fixes); outside it, or in an installed
    package (a `site-packages` folder, also one of a virtual environment inside the root: breaker round 17; any file
    of an environment, `.venv/src/` checkouts too: promise breaker round 30), the
    verified diff goes to the report folder. pid -> (applied, written_to, reason)."""
    if not o.apply:
        return {}
    root = os.path.realpath(o.root)
    outcome = {}
    held = [pid for pid in ids if not o.unsafe_fixes and is_observed(session.candidates[pid].finding)]
    outcome.update({pid: (False, None, OBSERVED_NOT_WRITTEN) for pid in held})
    ids = tuple(pid for pid in ids if pid not in held)
    for path, chosen in session.by_file(ids).items():
        text, source = combined_text(chosen), chosen[0].source
        installed = is_library_file(os.path.realpath(path)) or in_environment(path)
        if os.path.realpath(path).startswith(root.rstrip(os.sep) + os.sep) and not installed:  # `--root /` too
            try:
                write_atomically(path, source, text, force_readonly=o.force_readonly)
                result = (True, path, None)
            except WriteRefused as exc:  # changed since read, read-only, ...: this file only; the others are written
                result = (False, None, f"{display_path(path)} {exc}")
        else:
            diff_name = _outside_diff_name(path)
            folder = os.path.dirname(os.path.realpath(path))  # `git apply` takes no absolute or `..` name
            diff_path = session.report.write_text(diff_name, unified_diff(os.path.basename(os.path.realpath(path)),
                                                                          source, text))
            where = "in an installed package" if installed else f"outside --root {display_path(o.root)}"
            result = (False, diff_path, f"{where}: the verified diff was written to {diff_path} (apply it in "
                                        f"{display_path(folder)})")
        outcome.update({c.id: result for c in chosen})
    return outcome


def _outside_diff_name(path: str) -> str:
    """`patches/m1.py-<digest of its real path>.diff`: one name a file (`outside/p__q/m1.py` and `outside/p/q__m1.py`
    shared one when the path's separators became `__`, and one verified diff replaced the other: breaker round
    18)."""
    real = os.path.realpath(path)
    digest = hashlib.blake2b(real.encode("utf-8", "surrogateescape"), digest_size=6).hexdigest()
    name = re.sub(r"[^\w.-]", "_", os.path.basename(real))
    return f"patches/{name}-{digest}.diff"


def _patch_verdict(session: Session, c: PatchCandidate, trial: Trial | None, written,
                   final: Trial | None, ops_after: list[OpTotal], device: str) -> PatchVerdict:
    f = c.finding
    verdict = trial.verdict if trial is not None else NOT_RUN
    reason = c.reason or (trial.error if trial is not None else None) or session.nondeterministic
    reasons = (reason,) if reason else ()
    if trial is not None and trial.error is None and verdict == PARITY_FAILED:
        reasons = tuple(trial.parity.failures[:3])
    elif verdict == NO_GAIN:
        lo, hi = trial.paired.speedup_ci()
        reasons = (f"no measurable gain: the speedup's 95% interval [{lo:.3f}, {hi:.3f}] does not clear 1.0",)
    applied, written_to, write_reason = written or (False, None, None)
    parity = trial.parity if trial is not None else None
    return PatchVerdict(
        id=c.id, rule=f.rule, path=display_path(f.path), line=f.line, end_line=f.end_line,
        function=f.function, fix_safety=f.fix_safety, facts=f.extra.get("facts"),
        discharged=f.extra.get("discharged"), diff=f.patch,
        verdict=verdict, verified=verdict == VERIFIED, offered=verdict == VERIFIED,
        exercised=c.exercised,
        parity=None if parity is None else {
            "max_abs_err": parity.max_abs_err, "max_rel_err": parity.max_rel_err, "atol": parity.atol,
            "rtol": parity.rtol, "atol_applied": parity.atol_applied, "elements": parity.elements,
            "mismatched": parity.mismatched, "seeds": len(session.inputs), "outputs_compared": parity.outputs_compared,
            "fully_masked_rows": {"rows": parity.fully_masked_rows, "original": "NaN", "patched": "finite"}
            if parity.fully_masked_rows else None,
            "grads": session.options.train and session.gradients_compared(), "not_compared": parity.skipped},
        speedup=round(trial.paired.speedup(), 4) if trial is not None and trial.paired else None,
        speedup_ci=[round(v, 4) for v in trial.paired.speedup_ci()] if trial is not None and trial.paired else None,
        reasons=(write_reason,) if write_reason else reasons, applied=applied, written_to=written_to,
        state_dict=trial.state_dict.to_json() if trial is not None and trial.state_dict is not None else None,
        unsafe_facts_checked_on=(f"{len(session.inputs)} input(s) of {session.options.target}"
                                 if f.fix_safety == "unsafe" and trial is not None and trial.parity else None),
        emission=backend_emission(f.extra.get("emission"), ops_after if final is not None else None, device),
    )


# the ops that show each backend's own kernel ran (the CPU's SDPA flash op is not the CUDA one); compiled
# FlexAttention (what the flex patch runs, eval on CPU too) shows as its compiled region, never as an op named
# flex_attention (promise round 33: its numbers were called the fallback's)
BACKEND_KERNELS = {"flash": ("_scaled_dot_product_flash_attention",), "flash-attn": ("flash_attn",),
                   "flex": ("flex_attention", "torch-compiled region", "compiledfxgraph")}


def backend_emission(emission: dict | None, ops_after: list[OpTotal] | None, device: str) -> dict | None:
    """What `--backend` emitted, and whether the patched run's profile shows that backend's kernel: a flash or
    flex patch on a machine without it runs its SDPA fallback, and then that is what parity and speed measured."""
    if not emission or emission.get("emitted") in (None, "sdpa"):
        return emission
    markers = BACKEND_KERNELS.get(emission["emitted"], ())
    if emission["emitted"] in ("flash", "flash-attn") and not device.startswith("cuda"):
        ran = False  # CUDA kernels: whatever was profiled (or not, for a patch that did not verify)
    elif ops_after is None:
        ran = None
    else:
        ran = any(marker in op.op.lower() and not op.op.endswith("_for_cpu") for op in ops_after for marker in markers)
    return {**emission, "kernel_ran": ran, "device": device,
            "gpu_verified": bool(ran) and device.startswith("cuda")}


def _unmirrored(findings: list[dict], final: Trial) -> list[dict]:
    """Patched-side findings name the mirrored copies; show the original file (lines are the patched text's)."""
    out = []
    for finding in findings:
        finding = dict(finding)
        original = original_path(final.overlay_root, os.path.abspath(finding["path"]))
        if original:
            finding["path"], finding["patched_copy"] = display_path(original), True
        out.append(finding)
    return out


def _same_inputs(a: InputSet, b: InputSet) -> bool:
    """Whether two input sets hold the same values (tensors equal, everything else equal)."""
    left, left_spec = torch.utils._pytree.tree_flatten((a.args, a.kwargs))
    right, right_spec = torch.utils._pytree.tree_flatten((b.args, b.kwargs))
    return left_spec == right_spec and all(_same_value(x, y) for x, y in zip(left, right))


def _same_value(x, y) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype and \
            x.shape == y.shape and torch.equal(x, y)
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - a value that does not compare is not known to be the same
        return False


def _nan_count(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return int(tree.isnan().sum()) if tree.is_floating_point() else 0
    values = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else ()
    return sum(_nan_count(v) for v in values)


def _sdpa_ops(ops: list[OpTotal]) -> list[str]:
    return sorted(op.op for op in ops if any(marker in op.op for marker in SDPA_OP_MARKERS))
