"""Where `replaced-scores` is not accepted: keys the source visibly divides by what may be 0.

A mask applied by `masked_fill`/`where` discards a masked score whatever it is; SDPA adds its mask, which keeps a
NaN. The divergence is accepted where nothing shows a NaN key (patterns.masks), but cosine attention written by
hand shows one: `k / k.norm(dim=-1, keepdim=True)` is 0/0 on a zero padding vector, exactly where the padding mask
masks (breaker round 13), and the patch would give NaN rows to a model that works. So where k's definitions in the
function divide by a tensor not bounded away from 0 (no `eps` added, no `clamp(min=...)`), the fact is assumed.
`F.normalize` clamps its norm, and a NaN query or value also makes the original's row NaN: only keys matter. A key
taken as a parameter is read at its calls in the scanned tree (as call-site facts read them): one call passing a key
so built is enough. A key built by a helper (`l2norm(k)`, `utils.l2norm(k)`, `self.normalize(k)`, a module of the
class, a lambda) is read through what the helper returns, in this file or another of its package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from advisor.patterns import masks as mk
from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.attention.helpers import returns_of
from advisor.patterns.attention.tensor_facts import reaching_values
from advisor.patterns.call_site_facts import MAX_DEPTH as CALLERS_DEPTH, SiteScope, parameter_of
from advisor.static.package_functions import package_definition
from advisor.patterns.ops import number_value
from advisor.static.module_index import ParsedModule
from advisor.static.walk import children

DIVIDING_METHODS = frozenset({"div", "div_", "true_divide", "divide"})  # by their first argument
INVERTING = frozenset({"reciprocal", "rsqrt"})  # 1/x of their receiver (or first argument, as torch functions)
# what keeps a divisor's magnitude: unwrapped to find what bounds it
MAGNITUDE_KEEPING = frozenset({"sqrt", "unsqueeze", "view", "reshape", "expand", "expand_as", "to", "float", "half",
                               "double", "bfloat16", "type_as", "detach", "contiguous", "transpose"})
NEVER_ZERO = frozenset({"exp", "sigmoid", "softplus"})  # positive for finite inputs (up to underflow)
MAX_DEPTH = 8


@dataclass(frozen=True)
class Reader:
    """How names read where an expression is: the values reaching a name (None: unknown, a parameter), whether a
    node is a Python number, and the file's imports."""

    parsed: ParsedModule
    values: Callable[[cst.Name], list[cst.BaseExpression] | None]
    is_scalar: Callable[[cst.BaseExpression], bool]


def nan_key_fact(c: Candidate) -> None:
    """`replaced-scores` assumed, not accepted, where a mask replaces scores and the key's definitions (here, or
    at a call passing it) divide by what may be 0."""
    if len(c.leaf_nodes) < 2 or not any(term.fill_kind != mk.ADDITIVE and not term.learned
                                        for term in c.match.masks):
        return
    here = Reader(c.parsed, lambda name: reaching_values(c, name), c.values.is_scalar)
    found = _division(here, c.leaf_nodes[1], 0, set())
    division = (c.parsed, found, "in this function") if found is not None else \
        _division_at_callers(c.parsed, _base(c.leaf_nodes[1]), 0) if c.parsed.tree is not None else None
    if division is None:
        return
    parsed, node, where = division
    c.match.facts.assumed(mk.REPLACED_SCORES, mk.REPLACED_STATEMENT,
                          f"the key is built by `{parsed.code(node).strip().splitlines()[0]}` ({where}), which may "
                          "divide by 0 (a zero padding vector's norm): a NaN key the original's mask discards makes "
                          "the patch's row NaN")


def _division_at_callers(parsed: ParsedModule, node: cst.BaseExpression, depth: int):
    """(file, division, `at path:line`) at the first call of the tree passing, for the parameter `node` reads, a
    key so divided (followed through callers passing on their own parameter); None where no call shows one."""
    found = parameter_of(parsed, node) if depth <= CALLERS_DEPTH else None
    sites = parsed.tree.sites(parsed, *found) if found is not None else None
    for site in sites or ():
        if site.argument is None:
            continue
        passed_on = parameter_of(site.scope, site.argument) if site.scope is site.parsed else None
        if passed_on is not None and site.scope.tree is not None:
            deeper = _division_at_callers(site.scope, site.argument, depth + 1)
            if deeper is not None:
                return deeper
            continue
        division = _division(_reader_at(site.scope, site.argument), site.argument, 0, set())
        if division is not None:
            return site.scope, division, f"at {site.where}"
    return None


def _reader_at(parsed: ParsedModule, node: cst.CSTNode) -> Reader:
    """How names read at `node`, a node of `parsed` outside the block's function (a call site, a helper)."""
    scope = SiteScope(parsed, node)
    prover = scope.prover()
    return Reader(parsed, scope.values, prover.is_scalar if prover is not None else
                  lambda value: number_value(value) is not None)


