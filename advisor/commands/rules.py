"""`advisor rules`: list the rules loaded from rules/."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from advisor.registry import load_rules


def add_parser(sub) -> None:
    parser = sub.add_parser("rules", help="list the rules")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def run(args) -> int:
    rules = load_rules()
    if args.format == "json":
        print(json.dumps({"version": 1, "rules": [vars(rule) | {"references": list(rule.references)}
                                                  for rule in rules.values()]}, indent=2))
        return 0
    table = Table(title="advisor rules")
    for column in ("code", "kind", "title", "fix", "safety", "default"):
        table.add_column(column)
    for rule in rules.values():
        table.add_row(rule.code, rule.kind, rule.title, rule.fix, rule.fix_safety, "on" if rule.enabled else "off")
    Console().print(table)
    return 0
