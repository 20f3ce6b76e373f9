"""Static scan of one source text or many files: attention findings, each with its patch."""

from __future__ import annotations

import ast
import os
import re
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial

import libcst as cst

from advisor.backends.site import plan_backend
from advisor.findings import Finding, ScanError, display_path
from advisor.fixes import copies_casts
from advisor.fixes.evidence import RuntimeEvidence
from advisor.hf.config_rules import might_match as might_match_config
from advisor.hf.findings import config_findings
from advisor.patterns.attention import AttentionMatch, find_attention
from advisor.rewrite.apply import RewriteFailed, rewrite_edits
from advisor.rewrite.splice import Edit, apply_edits, local_diff
from advisor.registry import is_selected, load_rules
from advisor.static.discover import discover, read_source
from advisor.static.module_index import ParsedModule

SAFE, ESCAPING, UNPROVED = "ADV101", "ADV102", "ADV103"
PARALLEL_FROM = 16  # files; below this, process start-up costs more than it saves
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
IGNORE_COMMENT = re.compile(r"#\s*advisor:\s*ignore(?:\[([A-Z0-9, ]+)\])?")


@dataclass
class FileResult:
    path: str
    source: str
    fixed: str  # the source with every applicable patch applied (== source when none)
    findings: list[Finding] = field(default_factory=list)


@dataclass
class ScanResult:
    files: list[FileResult] = field(default_factory=list)
    errors: list[ScanError] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for result in self.files for f in result.findings]


def might_contain_attention(source: str) -> bool:
    """Cheap prefilter: every attention matcher anchors on a softmax, every configuration rule on one of its
    tokens (advisor.hf.config_rules.PREFILTER_TOKENS) and every static copy/cast proof on one of its own
    (advisor.fixes.copies_casts.PREFILTER_TOKENS), so a file with none has no static finding."""
    lowered = source.lower()
    return "softmax" in lowered or might_match_config(lowered) or copies_casts.might_match(lowered)


def analyze_source(source: str, path: str, unsafe_fixes: bool = False, select: list[str] | None = None,
                   ignore: list[str] | None = None, only: set[tuple[str, int]] | None = None,
                   backend: str = "sdpa", runtime: RuntimeEvidence | None = None) -> FileResult:
    """Findings for one file; raises libcst.ParserSyntaxError for unparsable source.
    `only` restricts which findings' patches go into `fixed` (by (rule, line)), for interactive review;
    `backend` is what attention rewrites target where the site is eligible (sdpa, flash, flash-attn);
    `runtime` is a profile's evidence (`fix --profile`), joined to this file's copies and casts."""
    parsed = ParsedModule(source, path)
    suppressed = _suppressions(source)
    findings, to_apply, config_edits, edits = [], [], [], []
    for match in find_attention(parsed):
        rule = _rule_for(match)
        if not is_selected(rule, select, ignore) or _is_suppressed(suppressed, match, rule):
            continue
        finding, finding_edits = _finding(parsed, match, rule, backend)
        findings.append(finding)
        chosen = only is None or (rule, finding.line) in only
        if chosen and finding.patch and (finding.fix_safety == "safe" or unsafe_fixes):
            to_apply.append(match)
            edits.append(finding_edits)
    covered = [(f.line, f.end_line, f.rule, f.patch is not None) for f in findings]
    evidence = runtime.for_path(path) if runtime is not None else None
    # Hugging Face and deprecated-API rules, then copies and casts: each finding with its own expression edit
    for finding, edit, finding_edits in config_findings(parsed) + copies_casts.copy_cast_findings(parsed, evidence,
                                                                                                   covered):
        if not is_selected(finding.rule, select, ignore) or _is_suppressed(suppressed, finding, finding.rule):
            continue
        findings.append(finding)
        chosen = only is None or (finding.rule, finding.line) in only
        if chosen and edit is not None and (finding.fix_safety == "safe" or unsafe_fixes):
            config_edits.append(edit)
            edits.append(finding_edits)
    fixed = source
    if len(edits) == 1:  # the usual case: that finding's own patch is the whole fix
        fixed = apply_edits(source, edits[0])
    elif edits:
        try:
            fixed = apply_edits(source, rewrite_edits(parsed, to_apply, drop_weights=unsafe_fixes, backend=backend,
                                                      edits=config_edits))
        except RewriteFailed:
            fixed = source
    return FileResult(path, source, fixed, findings)


