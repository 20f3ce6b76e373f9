"""Where code restricts the kernels SDPA may pick so that its math kernel is off.

A rewrite introduces an SDPA call, so process state restricting SDPA's kernels is in force for the patched block:
under `with sdpa_kernel(SDPBackend.FLASH_ATTENTION):` (common where a model's other layers already call SDPA) or
after `torch.backends.cuda.enable_math_sdp(False)`, a call only the math kernel takes (dropout in training on CPU,
3-D inputs, an attn_mask that requires grad) raises `No available kernel` where the eager block ran (breaker round
15). A restriction that keeps the math kernel (`sdpa_kernel(SDPBackend.MATH)`, `enable_flash_sdp(False)`) takes
every call SDPA takes. Read with CPython's parser, on the files whose text names one of them.
"""

from __future__ import annotations

import ast
import re

from advisor.static.python_ast import nodes, python_tree

CONTEXTS = frozenset({"sdpa_kernel", "sdp_kernel"})  # torch.nn.attention's, and torch.backends.cuda's old one
MATH_SWITCH = "enable_math_sdp"
MAY_RESTRICT = re.compile(r"\bsdpa?_kernel\b|\benable_math_sdp\b")


def math_kernel_excluded(text: str) -> list[tuple[int, str]]:
    """(line, the code) for each reference in `text` that may leave SDPA without its math kernel: a call of
    `sdpa_kernel` (or a name it is imported as) whose backends are not a literal holding `SDPBackend.MATH` (a
    computed list, `[b for b in ALL if b != MATH]`, may hold anything), the old `sdp_kernel` with `enable_math` not
    True, `enable_math_sdp` given anything but True, and any other use of those names (`partial(sdpa_kernel, ...)`,
    an alias bound at run time: breaker round 16). [] for source CPython cannot parse."""
    if MAY_RESTRICT.search(text) is None:
        return []
    try:
        tree = python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    names = {alias.asname or alias.name: alias.name for node in nodes(tree) if type(node) is ast.ImportFrom
             for alias in node.names if alias.name in (*CONTEXTS, MATH_SWITCH)}
    called = {id(node.func) for node in nodes(tree) if type(node) is ast.Call}
    found = []
    for node in nodes(tree):
        if type(node) is ast.Call and _excludes_math(node, names):
            found.append((node.lineno, ast.get_source_segment(text, node) or "sdpa_kernel"))
        elif _names_switch(node, names) and id(node) not in called and type(getattr(node, "ctx", None)) is ast.Load:
            found.append((node.lineno, ast.get_source_segment(text, node) or "sdpa_kernel"))
    return sorted((line, code.splitlines()[0][:80]) for line, code in found)


def _names_switch(node: ast.AST, names: dict[str, str]) -> bool:
    """A reference to `sdpa_kernel`, `sdp_kernel` or `enable_math_sdp`, by its name or an import's alias."""
    name = _leaf(node)
    return name in (*CONTEXTS, MATH_SWITCH) if type(node) is ast.Attribute else name in names


def _excludes_math(call: ast.Call, names: dict[str, str]) -> bool:
    if not _names_switch(call.func, names):
        return False
    name = names.get(_leaf(call.func), _leaf(call.func)) if type(call.func) is ast.Name else _leaf(call.func)
    if name == MATH_SWITCH:
        return not (call.args and _is_true(call.args[0]))
    if name == "sdp_kernel":  # keywords enable_flash/enable_math/...: math is on unless turned off
        math = next((k.value for k in call.keywords if k.arg == "enable_math"),
                    call.args[1] if len(call.args) > 1 else None)
        return math is not None and not _is_true(math) or any(k.arg is None for k in call.keywords)
    given = call.args[:1] + [k.value for k in call.keywords if k.arg in ("backends", None)]
    return not any(_literal_math(value) for value in given)


def _literal_math(node: ast.AST) -> bool:
    """`SDPBackend.MATH`, or a literal list or tuple holding it."""
    if type(node) in (ast.List, ast.Tuple):
        return any(_literal_math(element) for element in node.elts)
    return type(node) is ast.Attribute and node.attr == "MATH"


def _is_true(node: ast.AST) -> bool:
    return type(node) is ast.Constant and node.value is True


def _leaf(node: ast.AST) -> str | None:
    return node.attr if type(node) is ast.Attribute else node.id if type(node) is ast.Name else None
