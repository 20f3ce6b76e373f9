"""The static engine: discover -> read and syntax-check -> parse -> run the rule families whose prefilter tokens
occur (advisor.registry) -> selection and `# advisor: ignore` suppressions -> findings, each with its fix as node
edits. Patches (diffs) are built only when the caller asks for them, and fixes are applied by the rewrite layer,
once per file, for the findings a verb chooses (`FileResult.fixed_with`). Many files are scanned in processes."""

from __future__ import annotations

import gc
import io
import os
import re
import sys
import tokenize
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial

import libcst as cst

from advisor.child_lifetime import worker_pool
from advisor.contracts.detected import Detected, StaticContext
from advisor.contracts.finding import Finding, ScanError, display_path, relative_path
from advisor.contracts.evidence import RuntimeEvidence
from advisor.contracts.family import Family
from advisor.registry import families, is_selected
from advisor.rewrite.apply import RewriteFailed, combine, render
from advisor.rewrite.splice import apply_edits, local_diff
from advisor.static.collector import collector_paused, long_lived_set_aside
from advisor.static.deep_stack import outer_recursion_limit, run_with_deep_stack
from advisor.static.discover import SourceFile, discover, is_library_file, read_source
from advisor.static.module_index import ParsedModule
from advisor.static.notebook import NotebookCode
from advisor.static.python_ast import python_tree
from advisor.static.scan_cache import ScanCache
from advisor.static.tree_facts import TreeContext, tree_context

PARALLEL_FROM = 16  # files; below this, process start-up costs more than it saves
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
IGNORE_COMMENT = re.compile(r"#\s*advisor:\s*ignore(?:\[([A-Z0-9, ]+)\])?")


@dataclass
class Applied:
    """A file's text with chosen fixes applied, and what could not be: conflicts and a rewrite that failed."""

    text: str
    problems: list[str] = field(default_factory=list)
    not_applied: int = 0  # chosen fixes left out
    left: int | None = None  # once settled (`_settle`): the findings `text` still has that no applied fix removes


@dataclass
class FileResult:
    path: str
    source: str
    findings: list[Finding] = field(default_factory=list)
    unsafe_fixes: bool = False  # whether `fixed` applies unsafe fixes too
    detected: list[Detected] = field(default_factory=list, repr=False)  # in-process only: dropped when pickled
    parsed: ParsedModule | None = field(default=None, repr=False)
    notebook: NotebookCode | None = field(default=None, repr=False)  # a notebook: `source` is its code cells
    digest: str = field(default="", repr=False)  # of the bytes analysed (SourceFile.digest): the scan cache's key
    _applied: Applied | None = field(default=None, repr=False)

    def applicable(self, unsafe_fixes: bool | None = None) -> list[Finding]:
        """The findings whose fix `fixed` applies: safe ones, and unsafe ones too when asked."""
        unsafe = self.unsafe_fixes if unsafe_fixes is None else unsafe_fixes
        return [f for f in self.findings if f.fixable and (f.fix_safety == "safe" or unsafe)]

    @property
    def fixed(self) -> str:
        """The source with every applicable fix applied (== source when none)."""
        return self.applied.text

    @property
    def applied(self) -> Applied:
        if self._applied is None and self.__dict__.get("detached"):
            raise RuntimeError("this result came from another process without its fixed text (scan with fixed=True)")
        if self._applied is None:
            self._applied = self.fixed_with(self.applicable())
        return self._applied

    def fixed_with(self, chosen: list[Finding]) -> Applied:
        """The source with the fixes of `chosen` (findings of this result) applied in one pass of the rewrite
        layer; a fix that conflicts with an earlier chosen one is left out and named."""
        chosen_ids = {id(finding) for finding in chosen}  # by identity: one set lookup per finding, not a scan
        picked = [d for d in self.detected if d.fix is not None and id(d.finding) in chosen_ids]
        if len(picked) != len(chosen):
            raise ValueError("fixed_with takes findings of this result that have a fix")
        if not picked:
            return Applied(self.source)
        if len(picked) == 1:  # the usual case: that finding's own edits are the whole fix
            return Applied(apply_edits(self.source, picked[0].edits))
        merged, conflicts = combine(self.parsed, [d.fix for d in picked])
        problems = [f"{_where(picked[c.rejected].finding)}: fix not applied, it changes the code of the fix of "
                    f"{_where(picked[c.kept].finding)}" for c in conflicts]
        try:
            return Applied(apply_edits(self.source, render(self.parsed, merged)), problems, len(conflicts))
        except RewriteFailed as exc:
            return Applied(self.source, problems + [f"{display_path(self.path)}: fixes not applied together ({exc})"],
                           len(picked))

    def __getstate__(self):
        """Across processes a result carries its text, findings and (when computed) its fixed text; its node edits
        and tree stay behind."""
        return {**self.__dict__, "detected": [], "parsed": None, "detached": bool(self.detected)}


