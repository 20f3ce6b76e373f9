"""The registry: every rule code, built from the rule units in the top-level rules/ folder (shipped in the wheel as
the package `advisor.rules`). A unit declares one rule family: its rules (code, docs, examples) and its detectors.
Nothing else lists codes: detectors, fixes and reports refer to the units' Rule objects, so a code that no unit
declares cannot be emitted, and `advisor rules --explain CODE`, the README table and the generated tests all read
the same declarations."""

from __future__ import annotations

import importlib
import pkgutil
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache

RULES_PACKAGE = "advisor.rules"
SAFETIES = ("safe", "unsafe")
SELECTOR = re.compile(r"[A-Z]+[0-9]*")
DOC_SECTIONS = ("what", "why", "fix_doc")  # with the example, Ruff's sections: what it does, why, example, fix safety


@dataclass(frozen=True)
class Example:
    """Source a rule's detector must judge: a positive gives `code` once and, when `fixed` is set, exactly that
    text once its fixes are applied (`unsafe`: unsafe fixes too); a negative gives no finding of the rule, or, when
    `reason` is set, a finding without a patch whose reason contains it. A `workload` example is a module with a
    `workload()` function: it is profiled, and judged on the findings of that profile (and `fix --profile`)."""

    source: str
    positive: bool
    fixed: str | None = None
    reason: str | None = None
    unsafe: bool = False
    workload: bool = False


def positive(source: str, fixed: str | None = None, unsafe: bool = False, reason: str | None = None,
             workload: bool = False) -> Example:
    return Example(source, True, fixed=fixed, unsafe=unsafe, reason=reason, workload=workload)


def negative(source: str, reason: str | None = None, workload: bool = False) -> Example:
    return Example(source, False, reason=reason, workload=workload)


WORKLOAD_MODULE = '''import torch
import torch.nn.functional as F
from torch import nn

import advisor


class Block(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x):
{body}


def workload():
    return advisor.Workload(model=Block(), args=(torch.randn{shape},), steps=1)
'''


def workload_module(body: str, shape: tuple[int, ...], init: str = "") -> str:
    """Source of a workload example: a module whose forward runs `body` on one input `x` of `shape`, after
    `__init__` ran `init` (both without indentation)."""
    return WORKLOAD_MODULE.format(body=textwrap.indent(body, " " * 8), init=textwrap.indent(init, " " * 8),
                                  shape=shape)


@dataclass(frozen=True)
class Rule:
    code: str
    kind: str
    title: str
    summary: str  # the README table's "finding" column
    fix: str  # the fix's name ("none" when the rule only reports)
    fix_safety: str  # of the fix when every fact is proved; a finding can still lower it, saying why
    fix_summary: str  # the README table's "fix" column
    what: str  # what it finds
    why: str  # why it is slow
    fix_doc: str  # what the fix does and when it is safe
    example: str = ""  # source showing the pattern; defaults to the first positive example
    detectors: tuple[str, ...] = ("static",)  # "static" (source), "runtime" (profile or trace)
    examples: tuple[Example, ...] = ()
    references: tuple[str, ...] = ()
    threshold_share: float = 0.0  # a runtime finding below this share of the run is negligible
    enabled: bool = True
    graph: Callable | None = None  # its runtime detector: (OpGraph, device) -> list[Detection]
    tokens: tuple[str, ...] = ()  # what a file must contain (lower case) for its static detector to find anything

    @property
    def rationale(self) -> str:
        """The long description (SARIF's fullDescription)."""
        return f"{self.what} {self.why} {self.fix_doc}"

    @property
    def shown_example(self) -> str:
        return self.example or next((e.source for e in self.examples if e.positive), "")

    @property
    def shown_fix(self) -> str:
        """What the shown example becomes once fixed (empty when it is not a fixed example)."""
        return "" if self.example else next((e.fixed for e in self.examples if e.positive and e.fixed), "")

    def to_json(self) -> dict:
        return {"code": self.code, "kind": self.kind, "title": self.title, "enabled": self.enabled, "fix": self.fix,
                "fix_safety": self.fix_safety, "rationale": self.rationale, "references": list(self.references),
                "threshold_share": self.threshold_share, "what": self.what, "why": self.why,
                "example": self.shown_example, "fixed_example": self.shown_fix, "fix_doc": self.fix_doc,
                "detectors": list(self.detectors)}


