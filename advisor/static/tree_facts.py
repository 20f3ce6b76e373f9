"""What a proof about one file needs to know of the whole scanned tree (the files of one run).

Files are analysed one by one (in worker processes), but some facts depend on code anywhere in the tree: a
training loop in `train.py` that takes a gradient penalty through the attention of `model.py`. Those facts are
gathered once, before the per-file analysis, and handed to every file's analysis. Cheap filters keep the cost
to reading the files: a word prefilter, then CPython's parser on the few files that pass it; libcst parses only
the files that hold a relevant name.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.contracts.finding import ScanError
from advisor.static.autograd_use import AutogradSite, autograd_sites, worth_resolving
from advisor.static.discover import read_source
from advisor.static.module_index import ParsedModule
from advisor.static.project import ProjectFacts, hook_sites, project_facts


@dataclass(frozen=True)
class TreeFacts:
    files: int  # how many files the tree holds
    autograd: tuple[AutogradSite, ...] = ()  # where the tree asks for double backward or forward-mode AD

    def with_observed(self, requests: list[str]) -> TreeFacts:
        """These facts and what a profiled run was seen asking of autograd (advisor.runtime.autograd_probe)."""
        return TreeFacts(self.files, self.autograd + tuple(AutogradSite(what) for what in requests))

    @classmethod
    def of_file(cls, parsed: ParsedModule) -> TreeFacts:
        """A file analysed on its own is the whole tree."""
        return cls(1, tuple(autograd_sites(parsed)))


def tree_wide_facts(paths: list[str]) -> tuple[ProjectFacts, TreeFacts]:
    """What the whole tree says, with each file read once: the process-wide hooks it registers (static.project) and
    what it asks of autograd. An unreadable or unparsable file adds nothing: the scan reports it."""
    hooks: list = []
    autograd: list[AutogradSite] = []
    for path in paths:
        source = read_source(path)
        if isinstance(source, ScanError):
            continue
        hooks += hook_sites(path, source.text)
        if worth_resolving(source.text):
            try:
                autograd.extend(autograd_sites(ParsedModule(source.text, path)))
            except Exception:  # noqa: BLE001 - unparsable: the scan reports it as the file's error entry
                continue
    return project_facts(hooks), TreeFacts(len(paths), tuple(autograd))