def _where(finding: Finding) -> str:
    return f"{display_path(finding.path)}:{finding.line} {finding.rule}"


@dataclass
class ScanResult:
    files: list[FileResult] = field(default_factory=list)
    errors: list[ScanError] = field(default_factory=list)
    # every path named was dropped by force-exclude: nothing to scan, and nothing wrong (pre-commit naming only
    # excluded files must pass, as Ruff's hook does)
    all_excluded: bool = False

    @property
    def findings(self) -> list[Finding]:
        return [f for result in self.files for f in result.findings]


def might_match(source: str) -> bool:
    """Cheap prefilter: a file in which no family's tokens occur has no static finding."""
    lowered = source.lower()
    return any(family.might_match(lowered) for family in families())


def static_families(source: str, path: str, evidence=None) -> list[Family]:
    """The families whose static hook can find anything in this file, in order: those whose screen (or, without
    one, prefilter tokens) admits its text, and those that read the profile's evidence for it. A file with none is
    never parsed by libcst."""
    lowered, library = source.lower(), is_library_file(path)
    return [family for family in families() if family.static is not None and
            (family.might_find(source, lowered, library) or family.uses_evidence and evidence)]


def analyze_source(source: str, path: str, unsafe_fixes: bool = False, select: list[str] | None = None,
                   ignore: list[str] | None = None, backend: str = "sdpa", runtime: RuntimeEvidence | None = None,
                   patches: bool = True, tree_context: TreeContext | None = None,
                   observed_masks: bool = False, suppressions: bool = True) -> FileResult:
    """Findings for one file; raises libcst.ParserSyntaxError for unparsable source. `backend` is what attention
    rewrites target where the site is eligible (sdpa, flash, flash-attn); `runtime` is a profile's evidence
    (`fix --profile`), joined to this file's copies and casts; `patches` builds each finding's diff;
    `tree_context`: what the rest of the scanned tree says (static.tree_facts.TreeContext: the hooks it registers on
    every module, what it asks of autograd, the calls of this file's functions; None: the file alone);
    `observed_masks`: masks under `if m is not None:` that `runtime` saw present, their facts holding on every call,
    are passed to SDPA (an observed patch, for `optimize`) rather than guarded by their absence; without
    `suppressions`, `# advisor: ignore` comments are not read (a report says what they suppressed)."""
    with collector_paused():
        return _analyze_source(source, path, unsafe_fixes, select, ignore, backend, runtime, patches,
                               tree_context or TreeContext(), observed_masks, suppressions)


def _analyze_source(source: str, path: str, unsafe_fixes: bool, select: list[str] | None, ignore: list[str] | None,
                    backend: str, runtime: RuntimeEvidence | None, patches: bool, tree_context: TreeContext,
                    observed_masks: bool, suppressions: bool) -> FileResult:
    parsed = ParsedModule(source, path, tree_context.project, tree_context.calls)
    suppressed = comment_suppressions(source) if suppressions else {}
    evidence = runtime.for_path(path) if runtime is not None else None
    context = StaticContext(parsed, backend, evidence, tree=tree_context, unsafe_fixes=unsafe_fixes,
                            observed_masks=observed_masks)
    detected: list[Detected] = []
    for family in static_families(source, path, evidence):
        for found in family.static(context, family.rules):
            rule = found.finding.rule
            if is_selected(rule, select, ignore) and suppressing_line(suppressed, found.finding, rule) is None:
                detected.append(found)
                context.earlier.append(found.finding)
    if patches:
        for found in detected:
            if found.edits is not None:
                found.finding.patch = local_diff(relative_path(path), parsed.lines, found.edits)
    return FileResult(path, source, [d.finding for d in detected], unsafe_fixes, detected, parsed)


def comment_suppressions(source: str) -> dict[int, set[str] | None]:
    """Line -> codes ignored there (None: all codes), from `# advisor: ignore[CODE]` comments: comments only, as
    the tokenizer finds them (a string holding the words suppresses nothing)."""
    found: dict[int, set[str] | None] = {}
    if IGNORE_COMMENT.search(source) is None:
        return found
    try:
        comments = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
                    if token.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):  # CPython parsed it (the syntax check): not reached in practice
        return found
    for number, comment in comments:
        hit = IGNORE_COMMENT.search(comment)
        if hit:
            found[number] = {c.strip() for c in hit.group(1).split(",")} if hit.group(1) else None
    return found


