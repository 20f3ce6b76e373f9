"""Normalise the many spellings of one tensor operation into one `Op`.

`a @ b`, `torch.matmul(a, b)`, `a.matmul(b)`; `F.softmax(x, -1)`, `x.softmax(dim=-1)`, `self.attend(x)`
with `self.attend = nn.Softmax(dim=-1)`; `x.masked_fill_(m, v)` and `torch.masked_fill(x, m, v)`... The
attention matcher reasons about roles, so it only ever sees the canonical names below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from advisor.patterns.signatures import bind, signature_of
from advisor.patterns.mask_helpers import optional_add
from advisor.static.package_functions import decorators_keep, package_definition, package_function
from advisor.patterns.softmax_helpers import summarise
from advisor.static.dataflow import contains_call
from advisor.static.inplace_args import inplace_argument
from advisor.static.module_index import ClassInfo, ParsedModule
from advisor.static.walk import children

# methods that read only the shape of their argument: `x.expand_as(s)` is a view of x, never of s, and has its rank
SHAPE_ONLY_ARGUMENT = frozenset({"reshape_as", "view_as", "expand_as"})

CAST_METHODS = {"float", "half", "bfloat16", "double", "to", "type", "type_as"}
IDENTITY_METHODS = {"contiguous", "clone"}


@dataclass(eq=False)
class Op:
    """One tensor operation: `name` is canonical, `operands` the tensors in canonical order."""

    name: str  # matmul bmm baddbmm einsum softmax dropout masked_fill where add sub mul div cast identity
    #            transpose permute mT sequential
    node: cst.CSTNode
    operands: list[cst.BaseExpression]
    params: dict[str, object] = field(default_factory=dict)
    inplace: bool = False


def _arg(call: cst.Call, position: int, keyword: str | None = None) -> cst.BaseExpression | None:
    """The argument given at `position` (counting positional arguments only) or as `keyword=`."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if keyword is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == keyword:
                return a.value
    return positional[position].value if position < len(positional) else None


def _axes_permutation(pattern: str | None) -> list[int] | None:
    """An einops pattern that only reorders named axes (`'b i j -> b j i'`) as permute's dims; None for any
    pattern that groups, splits, adds or drops an axis."""
    if pattern is None or pattern.count("->") != 1:
        return None
    left, right = (side.split() for side in pattern.split("->"))
    if not all(axis.isidentifier() for axis in left + right) or sorted(left) != sorted(right) or \
            len(set(left)) != len(left):
        return None
    return [left.index(axis) for axis in right]


def _positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if a.keyword is None and not a.star]


