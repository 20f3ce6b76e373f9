"""The engine of the attention-configuration rules (advisor.rules.attention_config): walks the user's calls and
assignments, with the function each is in and whether it runs under no_grad/inference_mode, and asks every rule
about each. The rules read code only (never run anything) and resolve names through the file's imports, so
`from transformers import AutoModel as M; M.from_pretrained(..., attn_implementation="eager")` and
`import torch.backends.cuda as c; c.sdp_kernel(...)` are found alike. Library files (site-packages) are never
reported or patched: a one-line setting in the user's script switches the whole model instead.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from advisor.rewrite.apply import SourceEdit
from advisor.static.discover import is_library_file
from advisor.static.module_index import ParsedModule
from advisor.static.tree_facts import TreeFacts
from advisor.static.walk import walk

LOADERS = ("from_pretrained", "from_config", "_from_config")
INFERENCE_CONTEXTS = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad")


@dataclass
class ConfigMatch:
    rule: str
    node: cst.CSTNode  # where the finding points
    function: str
    message: str | None = None  # replaces the rule title when the site adds something (a flash_attention_2 hint)
    reasons: tuple[str, ...] = ()  # why there is no fix, or what an unsafe fix assumes
    edit: SourceEdit | None = None
    unsafe: bool = False


@dataclass
class Site:
    """A call or an assignment the rules are asked about, with the function it is in."""

    parsed: ParsedModule
    node: cst.Call | cst.Assign
    function: str
    in_inference: bool  # under torch.no_grad / inference_mode (a `with` or a decorator)
    autograd: TreeFacts | None = None  # what the scanned tree asks of autograd (None: this file alone)

    @cached_property
    def dotted(self) -> str:
        """The called name resolved through the imports ("" for an assignment or an unresolved call)."""
        return (self.parsed.imported_name(self.node.func) or "") if isinstance(self.node, cst.Call) else ""

    @cached_property
    def method(self) -> str | None:
        func = self.node.func if isinstance(self.node, cst.Call) else None
        return func.attr.value if isinstance(func, cst.Attribute) else None

    @property
    def is_loader(self) -> bool:
        """from_pretrained / from_config, or any callable of transformers."""
        return self.method in LOADERS or self.dotted.startswith("transformers.")

    def keyword(self, name: str) -> cst.BaseExpression | None:
        if isinstance(self.node, cst.Call):
            return next((arg.value for arg in self.node.args if arg.keyword is not None and
                         arg.keyword.value == name), None)
        return None

    def match(self, rule, **details) -> ConfigMatch:
        return ConfigMatch(rule.code, self.node, self.function, **details)


def installed_class(name: str) -> object | None:
    """A class of the installed transformers package, imported only from a library folder: the current folder
    leads `sys.path` for `python -m advisor` and the API, and a repository's own `transformers/` (a vendored fork,
    a hostile checkout) must never run in a static scan (breaker round 16). None where it is not so installed."""
    try:
        spec = importlib.util.find_spec("transformers")
        if spec is None or spec.origin is None or not is_library_file(spec.origin):
            return None
        import transformers

        return getattr(transformers, name, None)
    except Exception:  # noqa: BLE001 - a broken install means "not proved", never a crash of the scan
        return None


def literal_bool(node: cst.BaseExpression | None) -> bool | None:
    """True or False for the literal names, else None (any other expression is a run-time value)."""
    return {"True": True, "False": False}.get(node.value) if isinstance(node, cst.Name) else None


def is_true(node: cst.BaseExpression | None) -> bool:
    return literal_bool(node) is True


def find_config_issues(parsed: ParsedModule, rules, autograd: TreeFacts | None = None) -> list[ConfigMatch]:
    """Every match of `rules` (SiteRules) in the file, in source order; none in library files. `autograd`: what the
    scanned tree asks of autograd (None: this file alone)."""
    lowered = parsed.source.lower()
    checks = [rule.check for rule in rules if rule.check is not None and any(t in lowered for t in rule.tokens)]
    if is_library_file(parsed.path) or not checks:
        return []
    collector = _Collector(parsed, checks, autograd)
    walk(parsed.module, collector)
    return collector.found


class _Collector(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule, checks, autograd: TreeFacts | None) -> None:
        self.parsed = parsed
        self.checks = checks
        self.autograd = autograd
        self.found: list[ConfigMatch] = []
        self.scope: list[str] = []
        self.inference_depth = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scope.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scope.append(node.name.value)
        if any(self._is_inference_context(d.decorator) for d in node.decorators):
            self.inference_depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scope.pop()
        if any(self._is_inference_context(d.decorator) for d in original_node.decorators):
            self.inference_depth -= 1

    def visit_With(self, node: cst.With) -> None:
        if any(self._is_inference_context(item.item) for item in node.items):
            self.inference_depth += 1

    def leave_With(self, original_node: cst.With) -> None:
        if any(self._is_inference_context(item.item) for item in original_node.items):
            self.inference_depth -= 1

    def _is_inference_context(self, node: cst.BaseExpression) -> bool:
        target = node.func if isinstance(node, cst.Call) else node
        return self.parsed.imported_name(target) in INFERENCE_CONTEXTS

    def visit_Call(self, node: cst.Call) -> None:
        self._ask(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._ask(node)

    def _ask(self, node: cst.Call | cst.Assign) -> None:
        site = Site(self.parsed, node, ".".join(self.scope) or "<module>", self.inference_depth > 0, self.autograd)
        for check in self.checks:
            self.found.extend(check(site))