@dataclass(frozen=True)
class Family:
    """One rule unit: rules that share a detector. The static detector runs on a file only when one of the
    family's `prefilter` tokens (by default its rules' tokens) occurs in it (lower case), or always when the run
    has runtime evidence and `uses_evidence`."""

    name: str
    rules: tuple[Rule, ...]
    prefilter: tuple[str, ...] = ()
    static: Callable | None = None  # (StaticContext) -> list[Detected]; see advisor.engine.static
    graph_detectors: tuple[str, ...] = ()  # modules whose detect(op_graph, device) finds several of its codes
    uses_evidence: bool = False  # a profile's evidence for the file makes the static detector run

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


@lru_cache(maxsize=None)
def families(package: str = RULES_PACKAGE) -> tuple[Family, ...]:
    """Every unit of the rules package (each module's FAMILY): first those the package's ORDER names, in that
    order (a later family may read the findings of an earlier one: copies and casts inside an attention block),
    then any other module by name, so a new family is one new file. A package without units is a broken install,
    not an empty one: that raises."""
    root = importlib.import_module(package)
    order = getattr(root, "ORDER", ())
    names = [*order, *sorted(m.name for m in pkgutil.iter_modules(root.__path__) if m.name not in order)]
    found = tuple(getattr(importlib.import_module(f"{package}.{name}"), "FAMILY") for name in names)
    if not found:
        raise RuntimeError(f"no rule files found in {package} (a broken install?)")
    return found


@lru_cache(maxsize=None)
def load_rules(package: str = RULES_PACKAGE) -> dict[str, Rule]:
    """Every rule by code, in code order; a code declared twice or a rule missing a doc section raises."""
    rules: dict[str, Rule] = {}
    for family in families(package):
        for rule in family.rules:
            if rule.code in rules:
                raise ValueError(f"{rule.code} is declared twice")
            missing = [name for name in ("title", *DOC_SECTIONS) if not getattr(rule, name).strip()]
            if missing or rule.fix_safety not in SAFETIES:
                raise ValueError(f"{rule.code}: missing {', '.join(missing) or 'a valid fix_safety'}")
            rules[rule.code] = rule
    return dict(sorted(rules.items()))


def parse_selectors(text: str) -> list[str]:
    """Comma-separated codes or prefixes, upper-cased; ValueError when empty or one names no rule (a typo must never
    select nothing silently)."""
    codes = [code.strip().upper() for code in text.split(",") if code.strip()]
    malformed = [code for code in codes if not SELECTOR.fullmatch(code)]
    unknown = malformed or unknown_selectors(codes)
    if not codes or unknown:
        raise ValueError(f"unknown rule code or prefix: {', '.join(unknown) or repr(text)} (`advisor rules` lists "
                         "them)")
    return codes


def unknown_selectors(selectors: list[str]) -> list[str]:
    """Selectors (codes or prefixes such as "ADV1") that name no rule: a typo must not select nothing silently."""
    codes = load_rules()
    return [sel for sel in selectors if not any(code.startswith(sel) for code in codes)]


def _matches(code: str, selectors: list[str]) -> bool:
    return any(code.startswith(sel) for sel in selectors)


def is_selected(code: str, select: list[str] | None, ignore: list[str] | None) -> bool:
    """Ruff-style: --select and --ignore take codes or prefixes ("ADV1"), already upper-cased and validated."""
    rule = load_rules().get(code)
    if select:
        chosen = _matches(code, select)
    else:
        chosen = rule.enabled if rule else True
    return chosen and not (ignore and _matches(code, ignore))
