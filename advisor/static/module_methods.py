"""`nn.Module` methods whose result is the module itself: `Attn().eval().to(device)` is the instance `Attn()`
builds, so a name bound to it calls that class's `forward` (call sites, and what a `forward` does with a tensor
handed to it, read through such chains); so does `torch.compile` of it."""

from __future__ import annotations

import libcst as cst

SELF_RETURNING = frozenset({"eval", "train", "to", "cuda", "cpu", "float", "double", "half", "bfloat16",
                            "requires_grad_", "type"})
STATE_METHODS = SELF_RETURNING | {"zero_grad", "load_state_dict"}  # what may be called on an instance besides the
# instance itself, changing no call's arguments


MODULE_BASES = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})


def returns_itself(parsed, cls) -> bool:
    """The class (a `ClassInfo`) takes SELF_RETURNING from `nn.Module` itself: it derives from nothing else and
    defines none of them (`def eval(self): return lambda ...` does not return the module: breaker round 41)."""
    return cls is not None and not cls.node.decorators and not SELF_RETURNING & set(cls.methods) and \
        all(parsed.imported_name(base.value) in MODULE_BASES for base in cls.node.bases)


def compiled_instance(parsed, node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`model` of `torch.compile(model)` (options by keyword only): the compiled module's calls are the instance's,
    with the same arguments; None for anything else."""
    if not (isinstance(node, cst.Call) and node.args and node.args[0].keyword is None and not node.args[0].star
            and all(arg.keyword is not None for arg in node.args[1:])
            and parsed.imported_name(node.func) == "torch.compile"):
        return None
    return node.args[0].value


def without_self_returning_calls(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`Net()` for `Net().eval().to(device)`."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            node.func.attr.value in SELF_RETURNING:
        node = node.func.value
    return node


def only_called(parsed, reads: list[cst.Name]) -> bool:
    """Every read of an instance calls it (`model(x, mask)`) or drops a STATE_METHODS call's result (`model.eval()`):
    it is never handed on, stored or given another attribute."""
    return all(isinstance(parsed.parents.get(read), cst.Call) and parsed.parents[read].func is read or
               drops_state_method_result(parsed, read) for read in reads)


def drops_state_method_result(parsed, read: cst.Name) -> bool:
    """`model.eval()` as a statement: a method that changes no call's arguments (not a hook), result unread."""
    attribute = parsed.parents.get(read)
    call = parsed.parents.get(attribute)
    return isinstance(attribute, cst.Attribute) and attribute.value is read and \
        attribute.attr.value in STATE_METHODS and isinstance(call, cst.Call) and call.func is attribute and \
        isinstance(parsed.parents.get(call), cst.Expr)