def _rule_for(match: AttentionMatch) -> str:
    if match.output_node is None:
        return UNPROVED
    return ESCAPING if match.escapes else SAFE


def _finding(parsed: ParsedModule, match: AttentionMatch, rule: str,
             backend: str) -> tuple[Finding, list[Edit] | None]:
    """The finding, and the edits of its patch alone (None when it has none); both cost the size of the block.
    A patch whose proof left a fact assumed is unsafe whatever the rule's default: it names those facts."""
    definition = load_rules()[rule]
    patch, reason, edits = None, match.reason, None
    plan = plan_backend(parsed, match, backend) if match.output_node is not None else None
    fixable = match.output_node is not None and match.unsafe_reason is None
    if fixable:
        try:
            edits = rewrite_edits(parsed, [match], drop_weights=rule == ESCAPING, backend=backend)
            patch = local_diff(display_path(parsed.path), parsed.lines, edits)
        except RewriteFailed as exc:
            fixable, reason, edits = False, str(exc), None
        except Exception as exc:  # noqa: BLE001 - a bug of ours on one patch must not lose the file's findings
            fixable, edits = False, None
            reason = f"internal error while rewriting this block ({type(exc).__name__}: {exc}); please report it"
    elif match.unsafe_reason:
        reason = f"{match.reason}; {match.unsafe_reason}"
    safety = definition.fix_safety
    assumed = match.facts.assumptions + (plan.assumptions if plan else [])
    if assumed and match.output_node is not None:
        safety = "unsafe"
        unproved = "unproved: " + "; ".join(f"{fact.statement} ({fact.why})" for fact in assumed)
        reason = unproved if rule == SAFE or reason is None else f"{reason}; {unproved}"
    extra = {"roles": _roles(match), "facts": match.facts.to_json()} if match.output_node is not None else {}
    if plan is not None:  # backend eligibility of the SDPA call and what --backend emitted (issue 10)
        extra.update(plan.to_json())
    reason = reason if rule != SAFE or assumed else None
    if match.note:
        reason = f"{reason}; {match.note}" if reason else match.note
    return Finding(rule=rule, kind=definition.kind, path=parsed.path, line=match.line, end_line=match.end_line,
                   function=match.function, message=definition.title, fixable=fixable,
                   fix_safety=safety, reason=reason, patch=patch, extra=extra), edits


def _roles(match: AttentionMatch) -> dict[str, object]:
    return {"query": match.query, "key": match.key, "value": match.value, "scale": match.scale or "default",
            "mask": "causal" if match.is_causal else match.attn_mask, "dropout_p": match.dropout_p}


def _suppressions(source: str) -> dict[int, set[str] | None]:
    """Line -> codes ignored there (None: all codes), from `# advisor: ignore[CODE]` comments."""
    found: dict[int, set[str] | None] = {}
    for number, line in enumerate(source.splitlines(), start=1):
        hit = IGNORE_COMMENT.search(line)
        if hit:
            found[number] = {c.strip() for c in hit.group(1).split(",")} if hit.group(1) else None
    return found


def _is_suppressed(suppressed: dict[int, set[str] | None], match: AttentionMatch | Finding, rule: str) -> bool:
    for line in range(match.line, match.end_line + 1):
        if line in suppressed and (suppressed[line] is None or any(rule.startswith(c) for c in suppressed[line])):
            return True
    return False


