"""Rules are data: one TOML file per rule in the top-level rules/ folder, shipped in the wheel as the package
`advisor.rules` (see pyproject.toml) and read through importlib.resources, so an installed copy finds them too."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable

RULES_PACKAGE = "advisor.rules"
REQUIRED_FIELDS = ("code", "kind", "title", "enabled", "fix", "fix_safety", "rationale")


@dataclass(frozen=True)
class Rule:
    code: str
    kind: str
    title: str
    enabled: bool
    fix: str
    fix_safety: str
    rationale: str
    references: tuple[str, ...] = ()
    threshold_share: float = 0.0


@lru_cache(maxsize=None)
def load_rules(directory: Traversable | None = None) -> dict[str, Rule]:
    """Every rule by code. An install without rule files is broken, not empty: that raises."""
    folder = directory or resources.files(RULES_PACKAGE)
    rules: dict[str, Rule] = {}
    for entry in sorted((e for e in folder.iterdir() if e.name.endswith(".toml")), key=lambda e: e.name):
        data = tomllib.loads(entry.read_text(encoding="utf-8"))
        missing = [name for name in REQUIRED_FIELDS if name not in data]
        if missing:
            raise ValueError(f"{entry.name}: rule is missing {', '.join(missing)}")
        if data["fix_safety"] not in ("safe", "unsafe"):
            raise ValueError(f"{entry.name}: fix_safety must be 'safe' or 'unsafe'")
        data["references"] = tuple(data.get("references", ()))
        data["rationale"] = data["rationale"].strip()
        rules[data["code"]] = Rule(**data)
    if not rules:
        raise RuntimeError(f"no rule files found in {folder} (a broken install?)")
    return rules


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