def suppressing_line(suppressed: dict[int, set[str] | None], finding: Finding, rule: str) -> int | None:
    """The line of the `# advisor: ignore` comment (`comment_suppressions`) that suppresses `finding`, or None."""
    return next((line for line in range(finding.line, finding.end_line + 1) if line in suppressed and (
        suppressed[line] is None or any(rule.startswith(c) for c in suppressed[line]))), None)


@long_lived_set_aside()
def scan_paths(paths: list[str], unsafe_fixes: bool = False, select: list[str] | None = None,
               ignore: list[str] | None = None, on_file=None, jobs: int | None = None,
               backend: str = "sdpa", runtime: RuntimeEvidence | None = None, patches: bool = True,
               fixed: bool = True, call_site_facts: bool = True, path_rules=None, cache: bool = True,
               tree_paths: list[str] | None = None) -> ScanResult:
    """Scan files, in parallel processes when there are many; one bad file becomes an error entry and never
    stops the scan. Results keep the discovery order, so output is deterministic. `patches`: build each finding's
    diff; `fixed`: apply each file's fixes in the worker (a result from another process keeps no node edits).
    With jobs=1 the results keep their node edits, for a verb that picks fixes afterwards. `call_site_facts`: the
    discovered files' calls may prove facts of the functions they call (off for a library whose callers live
    outside the tree). What the tree says is gathered from all the files first, into one value every file's
    analysis reads (static.tree_facts.TreeContext): hooks that fire on every module (static.project) and autograd
    requests are collected whatever `call_site_facts` says. `path_rules` (advisor.config.PathRules):
    the configuration's exclude globs and per-file ignores. `on_file(path, total)` is called as each file's result
    arrives (for a progress bar). `cache`: reuse and keep each file's result on disk (static.scan_cache; not for a
    run with runtime evidence, nor with jobs=1, whose results keep their node edits). `tree_paths`: the tree whose
    files the facts are gathered from, beside `paths` (pre-commit names the staged files only: a training script
    left out of the commit still asks for double backward); the files `path_rules` excludes count for the facts
    too."""
    files, errors = discover(paths, path_rules)
    result = ScanResult(errors=errors, all_excluded=bool(paths) and path_rules is not None and
                        all(path_rules.excludes_named(path) for path in paths))
    store = ScanCache(dict(unsafe_fixes=unsafe_fixes, select=select, ignore=ignore, backend=backend, patches=patches,
                           fixed=fixed, call_site_facts=call_site_facts, path_rules=path_rules)) \
        if cache and runtime is None and jobs != 1 else None  # jobs=1: the caller wants the node edits
    jobs = jobs or min(os.cpu_count() or 1, 8)
    # excluded files are still the model's users (a test taking a gradient penalty through it): they count for the
    # tree's facts, and only their findings are dropped
    seen = {os.path.realpath(path) for path in files}
    whole = files + [path for path in (discover(paths)[0] if path_rules is not None and path_rules.exclude else []) +
                     (discover(tree_paths)[0] if tree_paths else [])
                     if os.path.realpath(path) not in seen and not seen.add(os.path.realpath(path))]
    tree = tree_context(whole, call_site_facts, cache=store, jobs=jobs)
    scan_one = partial(_scan_file, unsafe_fixes=unsafe_fixes, select=select, ignore=ignore, backend=backend,
                       runtime=runtime, patches=patches, fixed=fixed, tree=tree, path_rules=path_rules)
    done = (lambda path: on_file(path, len(files))) if on_file is not None else (lambda path: None)
    run = partial(_scan_all, jobs=jobs, done=done)
    outcomes = run(files, scan_one) if store is None else store.scan(files, scan_one, run, done, tree)
    for outcome in outcomes:
        (result.errors if isinstance(outcome, ScanError) else result.files).append(outcome)
    return result


def _scan_all(files: list[str], scan_one, jobs: int, done) -> list:
    """`scan_one` of each file, in discovery order: in a process pool when there are many."""
    if jobs > 1 and len(files) >= PARALLEL_FROM:
        return _scan_in_pool(files, scan_one, jobs, done)
    outcomes = []
    for path in files:
        outcomes.append(scan_one(path))
        done(path)
    return outcomes


