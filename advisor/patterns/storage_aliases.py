"""Which names a value may share storage with (a write through one writes the others): the aliasing the attention
block's checks read (patterns.scope: what SDPA re-reads, written between the scores and the value product) and the
reading of helpers' parameters (patterns.argument_writes)."""

from __future__ import annotations

import libcst as cst

from advisor.static.dataflow import Definition, expression_root
from advisor.static.module_index import LIBRARY_ROOTS, ParsedModule
from advisor.static.tensor_views import einsum_joins_operands
from advisor.static.walk import children, descendants

METADATA_READS = frozenset({"dtype", "device", "shape", "ndim", "layout", "size", "dim", "is_cuda"})
# tensor methods and functions whose result never shares its operands' storage (arithmetic, reductions, copies)
FRESH_TENSOR_OPS = frozenset({
    "add", "sub", "mul", "div", "matmul", "bmm", "baddbmm", "softmax", "log_softmax", "exp", "log",
    "sqrt", "rsqrt", "pow", "clone", "sum", "mean", "amax", "amin", "norm", "masked_fill", "where", "cat", "stack",
    "zeros_like", "ones_like", "full_like", "empty_like", "randn_like", "rand_like", "tril", "triu", "abs", "neg",
    "sigmoid", "tanh", "relu", "gelu", "outer", "mm", "scaled_dot_product_attention", "cumsum", "eq",
    "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "repeat", "repeat_interleave",
    "new_full", "new_zeros", "new_ones", "new_empty", "new_tensor"})


def may_alias(parsed: ParsedModule, node: cst.CSTNode) -> list[cst.Name]:
    """The names whose storage `node`'s value may share: itself for a name, the operand of an index, an attribute
    (`x.T`), a view or any method or function not known to return a new tensor, every element of a container and
    every argument of a call of anything else (`self.drop(q)` may be an identity); none for arithmetic, comparisons
    and the ops of FRESH_TENSOR_OPS. `self` is not followed (its attributes are checked apart)."""
    if isinstance(node, cst.Name):
        return [] if node.value == "self" else [node]
    if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.BooleanOperation,
                         cst.BaseNumber, cst.BaseString)):
        return []
    if isinstance(node, (cst.Subscript, cst.Attribute)):
        return may_alias(parsed, node.value)
    if isinstance(node, cst.IfExp):
        return may_alias(parsed, node.body) + may_alias(parsed, node.orelse)
    if isinstance(node, cst.Call):
        name = node.func.attr.value if isinstance(node.func, cst.Attribute) else \
            node.func.value if isinstance(node.func, cst.Name) else None
        if (name in FRESH_TENSOR_OPS or name in METADATA_READS or name in ("item", "tolist", "numel", "stride") or
                name == "einsum" and einsum_joins_operands(node)) and not _method_of_an_object(parsed, node.func):
            return []
        arguments = [alias for arg in node.args for alias in may_alias(parsed, arg.value)]
        if not isinstance(node.func, cst.Attribute) or parsed.imported_name(node.func) is not None:
            return arguments  # a function (`torch.transpose(q, 0, 1)`, a helper) may return an argument or a view
        receiver = node.func.value
        while isinstance(receiver, (cst.Attribute, cst.Subscript)):
            receiver = receiver.value
        if isinstance(receiver, cst.Name) and receiver.value == "self" or _method_of_an_object(parsed, node.func):
            return arguments  # a method or module of the object (`self.drop(q)`, `Ops.norm(q)` may be an identity)
        if name == "set_":  # `torch.empty(0).set_(k)`: the receiver now holds k's storage
            return may_alias(parsed, node.func.value) + arguments
        return may_alias(parsed, node.func.value)  # a tensor's method: a view of it, or itself
    elements = (cst.BaseElement, cst.BaseDictElement)  # a container holds references to its values
    return [alias for child in children(node) if isinstance(child, (cst.BaseExpression, *elements))
            for alias in may_alias(parsed, child.value if isinstance(child, elements) else child)]


def _method_of_an_object(parsed: ParsedModule, func: cst.BaseExpression) -> bool:
    """`Ops.norm(q)`, `cls.relu(q)`, `helpers.clone(q)`: a function reached through a class of this file or a module
    that is not a library's, named like a tensor op but free to return what it is given (breaker round 40)."""
    if not isinstance(func, cst.Attribute) or parsed.imported_name(func) is not None and \
            parsed.imported_name(func).split(".")[0] in LIBRARY_ROOTS:
        return False
    root = expression_root(func.value)
    return isinstance(root, cst.Name) and (root.value == "cls" or root.value in parsed.imports or
                                           root.value in parsed.top_level_classes)


def binding_origins(definition: Definition) -> list[cst.CSTNode]:
    """What a binding takes its value from: an assignment's value (also one stored into it, `d["k"] = q`), a loop's
    iterable, a `with` item, a `match` subject (its captures: breaker round 28), the value of a `(x := v)` in its
    statement; nothing for an import or an exception."""
    statement = definition.statement
    if definition.kind == "assign":
        return [definition.value] if definition.value is not None else []
    if definition.kind == "store" and isinstance(statement, cst.Assign):  # `d["k"] = q`: d now holds q
        return [statement.value]
    if definition.kind != "other" or statement is None:
        return []
    if isinstance(statement, cst.For):
        return [statement.iter]
    if isinstance(statement, cst.With):
        return [item.item for item in statement.items]
    if isinstance(statement, cst.Match):
        return [statement.subject]
    return [node.value for node in descendants(statement, (cst.NamedExpr,))
            if isinstance(node.target, cst.Name) and node.target.value == definition.name]
