"""The registry: every rule code, built from the rule units in the top-level rules/ folder (shipped in the wheel as
the package `advisor.rules`). A unit declares one rule family: its rules (code, docs, examples) and its detectors.
Nothing else lists codes: detectors, fixes and reports refer to the units' Rule objects, so a code that no unit
declares cannot be emitted, and `advisor rules --explain CODE`, the README table and the generated tests all read
the same declarations."""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache

from advisor.contracts.family import Family
from advisor.contracts.rule import Rule

RULES_PACKAGE = "advisor.rules"
SELECTOR = re.compile(r"[A-Z]+[0-9]*")
DOC_SECTIONS = ("what", "why", "fix_doc")  # with the example, Ruff's sections: what it does, why, example, fix safety


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


def rules_package_paths(package: str = RULES_PACKAGE) -> list[str]:
    """Where the rule units live (the scan cache hashes their source: an edited rule never reuses a result)."""
    return list(importlib.import_module(package).__path__)


@lru_cache(maxsize=None)
def load_rules(package: str = RULES_PACKAGE) -> dict[str, Rule]:
    """Every rule by code, in code order; a code declared twice or a rule missing a doc section raises."""
    rules: dict[str, Rule] = {}
    for family in families(package):
        for rule in family.rules:
            if rule.code in rules:
                raise ValueError(f"{rule.code} is declared twice")
            missing = [name for name in ("title", *DOC_SECTIONS) if not getattr(rule, name).strip()]
            if missing:  # (a Rule checks its own fix_safety)
                raise ValueError(f"{rule.code}: missing {', '.join(missing)}")
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
