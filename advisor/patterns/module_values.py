"""The value of a module-level tensor (`MASK = torch.randn(1, 1, L, L)`), where the file shows that every read sees
exactly what its one definition built.

Facts read from that definition (a mask's dtype, rank, values) hold at a read only when nothing else can have
changed the tensor: the name is bound once in the whole file, at module level, and never imported over, deleted,
declared `global` or reached through `globals()`/`setattr`; and every read of it, followed through the names and
parameters of this file it is handed to and the views taken of it, only computes new tensors from it (arithmetic,
comparisons, `torch.where`, `masked_fill`, ...) or reads its metadata. A read that could write it or let it escape
(an in-place method, an element write, `out=`, `.data`, `nn.Parameter(...)`, a container, a return, a call of
anything not known to leave it alone) makes the value unknown. Other modules that import the file and write the
tensor are not seen: a fact proved here assumes none does (the per-file scan cache drops it when this file changes).
A local tensor of a function (`mask = torch.zeros(...)`, read by call-site facts) is held to the same reads, except
that a function imported from another module may be passed it (the callee the facts are about is one).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.static.dataflow import UNDEFINED
from advisor.static.module_index import ParsedModule
from advisor.static.walk import walk

MAX_DEPTH = 6  # names and parameters followed from one read
METADATA = {"dtype", "shape", "device", "ndim", "is_cuda", "is_floating_point", "size", "dim", "numel"}
# methods whose result may share the receiver's memory (a view, or the receiver itself when nothing changes)
SHARING_METHODS = {"to", "float", "half", "bfloat16", "double", "type", "type_as", "bool", "long", "int", "byte",
                   "expand", "expand_as", "view", "view_as", "reshape", "reshape_as", "unsqueeze", "squeeze",
                   "transpose", "permute", "contiguous", "flatten", "unflatten", "detach", "t", "narrow", "select",
                   "T", "mT"}
# methods whose result is a new tensor (or a number), leaving the receiver alone
FRESH_METHODS = {"clone", "masked_fill", "add", "sub", "mul", "div", "neg", "exp", "eq", "ne", "lt", "le", "gt", "ge",
                 "logical_not", "logical_and", "logical_or", "sum", "mean", "amax", "amin", "max", "min", "abs",
                 "tril", "triu", "matmul", "bmm", "softmax", "isinf", "isnan", "isfinite", "all", "any",
                 "new_zeros", "new_ones", "new_full", "new_empty", "repeat", "where", "item", "tolist",
                 "is_floating_point", "size", "dim", "numel"}
# methods of another tensor that read an argument without keeping it
ARGUMENT_READING_METHODS = FRESH_METHODS | {"masked_fill_", "add_", "sub_", "mul_", "div_", "copy_", "to",
                                            "type_as", "expand_as", "view_as", "reshape_as", "masked_scatter"}
TORCH_FRESH = {f"torch.{name}" for name in (
    "where", "softmax", "log_softmax", "matmul", "bmm", "baddbmm", "tril", "triu", "masked_fill", "add", "sub", "mul",
    "div", "cat", "concat", "concatenate", "hstack", "vstack", "stack", "zeros_like", "ones_like", "full_like",
    "randn_like", "rand_like", "empty_like", "exp",
    "isinf", "isnan", "isfinite", "logical_not", "logical_and", "logical_or", "eq", "ne", "lt", "le", "gt", "ge",
    "clone", "maximum", "minimum", "clamp", "abs", "nn.functional.softmax", "nn.functional.pad",
    "nn.functional.scaled_dot_product_attention", "is_tensor", "numel")}
JOINS = {f"torch.{name}" for name in ("cat", "concat", "concatenate", "hstack", "vstack", "stack")}  # lists -> new
# `einsum("ij->ji", m)` is a view, and dropout returns its input itself when not training
TORCH_SHARING = {f"torch.{name}" for name in ("reshape", "transpose", "permute", "unsqueeze", "squeeze", "flatten",
                                              "broadcast_to", "t", "narrow", "select", "detach", "einsum",
                                              "nn.functional.dropout")}
INPLACE_POSITION = {"torch.nn.functional.dropout": 3}  # `F.dropout(m, p, training, inplace)`
HARMLESS_BUILTINS = {"isinstance", "len", "print", "repr", "str"}
ESCAPE_HATCHES = {"globals", "vars", "setattr", "exec", "eval", "locals", "__import__"}
# what reaches a module object or any object's namespace without naming the attribute in the source
NAMESPACE_ATTRIBUTES = {"__dict__", "__setattr__", "__getattribute__", "__delattr__"}
MODULE_OBJECT_SOURCES = {"sys.modules", "importlib.import_module", "importlib.reload"}


@dataclass(frozen=True)
class ModuleValue:
    value: cst.BaseExpression  # what the one definition assigns
    line: int  # where


def module_value(parsed: ParsedModule, name: str) -> ModuleValue | None:
    """The one module-level definition of `name`, when every read of it in the file sees that tensor unchanged."""
    return parsed.derived(("module-value", name), lambda p: _module_value(p, name))


def _module_value(parsed: ParsedModule, name: str) -> ModuleValue | None:
    bindings = parsed.bindings.get(name, [])
    if len(bindings) != 1 or name in parsed.imports or reached_by_name(parsed, name) or \
            name in parsed.outside_attribute_writes[0]:  # `program.MASK.fill_(...)` here or in another file
        return None
    target = parsed.parents.get(bindings[0])
    assign = parsed.parents.get(target)
    if not isinstance(target, cst.AssignTarget) or not isinstance(assign, cst.Assign) or len(assign.targets) != 1 \
            or parsed.innermost(assign, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) is not None:
        return None
    names = [node for node in parsed.nodes_of(cst.Name) if node.value == name]
    if not all(_read_only_use(parsed, node, bindings[0], 0) for node in names):
        return None
    return ModuleValue(assign.value, parsed.line(assign))


def reached_by_name(parsed: ParsedModule, name: str) -> bool:
    """Whether the file may reach its global `name` otherwise than by spelling it: `globals()["MASK"] = ...`,
    `vars()`, `exec`/`eval`, a namespace (`sys.modules[__name__].__dict__[...]`), the module object by import
    machinery (whose attributes a computed string can name), a string naming it (`getattr(module, "MASK")`), or a
    star import (`from consts import *`, whose names replace the file's). Once per file and name."""
    return parsed.derived(("reached-by-name", name), lambda p: _reached_by_name(p, name))


def _reached_by_name(parsed: ParsedModule, name: str) -> bool:
    if any(isinstance(node.names, cst.ImportStar) for node in parsed.nodes_of(cst.ImportFrom)):
        return True
    for node in parsed.nodes_of(cst.Call, cst.Attribute, cst.Name, cst.SimpleString):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ESCAPE_HATCHES:
            return True
        if isinstance(node, cst.Attribute) and node.attr.value in NAMESPACE_ATTRIBUTES or \
                isinstance(node, (cst.Attribute, cst.Name)) and parsed.imported_name(node) in MODULE_OBJECT_SOURCES:
            return True
        if isinstance(node, cst.SimpleString) and node.evaluated_value == name:
            return True
    return False


def _read_only_use(parsed: ParsedModule, node: cst.Name, binding: cst.Name, depth: int) -> bool:
    """One occurrence of the name: its binding, a name that is not this one (an attribute's, a keyword's), or a
    read that leaves the tensor alone."""
    parent = parsed.parents.get(node)
    if isinstance(parent, cst.Attribute) and parent.attr is node:  # `sys.modules[__name__].MASK`, not `self.MASK`
        return isinstance(parent.value, cst.Name) and parent.value.value == "self"
    if node is binding or isinstance(parent, cst.Arg) and parent.keyword is node:
        return True
    if isinstance(parent, (cst.Param, cst.NameItem, cst.Del, cst.AsName, cst.ImportAlias, cst.FunctionDef,
                           cst.ClassDef, cst.AssignTarget, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr)) \
            and not (isinstance(parent, (cst.AugAssign, cst.For, cst.CompFor)) and
                     getattr(parent, "target", None) is not node):
        return False  # another binding, a deletion or `global`: the file's one definition is not what every read sees
    return _leaves_alone(parsed, node, depth)


def _leaves_alone(parsed: ParsedModule, node: cst.BaseExpression, depth: int) -> bool:
    """The expression `node` may hold the tensor: what encloses it only reads it, or computes a new tensor."""
    if depth > MAX_DEPTH:
        return False
    parent = parsed.parents.get(node)
    again = lambda outer: _leaves_alone(parsed, outer, depth + 1)  # noqa: E731 - it may share memory
    if isinstance(parent, (cst.BinaryOperation, cst.Comparison, cst.ComparisonTarget, cst.UnaryOperation,
                           cst.BooleanOperation, cst.Index, cst.Expr)):
        return True  # a new tensor (or a bool), or an index that reads it
    if isinstance(parent, cst.AugAssign):
        return parent.value is node  # `scores += MASK` writes scores
    if isinstance(parent, cst.IfExp):
        return parent.test is node or again(parent)
    if isinstance(parent, cst.Subscript) and parent.value is node:
        return not _is_target(parsed, parent) and again(parent)
    if isinstance(parent, cst.Attribute) and parent.value is node:
        outer = parsed.parents.get(parent)
        if isinstance(outer, cst.Call) and outer.func is parent:
            method = parent.attr.value
            return method in FRESH_METHODS or method in SHARING_METHODS and again(outer)
        if _is_target(parsed, parent):
            return False
        return parent.attr.value in METADATA or parent.attr.value in ("T", "mT") and again(parent)
    if isinstance(parent, cst.Arg) and parent.value is node:
        return _argument_left_alone(parsed, parent, depth)
    if isinstance(parent, cst.Element) and parent.value is node:  # `torch.cat([a, MASK])`: a new tensor
        literal = parsed.parents.get(parent)
        arg = parsed.parents.get(literal)
        call = parsed.parents.get(arg)
        return isinstance(arg, cst.Arg) and arg.value is literal and not arg.star and arg.keyword is None and \
            isinstance(call, cst.Call) and call.args[0] is arg and parsed.imported_name(call.func) in JOINS
    if isinstance(parent, cst.Assign) and parent.value is node:
        return _alias_left_alone(parsed, parent, depth)
    return False  # returned, stored in a container or an attribute, yielded, ...


def _is_target(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    parent = parsed.parents.get(node)
    return isinstance(parent, (cst.AssignTarget, cst.Del)) or isinstance(parent, (cst.AugAssign, cst.AnnAssign)) \
        and parent.target is node


def _argument_left_alone(parsed: ParsedModule, arg: cst.Arg, depth: int) -> bool:
    call = parsed.parents.get(arg)
    if not isinstance(call, cst.Call) or arg.star or arg.keyword is not None and arg.keyword.value in ("out",
                                                                                                       "inplace"):
        return False
    dotted = parsed.imported_name(call.func) or ""
    if len([a for a in call.args if a.keyword is None]) > INPLACE_POSITION.get(dotted, len(call.args)):
        return False
    if dotted in TORCH_FRESH or dotted in HARMLESS_BUILTINS:
        return True
    if dotted in TORCH_SHARING:
        return _leaves_alone(parsed, call, depth + 1)
    forward = _submodule_forward(parsed, call)
    if forward is not None:
        return _parameter_left_alone(parsed, forward, call, arg, depth, skip=1)
    if isinstance(call.func, cst.Attribute) and not dotted:
        return call.func.attr.value in ARGUMENT_READING_METHODS and call.func.value is not arg.value
    if isinstance(call.func, cst.Name) and call.func.value in parsed.module_functions:
        return _parameter_left_alone(parsed, parsed.module_functions[call.func.value], call, arg, depth)
    return False  # a function of another module, a callable built at run time: it may write what it is passed


def _submodule_forward(parsed: ParsedModule, call: cst.Call) -> cst.FunctionDef | None:
    """`self.block(x, mask)` where the class builds `self.block` once, or `model(x, mask)` where the file binds
    `model` once at module level, as an instance of a module class of this file: its `forward` (None where the
    file registers hooks, which would see the arguments too, or names a `forward` attribute it may replace)."""
    func = call.func
    if "hook" in parsed.source or ".forward" in parsed.source:
        return None
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        caller = parsed.innermost(call, cst.FunctionDef)
        owner = next((o for f, o, _ in parsed.functions if f is caller), None)
        built = owner.only_value(func.attr.value) if owner is not None else None
    elif isinstance(func, cst.Name) and len(parsed.bindings.get(func.value, [])) == 1:
        assign = parsed.parents.get(parsed.parents.get(parsed.bindings[func.value][0]))
        built = assign.value if isinstance(assign, cst.Assign) and assign in _module_statements(parsed) else None
    else:
        return None
    if not (isinstance(built, cst.Call) and isinstance(built.func, cst.Name)):
        return None
    cls = parsed.top_level_classes.get(built.func.value)
    return cls.methods.get("forward") if cls is not None else None


def _module_statements(parsed: ParsedModule) -> set[cst.CSTNode]:
    """The small statements at the module's top level (not in an `if`, a loop or a function)."""
    return {small for line in parsed.module.body if isinstance(line, cst.SimpleStatementLine) for small in line.body}


def _parameter_left_alone(parsed: ParsedModule, function: cst.FunctionDef, call: cst.Call, arg: cst.Arg,
                          depth: int, skip: int = 0) -> bool:
    """The function of this file the tensor is passed to only reads the parameter that receives it (`skip`: the
    leading parameters the call does not pass, `self` of a module's `forward`)."""
    params = function.params
    if isinstance(params.star_arg, cst.Param) or isinstance(params.star_kwarg, cst.Param):
        return False
    if arg.keyword is not None:
        name = arg.keyword.value
    else:
        position = [a for a in call.args if a.keyword is None].index(arg) + skip
        positional = list(params.posonly_params) + list(params.params)
        if position >= len(positional):
            return False
        name = positional[position].name.value
    return _local_reads_left_alone(parsed, function, name, depth)


def _alias_left_alone(parsed: ParsedModule, assign: cst.Assign, depth: int) -> bool:
    """`alias = MASK` (or a view of it): every read of the alias leaves it alone too."""
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return False
    name = assign.targets[0].target.value
    scope = parsed.innermost(assign, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
    if isinstance(scope, cst.ClassDef):
        return False  # a class attribute, read as `self.name` too
    if _rebinds_itself(parsed, assign, scope, name):
        return True  # `m = m.to(torch.bool)`: the reads of `m` here are the ones whose loop reached this one
    if scope is None:
        return all(_leaves_alone(parsed, node, depth + 1) for node in _loads(parsed, parsed.module, name))
    return _local_reads_left_alone(parsed, scope, name, depth)


def _rebinds_itself(parsed: ParsedModule, assign: cst.Assign, scope: cst.CSTNode | None, name: str) -> bool:
    """`name = name.view(...)[...]`: the value is a chain of methods and indexing on the same local, so the alias's
    reads are reads of `name` in `scope`, every one of which the loop that reached this assignment checks (each
    entry walks every occurrence of a name in a scope that holds this one); walking them again would only recurse."""
    node = assign.value
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, (cst.Subscript, cst.Attribute)):
            node = node.value
        else:
            break
    return isinstance(node, cst.Name) and node.value == name and \
        parsed.innermost(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) is scope


def read_leaves_alone(parsed: ParsedModule, node: cst.Name) -> bool:
    """The one read `node` leaves the tensor it holds alone (see `_leaves_alone`), trusting no callee it does not
    read: `reset(mask)` is followed into `reset`, `torch.nn.init.zeros_(q)` is not known to read only."""
    return _leaves_alone(parsed, node, 0)


def local_reads_leave_alone(parsed: ParsedModule, function: cst.FunctionDef, name: str,
                            followed: tuple[cst.CSTNode, ...] = ()) -> bool:
    """Every read of the local `name` in `function` leaves the tensor it holds alone, as every read of a module-level
    tensor must (an alias written in place, `self.m = mask` then `self.m.fill_(...)`, would change it unseen; so
    would a function of another module it is passed to, `corrupt(m)`), except the reads `followed`, where the caller
    takes the tensor on (the buffer `register_buffer("m", m)` registers, the argument of the call site read)."""
    return _local_reads_left_alone(parsed, function, name, 0, followed=followed)


def assigned_values(parsed: ParsedModule, name: cst.Name,
                    followed: tuple[cst.CSTNode, ...] = ()) -> list[cst.BaseExpression] | None:
    """What the read `name` can hold: the plain assignments of its function that reach it, when every other read
    there leaves the tensor alone (`local_reads_leave_alone`, `followed` as there), or a module-level tensor's one
    definition (`module_value`); None when anything else may reach it (a parameter, an unpacking, an in-place
    write, an alias)."""
    function = parsed.innermost(name, cst.FunctionDef)
    flow = parsed.flow(function) if function is not None else None
    if flow is None or flow.reaching.get(name) == frozenset({UNDEFINED}):  # a global read
        found = module_value(parsed, name.value)
        return [found.value] if found is not None else None
    definitions = flow.definitions_of(name)
    if not definitions or flow.sees_undefined(name) or any(d.kind != "assign" or d.index is not None
                                                              for d in definitions):
        return None
    if not local_reads_leave_alone(parsed, function, name.value, followed):
        return None  # an alias, a view or a callee may write the tensor the assignment built
    return [d.value for d in definitions]


def _local_reads_left_alone(parsed: ParsedModule, scope: cst.CSTNode, name: str, depth: int,
                            followed: tuple[cst.CSTNode, ...] = ()) -> bool:
    """Every read of `name` inside `scope` (all of them, whatever else the name is bound to there)."""
    for node in _occurrences(parsed, scope, name):
        if any(node is read for read in followed):
            continue
        parent = parsed.parents.get(node)
        if isinstance(parent, (cst.Param, cst.AssignTarget)) or isinstance(parent, cst.Attribute) and \
                parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
            continue  # rebinding a local leaves the tensor alone
        if isinstance(parent, (cst.AugAssign, cst.NameItem, cst.Del)) or \
                not _leaves_alone(parsed, node, depth + 1):
            return False
    return True


def _occurrences(parsed: ParsedModule, scope: cst.CSTNode, name: str) -> list[cst.Name]:
    found: list[cst.Name] = []

    class _Names(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name:
                found.append(node)

    walk(scope, _Names())
    return found


def _loads(parsed: ParsedModule, scope: cst.CSTNode, name: str) -> list[cst.Name]:
    return [node for node in _occurrences(parsed, scope, name)
            if not isinstance(parsed.parents.get(node), (cst.AssignTarget, cst.Param))
            and not (isinstance(parsed.parents.get(node), cst.Attribute) and parsed.parents[node].attr is node)]