def _scan_in_pool(files: list[str], scan_one, jobs: int, done) -> list[FileResult | ScanError]:
    """Results in discovery order. A worker that dies (a segfault in a native parser, the OOM killer) breaks the
    whole pool; the files without a result are then rescanned one process each, so the file that kills its
    process becomes that file's error entry and every other file still gets its result."""
    outcomes: dict[str, FileResult | ScanError] = {}
    try:
        with _pool(jobs, scan_one) as pool:
            for path, outcome in zip(files, pool.map(_scan_in_worker, files, chunksize=4)):
                outcomes[path] = outcome
                done(path)
    except BrokenProcessPool:
        pass
    for path in files:
        if path not in outcomes:
            outcomes[path] = _scan_isolated(path, scan_one)
            done(path)
    return [outcomes[path] for path in files]


def _scan_isolated(path: str, scan_one) -> FileResult | ScanError:
    try:
        with _pool(1) as pool:
            return pool.submit(scan_one, path).result()
    except BrokenProcessPool:
        return ScanError(path, "the analysis process died on this file (a crash in a native library?); please "
                               "report it", internal=True)


def _pool(workers: int, scan_one=None) -> ProcessPoolExecutor:
    """Workers that end with this process, whatever ends it (README "Writes": a signal while scanning), each given
    `scan_one` once as it starts: sent with every task, its tree context (megabytes on a large tree) was pickled
    and unpickled once per chunk of files, which cost more than the analysis."""
    return worker_pool(workers, _keep_scan, scan_one)


_WORKER_SCAN = None  # in a pool's worker: what it runs on each path (`_keep_scan`)


def _keep_scan(scan_one) -> None:
    global _WORKER_SCAN
    _WORKER_SCAN = scan_one
    gc.freeze()  # the tree's facts, unpickled here, live as long as the worker (see static.collector)


def _scan_in_worker(path: str) -> FileResult | ScanError:
    return _WORKER_SCAN(path)


def _scan_file(path: str, unsafe_fixes: bool, select, ignore, backend: str = "sdpa",
               runtime: RuntimeEvidence | None = None, patches: bool = True,
               fixed: bool = True, tree: TreeContext | None = None, path_rules=None) -> FileResult | ScanError:
    """One file's result or its one error entry, whatever happens while reading or analysing it. User code's
    compile-time warnings (`"\\d"`, `x is 1`) are not the tool's messages and stay silent."""
    if path_rules and path_rules.ignored_codes(path):
        ignore = [*(ignore or []), *path_rules.ignored_codes(path)]

    def analysed() -> FileResult | ScanError:
        with warnings.catch_warnings(), collector_paused():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            result = _analyze_file(path, unsafe_fixes, select, ignore, backend, runtime, patches, tree)
            if fixed and isinstance(result, FileResult):  # computed here, where the node edits are
                _settle(result, lambda text: _analyze_code(SourceFile(path, text), unsafe_fixes, select, ignore,
                                                           backend, None, False, tree))
            return result

    try:
        try:
            return analysed()
        except RecursionError:  # nesting CPython accepts, deeper than the default limit lets a walk recurse
            return run_with_deep_stack(analysed)
    except RecursionError:
        return ScanError(path, "too deeply nested to analyse (the interpreter's recursion limit was reached)")
    except MemoryError:
        return ScanError(path, "too large to analyse (out of memory)")
    except Exception as exc:  # noqa: BLE001 - a bug of ours on one file must not stop the scan
        return ScanError(path, f"internal error while analysing ({type(exc).__name__}: {exc}); please report it",
                         internal=True)


FIX_ROUNDS = 16  # fixes nested in one expression (`x.float().float().contiguous().contiguous()`) take a round each


def _settle(result: FileResult, analyze) -> None:
    """Apply the file's fixes until they settle, on the text in memory: a fix nested in another's expression waits
    for the next round, and one fix may make another (`x.contiguous().float().contiguous().float()`: the copy
    removed, two casts meet). So `fix` shows what `--apply` writes and a second run changes nothing (breaker rounds
    14 and 16). `analyze(text)` reads the text again: statically, since a profile's lines are those of the text
    it ran."""
    current, last, applied = result.source, result, result.applied
    for _ in range(FIX_ROUNDS - 1):
        if applied.text == current:
            break
        again = analyze(applied.text)
        if not isinstance(again, FileResult):
            break
        current, last, applied = applied.text, again, again.applied
    else:
        if len(applied.text) > len(current):  # still growing: a fix applying again to its own output (breaker round
            # 56: a guarded patch's fallback read as a new block nested the patch 16 deep): one round only, and
            # say so. (Still shrinking, as 20 chained copies lose one a round, is left for the next run.)
            last, applied = result, result.applied
            applied.problems.append(f"{display_path(result.path)}: the fixes did not settle in {FIX_ROUNDS} "
                                    f"rounds, so only the first round is applied; please report it")
    applied.left = len(last.findings) - len(last.applicable()) + applied.not_applied
    result._applied = applied


