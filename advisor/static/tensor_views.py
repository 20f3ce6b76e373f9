"""Which local names an expression's tensor may share storage with: a write through `mask[:, :p].fill_(1)`,
`torch.narrow(mask, 1, 0, p).fill_(1)`, or an alias `m2 = mask[:, :p]; m2 += 1` changes `mask`'s values as surely as
`mask[0] = 1` does, and a proof that reads `mask` from its one assignment must see it.

torch's view ops (the "Tensor Views" page of its docs) return views of their input; casts, `.contiguous()`,
`reshape` and the in-place methods may return the input itself. A call of anything else of torch's is a fresh
tensor (`q.matmul(k)`, `F.softmax(s)`). A call this module cannot place (a helper of the user's, a module
`self.drop(x)`, einops) may return any tensor it is given, so its arguments count.
"""

from __future__ import annotations

from functools import cache

import libcst as cst
import networkx as nx

from advisor.static.outside_writes import writes_its_receiver
from advisor.static.walk import walk

VIEW_OPS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "expand", "expand_as", "broadcast_to",
    "transpose", "t", "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "adjoint", "squeeze", "unsqueeze",
    "narrow", "select", "diagonal", "unfold", "unbind", "split", "split_with_sizes", "chunk", "tensor_split",
    "hsplit", "vsplit", "dsplit", "as_strided", "detach", "view_as_real", "view_as_complex", "atleast_1d",
    "atleast_2d", "atleast_3d", "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16",
    "bool", "byte", "char", "short", "int", "long", "cpu", "cuda", "rearrange", "ravel", "alias",
})
# what reads a tensor's memory layout, builds a tensor from it, or raises on some strides (`view_as_complex`:
# breaker round 31's rotary embedding): a copy removed before one, or SDPA's output strides, may change it
STRIDE_READS = frozenset({"stride", "is_contiguous", "data_ptr", "storage", "untyped_storage", "storage_offset",
                          "as_strided", "as_strided_", "set_", "numpy", "unfold", "data", "grad", "resize_",
                          "from_dlpack", "to_dlpack", "__dlpack__", "view_as_complex", "view_as_real",
                          "save"})  # `torch.save` writes the strides out (breaker round 32)
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
# library calls whose result holds the storage of what they are given (`nn.Parameter(t)`, `torch.as_tensor(t)`)
SHARING_CONSTRUCTORS = frozenset({"Parameter", "as_tensor", "asarray", "from_numpy", "frombuffer", "Buffer"})
# ... that return their input itself where they compute nothing (a dropout at p=0 or out of training)
RETURNS_ITS_INPUT = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                               "feature_alpha_dropout", "feature_dropout"})
# torch functions and methods that draw random numbers in their input's memory order: with one seed, a permuted
# tensor and its contiguous copy get their draws on other elements (breaker rounds 16 and 25)
RANDOM_OPS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                        "rand_like", "randn_like", "randint_like", "bernoulli", "native_dropout", "poisson",
                        "multinomial", "rrelu", "rrelu_", "rrelu_with_noise", "fractional_max_pool2d",
                        "fractional_max_pool3d"})
# what draws from torch's generator besides RANDOM_OPS: factories and in-place samplers
RANDOM_DRAWS = RANDOM_OPS | frozenset({"rand", "randn", "randint", "randperm", "normal", "uniform_", "normal_",
                                       "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_",
                                       "manual_seed", "seed", "set_rng_state", "fork_rng", "binomial",
                                       "gumbel_softmax", "standard_gamma", "_standard_gamma", "_sample_dirichlet",
                                       "log_normal", "exponential", "geometric", "cauchy", "make_tensor"})
# library namespaces whose other functions return fresh tensors
LIBRARIES = frozenset({"torch", "F", "nn", "functional", "np", "numpy", "math", "einops", "th"})
# builtins whose result holds no tensor of its arguments
SCALAR_BUILTINS = frozenset({"len", "int", "float", "bool", "str", "repr", "isinstance", "hasattr", "range", "print",
                             "id", "hash", "type", "abs", "round", "divmod", "format", "callable", "getattr"})
