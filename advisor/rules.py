"""Rules are data: one TOML file per rule in rules/. This module loads and selects them."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
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
def load_rules(directory: Path | None = None) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for path in sorted((directory or RULES_DIR).glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        missing = [name for name in REQUIRED_FIELDS if name not in data]
        if missing:
            raise ValueError(f"{path}: rule is missing {', '.join(missing)}")
        if data["fix_safety"] not in ("safe", "unsafe"):
            raise ValueError(f"{path}: fix_safety must be 'safe' or 'unsafe'")
        data["references"] = tuple(data.get("references", ()))
        data["rationale"] = data["rationale"].strip()
        rules[data["code"]] = Rule(**data)
    return rules


def _matches(code: str, selectors: list[str]) -> bool:
    return any(code.startswith(sel.strip().upper()) for sel in selectors if sel.strip())


def is_selected(code: str, select: list[str] | None, ignore: list[str] | None) -> bool:
    """Ruff-style: --select and --ignore take codes or prefixes ("ADV1")."""
    rule = load_rules().get(code)
    if select:
        chosen = _matches(code, select)
    else:
        chosen = rule.enabled if rule else True
    return chosen and not (ignore and _matches(code, ignore))
