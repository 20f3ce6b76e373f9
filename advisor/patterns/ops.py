"""Normalise the many spellings of one tensor operation into one `Op`.

`a @ b`, `torch.matmul(a, b)`, `a.matmul(b)`; `F.softmax(x, -1)`, `x.softmax(dim=-1)`, `self.attend(x)`
with `self.attend = nn.Softmax(dim=-1)`; `x.masked_fill_(m, v)` and `torch.masked_fill(x, m, v)`... The
attention matcher reasons about roles, so it only ever sees the canonical names below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from advisor.static.module_index import ClassInfo, ParsedModule

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
                return self._module_call(call.func.attr.value, call)
            return self._method(call.func.attr.value, receiver, call)
        return None

    def _function(self, dotted: str, call: cst.Call) -> Op | None:
        short = dotted.rsplit(".", 1)[-1]
        family = dotted.rsplit(".", 1)[0]
        args = _positional(call)
        if family == "einops" and short == "einsum":
            if len(args) != 3 or not isinstance(args[-1], (cst.SimpleString, cst.ConcatenatedString)):
                return None
            return Op("einsum", call, args[:-1], {"spec": args[-1].evaluated_value, "einops": True})
        if family not in ("torch", "torch.nn.functional", "torch.functional"):
            return None
        if short == "einsum":
            return self._einsum(call, args)
        if short in ("matmul", "bmm") and len(args) == 2:
            return Op(short, call, args)
        if short == "baddbmm" and len(args) == 3:
            return Op("baddbmm", call, args[1:], {"input": args[0], "beta": _arg(call, 3, "beta"),
                                                  "alpha": _arg(call, 4, "alpha")})
        if short == "softmax" and args:
            return Op("softmax", call, [args[0]], {"dim": _arg(call, 1, "dim"), "dtype": _arg(call, 3, "dtype")
                                                   if family == "torch.nn.functional" else _arg(call, 2, "dtype")})
        if short == "dropout" and args:
            training_kw = "training" if family == "torch.nn.functional" else "train"
            return Op("dropout", call, [args[0]], {"p": _arg(call, 1, "p"), "training": _arg(call, 2, training_kw),
                                                   "default_training": family == "torch.nn.functional"})
        if short == "masked_fill" and len(args) == 3:
            return Op("masked_fill", call, [args[0]], {"mask": args[1], "fill": args[2]})
        if short == "where" and len(args) == 3:
            return Op("where", call, [args[1], args[2]], {"condition": args[0]})
        if short in ("add", "mul", "div") and len(args) == 2 and len(call.args) == 2:
            return Op(short, call, args)
        if short == "transpose" and len(args) == 3:
            return Op("transpose", call, [args[0]], {"dims": args[1:]})
        if short == "permute" and len(args) == 2:
            return Op("permute", call, [args[0]], {"dims": _tuple_items(args[1])})
        return None

    def _einsum(self, call: cst.Call, args: list[cst.BaseExpression]) -> Op | None:
        if not args or not isinstance(args[0], (cst.SimpleString, cst.ConcatenatedString)):
            return None
        operands = args[1:]
        if len(operands) == 1 and isinstance(operands[0], (cst.List, cst.Tuple)):
            operands = [el.value for el in operands[0].elements]
        if len(operands) != 2:
            return None
        return Op("einsum", call, operands, {"spec": args[0].evaluated_value, "einops": False})

    def _method(self, method: str, receiver: cst.BaseExpression, call: cst.Call) -> Op | None:
        args = _positional(call)
        inplace = method.endswith("_") and not method.startswith("_")
        base = method[:-1] if inplace else method
        if base in ("matmul", "bmm") and len(args) == 1 and not inplace:
            return Op(base, call, [receiver, args[0]])
        if base == "baddbmm" and len(args) == 2:
            return Op("baddbmm", call, args, {"input": receiver, "beta": _arg(call, 2, "beta"),
                                              "alpha": _arg(call, 3, "alpha")}, inplace)
        if base == "softmax" and not inplace:
            return Op("softmax", call, [receiver], {"dim": _arg(call, 0, "dim"), "dtype": _arg(call, 1, "dtype")})
        if base == "masked_fill" and len(args) == 2:
            return Op("masked_fill", call, [receiver], {"mask": args[0], "fill": args[1]}, inplace)
        if base == "where" and len(args) == 2 and not inplace:
            return Op("where", call, [receiver, args[1]], {"condition": args[0]})
        if base in ("add", "mul", "div") and len(args) == 1 and len(call.args) == 1:
            return Op(base, call, [receiver, args[0]], inplace=inplace)
        if base in ("view", "reshape") and args and len(args) == len(call.args) and not inplace:
            return Op("view", call, [receiver], {"shape": args})
        if base in CAST_METHODS and not inplace:
            return Op("cast", call, [receiver], {"method": base})
        if base in IDENTITY_METHODS and not inplace and not call.args:
            return Op("identity", call, [receiver])
        if base == "transpose" and len(args) == 2 and not inplace:
            return Op("transpose", call, [receiver], {"dims": args})
        if base == "permute" and not inplace:
            dims = _tuple_items(args[0]) if len(args) == 1 else args
            return Op("permute", call, [receiver], {"dims": dims})
        return None

    def _module_call(self, attribute: str, call: cst.Call) -> Op | None:
        """`self.attend(x)`: what `self.attend` was built as in the class decides the op."""
        args = _positional(call)
        if len(args) != 1 or len(call.args) != 1:
            return None
        built = self.owner.only_value(attribute)
        if built is None:
            return None
        prefix = f"self.{attribute}"
        return self._module_op(built, prefix, call, args[0])

    def _module_op(self, built, prefix: str, call, operand) -> Op | None:
        if not isinstance(built, cst.Call):
            return None
        dotted = self.parsed.imported_name(built.func) or ""
        if dotted in ("torch.nn.Softmax", "torch.nn.modules.activation.Softmax"):
            return Op("softmax", call, [operand], {"dim": _arg(built, 0, "dim"), "dtype": None})
        if dotted in ("torch.nn.Dropout", "torch.nn.modules.dropout.Dropout"):
            return Op("dropout", call, [operand], {"p": cst.parse_expression(f"{prefix}.p"),
                                                   "training": cst.parse_expression(f"{prefix}.training"),
                                                   "module": True})
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