def scan_paths(paths: list[str], unsafe_fixes: bool = False, select: list[str] | None = None,
               ignore: list[str] | None = None, on_file=None, jobs: int | None = None,
               backend: str = "sdpa", runtime: RuntimeEvidence | None = None) -> ScanResult:
    """Scan files, in parallel processes when there are many; one bad file becomes an error entry and never
    stops the scan. Results keep the discovery order, so output is deterministic."""
    files, errors = discover(paths)
    result = ScanResult(errors=errors)
    jobs = jobs or min(os.cpu_count() or 1, 8)
    scan_one = partial(_scan_file, unsafe_fixes=unsafe_fixes, select=select, ignore=ignore, backend=backend,
                       runtime=runtime)
    if jobs > 1 and len(files) >= PARALLEL_FROM:
        outcomes = _scan_in_pool(files, scan_one, jobs)
    else:
        outcomes = []
        for path in files:
            if on_file is not None:
                on_file(path)
            outcomes.append(scan_one(path))
    for outcome in outcomes:
        (result.errors if isinstance(outcome, ScanError) else result.files).append(outcome)
    return result


def _scan_in_pool(files: list[str], scan_one, jobs: int) -> list[FileResult | ScanError]:
    """Results in discovery order. A worker that dies (a segfault in a native parser, the OOM killer) breaks the
    whole pool; the files without a result are then rescanned one process each, so the file that kills its
    process becomes that file's error entry and every other file still gets its result."""
    outcomes: dict[str, FileResult | ScanError] = {}
    try:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for path, outcome in zip(files, pool.map(scan_one, files, chunksize=4)):
                outcomes[path] = outcome
    except BrokenProcessPool:
        pass
    for path in files:
        if path not in outcomes:
            outcomes[path] = _scan_isolated(path, scan_one)
    return [outcomes[path] for path in files]


def _scan_isolated(path: str, scan_one) -> FileResult | ScanError:
    try:
        with ProcessPoolExecutor(max_workers=1) as pool:
            return pool.submit(scan_one, path).result()
    except BrokenProcessPool:
        return ScanError(path, "the analysis process died on this file (a crash in a native library?); please "
                               "report it", internal=True)


def _scan_file(path: str, unsafe_fixes: bool, select, ignore, backend: str = "sdpa",
               runtime: RuntimeEvidence | None = None) -> FileResult | ScanError:
    """One file's result or its one error entry, whatever happens while reading or analysing it. User code's
    compile-time warnings (`"\\d"`, `x is 1`) are not the tool's messages and stay silent."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return _analyze_file(path, unsafe_fixes, select, ignore, backend, runtime)
    except RecursionError:
        return ScanError(path, "too deeply nested to analyse (the interpreter's recursion limit was reached)")
    except MemoryError:
        return ScanError(path, "too large to analyse (out of memory)")
    except Exception as exc:  # noqa: BLE001 - a bug of ours on one file must not stop the scan
        return ScanError(path, f"internal error while analysing ({type(exc).__name__}: {exc}); please report it",
                         internal=True)


def _analyze_file(path: str, unsafe_fixes: bool, select, ignore, backend: str,
                  runtime: RuntimeEvidence | None) -> FileResult | ScanError:
    source = read_source(path)
    if isinstance(source, ScanError):
        return source
    error = _syntax_error(source.text, path)  # always the running interpreter's verdict, so one file gets one answer
    if error is not None:
        return error
    measured = runtime is not None and runtime.for_path(path) is not None
    if not measured and not might_contain_attention(source.text):
        return FileResult(path, source.text, source.text)
    try:
        return analyze_source(source.text, path, unsafe_fixes, select, ignore, backend=backend, runtime=runtime)
    except cst.ParserSyntaxError as exc:  # code CPython accepts but libcst cannot parse
        return ScanError(path, f"cannot parse at line {exc.raw_line}: {exc.message}")


def _syntax_error(text: str, path: str) -> ScanError | None:
    """The syntax check of the Python running advisor (CPython's parser is ~50x faster than libcst's): code newer
    than this interpreter, or nested deeper than its parser allows, is a syntax error here, whatever it contains."""
    try:
        ast.parse(text, path)
    except SyntaxError as exc:
        return ScanError(path, f"syntax error at line {exc.lineno}: {exc.msg} (Python {PYTHON_VERSION} parser)")
    except ValueError as exc:  # null bytes
        return ScanError(path, str(exc))
    return None
