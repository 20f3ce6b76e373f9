"""A rule family: rules that share detectors, and the hooks the engines call with its rules."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from advisor.contracts.rule import Rule


@dataclass(frozen=True)
class Family:
    """One rule unit: rules that share detectors. Its hooks are how each engine runs it, each called with the
    family's own rules last, so no engine names a rule: `static` (the static engine, per file), `graph` (a profiled
    run's op graph), `trace` (a Chrome trace's ops), `post_profile` (the ranked findings of a profiled workload,
    with its model: a family may add findings that need the live model). A rule's own `graph` and `trace` run
    beside them. The static hook runs on a file only when one of the family's `prefilter` tokens (by default its
    rules' tokens) occurs in it (lower case), or always when the run has runtime evidence and `uses_evidence`."""

    name: str
    rules: tuple[Rule, ...]
    prefilter: tuple[str, ...] = ()
    static: Callable | None = None  # (StaticContext, rules) -> list[Detected]; see advisor.contracts.detected
    graph: Callable | None = None  # (OpGraph, device, rules) -> list[Detection]
    trace: Callable | None = None  # (TraceView, rules) -> Iterable[TraceHit]; see advisor.runtime.trace_detect
    post_profile: Callable | None = None  # (model, target, ranked findings, rules) -> ranked findings
    uses_evidence: bool = False  # a profile's evidence for the file makes the static hook run

    @cached_property  # read for every file scanned
    def tokens(self) -> tuple[str, ...]:
        return self.prefilter or tuple(dict.fromkeys(token for rule in self.rules for token in rule.tokens))

    def might_match(self, lowered_source: str) -> bool:
        return any(token in lowered_source for token in self.tokens)


def unit_rules(package: str) -> tuple[Rule, ...]:
    """The rules of a family kept one per module (each module's RULE), in code order: adding a rule to such a
    family is adding a module to its package. Modules whose name starts with "_" hold shared helpers."""
    root = importlib.import_module(package)
    modules = [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(root.__path__)
               if not m.name.startswith("_")]
    return tuple(sorted((module.RULE for module in modules), key=lambda rule: rule.code))
