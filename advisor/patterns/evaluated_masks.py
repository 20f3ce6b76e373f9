"""A mask built from constants alone, computed: whether every row keeps a key.

The structural readers prove the common forms (a causal triangle, `causal.built_keeps_first_key`; small values,
`call_site_facts.SiteScope.interval`). A padding pattern, a band or a mask joined from pieces has no form of its own
(`torch.cat([torch.zeros(B, 1, 1, S - 4), torch.full((B, 1, 1, 4), -1e4)], -1)`, `(torch.arange(S) >= S - 4).float()
* -1e9`). Where every name in it is a number or a tensor whose one definition the file shows (what `values_of`
gives: `module_values` for module-level names) and every call is one of torch's pure builders below, its value is
fixed, so computing it proves the fact for every call, as reading the definition does. Random draws are never
computed (their values change from run to run), nor is anything outside these lists, nor a tensor of more than
MAX_ELEMENTS elements. The expression is checked whole before torch is imported, so a scan that meets no such mask
never imports it.

Every row keeps a key where its largest value lies within SMALL_LIMIT of 0: that key carries its score as it is, so
no fill swallows the row. Where the read may slice rows and columns from 0 (`causal.under_row_reads`), column 0
must be that key in every row.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable

import libcst as cst

from advisor.patterns.copy_cast_roles import dtype_name
from advisor.patterns.module_values import module_steps
from advisor.static.dataflow import UNDEFINED
from advisor.static.global_reach import reached_by_name
from advisor.static.global_writes import written_elsewhere
from advisor.static.module_index import ParsedModule

SMALL_LIMIT = 10.0  # as call_site_facts.SMALL_LIMIT: a value that leaves a score as precise as it is
MAX_ELEMENTS = 1 << 22
MAX_DEPTH = 40
Resolve = Callable[[cst.Name], "list[cst.BaseExpression] | None"]
Thunk = Callable[[], object]

BUILDERS = frozenset({"zeros", "ones", "full", "arange", "tril", "triu", "cat", "concat", "stack", "where",
                      "zeros_like", "ones_like", "full_like", "logical_not", "logical_and", "logical_or", "eye",
                      "finfo", "minimum", "maximum", "clamp", "hstack", "vstack"})
METHODS = frozenset({"masked_fill", "tril", "triu", "float", "double", "bool", "long", "int", "half", "bfloat16",
                     "to", "unsqueeze", "view", "reshape", "expand", "repeat", "transpose", "permute", "flip", "t",
                     "clone", "contiguous", "detach", "logical_not", "eq", "ne", "lt", "le", "gt", "ge", "clamp",
                     "clamp_min", "clamp_max", "squeeze", "flatten", "abs", "neg", "add", "sub", "mul", "div",
                     "remainder", "sign", "logical_and", "logical_or"})
KEYWORDS = frozenset({"dtype", "diagonal", "dim", "value", "fill_value", "start", "end", "step", "min", "max",
                      "dims", "repeats"})
IGNORED_KEYWORDS = frozenset({"device", "requires_grad", "layout", "pin_memory", "non_blocking"})
NUMBERS = {"math.inf": math.inf, "math.pi": math.pi, "math.e": math.e, "torch.inf": math.inf}
BINARY = {cst.Add: operator.add, cst.Subtract: operator.sub, cst.Multiply: operator.mul, cst.Divide: operator.truediv,
          cst.FloorDivide: operator.floordiv, cst.Modulo: operator.mod, cst.Power: operator.pow,
          cst.BitAnd: operator.and_, cst.BitOr: operator.or_, cst.BitXor: operator.xor}
COMPARE = {cst.LessThan: operator.lt, cst.GreaterThan: operator.gt, cst.LessThanEqual: operator.le,
           cst.GreaterThanEqual: operator.ge, cst.Equal: operator.eq, cst.NotEqual: operator.ne}
UNARY = {cst.Minus: operator.neg, cst.Plus: operator.pos, cst.BitInvert: operator.invert}


# process-wide settings a program may change before the mask is built, which this process does not share
# (`torch.set_default_dtype(torch.float64)` turns `torch.finfo().eps` into another number; flushed denormals read
# as 0): breaker round 41
PROCESS_SETTINGS = ("set_default_dtype", "set_default_tensor_type", "set_flush_denormal", "set_default_device",
                    "set_default_", "set_flush_")  # the stems: a name joined at run time (breaker round 42)
# a function of torch looked up by a name the code computes, and called: it may be any of them, a setting's included
COMPUTED_TORCH_CALL = re.compile(r"""getattr\(\s*torch(?:\.\w+)*\s*,\s*+(?!["'][\w.]*["']\s*\))"""
                                 r"""[^()]*(?:\([^()]*\)[^()]*)*\)\s*\(""")


def values_may_differ(parsed: ParsedModule, settings: tuple[str, ...] = ("set_flush_denormal",)) -> bool:
    """The scan's torch may compute otherwise than the program's: a file of the tree changes a process-wide setting,
    or replaces a torch or math function (`torch.full = patched` at import). Every reader of a mask's values from
    how it is built (computed here, or read as a triangle's parts or as bounds) holds only where this is False; the
    readers of forms, whose numbers do not depend on the default dtype, ask only of the `settings` that change
    values whatever the dtype."""
    tree = parsed.tree
    if any(word in parsed.source or tree is not None and tree.mentioning(word) for word in settings):
        return True
    if COMPUTED_TORCH_CALL.search(parsed.source) or \
            tree is not None and tree.any_file_matches("computed torch calls", COMPUTED_TORCH_CALL):
        return True  # `getattr(torch, "set_default_" + key)(torch.float64)`: any of torch's functions (round 42)
    return any(name.startswith(("torch.Tensor.", "math.")) or name.startswith("torch.") and
               name.rsplit(".", 1)[-1] in BUILDERS | METHODS | {"tensor", "finfo", "einsum", "matmul"}
               for name in parsed.outside_attribute_writes[0])  # not `torch.backends.cudnn.benchmark = True`


class _NotComputed(Exception):
    """The expression holds something this module does not compute."""


def every_row_keeps_a_key(parsed: ParsedModule, node: cst.BaseExpression, values_of: Resolve,
                          sliced: bool = True) -> bool:
    """`node` is computed (see the module's docstring) and every row of it keeps a key with a small value and none
    larger: key 0, where the read may slice its columns from 0 (`sliced`), else any."""
    if values_may_differ(parsed, PROCESS_SETTINGS):
        return False
    try:
        thunk = _Compiler(parsed, values_of).compile(node, 0)
    except _NotComputed:
        return False
    import torch

    try:
        with torch.no_grad():
            value = thunk()
    except Exception:  # noqa: BLE001 - a shape error, an overflow, a builder given what it rejects: not computed
        return False
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.numel() == 0:
        return False
    rows = value.double()
    largest = rows.amax(-1)
    kept = rows[..., 0].abs() if sliced else largest.abs()
    return not bool(rows.isnan().any()) and float(kept.max()) <= SMALL_LIMIT and float(largest.max()) <= SMALL_LIMIT


class _Compiler:
    """Turns an expression into a thunk computing it, or raises _NotComputed."""

    def __init__(self, parsed: ParsedModule, values_of: Resolve) -> None:
        self.parsed, self.values_of = parsed, values_of
        self.building: dict[str, list] = {}  # name -> the cell holding what the module-level steps built so far

    def compile(self, node: cst.BaseExpression, depth: int) -> Thunk:
        if depth > MAX_DEPTH:
            raise _NotComputed
        below = lambda child: self.compile(child, depth + 1)  # noqa: E731
        if isinstance(node, (cst.Integer, cst.Float)):
            number = node.evaluated_value
            return lambda: number
        if isinstance(node, cst.Name):
            return self._name(node, depth)
        if isinstance(node, (cst.Tuple, cst.List)):
            if any(isinstance(e, cst.StarredElement) for e in node.elements):
                raise _NotComputed
            items = [below(e.value) for e in node.elements]
            return lambda: tuple(item() for item in items)
        if isinstance(node, cst.UnaryOperation) and type(node.operator) in UNARY:
            inner, apply = below(node.expression), UNARY[type(node.operator)]
            return lambda: apply(inner())
        if isinstance(node, cst.BinaryOperation) and type(node.operator) in BINARY:
            left, right, apply = below(node.left), below(node.right), BINARY[type(node.operator)]
            return lambda: _checked(apply(left(), right()))
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and \
                type(node.comparisons[0].operator) in COMPARE:
            left, right = below(node.left), below(node.comparisons[0].comparator)
            apply = COMPARE[type(node.comparisons[0].operator)]
            return lambda: apply(left(), right())
        if isinstance(node, cst.Subscript):
            return self._subscript(node, depth)
        if isinstance(node, cst.Attribute):
            return self._attribute(node, depth)
        if isinstance(node, cst.Call):
            return self._call(node, depth)
        raise _NotComputed

    def _import_intact(self, func: cst.BaseExpression) -> bool:
        """The name `func` is read through still holds what the file's import bound (breaker round 42: `import
        __main__; __main__.full = patched` in another file rebinds `from torch import full`; so may a write of
        `program.full`, or of the name reached otherwise than by spelling it)."""
        while isinstance(func, cst.Attribute):
            func = func.value
        if not isinstance(func, cst.Name):
            return False
        name, parsed = func.value, self.parsed
        return not (reached_by_name(parsed, name) or name in parsed.outside_attribute_writes[0] or
                    parsed.global_rebound_by_computed_name(name) is not None or
                    parsed.tree is not None and written_elsewhere(parsed, parsed.tree, name) is not None)

    def _builtin(self, name: str) -> bool:
        """The file binds `name` nowhere (no assignment, def or class), so it is the builtin."""
        defined = (cst.FunctionDef, cst.ClassDef)
        return name not in self.parsed.bindings and not any(
            isinstance(self.parsed.parents.get(n), defined) for n in self.parsed.names_spelled(name))

    def _name(self, node: cst.Name, depth: int) -> Thunk:
        if node.value in ("True", "False", "None"):
            constant = {"True": True, "False": False, "None": None}[node.value]
            return lambda: constant
        if node.value in self.building:  # a step's read of the tensor the steps before it built
            cell = self.building[node.value]
            return lambda: cell[0]
        values = self.values_of(node)
        if values and len(values) == 1:
            return self.compile(values[0], depth + 1)
        steps = module_steps(self.parsed, node.value, registered=(node,)) if not values and self._global(node) \
            else None  # the read itself may be the buffer registration the caller reads through
        if steps is None:
            raise _NotComputed
        return self._steps(node.value, steps, depth)

    def _global(self, node: cst.Name) -> bool:
        function = self.parsed.frame(node)
        return function is None or self.parsed.flow(function).reaching.get(node) == frozenset({UNDEFINED})

    def _steps(self, name: str, steps: list[cst.BaseSmallStatement], depth: int) -> Thunk:
        """What the module-level statements that build `name` leave in it, run in order."""
        cell: list = [None]
        outer, self.building = self.building, {**self.building, name: cell}
        try:
            runs = [self._step(step, cell, depth) for step in steps]
        finally:
            self.building = outer

        def run():
            for step in runs:
                step()
            return cell[0]

        return run

    def _step(self, step: cst.BaseSmallStatement, cell: list, depth: int) -> Thunk:
        if isinstance(step, cst.Assign) and isinstance(step.targets[0].target, cst.Name):
            value = self.compile(step.value, depth + 1)
            return lambda: cell.__setitem__(0, _checked(value()))
        if isinstance(step, cst.Assign):  # `MASK[..., -3:] = -1e9`
            target = step.targets[0].target
            index, value = self._subscript(target, depth, index_only=True), self.compile(step.value, depth + 1)
            return lambda: cell[0].__setitem__(index(), value())
        call = step.value
        positional = [self.compile(a.value, depth + 1) for a in call.args if a.keyword is None and not a.star]
        if len(positional) != len(call.args):
            raise _NotComputed
        method = call.func.attr.value
        return lambda: _method(cell[0], method, [p() for p in positional], {})

    def _attribute(self, node: cst.Attribute, depth: int) -> Thunk:
        dotted = self.parsed.imported_name(node)
        if dotted in NUMBERS:
            number = NUMBERS[dotted]
            return lambda: number
        dtype = dtype_name(self.parsed, node)
        if dtype is not None:
            return lambda: _torch_dtype(dtype)
        if node.attr.value in ("min", "max", "eps", "tiny") and isinstance(node.value, cst.Call) and \
                self.parsed.imported_name(node.value.func) == "torch.finfo":
            info, name = self.compile(node.value, depth + 1), node.attr.value
            return lambda: float(getattr(info(), name))
        if node.attr.value == "T":
            inner = self.compile(node.value, depth + 1)
            return lambda: inner().T
        raise _NotComputed

    def _subscript(self, node: cst.Subscript, depth: int, index_only: bool = False) -> Thunk:
        base = None if index_only else self.compile(node.value, depth + 1)
        parts: list[Thunk] = []
        for element in node.slice:
            part = element.slice
            if isinstance(part, cst.Index) and part.star is None:
                if isinstance(part.value, cst.Ellipsis):
                    parts.append(lambda: Ellipsis)
                else:
                    index = self.compile(part.value, depth + 1)
                    parts.append(lambda index=index: _plain_index(index()))
            elif isinstance(part, cst.Slice):
                bounds = [self.compile(b, depth + 1) if b is not None else (lambda: None)
                          for b in (part.lower, part.upper, part.step)]
                parts.append(lambda bounds=bounds: slice(*(_plain_index(b()) for b in bounds)))
            else:
                raise _NotComputed
        if index_only:
            return lambda: tuple(p() for p in parts)
        return lambda: _checked(base()[tuple(p() for p in parts)])

    def _call(self, node: cst.Call, depth: int) -> Thunk:
        if any(arg.star for arg in node.args):
            raise _NotComputed
        dotted = self.parsed.imported_name(node.func)
        if dotted == "float" and self._builtin("float") and len(node.args) == 1 and \
                isinstance(node.args[0].value, cst.SimpleString):
            text = node.args[0].value.evaluated_value
            if isinstance(text, str) and text.strip().lower() in ("inf", "-inf", "+inf", "infinity", "-infinity"):
                number = float(text)
                return lambda: number
            raise _NotComputed
        positional = [self.compile(a.value, depth + 1) for a in node.args if a.keyword is None]
        keywords = {}
        for arg in node.args:
            if arg.keyword is None or arg.keyword.value in IGNORED_KEYWORDS:
                continue
            if arg.keyword.value not in KEYWORDS:
                raise _NotComputed
            keywords[arg.keyword.value] = self.compile(arg.value, depth + 1)
        if dotted is not None and dotted.startswith("torch.") and dotted[len("torch."):] in BUILDERS:
            if not self._import_intact(node.func):
                raise _NotComputed
            name = dotted[len("torch."):]
            return lambda: _build(name, [p() for p in positional], {k: v() for k, v in keywords.items()})
        if dotted is None and isinstance(node.func, cst.Attribute) and node.func.attr.value in METHODS:
            receiver, method = self.compile(node.func.value, depth + 1), node.func.attr.value
            return lambda: _method(receiver(), method, [p() for p in positional],
                                   {k: v() for k, v in keywords.items()})
        raise _NotComputed


def _method(receiver: object, method: str, positional: list, keywords: dict) -> object:
    import torch

    if not isinstance(receiver, torch.Tensor):
        raise _NotComputed  # a number's or a tuple's method is no tensor's
    if method == "repeat":
        times = [t for p in positional for t in (p if isinstance(p, (tuple, list)) else [p])]
        if not all(isinstance(t, int) for t in times) or receiver.numel() * math.prod(times) > MAX_ELEMENTS:
            raise _NotComputed
    return _checked(getattr(receiver, method)(*positional, **keywords))


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _plain_index(value: object) -> object:
    """An index is a number, None or a slice bound, never a tensor (advanced indexing is not computed here)."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _NotComputed


def _build(name: str, positional: list, keywords: dict):
    import torch

    if _elements(name, positional, keywords) > MAX_ELEMENTS:
        raise _NotComputed
    return _checked(getattr(torch, name)(*positional, **keywords))


def _elements(name: str, positional: list, keywords: dict) -> float:
    """How many elements a creating builder makes (0 for one that only combines tensors it is given, which are
    checked already), before it makes them."""
    if name in ("zeros", "ones", "full"):
        sizes = positional[:1] if name == "full" or positional and isinstance(positional[0], (tuple, list)) \
            else positional
        flat = [s for p in sizes for s in (p if isinstance(p, (tuple, list)) else [p])]
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in flat):
            raise _NotComputed
        return math.prod(flat)
    if name == "arange":
        bounds = positional + [keywords.get(k) for k in ("start", "end", "step") if k in keywords]
        if not bounds or not all(isinstance(b, (int, float)) for b in bounds):
            raise _NotComputed
        start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds[:2], bounds[2] if len(bounds) > 2 else 1)
        return abs((end - start) / step) if step else math.inf
    if name == "eye":
        if not positional or not all(isinstance(n, int) for n in positional[:2]):
            raise _NotComputed
        return positional[0] * (positional[1] if len(positional) > 1 else positional[0])
    return 0


def _checked(value: object) -> object:
    """The value, unless it is a tensor too large to compute further."""
    import torch

    if isinstance(value, torch.Tensor) and value.numel() > MAX_ELEMENTS:
        raise _NotComputed
    return value