def _analyze_file(path: str, unsafe_fixes: bool, select, ignore, backend: str,
                  runtime: RuntimeEvidence | None, patches: bool = True,
                  tree: TreeContext | None = None) -> FileResult | ScanError:
    source = read_source(path)
    if isinstance(source, ScanError):
        return source
    if source.notebook is not None:
        outcome = _in_cells(_analyze_code(source, unsafe_fixes, select, ignore, backend, None, False, tree),
                            source.notebook, patches)
    else:
        outcome = _analyze_code(source, unsafe_fixes, select, ignore, backend, runtime, patches, tree)
    if isinstance(outcome, FileResult):
        outcome.digest = source.digest
    return outcome


def _analyze_code(source, unsafe_fixes: bool, select, ignore, backend: str, runtime: RuntimeEvidence | None,
                  patches: bool, tree: TreeContext | None) -> FileResult | ScanError:
    """One module's text (a file's, or a notebook's code cells) checked, prefiltered and analysed."""
    path = source.path
    error = _syntax_error(source.text, path)  # always the running interpreter's verdict, so one file gets one answer
    if error is not None:
        return error
    measured = runtime is not None and runtime.for_path(path) is not None
    if not measured and not static_families(source.text, path):
        return FileResult(path, source.text)
    try:
        return analyze_source(source.text, path, unsafe_fixes, select, ignore, backend=backend, runtime=runtime,
                              patches=patches, tree_context=tree)
    except cst.ParserSyntaxError as exc:  # code CPython accepts but libcst cannot parse
        return ScanError(path, f"libcst, which advisor reads and rewrites code with, cannot parse it (Python can): "
                               f"line {exc.raw_line}: {exc.message}")


def _in_cells(outcome: FileResult | ScanError, notebook: NotebookCode, patches: bool) -> FileResult | ScanError:
    """A notebook's result with lines in its cells (each finding's `cell`, and `line`/`end_line` in that cell);
    its patches are diffs of the cells they change. The fixed module goes back into the notebook's JSON when
    written (FileResult.notebook)."""
    if isinstance(outcome, ScanError):
        line = re.search(r"at line (\d+)", outcome.message)
        if line:
            cell, in_cell = notebook.locate(int(line.group(1)))
            outcome.message = outcome.message.replace(line.group(0), f"in cell {cell} at line {in_cell}", 1)
        return outcome
    for found in outcome.detected:
        if patches and found.edits is not None:
            fixed = apply_edits(outcome.source, found.edits)
            found.finding.patch = notebook.cell_diffs(relative_path(outcome.path), fixed)
    for finding in outcome.findings:
        cell, finding.line = notebook.locate(finding.line)
        end_cell, finding.end_line = notebook.locate(finding.end_line)
        if end_cell != cell:  # a block cannot span cells; keep the range inside the first
            finding.end_line = finding.line
        finding.extra["cell"] = cell
    outcome.notebook = notebook
    return outcome


def _syntax_error(text: str, path: str) -> ScanError | None:
    """The syntax check of the Python running advisor (CPython's parser is ~50x faster than libcst's): code newer
    than this interpreter, or nested deeper than its parser allows, is a syntax error here, whatever it contains."""
    parser = f"Python {PYTHON_VERSION} parser"
    if "\0" in text:  # the parser's own message names no line
        line = text[:text.index("\0")].count("\n") + 1
        return ScanError(path, f"syntax error at line {line}: a null byte (\\x00) is not allowed in source code "
                               f"({parser})")
    try:
        with outer_recursion_limit():  # the user's interpreter's verdict, also where the analysis runs deep
            python_tree(text, path)
    except SyntaxError as exc:
        return ScanError(path, f"syntax error at line {exc.lineno}: {exc.msg} ({parser})")
    except MemoryError:  # CPython's parser raises it when its stack is full, at any amount of free memory
        return ScanError(path, f"nested too deeply for the {parser} (its stack overflowed)")
    return None