CONSTANTS = frozenset({"None", "True", "False", "Ellipsis"})  # names that hold no tensor
SIZE_METHODS = frozenset({"size", "dim", "numel", "item", "tolist", "stride", "nelement", "element_size"})


def torch_op_name(dotted: str) -> str:
    """The op a torch name calls: its last part, or for an aten op reached with its overload
    (`torch.ops.aten.view.default`) the op's name, not the overload's."""
    parts = dotted.split(".")
    return parts[3] if parts[:2] == ["torch", "ops"] and len(parts) > 3 else parts[-1]


def storage_roots(expression: cst.BaseExpression, libraries: frozenset[str] = frozenset()) -> list[cst.Name]:
    """The names whose tensors the value of `expression` may be, or view. `libraries`: the module's names of
    library functions (`from torch import einsum`): a call of one views only what a view op of that name would."""
    if isinstance(expression, cst.Name):
        return [] if expression.value in CONSTANTS else [expression]
    if isinstance(expression, cst.Subscript):
        return storage_roots(expression.value, libraries)
    if isinstance(expression, cst.Attribute):  # a view, or a bound in-place method (`cb = x.mul_`) that writes x
        viewing = expression.attr.value in VIEW_ATTRIBUTES or writes_its_receiver(expression.attr.value)
        return storage_roots(expression.value, libraries) if viewing else []
    if isinstance(expression, (cst.Tuple, cst.List)):
        return [root for element in expression.elements for root in storage_roots(element.value, libraries)]
    if isinstance(expression, cst.IfExp):
        return storage_roots(expression.body, libraries) + storage_roots(expression.orelse, libraries)
    if isinstance(expression, cst.NamedExpr):
        return storage_roots(expression.value, libraries)
    if isinstance(expression, cst.BooleanOperation):  # `a and b` is one of them
        return storage_roots(expression.left, libraries) + storage_roots(expression.right, libraries)
    if not isinstance(expression, cst.Call):
        return []
    func, positional = expression.func, [arg.value for arg in expression.args if arg.keyword is None]
    if isinstance(func, cst.Name):
        if func.value in SCALAR_BUILTINS:
            return []
        if func.value in libraries:  # `from torch import einsum`: as `torch.einsum`
            viewed = _library_viewed(func.value, expression, positional)
        else:
            viewed = positional[:1] if func.value in VIEW_OPS else positional
        return [root for value in viewed for root in storage_roots(value, libraries)]
    if not isinstance(func, cst.Attribute):
        return [root for value in positional for root in storage_roots(value, libraries)]
    name, receiver = func.attr.value, func.value
    if is_library(receiver):  # `torch.narrow(mask, ...)`: a view of its first argument; `torch.matmul` a new tensor
        viewed = _library_viewed(name, expression, positional)
        return [root for value in viewed for root in storage_roots(value, libraries)]
    if isinstance(receiver, cst.Name) and receiver.value == "self":  # a module or method of the user's
        return [root for value in positional for root in storage_roots(value, libraries)]
    if name in VIEW_OPS or writes_its_receiver(name) or name == "__getitem__":  # in place: returns its receiver
        return storage_roots(receiver, libraries)
    return []