def _has_star(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


class OpReader:
    """Reads `Op`s from expressions of one module, resolving imports and `self.<module>` attributes."""

    def __init__(self, parsed: ParsedModule, owner: ClassInfo | None) -> None:
        self.parsed = parsed
        self.owner = owner

    def read(self, node: cst.CSTNode) -> Op | None:
        if isinstance(node, cst.BinaryOperation):
            return self._binary(node)
        if isinstance(node, cst.Attribute) and node.attr.value == "mT":
            return Op("mT", node, [node.value])
        if isinstance(node, cst.Call) and not _has_star(node):
            return self._call(node)
        return None

    def _binary(self, node: cst.BinaryOperation) -> Op | None:
        names = {cst.MatrixMultiply: "matmul", cst.Add: "add", cst.Subtract: "sub", cst.Multiply: "mul",
                 cst.Divide: "div"}
        name = names.get(type(node.operator))
        return Op(name, node, [node.left, node.right]) if name else None

    def _call(self, call: cst.Call) -> Op | None:
        dotted = self.parsed.imported_name(call.func) if _is_dotted(call.func) else None
        if dotted is not None:
            return self._function(dotted, call)
        if isinstance(call.func, cst.Attribute):
            receiver = call.func.value
            if (isinstance(receiver, cst.Name) and receiver.value == "self" and self.owner is not None):
                attribute = call.func.attr.value
                op = self._module_call(attribute, call)
                helper = self.owner.methods.get(attribute) \
                    if self.owner.method_shadowed(attribute, outside=False) is None else None
                if helper is not None and not decorators_keep(self.parsed, helper):
                    helper = None  # a wrapper computes the result, or `staticmethod` binds no `self`
                return op if op is not None or helper is None else self._read_helper(self.parsed, helper, call, True)
            return self._method(call.func.attr.value, receiver, call)
        if isinstance(call.func, cst.Call):
            return self._inline_module_call(call.func, call)
        if isinstance(call.func, cst.Name) and call.func.value in self.parsed.plain_functions \
                and call.func.value not in self.parsed.bound_names:  # not rebound (`f = torch.compile(f)`)
            return self._read_helper(self.parsed, self.parsed.plain_functions[call.func.value], call, False)
        return None

    def _helper_op(self, helper: cst.FunctionDef, call: cst.Call, through_self: bool,
                   owner: ClassInfo | None = None) -> Op | None:
        """`stable_softmax(s, -1)` where the helper's whole body (after a docstring) is `return F.softmax(x, dim,
        dtype=...)`, or a module's `forward` that is `return torch.matmul(a, b)` (SqueezeBERT's MatMulWrapper): the
        op of the caller's arguments. Its params are read with the call's arguments for the helper's parameters;
        any other use of a parameter (or a decorator) leaves the call unread."""
        returned = _only_return(helper)
        kind = _helper_kind(helper)
        if returned is None or kind is None or (kind == "static" and not through_self):
            return None
        bound = bound_parameters(helper, call, skip_first=through_self and kind == "instance")
        if bound is None:
            return None
        inner = OpReader(self.parsed, owner or (self.owner if through_self else None)).read(returned)
        if inner is None or inner.name not in HELPER_OPS:
            return None
        operands = [_as_argument(operand, bound) for operand in inner.operands]
        params = {key: _as_argument(value, bound) if isinstance(value, cst.CSTNode) else value
                  for key, value in inner.params.items()}
        if None in operands or any(value is None and inner.params[key] is not None for key, value in params.items()):
            return None
        return Op(inner.name, call, operands, params)

    def _read_helper(self, home: ParsedModule, helper: cst.FunctionDef, call: cst.Call,
                     through_self: bool) -> Op | None:
        """A helper of this file read as its one op, else (here or in another file of the package) a helper whose
        every return is the softmax of one parameter (`softmax_helpers`)."""
        op = self._helper_op(helper, call, through_self) if home is self.parsed else None
        if op is not None:
            return op
        added = optional_add(home, helper) if not through_self else None
        if added is not None:
            return _optional_add_op(helper, call, *added)
        kind = _helper_kind(helper)
        summary = summarise(home, helper, OpReader(home, None)) if kind == "instance" or \
            (kind == "static" and through_self) else None
        bound = bound_parameters(helper, call, skip_first=through_self and kind == "instance") if summary else None
        if bound is None or summary.param not in bound:
            return None
        dim = bound.get(summary.dim.value) if isinstance(summary.dim, cst.Name) else summary.dim
        torch = self.parsed.module_aliases.get("torch")
        if summary.dtype is not None and torch is None:
            return None  # the dtype cannot be named in this file
        dtype = cst.parse_expression(f"{torch}.{summary.dtype}") if summary.dtype is not None else None
        return Op("softmax", call, [bound[summary.param]], {"dim": dim, "dtype": dtype})

    def _package_helper(self, module: str, name: str, call: cst.Call) -> Op | None:
        """`utils.softmax(w, dim=-1, onnx_trace=...)` with `utils` a module of this file's package."""
        home = self.parsed.package_module(module)
        found = package_function(home, name) if home is not None else None
        return self._read_helper(*found, call, False) if found is not None else None

    def _module_forward(self, built: cst.Call, call: cst.Call) -> Op | None:
        """`self.matmul_qk(q, k)` with `self.matmul_qk = MatMulWrapper()`, a plain `nn.Module` subclass of this
        file (no `__call__` of its own): its `forward` read as a helper; or a bias module of the package whose
        forward adds a term to the scores (`_bias_forward`)."""
        if not isinstance(built.func, cst.Name):
            return None
        found = _module_class(self.parsed, built.func.value)
        if found is None:
            return None
        home, module_class = found
        forward = module_class.methods["forward"]
        op = self._helper_op(forward, call, True, module_class) if home is self.parsed and not _has_star(built) \
            else None
        return op or _bias_forward([(BiasModule(home, module_class, built.func.value), forward)], call)

    def _chosen_bias_module(self, built: cst.BaseExpression | None, call: cst.Call) -> Op | None:
        """`self.rel_pos(attn)` with `self.rel_pos = rel_pos_cls(heads) if rel_pos_cls else None`: the class is the
        caller's, so the call is read as a bias module's add only where every bias module class this file names
        (defines or imports from its package) adds the same term (`self.get_bias()`); the patch runs for exactly
        those classes (`attention.module_guard`), the original for any other."""
        if isinstance(built, cst.IfExp) and _is_none(built.orelse):
            built = built.body
        init = self.owner.methods.get("__init__") if self.owner is not None else None
        if not isinstance(built, cst.Call) or not isinstance(built.func, cst.Name) or init is None or \
                built.func.value not in {p.name.value for p in init.params.params + init.params.kwonly_params}:
            return None
        modules = [(BiasModule(home, module_class, name), module_class.methods["forward"])
                   for name, (home, module_class) in _module_classes(self.parsed).items()]
        return _bias_forward(modules, call) if modules else None

    def _function(self, dotted: str, call: cst.Call) -> Op | None:
        short = dotted.rsplit(".", 1)[-1]
        family = dotted.rsplit(".", 1)[0]
        args = _positional(call)
        if family == "einops" and short == "einsum":
            if len(args) != 3 or not _is_string(args[-1]):
                return None
            return Op("einsum", call, args[:-1], {"spec": literal_string(args[-1]), "spec_node": args[-1],
                                                  "einops": True})
        if family == "einops" and short == "rearrange" and len(args) == 2 and len(call.args) == 2 and \
                _is_string(args[1]):
            order = _axes_permutation(literal_string(args[1]))
            return Op("permute", call, [args[0]], {"dims": [cst.Integer(str(i)) for i in order]}) if order else None
        if family not in ("torch", "torch.nn.functional", "torch.functional"):
            return self._package_helper(family, short, call)
        if short == "einsum":
            return self._einsum(call, args)
        if short == "exp" and len(args) == 1 and len(call.args) == 1:
            return _exp_of_log_softmax(call, self.read(args[0]))
        if short == "dropout":
            bound = _bound(family, short, call)
            training = "training" if family == "torch.nn.functional" else "train"
            return None if bound is None or "input" not in bound else \
                Op("dropout", call, [bound["input"]], {"p": bound.get("p"), "training": bound.get(training),
                                                       "default_training": family == "torch.nn.functional"},
                   inplace=inplace_argument(self.parsed, call))
        return _op_of(short, call, _bound(family, short, call))

    def _einsum(self, call: cst.Call, args: list[cst.BaseExpression]) -> Op | None:
        if not args or not _is_string(args[0]):
            return None
        operands = args[1:]
        if len(operands) == 1 and isinstance(operands[0], (cst.List, cst.Tuple)):
            operands = [el.value for el in operands[0].elements]
        if len(operands) != 2:
            return None
        return Op("einsum", call, operands, {"spec": literal_string(args[0]), "spec_node": args[0], "einops": False})

    def _method(self, method: str, receiver: cst.BaseExpression, call: cst.Call) -> Op | None:
        args = _positional(call)
        inplace = method.endswith("_") and not method.startswith("_")
        base = method[:-1] if inplace else method
        if base == "exp" and not call.args and not inplace:
            return _exp_of_log_softmax(call, self.read(receiver))
        if base in BOUND_OPS and base not in FUNCTION_ONLY and (not inplace or base in INPLACE_OPS):
            op = _op_of(base, call, _bound("torch", base, call, receiver))
            if op is not None:
                op.inplace = inplace
                return op
        if base in ("view", "reshape") and args and len(args) == len(call.args) and not inplace:
            return Op("view", call, [receiver], {"shape": args})
        if base in CAST_METHODS and not inplace:
            return Op("cast", call, [receiver], {"method": base})
        if base in IDENTITY_METHODS and not inplace and not call.args:
            return Op("identity", call, [receiver])
        if base == "permute" and not inplace:
            dims = _tuple_items(args[0]) if len(args) == 1 else args
            return Op("permute", call, [receiver], {"dims": dims})
        return None

    def _module_call(self, attribute: str, call: cst.Call) -> Op | None:
        """`self.attend(x)`: what `self.attend` was built as in the class decides the op (a rewrite that deletes
        the call must still prove nothing rebinds it: attention.block_checks)."""
        built = self.owner.class_value(attribute)
        if isinstance(built, (cst.Name, cst.Attribute)) and self.parsed.imported_name(built) is not None:
            return self._function(self.parsed.imported_name(built), call)  # `self.matmul = torch.matmul`
        if isinstance(built, cst.Call) and self.parsed.imported_name(built.func) == "functools.partial":
            return self._partial_call(built, call)
        if isinstance(built, cst.Call):
            op = self._module_forward(built, call)
            if op is not None:
                return op
        op = self._chosen_bias_module(built, call)
        if op is not None:
            return op
        args = _positional(call)
        if len(args) != 1 or len(call.args) != 1 or built is None:
            return None
        prefix = f"self.{attribute}"
        return self._module_op(built, prefix, call, args[0])

    def _inline_module_call(self, built: cst.Call, call: cst.Call) -> Op | None:
        """`nn.Softmax(dim=-1)(x)`: a module built and called in one expression (BLIP, ALBEF). Only modules whose
        result does not depend on their state: an inline `nn.Dropout(p)(x)` is always in training mode."""
        args = _positional(call)
        if len(args) != 1 or len(call.args) != 1 or _has_star(built) or not _is_dotted(built.func):
            return None
        if self.parsed.imported_name(built.func) in ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax"):
            return self._module_op(built, "", call, args[0])
        return None

    def _partial_call(self, built: cst.Call, call: cst.Call) -> Op | None:
        """`self.attn_fn(s)` with `self.attn_fn = partial(F.softmax, dim=-1)`: the function called with the
        partial's arguments first (a keyword of the call overrides the partial's)."""
        if not built.args or built.args[0].keyword is not None or _has_star(built) or _has_star(call):
            return None
        bound, given = list(built.args[1:]), list(call.args)
        positional = [a for a in bound + given if a.keyword is None]
        keywords = [a for a in given + bound if a.keyword is not None]
        op = self.read(cst.Call(func=built.args[0].value, args=positional + keywords))
        if op is None or op.name not in ("softmax", "log_softmax"):
            return None
        return Op(op.name, call, op.operands, op.params)

    def _module_op(self, built, prefix: str, call, operand) -> Op | None:
        if isinstance(built, cst.IfExp):
            return self._conditional_module_op(built, prefix, call, operand)
        if not isinstance(built, cst.Call):
            return None
        dotted = self.parsed.imported_name(built.func) or ""
        if dotted in ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax"):
            return Op("softmax", call, [operand], {"dim": _arg(built, 0, "dim"), "dtype": None})
        if dotted in ("torch.nn.Dropout", "torch.nn.modules.dropout.Dropout"):
            return Op("dropout", call, [operand], {"p": cst.parse_expression(f"{prefix}.p"),
                                                   "training": cst.parse_expression(f"{prefix}.training"),
                                                   "module": True}, inplace=inplace_argument(self.parsed, built))
        if dotted in ("torch.nn.Identity",):
            return Op("identity", call, [operand])
        if dotted == "torch.nn.Sequential":
            stages = []
            for position, element in enumerate(_positional(built)):
                stage = self._module_op(element, f"{prefix}[{position}]", call, operand)
                if stage is None:
                    return None
                stages.append(stage)
            return Op("sequential", call, [operand], {"stages": stages})
        return None


    def _conditional_module_op(self, built: cst.IfExp, prefix: str, call, operand) -> Op | None:
        """`nn.Dropout(p) if p else nn.Identity()`: an identity where both sides are one; a dropout where either
        side is one and the other an identity (its `p` then read with a default: `maybe_identity`)."""
        sides = [self._module_op(side, prefix, call, operand) for side in (built.body, built.orelse)]
        names = {side.name if side is not None else None for side in sides}
        if names == {"identity"}:
            return Op("identity", call, [operand])
        if not names <= {"dropout", "identity"}:
            return None
        dropout = next(side for side in sides if side.name == "dropout")
        return Op("dropout", call, [operand], {**dropout.params, "maybe_identity": "identity" in names},
                  inplace=dropout.inplace)


BOUND_OPS = {"matmul", "bmm", "baddbmm", "softmax", "log_softmax", "masked_fill", "where", "add", "mul", "div",
             "transpose", "permute", "tanh"}
FUNCTION_ONLY = {"permute"}  # the method takes its dims as varargs (`x.permute(0, 2, 1)`): read by `_method`
INPLACE_OPS = {"baddbmm", "masked_fill", "add", "mul", "div"}  # whose `_` method is read as the same op in place
_PRODUCT_OPERAND = {"matmul": "other", "bmm": "mat2"}


def _bound(family: str, name: str, call: cst.Call,
           receiver: cst.BaseExpression | None = None) -> dict[str, cst.BaseExpression] | None:
    signature = signature_of(family, name)
    return None if signature is None else bind(call, signature, receiver)


def _op_of(name: str, call: cst.Call, a: dict[str, cst.BaseExpression] | None) -> Op | None:
    """The op of a call of `torch.<name>` (or its Tensor method) whose arguments are bound by parameter name."""
    if a is None or name not in BOUND_OPS or "input" not in a:
        return None
    if name in _PRODUCT_OPERAND and _PRODUCT_OPERAND[name] in a:
        return Op(name, call, [a["input"], a[_PRODUCT_OPERAND[name]]])
    if name == "baddbmm" and "batch1" in a and "batch2" in a:
        return Op("baddbmm", call, [a["batch1"], a["batch2"]], {"input": a["input"], "beta": a.get("beta"),
                                                               "alpha": a.get("alpha")})
    if name in ("softmax", "log_softmax"):
        return Op(name, call, [a["input"]], {"dim": a.get("dim"), "dtype": a.get("dtype")})
    if name == "masked_fill" and "mask" in a and "value" in a:
        return Op("masked_fill", call, [a["input"]], {"mask": a["mask"], "fill": a["value"]})
    if name == "where" and "condition" in a and "other" in a:
        return Op("where", call, [a["input"], a["other"]], {"condition": a["condition"]})
    if name in ("add", "mul", "div") and set(a) == {"input", "other"}:
        return Op(name, call, [a["input"], a["other"]])
    if name == "tanh" and set(a) == {"input"}:
        return Op("tanh", call, [a["input"]])
    if name == "transpose" and "dim0" in a and "dim1" in a:
        return Op("transpose", call, [a["input"]], {"dims": [a["dim0"], a["dim1"]]})
    if name == "permute" and "dims" in a:
        return Op("permute", call, [a["input"]], {"dims": _tuple_items(a["dims"])})
    return None


def _is_string(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


def literal_string(node: cst.BaseExpression) -> str | None:
    """The value of a string literal, including an f-string without placeholders and an implicit
    concatenation of such; None when any part is computed (`f'{h}id'`)."""
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value if isinstance(node.evaluated_value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = literal_string(node.left), literal_string(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, cst.FormattedString) and all(isinstance(p, cst.FormattedStringText) for p in node.parts):
        text = "".join(p.value for p in node.parts).replace("{{", "{").replace("}}", "}")
        prefix = node.prefix.lower().replace("f", "")
        if "b" in prefix:
            return None
        quote = node.start[len(node.prefix):]
        value = cst.SimpleString(f"{prefix}{quote}{text}{node.end}").evaluated_value
        return value if isinstance(value, str) else None
    return None


def _exp_of_log_softmax(call: cst.Call, inner: Op | None) -> Op | None:
    """`log_softmax(x, dim).exp()` is the softmax of x (the same values up to rounding)."""
    if inner is None or inner.name != "log_softmax":
        return None
    return Op("softmax", call, inner.operands, inner.params)


HELPER_OPS = {"softmax", "matmul", "bmm", "einsum"}  # ops a one-line helper is read as (an einsum's literal spec
# reads no parameter)


def _only_return(function: cst.FunctionDef) -> cst.BaseExpression | None:
    """The value of a function whose whole body, after an optional docstring, is one `return <value>`."""
    body = list(function.body.body)
    if len(body) == 2 and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 and \
            isinstance(body[0].body[0], cst.Expr) and isinstance(body[0].body[0].value, cst.SimpleString):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1 \
            or not isinstance(body[0].body[0], cst.Return):
        return None
    return body[0].body[0].value


def _helper_kind(function: cst.FunctionDef) -> str | None:
    """'static' or 'instance' for a helper without other decorators (which could change what it computes)."""
    names = [d.decorator.value if isinstance(d.decorator, cst.Name) else None for d in function.decorators]
    if not names:
        return "instance"
    return "static" if names == ["staticmethod"] else None


@dataclass(frozen=True)
class BiasModule:
    """The class a bias module's term is read in: its file, its class, and the name it is built by in the caller's
    file (the class is what the constructor's arguments never change)."""

    home: ParsedModule
    owner: ClassInfo
    built_as: str


def _module_class(parsed: ParsedModule, name: str) -> tuple[ParsedModule, ClassInfo] | None:
    """(its file, the class) for a plain `nn.Module` subclass `name` names in `parsed` (defined there or imported from
    the package): one base, a `forward`, no `__call__` of its own."""
    found = package_definition(parsed, name, lambda module: module.top_level_classes)
    if found is None:
        return None
    home, module_class = found
    if "__call__" in module_class.methods or "forward" not in module_class.methods:
        return None
    bases = module_class.node.bases
    return found if len(bases) == 1 and home.imported_name(bases[0].value) == "torch.nn.Module" else None


def _module_classes(parsed: ParsedModule) -> dict[str, tuple[ParsedModule, ClassInfo]]:
    """The plain module classes the file defines, or imports by name and passes to a call (`partial(RelPosBias,
    ...)`, `Block(rel_pos_cls=RelPosMlp)`): a class a caller may hand to the constructor (once per file; only those
    imported names are resolved, which parses the modules defining them)."""

    def build(module: ParsedModule) -> dict[str, tuple[ParsedModule, ClassInfo]]:
        passed = {arg.value.value for call in module.calls_and_classes[0] for arg in call.args
                  if isinstance(arg.value, cst.Name)}
        names = list(module.top_level_classes) + [n for n, dotted in module.imports.items()
                                                  if "." in dotted and n in passed]
        found = {name: _module_class(module, name) for name in names}
        return {name: value for name, value in found.items() if value is not None}

    return parsed.derived(_module_classes, build)


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _bias_forward(modules: list[tuple[BiasModule, cst.FunctionDef]], call: cst.Call) -> Op | None:
    """`self.rel_pos(attn)` where the module's `forward` is `return attn + <term>` and the term reads no parameter
    but `self` (a relative-position bias module): an add of the term, read on the module (`self.rel_pos.get_bias()`),
    to the call's argument. The deleted module call gets the module-identity and no-hooks facts (block_checks); the
    op keeps each class whose forward adds that term (`module_bias`: the module, its forward, the term as the forward
    writes it, `self.get_bias()`), in which the term's rank and values are read (`attention.module_terms`). Where the
    module may be of several classes, those whose forward adds another term or is no such add are left out."""
    read = [(module, forward, _forward_term(forward, call)) for module, forward in modules]
    read = [(module, forward, found) for module, forward, found in read if found is not None]
    if not read or len({(cst.Module([]).code_for_node(on_module), id(scores), first)
                        for _, _, (_, on_module, scores, first) in read}) != 1:
        return None
    _, on_module, scores, first = read[0][2]
    operands = [scores, on_module] if first else [on_module, scores]
    return Op("add", call, operands, {"module_bias": tuple((module, forward, found[0])
                                                           for module, forward, found in read)})


def _forward_term(forward: cst.FunctionDef, call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression,
                                                                    cst.BaseExpression, bool] | None:
    """(the term as the forward writes it, the term read on the called module, the call's scores argument, whether
    the scores come first)."""
    returned = _only_return(forward)
    params = [p.name.value for p in forward.params.params]
    if _helper_kind(forward) != "instance" or len(params) < 2 or forward.asynchronous or \
            not isinstance(returned, cst.BinaryOperation) or not isinstance(returned.operator, cst.Add):
        return None
    owner, scores = params[0], params[1]
    sides = [returned.left, returned.right]
    chain = [isinstance(side, cst.Name) and side.value == scores for side in sides]
    if sum(chain) != 1:
        return None
    term = sides[chain.index(False)]
    bound = bound_parameters(forward, call, skip_first=True)
    if bound is None or scores not in bound or _reads_any(term, set(params[1:]) | {p.name.value for p in
                                                                                    forward.params.kwonly_params}):
        return None
    if any(contains_call(arg.value) for arg in call.args if arg.value is not bound[scores]):
        return None  # the deleted call would no longer evaluate an argument that may run code
    on_module = _on_module(term, owner, call.func)
    return None if on_module is None else (term, on_module, bound[scores], chain[0])


def _on_module(term: cst.BaseExpression, owner: str, module: cst.BaseExpression) -> cst.BaseExpression | None:
    """The term with the forward's `self` read as the module expression (`self.get_bias()` on `self.rel_pos`);
    None where `self` is used otherwise than as the object of an attribute."""

    class OnModule(cst.CSTTransformer):
        def __init__(self) -> None:
            self.other_use = False

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            if isinstance(node.value, cst.Name) and node.value.value == owner:
                return False  # its `attr` is a name of the module's, not a read of `self`
            return True

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            if isinstance(original.value, cst.Name) and original.value.value == owner:
                return updated.with_changes(value=module)
            return updated

        def visit_Name(self, node: cst.Name) -> None:
            if node.value == owner:
                self.other_use = True

    transformer = OnModule()
    rewritten = term.visit(transformer)
    return None if transformer.other_use else rewritten


def _optional_add_op(helper: cst.FunctionDef, call: cst.Call, scores: str, mask: str) -> Op | None:
    """`maybe_add_mask(s, m)` as an add whose mask may be None (`mask_helpers`); the scores as they are where the
    call passes no mask."""
    bound = bound_parameters(helper, call, skip_first=False)
    if bound is None or scores not in bound or mask not in bound:
        return None
    if isinstance(bound[mask], cst.Name) and bound[mask].value == "None":
        return Op("identity", call, [bound[scores]])
    return Op("add", call, [bound[scores], bound[mask]], {"optional": True})


def bound_parameters(function: cst.FunctionDef, call: cst.Call,
                     skip_first: bool) -> dict[str, cst.BaseExpression] | None:
    """The helper's parameters bound to the call's arguments and their defaults; None when they do not fit."""
    params = function.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg or params.posonly_params or _has_star(call):
        return None
    every = list(params.params[1:] if skip_first else params.params) + list(params.kwonly_params)
    positional = _positional(call)
    if len(positional) > len(params.params) - int(skip_first):
        return None
    bound = {param.name.value: value for param, value in zip(every, positional)}
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value not in {p.name.value for p in every} or arg.keyword.value in bound:
                return None
            bound[arg.keyword.value] = arg.value
    for param in every:
        if param.name.value not in bound:
            if param.default is None:
                return None
            bound[param.name.value] = param.default
    return bound


def _as_argument(node: cst.BaseExpression | None, bound: dict[str, cst.BaseExpression]) -> cst.BaseExpression | None:
    """A helper's expression as the caller sees it: a parameter is its argument; an expression that reads no
    parameter is itself (module-level names only, since the helper's body is one `return`); None otherwise."""
    if node is None:
        return None
    if isinstance(node, cst.Name) and node.value in bound:
        return bound[node.value]
    return None if _reads_any(node, set(bound)) else node


def _reads_any(node: cst.CSTNode, names: set[str]) -> bool:
    if isinstance(node, cst.Name):
        return node.value in names
    if isinstance(node, cst.Attribute):
        return _reads_any(node.value, names)
    return any(_reads_any(child, names) for child in children(node))


def _is_dotted(node: cst.BaseExpression) -> bool:
    """`torch.nn.functional.softmax` is; `F.softmax(x).to` is not (a method of a call's result)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _tuple_items(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, (cst.Tuple, cst.List)):
        return [el.value for el in node.elements]
    return [node]


def int_value(node: cst.BaseExpression | None) -> int | None:
    """The value of an integer literal, including a negative one; None for anything else."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
            and isinstance(node.expression, cst.Integer):
        return -int(node.expression.evaluated_value)
    return None


def number_value(node: cst.BaseExpression | None) -> float | None:
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.evaluated_value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        inner = number_value(node.expression)
        if inner is not None:
            return -inner if isinstance(node.operator, cst.Minus) else inner
    return None


def views_another_dtype(call: cst.Call) -> bool:
    """`t.view(torch.float64)`: a `view` that may reinterpret the tensor's bytes as another dtype (its values as
    well), since its one argument is no size (`t.view(-1)`, `t.view(b, 1, n)`, `t.view((b, n))`, `t.view(*s)`,
    `t.view(x.shape)`; a name, `t.view(shape)`, may hold a dtype too). Dtype- and value-keeping readers skip it."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "view"):
        return False
    if any(arg.keyword is not None for arg in call.args):
        return True
    if len(call.args) != 1 or call.args[0].star:
        return False
    size = call.args[0].value
    return not (int_value(size) is not None or isinstance(size, (cst.Tuple, cst.List)) or
                isinstance(size, cst.Attribute) and size.attr.value == "shape" or
                isinstance(size, cst.Call) and isinstance(size.func, cst.Attribute) and size.func.attr.value == "size")
