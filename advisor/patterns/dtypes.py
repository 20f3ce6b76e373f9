"""Which tensors provably share a dtype, read from the source.

SDPA needs q, k and v of one dtype, and an additive mask of the query's dtype. The original proves some dtype
equalities by running at all: matmul/bmm/baddbmm/einsum and `F.linear` raise on mixed dtypes. A tensor's
*dtype root* is where its dtype comes from, followed back through operations that keep it (views, layout
changes, Python-number scaling, masked fills, dropout, softmax without `dtype=`, casts to another tensor's
dtype, one `nn.Linear` of an input); two tensors with the same root have the same dtype. A root is a CST node
(the tensor the walk stopped at) or a dtype's name (`torch.float32` after `.float()`).
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from advisor.patterns.ops import OpReader
from advisor.static.dataflow import UNDEFINED, FunctionFlow
from advisor.static.module_index import ClassInfo, ParsedModule

Root = object  # a cst node or a dtype name
LAYOUT_METHODS = {"view", "reshape", "permute", "transpose", "contiguous", "unsqueeze", "squeeze", "flatten",
                  "expand", "expand_as", "clone", "detach", "chunk", "split", "unbind", "repeat", "narrow", "amax"}
EINOPS = {"einops.rearrange", "einops.repeat"}
SAME_DTYPE_FUNCTIONS = {"torch.nn.functional.normalize"}  # return their input's dtype (cosine attention's q and k)
TENSOR_OPS = {"matmul", "bmm", "baddbmm", "einsum", "transpose", "permute", "mT", "view", "softmax", "dropout"}
CONCRETE = {"float": "torch.float32", "half": "torch.float16", "bfloat16": "torch.bfloat16", "double": "torch.float64"}
DTYPE_NAMES = {f"torch.{name}" for name in ("float32", "float", "float16", "half", "bfloat16", "float64", "double")}
CANONICAL = {"torch.float": "torch.float32", "torch.half": "torch.float16", "torch.double": "torch.float64"}
MAX_DEPTH = 30
CREATIONS = {f"torch.{name}" for name in ("full", "tensor", "empty", "zeros", "ones", "rand", "randn")}
LIKE_CREATIONS = {f"torch.{name}_like" for name in ("empty", "zeros", "ones", "full", "rand", "randn")}
# torch.nn layers whose output is floating (their float parameters raise on integer inputs, or embed them)
FLOAT_LAYERS = {f"torch.nn.{name}" for name in ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
                                                 "ConvTranspose2d", "ConvTranspose3d", "Embedding", "LayerNorm",
                                                 "GroupNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d")}


class DtypeRoots:
    """Dtype roots of expressions in one match: `argument_of(name)` maps a parameter of an inlined helper
    to the caller's argument (or None); `helper(call)` is (what the helper called there returns, the helper,
    its parameters bound to that call's arguments) or None; `function_of(node)` the function holding a node;
    `is_scalar(node)` proves a Python number (scaling a float tensor by one keeps its dtype)."""

    def __init__(self, parsed: ParsedModule, owner: ClassInfo | None, reader: OpReader,
                 flow_for: Callable[[cst.CSTNode], FunctionFlow],
                 argument_of: Callable[[cst.Name], cst.BaseExpression | None],
                 helper: Callable[[cst.Call], tuple[cst.BaseExpression, cst.FunctionDef, dict] | None],
                 function_of: Callable[[cst.CSTNode], cst.FunctionDef | None],
                 is_scalar: Callable[[cst.BaseExpression], bool]) -> None:
        self.parsed, self.owner, self.reader, self.is_scalar = parsed, owner, reader, is_scalar
        self.flow_for, self.argument_of, self.helper, self.function_of = flow_for, argument_of, helper, function_of
        self._bound: dict[cst.FunctionDef, dict[str, cst.BaseExpression]] = {}  # helpers being followed
        self._through_float_layer = False  # the walk passed a layer that takes float inputs only (`is_floating`)
        self._kept_addends: tuple[cst.BaseExpression, ...] = ()  # read by `same_given_addends` only

    def same(self, *nodes: cst.BaseExpression) -> bool:
        roots = [self.root(node) for node in nodes]
        return all(_equal(roots[0], other) for other in roots[1:])

    def same_given_addends(self, addends: list[cst.BaseExpression], *nodes: cst.BaseExpression) -> bool:
        """`same`, reading a sum with one of `addends` as the other operand's dtype: true wherever no addend is a
        float wider than what it is added to, which the caller must prove or record as a fact (an additive mask's
        `mask-dtype`: FSMT's fill `finfo(scores.dtype).min` after `scores + mask` has the query's dtype)."""
        self._kept_addends = tuple(addends)
        try:
            return self.same(*nodes)
        finally:
            self._kept_addends = ()

    def is_floating(self, node: cst.BaseExpression) -> bool:
        """Whether the source shows `node` floating: its dtype root is a float dtype, or a float layer's output
        (`self.q(h)` of an `nn.Conv2d`), or the walk to it passes an `nn.Linear` (which raises on other inputs)."""
        self._through_float_layer = False
        found = self.root(node)
        return self._through_float_layer or isinstance(found, str) and found in DTYPE_NAMES or \
            isinstance(found, cst.Call) and layer_class(self.parsed, self.owner, found) in FLOAT_LAYERS

    def root(self, node: cst.BaseExpression, depth: int = 0) -> Root:
        """The dtype root of `node`: itself when no dtype-keeping step leads further back."""
        found = self._step(node, depth) if depth <= MAX_DEPTH else None
        return node if found is None else found

    def _step(self, node: cst.BaseExpression, depth: int) -> Root | None:
        if isinstance(node, cst.Name):
            return self._name_root(node, depth)
        concrete = self._dtype_name(node)
        if concrete is not None:
            return concrete
        if isinstance(node, cst.Subscript):  # an item of a tuple of tensors need not share their dtype
            return self.root(node.value, depth + 1) if self._is_tensor(node.value, depth) else None
        op = self.reader.read(node)
        if op is not None:
            return self._op_root(op, depth)
        if isinstance(node, cst.Call):
            return self._call_root(node, depth)
        return None

    def _name_root(self, node: cst.Name, depth: int) -> Root | None:
        argument = self.argument_of(node)
        if argument is not None:
            return self.root(argument, depth + 1)
        flow = self.flow_for(node)
        ids = flow.reaching.get(node)
        if not ids or UNDEFINED in ids:
            return None
        definitions = [flow.definitions[i] for i in sorted(ids)]
        bound = self._bound.get(self.function_of(node), {})
        if len(definitions) == 1 and definitions[0].kind == "param" and node.value in bound:
            return self._bound_root(self.function_of(node), node.value, depth)
        return self._definitions_root(flow, definitions, depth)

    def _definitions_root(self, flow: FunctionFlow, definitions: list, depth: int) -> Root | None:
        roots = [self._definition_root(flow, definition, depth) for definition in definitions]
        if not roots or None in roots or not all(_equal(roots[0], other) for other in roots[1:]):
            return None  # reassigned on several paths: the read itself is the root
        return roots[0]

    def _definition_root(self, flow: FunctionFlow, definition, depth: int) -> Root | None:
        if definition.kind == "param":
            return definition  # a parameter is its own root
        if definition.kind in ("aug", "inplace") and UNDEFINED not in definition.previous and depth <= MAX_DEPTH:
            # `s += m`, `s.masked_fill_(...)`: an in-place update never changes a tensor's dtype
            return self._definitions_root(flow, [flow.definitions[i] for i in sorted(definition.previous)], depth + 1)
        if definition.kind != "assign":
            return None
        value = definition.value
        if definition.index is None:
            return self.root(value, depth + 1)
        if isinstance(value, (cst.Tuple, cst.List)):  # `q, k, v = a, b, c`
            elements = value.elements
            if any(isinstance(e, cst.StarredElement) for e in elements) or definition.index >= len(elements):
                return None
            return self.root(elements[definition.index].value, depth + 1)
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "map" \
                and len(value.args) == 2 and isinstance(value.args[0].value, cst.Lambda):
            return self._map_root(value.args[0].value, value.args[1].value, definition.index, depth)
        if self._is_tensor(value, depth):  # unpacking a tensor, or a chunk/split/unbind of one
            return self.root(value, depth + 1)
        return None

    def _map_root(self, function: cst.Lambda, items: cst.BaseExpression, index: int, depth: int) -> Root | None:
        """`q, k, v = map(lambda t: rearrange(t, ...), (q, k, v))`: the lambda keeps its argument's dtype."""
        params = function.params.params
        if len(params) != 1:
            return None
        if isinstance(items, (cst.Tuple, cst.List)):
            if index >= len(items.elements) or any(isinstance(e, cst.StarredElement) for e in items.elements):
                return None
            item = items.elements[index].value
        elif self._is_tensor(items, depth):
            item = items  # the items of a tensor, or of a chunk/split of one, share its dtype
        else:
            return None
        body = function.body
        while True:
            op = self.reader.read(body)
            inner = _layout_receiver(body) if op is None else None
            if inner is None and isinstance(body, cst.Call) and self.parsed.imported_name(body.func) in EINOPS:
                inner = body.args[0].value
            if inner is None:
                break
            body = inner
        if isinstance(body, cst.Name) and body.value == params[0].name.value:
            return self.root(item, depth + 1)
        return None

    def _is_tensor(self, node: cst.BaseExpression, depth: int) -> bool:
        """A tensor, or a tuple of slices of one tensor (never a tuple of unrelated tensors)."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, cst.Name):
            flow = self.flow_for(node)
            ids = flow.reaching.get(node)
            return bool(ids) and UNDEFINED not in ids and all(
                flow.definitions[i].kind == "assign" and flow.definitions[i].index is None
                and self._is_tensor(flow.definitions[i].value, depth + 1) for i in ids)
        op = self.reader.read(node)
        if op is not None:  # not `+`: it also joins tuples
            return op.name in TENSOR_OPS
        return isinstance(node, cst.Call) and (_layout_receiver(node) is not None or self._is_linear_call(node)
                                               or self.parsed.imported_name(node.func) in EINOPS)

    def _op_root(self, op, depth: int) -> Root | None:
        name = op.name
        if name in ("matmul", "bmm", "baddbmm", "einsum"):  # raise on mixed dtypes: the operands' shared dtype
            return self.root(op.operands[0], depth + 1)
        if name in ("transpose", "permute", "mT", "identity", "dropout", "view", "masked_fill"):
            return self.root(op.operands[0], depth + 1)
        if name == "softmax":
            return self._softmax_root(op, depth)
        if name == "sequential":
            return self.root(op.operands[0], depth + 1)
        if name == "cast":
            return self._cast_root(op, depth)
        if name in ("mul", "div", "add", "sub"):
            left, right = op.operands
            if name in ("add", "sub") and any(right is addend for addend in self._kept_addends):
                return self.root(left, depth + 1)
            if name == "add" and any(left is addend for addend in self._kept_addends):
                return self.root(right, depth + 1)
            if self.is_scalar(right):
                return self.root(left, depth + 1)
            if self.is_scalar(left):
                return self.root(right, depth + 1)
            return self._common(left, right, depth)
        if name == "where":
            return self._common(*op.operands, depth)
        return None

    def _softmax_root(self, op, depth: int) -> Root | None:
        dtype = op.params.get("dtype")
        if dtype is None:
            return self.root(op.operands[0], depth + 1)
        return self._dtype_argument(dtype, depth)

    def _cast_root(self, op, depth: int) -> Root | None:
        method, call = op.params["method"], op.node
        if method in CONCRETE:
            return CONCRETE[method]
        args = [a for a in call.args if a.keyword is None]
        keyword = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if method == "type_as" and len(args) == 1:
            return self.root(args[0].value, depth + 1)
        target = keyword if keyword is not None else (args[0].value if len(args) == 1 else None)
        return self._dtype_argument(target, depth) if target is not None else None

    def _dtype_argument(self, node: cst.BaseExpression, depth: int) -> Root | None:
        """`x.dtype` has x's root; `torch.float32` is itself."""
        if isinstance(node, cst.Attribute) and node.attr.value == "dtype":
            return self.root(node.value, depth + 1)
        if isinstance(node, cst.Name) and depth <= MAX_DEPTH:  # `dtype = query.dtype`
            flow = self.flow_for(node)
            ids = flow.reaching.get(node) or {UNDEFINED}
            if UNDEFINED not in ids and len(ids) == 1:
                definition = flow.definitions[next(iter(ids))]
                if definition.kind == "assign" and definition.index is None:
                    return self._dtype_argument(definition.value, depth + 1)
        return self._dtype_name(node)

    def _dtype_name(self, node: cst.BaseExpression) -> str | None:
        if not isinstance(node, cst.Attribute):
            return None
        dotted = self.parsed.imported_name(node)
        return CANONICAL.get(dotted, dotted) if dotted in DTYPE_NAMES else None

    def _common(self, left: cst.BaseExpression, right: cst.BaseExpression, depth: int) -> Root | None:
        """Two tensors combined: their dtype when both provably have the same one (no promotion)."""
        first, second = self.root(left, depth + 1), self.root(right, depth + 1)
        return first if _equal(first, second) else None

    def _call_root(self, call: cst.Call, depth: int) -> Root | None:
        receiver = _layout_receiver(call)
        if receiver is not None:
            return self.root(receiver, depth + 1)
        dotted = self.parsed.imported_name(call.func) or ""
        if (dotted in EINOPS or dotted in SAME_DTYPE_FUNCTIONS) and call.args:
            return self.root(call.args[0].value, depth + 1)
        if dotted in CREATIONS or dotted in LIKE_CREATIONS:  # `dtype=` names it; a `_like` without one keeps x's
            dtype = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "dtype"), None)
            if dtype is not None:
                return self._dtype_argument(dtype, depth)
            return self.root(call.args[0].value, depth + 1) if dotted in LIKE_CREATIONS and call.args else None
        if self._is_linear_call(call):  # F.linear raises unless input and weight share a dtype
            self._through_float_layer = True
            return self.root(call.args[0].value, depth + 1)
        entered = self.helper(call)
        if entered is None:
            return None
        returned, function, bound = entered
        outer = self._bound.get(function)
        self._bound[function] = bound
        try:
            return self.root(returned, depth + 1)
        finally:
            if outer is None:
                del self._bound[function]
            else:
                self._bound[function] = outer

    def _bound_root(self, function: cst.FunctionDef, name: str, depth: int) -> Root:
        """A helper's parameter is the argument of the call being followed, read where the call is."""
        bound = self._bound.pop(function)
        try:
            return self.root(bound[name], depth + 1)
        finally:
            self._bound[function] = bound

    def _is_linear_call(self, call: cst.Call) -> bool:
        return layer_class(self.parsed, self.owner, call) == "torch.nn.Linear"


def layer_class(parsed: ParsedModule, owner: ClassInfo | None, call: cst.Call) -> str | None:
    """The torch.nn class of `self.layer(x)`, where the class builds `self.layer` once as one."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
            and owner is not None and len(call.args) == 1 and call.args[0].keyword is None):
        return None
    built = owner.only_value(func.attr.value)
    return parsed.imported_name(built.func) if isinstance(built, cst.Call) else None


def _layout_receiver(node: cst.BaseExpression) -> cst.BaseExpression | None:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            node.func.attr.value in LAYOUT_METHODS:
        return node.func.value
    return None


def _equal(first: Root, second: Root) -> bool:
    return first is second or (isinstance(first, str) and first == second)
