"""Code that changes what torch's own ops compute, wherever in the tree it is defined.

A `TorchFunctionMode` (or `TorchDispatchMode`) entered by a training script sees every torch call the model makes,
and a tensor subclass's `__torch_function__` every call on its instances: a mode that scales softmax's output
(breaker round 13, bug 37) changes the eager block and not the SDPA call that replaces it. So does a kernel
registered for an `aten` op through `torch.library`, and so does a mode torch ships, used anywhere in the tree
(`with FlopCounterMode() as fc:` counts the eager block's matmuls and no FLOPs for the CPU flash kernel: 11.0 M
against 4.7 M a step, breaker round 15). Neither is visible where the attention is: a mode is entered
through a method call (`mode.__enter__()`, `with mode:`) on an object of any name. So any such definition in the
scanned tree leaves the patches of every block unproved (`torch-ops`, assumed: `advisor optimize` still measures
them on the user's run, where the mode is entered as it is).

Read with CPython's parser, on the files whose text names one of them.
"""

from __future__ import annotations

import ast
import re

import torch

from advisor.static.python_ast import nodes, python_tree

OVERRIDES = frozenset({"__torch_function__", "__torch_dispatch__"})
# a no-op `__torch_function__`: it turns a subclass's handling off, and ops then compute as torch's
DISABLED = "_disabled_torch_function_impl"
# torch.library's registrations of kernels (for an `aten::` op: torch's own)
REGISTRARS = frozenset({"Library", "impl", "register_kernel", "register_torch_dispatch", "register_autograd"})
# the dispatch and function modes torch ships (their subclasses define `__torch_dispatch__` and are found so)
# (and the hooks that replace what autograd saves: a pack hook compressing to bf16 changes the gradients of every op
# whose saved tensors the rewrite changes, breaker round 16; `save_on_cpu` moves them exactly)
TORCH_MODES = frozenset({"FlopCounterMode", "DebugMode", "CommDebugMode", "LoggingTensorMode", "FakeTensorMode",
                         "CrossRefFakeMode", "FunctionalTensorMode", "ProxyTorchDispatchMode", "TorchDispatchMode",
                         "TorchFunctionMode", "SchemaCheckMode", "RuntimeEstimator", "MemTracker",
                         "saved_tensors_hooks"})
MAY_OVERRIDE = re.compile(r"__torch_(?:function|dispatch)__|\blibrary\b|\bLibrary\b|"
                          r"\bclass\s+\w+\s*\([^)]*\b(?:Tensor|Parameter)\b|"
                          r"\b(?:FlopCounter|Debug|CommDebug|LoggingTensor|FakeTensor|CrossRefFake|FunctionalTensor|"
                          r"ProxyTorchDispatch|TorchDispatch|TorchFunction|SchemaCheck)Mode\b|\bRuntimeEstimator\b|"
                          r"\bMemTracker\b|\bsaved_tensors_hooks\b")


def op_overrides(text: str) -> list[tuple[int, str]]:
    """(line, what: a short code) for each definition in `text` that may change what a torch op computes: a
    `__torch_function__` or `__torch_dispatch__` defined or assigned (a mode's or a tensor subclass's), a method of
    a `Tensor` or `Parameter` subclass defined over one of torch.Tensor's (`transpose`, `__matmul__`: TENSOR_OPS), a
    torch.library registration naming an `aten` op or namespace, and a read of a mode torch ships or of
    `saved_tensors_hooks` (TORCH_MODES, by name or an import's alias; not the import alone). [] for source CPython
    cannot parse (the scan reports it)."""
    if MAY_OVERRIDE.search(text) is None:
        return []
    try:
        tree = python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    modes = {alias.asname or alias.name: alias.name for node in nodes(tree) if type(node) is ast.ImportFrom
             for alias in node.names if alias.name in TORCH_MODES}  # `FlopCounterMode as FLOPCounter` too
    found: list[tuple[int, str]] = []
    for node in nodes(tree):
        kind = type(node)
        if kind in (ast.FunctionDef, ast.AsyncFunctionDef) and node.name in OVERRIDES:
            found.append((node.lineno, node.name))
        elif kind is ast.ClassDef and _tensor_subclass(node):
            found += [(method.lineno, f"{node.name}.{method.name}") for method in node.body
                      if type(method) in (ast.FunctionDef, ast.AsyncFunctionDef) and method.name in TENSOR_OPS]
        elif kind in (ast.Assign, ast.AnnAssign) and _assigns_override(node):
            found.append((node.lineno, "__torch_function__ = ..."))
        elif kind is ast.Call and _registers_aten_kernel(node):
            found.append((node.lineno, "torch.library kernel for aten"))
        elif kind in (ast.Name, ast.Attribute) and type(node.ctx) is ast.Load and \
                (node.attr if kind is ast.Attribute else modes.get(node.id)) in TORCH_MODES:
            found.append((node.lineno, node.attr if kind is ast.Attribute else modes[node.id]))
    return sorted(found)


# torch.Tensor's methods, operators among them, that a tensor subclass may define over torch's: the eager block
# calls the subclass's (`transpose`, `__matmul__`, `softmax`), SDPA none (breaker round 50); not construction,
# printing, pickling and the like, which compute nothing the block reads
TENSOR_OPS = frozenset(dir(torch.Tensor)) - {
    "__init__", "__new__", "__repr__", "__str__", "__format__", "__reduce__", "__reduce_ex__", "__deepcopy__",
    "__setstate__", "__getstate__", "__class_getitem__", "__init_subclass__", "__subclasshook__", "__sizeof__",
    "__dir__", "__hash__", "__torch_function__", "__torch_dispatch__", "__doc__", "__module__"}


def _tensor_subclass(node: ast.ClassDef) -> bool:
    """A class whose bases name `Tensor` or `Parameter` (`torch.Tensor`, `nn.Parameter`, an import of either)."""
    return any((base.attr if type(base) is ast.Attribute else getattr(base, "id", None)) in ("Tensor", "Parameter")
               for base in node.bases)


def _assigns_override(node: ast.Assign | ast.AnnAssign) -> bool:
    targets = node.targets if type(node) is ast.Assign else [node.target]
    named = any((target.id if type(target) is ast.Name else getattr(target, "attr", None)) in OVERRIDES
                for target in targets)
    value = node.value
    disabled = value is not None and (getattr(value, "attr", None) == DISABLED or getattr(value, "id", None) == DISABLED)
    return named and not disabled


def _registers_aten_kernel(node: ast.Call) -> bool:
    """`torch.library.Library("aten", "IMPL")`, `@torch.library.impl("aten::softmax", ...)`, `lib.impl(...)` on
    such a library, `register_kernel("aten::...")`: a call of a REGISTRARS name with a string argument naming
    `aten`."""
    name = node.func.attr if type(node.func) is ast.Attribute else getattr(node.func, "id", None)
    if name not in REGISTRARS:
        return False
    strings = [argument.value for argument in node.args + [keyword.value for keyword in node.keywords]
               if type(argument) is ast.Constant and isinstance(argument.value, str)]
    return any(text == "aten" or text.startswith("aten::") for text in strings)