def _base(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor a chain of method calls and indexing starts from (`key` of `key.transpose(-2, -1)`)."""
    while isinstance(node, (cst.Call, cst.Subscript)) and (isinstance(node, cst.Subscript) or
                                                           isinstance(node.func, cst.Attribute)):
        node = node.value if isinstance(node, cst.Subscript) else node.func.value
    return node


def _division(reader: Reader, node: cst.CSTNode, depth: int, seen: set[cst.CSTNode]) -> cst.CSTNode | None:
    if depth > MAX_DEPTH or node in seen:
        return None
    seen.add(node)
    if isinstance(node, cst.Name):
        for value in reader.values(node) or ():
            found = _division(reader, value, depth + 1, seen)
            if found is not None:
                return found
        return None
    divisor = _divisor(reader, node)
    if divisor is not None and not _bounded(reader, divisor, 0):
        return node
    if isinstance(node, cst.Call) and any(_division(_reader_at(home, value), value, depth + 1, seen) is not None
                                          for home, value in _helper_values(reader, node)):
        return node
    for child in children(node):
        found = _division(reader, child, depth, seen)
        if found is not None:
            return found
    return None


def _any_function(module: ParsedModule) -> dict[str, cst.FunctionDef]:
    """A module's functions, decorated or not: a hazard read in a body counts whatever wraps it."""
    return module.module_functions


def _helper_values(reader: Reader, call: cst.Call) -> list[tuple[ParsedModule, cst.BaseExpression]]:
    """(file, expression) for each value a helper the call may run returns: a function of the file or its package
    (by name or through an imported module), any method of the file so named (`self.normalize(k)`: a subclass may
    override it), the `forward` of a module class the class assigns to the attribute, a lambda bound to the name."""
    func, parsed = call.func, reader.parsed
    found: list[tuple[ParsedModule, cst.FunctionDef]] = []
    if isinstance(func, cst.Name):
        lambdas = [value for value in reader.values(func) or () if isinstance(value, cst.Lambda)]
        if lambdas:
            return [(parsed, value.body) for value in lambdas]
        found = [package_definition(parsed, func.value, _any_function)]
    elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        name = func.attr.value
        found = [(parsed, function) for function in parsed.methods_named(name)]
        owner = SiteScope(parsed, call).owner
        built = owner.only_value(name) if owner is not None else None
        if isinstance(built, cst.Call) and isinstance(built.func, cst.Name):
            module_class = package_definition(parsed, built.func.value, lambda module: module.top_level_classes)
            found.append((module_class[0], module_class[1].methods.get("forward")) if module_class else None)
    elif (dotted := parsed.imported_name(func)) is not None and "." in dotted and not dotted.startswith("torch."):
        module, name = dotted.rsplit(".", 1)
        home = parsed.package_module(module)
        found = [package_definition(home, name, _any_function) if home is not None else None]
    return [(home, node.value) for home, function in filter(None, found) if function is not None
            for node in returns_of(function) if node.value is not None]


def _divisor(reader: Reader, node: cst.CSTNode) -> cst.BaseExpression | None:
    """What `node` divides by: `a / b`, `a ** -p` (a), `a.div(b)`, `torch.div(a, b)`, `b.rsqrt()`,
    `torch.reciprocal(b)`."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
        return node.right
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        exponent = number_value(node.right)
        return node.left if exponent is None or exponent < 0 else None
    if not isinstance(node, cst.Call):
        return None
    positional = [argument.value for argument in node.args if argument.keyword is None and not argument.star]
    if isinstance(node.func, cst.Attribute) and node.func.attr.value in DIVIDING_METHODS | INVERTING and \
            reader.parsed.imported_name(node.func) is None:
        if node.func.attr.value in INVERTING:
            return node.func.value
        return positional[0] if positional else None
    dotted = reader.parsed.imported_name(node.func) or ""
    name = dotted.removeprefix("torch.")
    if dotted.startswith("torch.") and name in INVERTING and positional:
        return positional[0]
    if dotted.startswith("torch.") and name in DIVIDING_METHODS and len(positional) >= 2:
        return positional[1]
    return None


def _bounded(reader: Reader, node: cst.BaseExpression, depth: int) -> bool:
    """Whether `node` is visibly kept away from 0: a Python number (the same for every key, so a 0 makes every
    score NaN in the original too), a sum with a positive number or an `eps`, a `clamp(min=...)`, a `max` or an
    `exp`, read through names and magnitude-keeping calls."""
    if depth > MAX_DEPTH:
        return False
    if reader.is_scalar(node):
        return True
    if isinstance(node, cst.Name):
        values = reader.values(node)
        return bool(values) and all(_bounded(reader, value, depth + 1) for value in values)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return any(_positive_constant(reader, side) for side in (node.left, node.right))
    if not isinstance(node, cst.Call):
        return False
    dotted = reader.parsed.imported_name(node.func) or ""
    name = dotted.rsplit(".", 1)[-1] if dotted else \
        node.func.attr.value if isinstance(node.func, cst.Attribute) else getattr(node.func, "value", "")
    keywords = {argument.keyword.value for argument in node.args if argument.keyword is not None}
    if name in ("clamp", "clip") and "min" in keywords or name in ("clamp_min", "max", "maximum", "fmax") or \
            name in NEVER_ZERO:
        return True
    if name in MAGNITUDE_KEEPING and isinstance(node.func, cst.Attribute) and not dotted:
        return _bounded(reader, node.func.value, depth + 1)
    if name in MAGNITUDE_KEEPING and node.args:  # `torch.sqrt(x)`
        return _bounded(reader, node.args[0].value, depth + 1)
    return False


def _positive_constant(reader: Reader, node: cst.BaseExpression) -> bool:
    """A positive number literal, or a number whose name says it is an epsilon (`self.eps`, `eps`)."""
    value = number_value(node)
    if value is not None:
        return value > 0
    named = node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else ""
    return "eps" in named.lower() and reader.is_scalar(node) or named.lower() in ("eps", "epsilon")
