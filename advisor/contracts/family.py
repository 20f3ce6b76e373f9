"""A rule family: rules that share detectors, and the hooks the engines call with its rules."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from advisor.contracts.rule import Rule

# what may stand between `.`, a method's name and `(` in a call: spaces, line breaks inside brackets, backslash
# continuations, comments (each to its line's end, so the pattern never backtracks into one), and the `)` of a
# parenthesised attribute (`(x.float)()`)
_CALL_GAP = r"(?:\s|\\|\)|#[^\r\n]*(?![^\r\n]))*"


@dataclass(frozen=True)
class Screen:
    """Where a family's static findings can lie, read from the text alone, so that the engine can skip what cannot
    hold one (not even parse it): every finding lies in one top-level statement whose text holds one of `words`
    (lower case, matched in any case) or a call of a method named in `methods` (`x.float()`, as the method's name
    is spelled). A family whose findings can depend on code anywhere in the file (an import naming a callable) has
    no screen."""

    words: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()

    @cached_property
    def _method_call(self) -> re.Pattern | None:
        names = "|".join(sorted(map(re.escape, self.methods)))
        return re.compile(rf"\.{_CALL_GAP}(?:{names})\b{_CALL_GAP}\(") if names else None

    def admits(self, text: str, lowered: str) -> bool:
        """Whether `text` (`lowered`: the same in lower case) may hold a finding."""
        return any(word in lowered for word in self.words) or \
            self._method_call is not None and self._method_call.search(text) is not None


@dataclass(frozen=True)
class Family:
    """One rule unit: rules that share detectors. Its hooks are how each engine runs it, each called with the
    family's own rules last, so no engine names a rule: `static` (the static engine, per file), `graph` (a profiled
    run's op graph), `trace` (a Chrome trace's ops), `post_profile` (the ranked findings of a profiled workload,
    with its model: a family may add findings that need the live model). A rule's own `graph` and `trace` run
    beside them. The static hook runs on a file only when one of the family's `prefilter` tokens (by default its
    rules' tokens) occurs in it (lower case), or always when the run has runtime evidence and `uses_evidence`; a
    family with a `screen` runs only where that screen admits the text, and one with `library_files` False never
    runs on a file of an installed package (site-packages), where it reports nothing."""

    name: str
    rules: tuple[Rule, ...]
    prefilter: tuple[str, ...] = ()
    static: Callable | None = None  # (StaticContext, rules) -> list[Detected]; see advisor.contracts.detected
    graph: Callable | None = None  # (OpGraph, device, rules) -> list[Detection]
    trace: Callable | None = None  # (TraceView, rules) -> Iterable[TraceHit]; see advisor.runtime.trace_detect
    post_profile: Callable | None = None  # (model, target, ranked findings, rules) -> ranked findings
    uses_evidence: bool = False  # a profile's evidence for the file makes the static hook run
    screen: Screen | None = None  # where its static findings can lie (None: its prefilter tokens decide)
    library_files: bool = True  # False: its static hook reports nothing in installed packages' files

    @cached_property  # read for every file scanned
    def tokens(self) -> tuple[str, ...]:
        return self.prefilter or tuple(dict.fromkeys(token for rule in self.rules for token in rule.tokens))

    def might_match(self, lowered_source: str) -> bool:
        return any(token in lowered_source for token in self.tokens)

    def might_find(self, source: str, lowered: str, library_file: bool) -> bool:
        """Whether the static hook can find anything in this source (`lowered`: the same in lower case)."""
        if library_file and not self.library_files:
            return False
        return self.screen.admits(source, lowered) if self.screen is not None else self.might_match(lowered)


def unit_rules(package: str) -> tuple[Rule, ...]:
    """The rules of a family kept one per module (each module's RULE), in code order: adding a rule to such a
    family is adding a module to its package. Modules whose name starts with "_" hold shared helpers."""
    root = importlib.import_module(package)
    modules = [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(root.__path__)
               if not m.name.startswith("_")]
    return tuple(sorted((module.RULE for module in modules), key=lambda rule: rule.code))
