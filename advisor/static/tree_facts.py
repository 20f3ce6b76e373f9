"""What a proof about one file needs to know of the whole scanned tree (the files of one run).

Files are analysed one by one (in worker processes), but some facts depend on code anywhere in the tree: a
training loop in `train.py` that takes a gradient penalty through the attention of `model.py`. Those facts are
gathered once, before the per-file analysis, and handed to every file's analysis as one value, `TreeContext`,
with the tree's call sites (static.call_sites). Cheap filters keep the cost to reading the files: a word
prefilter, then CPython's parser on the few files that pass it; libcst parses only the files that hold a
relevant name.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from advisor.child_lifetime import worker_pool
from advisor.contracts.finding import ScanError
from advisor.static.autograd_use import (AutogradSite, autograd_sites, autograd_uses, name_uses, nested, plain_pass,
                                          unparsed_request, uses_name, worth_resolving)
from advisor.static.call_sites import Tree
from advisor.static.collector import collector_paused
from advisor.static.discover import SourceFile, read_source
from advisor.static.module_index import ParsedModule
from advisor.static.project import ProjectFacts, hook_sites, project_facts


@dataclass(frozen=True)
class TreeFacts:
    files: int  # how many files the tree holds
    autograd: tuple[AutogradSite, ...] = ()  # where the tree asks for double backward or forward-mode AD
    # Sites that pass on a parameter of a function (or class) nothing in the tree uses: no call of the tree asks.
    passed_on: tuple[AutogradSite, ...] = ()

    def with_observed(self, requests: list[str]) -> TreeFacts:
        """These facts and what a profiled run was seen asking of autograd (advisor.runtime.autograd_probe)."""
        return TreeFacts(self.files, self.autograd + tuple(AutogradSite(what) for what in requests), self.passed_on)

    @classmethod
    def of_file(cls, parsed: ParsedModule) -> TreeFacts:
        """A file analysed on its own is the whole tree."""
        return cls(1, *_callers_decide(autograd_sites(parsed), lambda name: uses_name(parsed.source, name)))


@dataclass(frozen=True)
class TreeContext:
    """All that one file's analysis reads of the rest of the scanned tree, built once per scan (`tree_context`) and
    handed down whole. A field left None: the file alone (its own hooks, its own autograd requests, no call
    sites)."""

    project: ProjectFacts | None = None  # process-wide hooks registered in the tree (static.project)
    autograd: TreeFacts | None = None  # what the tree asks of autograd
    calls: Tree | None = None  # the files whose calls may prove facts (None: the call-site-facts setting is off)

    def cache_key(self) -> tuple:
        """What keys every scan-cache entry: the facts. Not the call-site reader, which is new each scan: an entry
        keeps instead the digests of the files its analysis read through it (static.scan_cache)."""
        return (self.project, self.autograd)


PARALLEL_FROM = 64  # files; a smaller tree's parts cost less than starting the workers
OUTSIDE_CALLERS = ("call-site facts are off (`--no-call-site-facts`), so callers outside the scanned tree may ask "
                   "for double backward or forward-mode AD")


def tree_context(paths: list[str], call_site_facts: bool = True, cache=None, jobs: int = 1) -> TreeContext:
    """The scanned tree's context (`tree_wide_facts`, then the call sites when `call_site_facts`). One file is its own
    tree: its hooks are its parse's own."""
    project, autograd = tree_wide_facts(paths, call_site_facts, cache, jobs)
    return TreeContext(project if len(paths) > 1 else None, autograd, Tree(paths) if call_site_facts else None)


def tree_wide_facts(paths: list[str], callers_in_tree: bool = True, cache=None,
                    jobs: int = 1) -> tuple[ProjectFacts, TreeFacts]:
    """What the whole tree says, from each file's `file_contribution`: the process-wide hooks it registers
    (static.project) and what it asks of autograd. An unreadable or unparsable file adds nothing: the scan reports
    it. `callers_in_tree` (the call-site-facts setting): a site passing on its function's parameter asks nothing
    where nothing in the tree uses that function; off, every such site asks, and so do the callers outside the tree
    (OUTSIDE_CALLERS). `cache` (advisor.static.scan_cache.ScanCache) keeps each file's part by its content, and
    learns each file's digest. `jobs` > 1: the parts not kept are computed in that many processes."""
    hooks: list = []
    autograd: list[AutogradSite] = []
    reverse: list[AutogradSite] = []
    for found_hooks, (found_autograd, found_reverse) in _contributions(paths, cache, jobs):
        hooks += found_hooks
        autograd += found_autograd
        reverse += found_reverse
    # reverse transforms in two files may nest as in one
    autograd += nested(reverse, lambda name: _uses(paths, name), lambda: _first_plain_pass(paths))
    if not callers_in_tree:  # a library's callers may take double backward through it whatever the tree says
        return project_facts(hooks), TreeFacts(len(paths), (*autograd, AutogradSite(OUTSIDE_CALLERS)))
    return project_facts(hooks), TreeFacts(len(paths), *_callers_decide(autograd, lambda name: _used(paths, name)))