def _library_viewed(name: str, call: cst.Call, positional: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """What a library function's result may view or be: its first argument for a view op, an in-place op, a
    constructor sharing its input or a dropout (one that does not drop returns its input); an einsum's operands
    unless it joins two or more (`einsum('ij->ji', q)` is a view of q: breaker round 39); nothing otherwise."""
    if name in VIEW_OPS | SHARING_CONSTRUCTORS | RETURNS_ITS_INPUT or writes_its_receiver(name):
        return positional[:1]
    if name == "einsum":
        return [] if einsum_joins_operands(call) else positional[1:]
    return []


def einsum_joins_operands(call: cst.Call) -> bool:
    """`einsum(eq, a, b)` of two operands or more computes a new tensor; of one (`einsum('ij->ji', q)`, or
    `einsum(q, [0, 1], [1, 0])` in the sublist form: breaker round 40) it may be a view of it (breaker round 39)."""
    positional = [arg for arg in call.args if arg.keyword is None]
    if any(arg.star for arg in call.args) or not positional:
        return False
    if isinstance(positional[0].value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return len(positional) >= 3
    return len(positional) >= 4  # the sublist form, `einsum(a, [0, 1], b, [1, 2])`: operands and sublists paired



def _is_size(value: cst.BaseExpression) -> bool:
    """A number, or the sizes of a tensor: `4`, `x.size()`, `x.size(-1)`, `x.shape`, `x.shape[-1]`, `len(x)`."""
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if isinstance(value, cst.Subscript):
        value = value.value
    if isinstance(value, cst.Attribute):
        return value.attr.value in ("shape", "ndim")
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        return value.func.attr.value in SIZE_METHODS
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("len", "int")


def is_library(node: cst.BaseExpression) -> bool:
    """`torch`, `torch.Tensor`, `F`, `np`: a namespace of functions, not a tensor."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name) and node.value in LIBRARIES


def view_aliases(function: cst.FunctionDef, libraries: frozenset[str] = frozenset()) -> dict[str, frozenset[str]]:
    """Each local name -> the other names that may share its storage, through the function's assignments and loop
    targets (`m2 = mask[:, :p]`, `a, b = x.chunk(2)`, `for row in mask:`), either way and transitively. Read once
    for the whole function, whatever the order: a write through one of them is a write of them all. `libraries`:
    see `storage_roots`."""
    bindings = _Bindings(function, libraries)
    walk(function, bindings)
    bindings.shared.remove_nodes_from(bindings.sizes - bindings.tensors)  # ints hold no storage
    return {name: frozenset(component - {name}) for component in nx.connected_components(bindings.shared)
            for name in component}


class _Bindings(cst.CSTVisitor):
    """The may-share-storage graph of a function's names; `sizes`, the names some binding gives a size or a number
    (`b, n, c = x.size()`, `d = q.shape[-1]`, `n = 4`), and `tensors`, those some other binding gives anything
    else: a name only ever a size views nothing (a helper `self._shape(k, -1, bsz)` is passed one)."""

    def __init__(self, function: cst.FunctionDef, libraries: frozenset[str]) -> None:
        self.function, self.shared, self.libraries = function, nx.Graph(), libraries
        self.sizes: set[str] = set()
        self.tensors: set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        roots = storage_roots(node.value, self.libraries)
        for target in node.targets:
            self._join(target.target, roots)
            self._note_kind(target.target, node.value)

    def _note_kind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        names = [target.value] if isinstance(target, cst.Name) else [
            element.value.value for element in target.elements if isinstance(element.value, cst.Name)] \
            if isinstance(target, (cst.Tuple, cst.List)) else []
        (self.sizes if _is_size(value) else self.tensors).update(names)

    def visit_For(self, node: cst.For) -> None:
        self._join(node.target, storage_roots(node.iter, self.libraries))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.function  # a nested function's own locals are its own

    def _join(self, target: cst.BaseExpression, roots: list[cst.Name]) -> None:
        if isinstance(target, cst.Name):
            self.shared.add_edges_from((target.value, root.value) for root in roots if root.value != target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._join(element.value, roots)
        elif isinstance(target, cst.StarredElement):
            self._join(target.value, roots)


@cache
def tensor_method_names() -> frozenset[str]:
    """torch.Tensor's public methods (torch imported only where a proof asks: a second per process)."""
    import torch

    return frozenset(name for name in dir(torch.Tensor) if not name.startswith("__"))
