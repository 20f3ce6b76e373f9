"""A profiled transformers model that ran eager attention: one finding at the line of the user's code that chose
it (or, when nothing there chose it, the line that built the model), with the measured cost of the eager
attention that ran in the library's files. The library files themselves are never the fix site.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import libcst as cst

from advisor.contracts.finding import Finding, relative_path
from advisor.hf.config_rules import LOADERS
from advisor.hf.findings import config_findings
from advisor.contracts.rule import Rule
from advisor.rewrite.splice import local_diff
from advisor.static.module_index import ParsedModule
from advisor.static.walk import walk


@dataclass(frozen=True)
class EagerAttentionRules:
    """What the attention_config unit hands over: the rule this reports (measured), the static rule whose
    finding it reuses when this file chose eager (setting), and the rule whose measured time is its cost
    (library_attention: hand-written attention measured in the library's files)."""

    measured: Rule
    setting: Rule
    library_attention: Rule


def with_eager_attention_finding(model, target: str, ranked: list[Finding],
                                 rules: EagerAttentionRules) -> list[Finding]:
    """The ranked findings with the measured-eager finding (if any) right after the library attention it accounts
    for: its time is theirs, not additional, so it never outranks them."""
    added = eager_attention_findings(model, target, ranked, rules)
    if not added:
        return ranked
    library = [index for index, f in enumerate(ranked)
               if f.rule == rules.library_attention.code and _in_library(f)]
    position = library[-1] + 1 if library else len(ranked)
    ordered = ranked[:position] + added + ranked[position:]
    for rank, finding in enumerate(ordered, 1):
        finding.extra["rank"] = rank
    return ordered


def eager_attention_findings(model, target: str, measured: list[Finding],
                             rules: EagerAttentionRules) -> list[Finding]:
    """[] unless the model is a transformers model configured with eager attention."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "eager":
        return []
    path, function = _target_source(target)
    if path is None:
        return []
    with open(path, encoding="utf-8") as handle:
        parsed = ParsedModule(handle.read(), path)
    library = [f for f in measured if f.rule == rules.library_attention.code and _in_library(f)]
    cost = {"self_us": round(sum(f.extra["self_us"] for f in library), 3),
            "share": round(sum(f.extra["share"] for f in library), 5),
            "calls": sum(f.extra["calls"] for f in library),
            "evidence": {"library_sites": [f"{f.path}:{f.line}" for f in library],
                         "model_class": type(model).__name__, "time_is": "that of the library_sites, not additional"}}
    rule = rules.measured
    chosen = _choosing_finding(parsed, function, rules.setting)
    if chosen is not None:
        return [Finding(rule=rule.code, kind=rule.kind, path=path, line=chosen.line, end_line=chosen.end_line,
                        function=chosen.function, message=rule.title, fixable=chosen.fixable,
                        fix_safety=chosen.fix_safety, reasons=chosen.reasons, patch=chosen.patch,
                        extra=cost)]
    line, end_line = _building_line(parsed, function)
    supports = getattr(type(model), "_supports_sdpa", False) is True
    reason = ('nothing in this file sets attn_implementation="eager": pass attn_implementation="sdpa" where the '
              "model is built" if supports else
              f"{type(model).__name__} does not declare SDPA support, so transformers defaulted to eager")
    return [Finding(rule=rule.code, kind=rule.kind, path=path, line=line, end_line=end_line, function=function,
                    message=rule.title, fixable=False, fix_safety=rule.fix_safety, reasons=(reason,), extra=cost)]


def _in_library(finding: Finding) -> bool:
    return "transformers" in finding.path.split(os.sep)


def _target_source(target: str) -> tuple[str | None, str]:
    """The file and function name of TARGET ('file.py:fn' or 'pkg.module:fn')."""
    module_ref, _, function = target.rpartition(":")
    if module_ref.endswith(".py") or os.sep in module_ref or "/" in module_ref:
        return os.path.abspath(module_ref), function
    spec = importlib.util.find_spec(module_ref)
    origin = spec.origin if spec is not None else None
    return (origin if origin and origin.endswith(".py") else None), function


def _choosing_finding(parsed: ParsedModule, function: str, setting: Rule) -> Finding | None:
    """The static finding of `setting` (eager attention set in this file), preferring one inside the target
    function."""
    eager = []
    for found in config_findings(parsed, (setting,)):
        if found.finding.rule == setting.code:
            if found.edits is not None:
                found.finding.patch = local_diff(relative_path(parsed.path), parsed.lines, found.edits)
            eager.append(found.finding)
    inside = [finding for finding in eager if finding.function.split(".")[0] == function]
    return (inside or eager or [None])[0]


def _building_line(parsed: ParsedModule, function: str) -> tuple[int, int]:
    """The first transformers loader or constructor call in the target function, else its `def` line."""
    definition = parsed.module_functions.get(function)
    if definition is None:
        return 1, 1
    collector = _TransformersCalls(parsed)
    walk(definition, collector)
    if not collector.calls:
        return parsed.line(definition.name), parsed.line(definition.name)
    return parsed.line(collector.calls[0]), parsed.end_line(collector.calls[0])


class _TransformersCalls(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule) -> None:
        self.parsed, self.calls = parsed, []

    def visit_Call(self, node: cst.Call) -> None:
        dotted = self.parsed.imported_name(node.func) or ""
        if dotted.startswith("transformers.") and (dotted.endswith(LOADERS) or dotted.count(".") == 1):
            self.calls.append(node)