def _contributions(paths: list[str], cache, jobs: int) -> list:
    """Each readable file's `file_contribution`, in the order of `paths`: kept ones from the cache, the others
    computed here or, for a large tree, in a pool (each worker reads the file itself: the texts are not sent)."""
    parts: dict[str, tuple] = {}
    todo: list[str] = []
    for path in paths:
        source = read_source(path)
        if isinstance(source, ScanError):
            continue
        kept = cache.kept_contribution(source) if cache is not None else None
        if kept is not None:
            parts[path] = kept
        elif jobs > 1 and len(paths) >= PARALLEL_FROM:
            todo.append(path)
        else:
            with collector_paused():
                _keep(parts, cache, path, (source.digest, file_contribution(source)))
    if todo:
        try:
            with worker_pool(jobs) as pool:
                for path, found in zip(todo, pool.map(_contribution_at, todo, chunksize=16)):
                    _keep(parts, cache, path, found)
        except BrokenProcessPool:  # a worker died: what it left is read here, as a scan of one process would
            for path in todo:
                if path not in parts:
                    _keep(parts, cache, path, _contribution_at(path))
    return [parts[path] for path in paths if path in parts]


def _keep(parts: dict[str, tuple], cache, path: str, found: tuple[str, tuple] | None) -> None:
    if found is not None:
        parts[path] = found[1]
        if cache is not None:
            cache.keep_contribution(path, *found)


def _contribution_at(path: str) -> tuple[str, tuple] | None:
    """(the digest of the bytes read, `file_contribution`) of the file at `path`; None where it cannot be read."""
    source = read_source(path)
    if isinstance(source, ScanError):
        return None
    with collector_paused():
        return source.digest, file_contribution(source)


def file_contribution(source: SourceFile) -> tuple[list, tuple[list[AutogradSite], list[AutogradSite]]]:
    """One file's part of the tree-wide facts: its hook registrations and attribute writes (static.project), and its
    autograd requests with its uses of reverse-mode transforms (autograd_use.autograd_uses)."""
    autograd: tuple[list[AutogradSite], list[AutogradSite]] = ([], [])
    text = source.notebook.run_text if source.notebook is not None else source.text  # `%time` lines' code too
    if worth_resolving(text):  # False where CPython cannot parse it: then its words are read
        try:
            autograd = autograd_uses(ParsedModule(text, source.path))
        except Exception:  # noqa: BLE001 - unparsable: the scan reports it as the file's error entry
            pass
    else:
        unread = unparsed_request(text, source.path)
        autograd = ([unread], []) if unread is not None else autograd
    return hook_sites(source.path, text), autograd


def _callers_decide(sites: list[AutogradSite], used) -> tuple[tuple[AutogradSite, ...], tuple[AutogradSite, ...]]:
    """(the sites that ask, the sites passing on a parameter of a function or class that `used(name)` says nothing
    uses, so that no call of the tree reaches them)."""
    names = {site.caller_decides for site in sites if site.caller_decides is not None}
    unused = {name for name in names if not used(name)}
    return (tuple(site for site in sites if site.caller_decides not in unused),
            tuple(site for site in sites if site.caller_decides in unused))


def _uses(paths: list[str], name: str) -> int:
    """How many times the tree's files read `name`."""
    sources = [read_source(path) for path in paths]
    return sum(name_uses(source.text, name) for source in sources if not isinstance(source, ScanError))


def _first_plain_pass(paths: list[str]) -> AutogradSite | None:
    """The tree's first reverse pass of plain autograd (autograd_use.plain_pass)."""
    for path in paths:
        source = read_source(path)
        found = None if isinstance(source, ScanError) else plain_pass(source.text, source.path)
        if found is not None:
            return found
    return None


def _used(paths: list[str], name: str) -> bool:
    """Whether any file of the tree uses `name` (an unreadable file that may mention it counts)."""
    for path in paths:
        source = read_source(path)
        if isinstance(source, ScanError) or uses_name(source.text, name):
            return True
    return False
