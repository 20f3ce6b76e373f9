"""What a rule is: its code, docs, examples and fix safety (Ruff's sections: what it does, why, example, fix
safety). Rule units declare these; the registry, the engines and the reports read them."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from advisor.contracts.fix_safety import FixSafety


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
    fix_safety: FixSafety  # of the fix when every fact is proved; a finding can still lower it, saying why
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
    trace: Callable | None = None  # its trace detector: (TraceView) -> Iterable[TraceHit]
    tokens: tuple[str, ...] = ()  # what a file must contain (lower case) for its static detector to find anything

    def __post_init__(self) -> None:
        object.__setattr__(self, "fix_safety", FixSafety(self.fix_safety))  # a unit may write the plain string

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
