"""`advisor rules`: list the rules of the registry; `--explain CODE` prints one rule's documentation."""

from __future__ import annotations

import json

from advisor.errors import AdvisorError
from advisor.registry import load_rules


def add_parser(sub) -> None:
    parser = sub.add_parser("rules", help="list the rules, or explain one (--explain CODE)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--explain", metavar="CODE", default=None,
                        help="what the rule finds, why it is slow, an example, and its fix's safety")
    parser.set_defaults(run=run)


def run(args) -> int:
    rules = load_rules()
    if args.explain is not None:
        rule = rules.get(args.explain.strip().upper())
        if rule is None:
            raise AdvisorError(f"unknown rule code: {args.explain} (`advisor rules` lists them)")
        if args.format == "json":
            print(json.dumps({"version": 1, "rule": rule.to_json()}, indent=2))
        else:
            from rich.console import Console
            from rich.markdown import Markdown

            from advisor.report.rules_doc import explain

            Console().print(Markdown(explain(rule)))
        return 0
    if args.format == "json":
        print(json.dumps({"version": 1, "rules": [rule.to_json() for rule in rules.values()]}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="advisor rules")
    for column in ("code", "kind", "title", "fix", "safety", "default"):
        table.add_column(column)
    for rule in rules.values():
        table.add_row(rule.code, rule.kind, rule.title, rule.fix, rule.fix_safety, "on" if rule.enabled else "off")
    Console().print(table)
    return 0
