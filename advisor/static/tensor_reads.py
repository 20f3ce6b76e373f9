"""Whether a read of a tensor leaves it alone: followed through the names it is assigned to, the views taken of it
and the parameters of the file's functions and module `forward`s it is passed to, it only computes new tensors from
it (arithmetic, comparisons, `torch.where`, `masked_fill`, ...) or reads its metadata. A read that could write it or
let it escape (an in-place method, an element write, `out=`, `.data`, `nn.Parameter(...)`, a container, a return, a
call of anything not known to leave it alone) does not. Module-level and local tensors are held to it
(patterns/module_values.py), and so is a tensor a class builds for an attribute (static/attribute_escapes.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from advisor.static.dataflow import is_self
from advisor.static.inplace_args import INPLACE_POSITIONS
from advisor.static.module_methods import MODULE_BASES, compiled_instance, only_called, returns_itself, \
    without_self_returning_calls
from advisor.static.outside_writes import IN_PLACE_DUNDERS, in_place_name
from advisor.static.package_functions import called_function
from advisor.static.spread_arguments import element_destinations, position_of
from advisor.static.tensor_views import VIEW_ATTRIBUTES, VIEW_OPS
from advisor.static.walk import walk

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule

MAX_DEPTH = 6  # names and parameters followed from one read
METADATA = {"dtype", "shape", "device", "ndim", "is_cuda", "is_floating_point", "size", "dim", "numel",
            "requires_grad", "is_leaf", "layout"}
# methods whose result may share the receiver's memory (a view, or the receiver itself when nothing changes): torch's
# view ops and casts (static.tensor_views)
SHARING_METHODS = VIEW_OPS - {"rearrange"}
# methods whose result is a new tensor (or a number), leaving the receiver alone
FRESH_METHODS = {"clone", "masked_fill", "add", "sub", "mul", "div", "neg", "exp", "eq", "ne", "lt", "le", "gt", "ge",
                 "logical_not", "logical_and", "logical_or", "sum", "mean", "amax", "amin", "max", "min", "abs",
                 "tril", "triu", "matmul", "bmm", "softmax", "isinf", "isnan", "isfinite", "all", "any",
                 "new_zeros", "new_ones", "new_full", "new_empty", "repeat", "where", "item", "tolist",
                 "is_floating_point", "size", "dim", "numel"}
# methods of another tensor that read an argument without keeping it (not `add`: a set's keeps it, `REG.add(MASK)`)
ARGUMENT_READING_METHODS = FRESH_METHODS - {"add"} | {"masked_fill_", "add_", "sub_", "mul_", "div_", "copy_", "to",
                                            "type_as", "expand_as", "view_as", "reshape_as", "masked_scatter"}
TORCH_FRESH = {f"torch.{name}" for name in (
    "where", "softmax", "log_softmax", "matmul", "bmm", "baddbmm", "tril", "triu", "masked_fill", "add", "sub", "mul",
    "div", "cat", "concat", "concatenate", "hstack", "vstack", "stack", "zeros_like", "ones_like", "full_like",
    "randn_like", "rand_like", "empty_like", "exp",
    "isinf", "isnan", "isfinite", "logical_not", "logical_and", "logical_or", "eq", "ne", "lt", "le", "gt", "ge",
    "clone", "maximum", "minimum", "clamp", "abs", "nn.functional.softmax", "nn.functional.pad",
    "nn.functional.scaled_dot_product_attention", "is_tensor", "numel")}
JOINS = {f"torch.{name}" for name in ("cat", "concat", "concatenate", "hstack", "vstack", "stack")}  # lists -> new
# the same as torch functions; `einsum("ij->ji", m)` is a view, and dropout returns its input itself when not training
TORCH_SHARING = {f"torch.{name}" for name in SHARING_METHODS} | {"torch.einsum", "torch.nn.functional.dropout"}
# calls whose result has at least one dim (an index of them gathers a copy): methods, torch functions, and torch
# functions given a non-empty list
DIMMED_METHODS = frozenset({"view", "reshape", "flatten", "unsqueeze", "nonzero", "argsort"})
DIMMED_TORCH = frozenset({"torch.arange", "torch.randperm", "torch.nonzero", "torch.argsort", "torch.stack",
                          "torch.tril_indices", "torch.triu_indices"})
LISTED_TORCH = frozenset({"torch.tensor", "torch.as_tensor", "torch.LongTensor"})
# torch's creations from sizes (all of them given positionally, but `torch.full`'s)
SIZED_TORCH = frozenset({"torch.empty", "torch.zeros", "torch.ones", "torch.rand", "torch.randn", "torch.full"})
SIZED_METHODS = frozenset({"new_empty", "new_zeros", "new_ones", "new_full"})
CONTAINER_DISPLAYS = (cst.List, cst.Tuple, cst.Set, cst.Dict, cst.ListComp, cst.SetComp, cst.DictComp,
                      cst.GeneratorExp)
CONTAINER_BUILDERS = frozenset({"list", "tuple", "set", "dict", "sorted", "reversed", "collections.deque"})
NUMBER_METHODS = {"item", "tolist", "size", "dim", "numel", "is_floating_point"}  # tensor methods giving numbers
HARMLESS_BUILTINS = {"isinstance", "len", "print", "repr", "str", "float", "int", "bool", "round", "abs"}
# what a class may assign an attribute that holds a tensor: a Parameter or Buffer (the other torch.nn classes are
# modules, whose own state is another question), besides any other torch function's result
NUMBER_INFO = {"torch.finfo", "torch.iinfo"}  # torch calls whose attributes are numbers
TENSOR_CLASSES = {"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer",
                  "torch.nn.parameter.Buffer"}


def leaves_alone(parsed: ParsedModule, node: cst.BaseExpression, depth: int, writes_seen: bool = False) -> bool:
    """The expression `node` may hold the tensor: what encloses it only reads it, or computes a new tensor.
    `writes_seen`: a write straight through `node` (into its elements, by an in-place method or function, `.data =`,
    on it or on a view a method or torch function takes of it) is read elsewhere (static.outside_writes, for
    another object's attribute), so only what hands the tensor on counts."""
    if depth > MAX_DEPTH:
        return False
    parent = parsed.parents.get(node)
    again = lambda outer: leaves_alone(parsed, outer, depth + 1, writes_seen)  # noqa: E731 - it may share memory
    if isinstance(parent, (cst.UnaryOperation, cst.Expr)):
        return True  # a new tensor, or a statement that drops it
    if isinstance(parent, (cst.BinaryOperation, cst.Comparison, cst.ComparisonTarget, cst.Index)):
        return _operands_plain(parsed, parent, node)  # a new tensor (or a bool), or an index that reads it
    if isinstance(parent, cst.BooleanOperation):
        return again(parent)  # `m or other` is `m` itself
    if isinstance(parent, cst.Call) and parent.func is node:
        return True  # a tensor called raises; a call hands nothing it is not given
    if isinstance(parent, cst.AugAssign):  # `scores += MASK` writes scores
        return parent.value is node and _augments_a_tensor(parsed, parent) or parent.target is node and writes_seen
    if isinstance(parent, cst.IfExp):
        return parent.test is node or again(parent)
    if isinstance(parent, cst.Subscript) and parent.value is node:
        if _is_target(parsed, parent):
            return writes_seen
        return _indexed_by_tensor(parsed, parent) or again(parent)  # advanced indexing copies
    if isinstance(parent, cst.Attribute) and parent.value is node:
        outer = parsed.parents.get(parent)
        if isinstance(outer, cst.Call) and outer.func is parent:
            method = parent.attr.value
            return method in FRESH_METHODS or (method in SHARING_METHODS or writes_seen) and again(outer)
        if _is_target(parsed, parent):
            return writes_seen
        return parent.attr.value in METADATA or parent.attr.value in VIEW_ATTRIBUTES and again(parent)
    if isinstance(parent, cst.Arg) and parent.value is node:
        return _argument_left_alone(parsed, parent, depth, writes_seen)
    if isinstance(parent, cst.Element) and parent.value is node:  # `torch.cat([a, MASK])`: a new tensor
        literal = parsed.parents.get(parent)
        arg = parsed.parents.get(literal)
        call = parsed.parents.get(arg)
        if isinstance(arg, cst.Arg) and arg.value is literal and not arg.star and arg.keyword is None and \
                isinstance(call, cst.Call) and call.args[0] is arg and parsed.imported_name(call.func) in JOINS:
            return True
        return _spread_left_alone(parsed, parent, depth)  # `inputs = [q, k, v, MASK]`, then `model(*inputs)`
    if isinstance(parent, cst.DictElement) and parent.value is node:  # `kw = {"mask": MASK}`, then `model(**kw)`
        return _spread_left_alone(parsed, parent, depth)
    if isinstance(parent, cst.Assign) and parent.value is node:
        return _alias_left_alone(parsed, parent, depth)
    if isinstance(parent, cst.Return) and parent.value is node:
        return _calls_left_alone(parsed, parsed.innermost(parent, (cst.FunctionDef, cst.Lambda)), depth)
    return False  # stored in a container or an attribute, yielded, ...


def _operands_plain(parsed: ParsedModule, parent: cst.CSTNode, node: cst.CSTNode) -> bool:
    """What an operator takes beside `node` runs none of the program's code on it: a tensor or a number (breaker
    round 42: `P + MASK`, `MASK in P`, `P[MASK]` hand the tensor to `P`'s own `__add__`, `__contains__`,
    `__getitem__`, which may write it; so may a `__torch_function__` or `__radd__` of an object `MASK + P` meets)."""
    if not _defines_operators(parsed):
        return True  # no class of the program runs code for an operator: torch's or Python's own do
    if isinstance(parent, cst.ComparisonTarget):
        parent = parsed.parents.get(parent)
    if isinstance(parent, cst.Index):
        subscript = parsed.parents.get(parsed.parents.get(parent))
        others = [subscript.value] if isinstance(subscript, cst.Subscript) else [None]
    elif isinstance(parent, cst.BinaryOperation):
        others = [parent.left, parent.right]
    elif isinstance(parent, cst.Comparison):
        if all(isinstance(target.operator, (cst.Is, cst.IsNot)) for target in parent.comparisons):
            return True  # `mask is not None`: identity, no method of either side
        others = [parent.left, *(target.comparator for target in parent.comparisons)]
    else:
        return False
    return all(other is node or _plain_operand(parsed, other) for other in others)


# what an operator calls on the objects it is given; a file naming one may define it for its own objects
OPERATOR_DUNDERS = re.compile(r"\b__(?:r|i)?(?:add|sub|mul|matmul|truediv|floordiv|mod|divmod|pow|and|or|xor|lshift|"
                              r"rshift|eq|ne|lt|le|gt|ge|contains|getitem|index|torch_function|torch_dispatch|"
                              r"array_ufunc|array_function)__\b")


def _defines_operators(parsed: ParsedModule) -> bool:
    """Whether this file or another of the tree names an operator's dunder (`def __contains__`, `__radd__ = f`,
    `__torch_function__`): only then may an operator run the program's code on a tensor it is given. Read once per
    file (a search of the whole text per read made a file of 800 blocks quadratic)."""
    return parsed.tree_matches("operator dunders", OPERATOR_DUNDERS)


def _defines_method(parsed: ParsedModule, method: str) -> bool:
    """Whether this file or another of the tree defines or assigns a function named `method` (breaker round 42: a
    class's own `where(self, m)` writing the tensor a tensor method of that name would only read). Read once per file
    and name."""
    return parsed.derived((_defines_method, method), lambda parsed: _names_method(parsed, method))


def _names_method(parsed: ParsedModule, method: str) -> bool:
    name = re.escape(method)
    pattern = re.compile(rf"\bdef\s+{name}\s*\(|\b{name}\s*=[^=]|[\"']{name}[\"']")
    if pattern.search(parsed.source):
        return True
    tree = parsed.tree
    return tree is not None and tree.any_file_matches(f"defines {method}", pattern)


def _plain_operand(parsed: ParsedModule, node: cst.BaseExpression | None) -> bool:
    """A number literal (or its negation, `float("-inf")`), or an expression the source shows is a tensor."""
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary)) or \
            isinstance(node, cst.Name) and node.value in ("None", "True", "False"):
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("float", "int") and \
            node.func.value not in parsed.bindings:
        return True
    return node is not None and (shows_a_tensor(parsed, node) or _class_tensor(parsed, node))


def _class_tensor(parsed: ParsedModule, node: cst.BaseExpression) -> bool:
    """`self.table.T`, `self.table[...]`: views and elements of an attribute every binding of which in its class
    builds a tensor (`nn.Parameter(...)`, a torch function's result) or registers a buffer, and that nothing
    outside the class rebinds."""
    while isinstance(node, (cst.Attribute, cst.Subscript)) and not (isinstance(node, cst.Attribute) and
                                                                   is_self(node.value)):
        if isinstance(node, cst.Attribute) and node.attr.value not in VIEW_ATTRIBUTES | {"data"}:
            return False
        node = node.value
    if not (isinstance(node, cst.Attribute) and is_self(node.value)):
        return False
    function = parsed.frame(node)
    owner = parsed.owner_of(function)
    name = node.attr.value
    values = owner.shape_values(name) if owner is not None else None  # writes into its elements leave a tensor
    if not values:
        return False
    buffer = (owner.node, name) in registered_buffers(parsed)
    return all(builds_tensor(parsed, value) or buffer and _registration_value(parsed, value) for value in values)


def _registration_value(parsed: ParsedModule, value: cst.BaseExpression) -> bool:
    """`value` is what `self.register_buffer(name, value)` registers (a buffer whatever it is given)."""
    arg = parsed.parents.get(value)
    call = parsed.parents.get(arg) if isinstance(arg, cst.Arg) else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
        call.func.attr.value == "register_buffer"


def _augments_a_tensor(parsed: ParsedModule, augmented: cst.AugAssign) -> bool:
    """`scores += MASK` adds into a tensor, reading MASK; `rows += MASK` on a list extends it with MASK's rows, which
    are views (a thirteenth breaker's). `+=` reads its value only into a name its scope binds by plain assignments
    alone, none of them a container."""
    if not isinstance(augmented.operator, cst.AddAssign):
        return True
    target = augmented.target
    if not isinstance(target, cst.Name):
        return False
    scope = parsed.innermost(augmented, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
    for name in parsed.names_spelled(target.value):
        if parsed.innermost(name, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) is not scope:
            continue
        parent = parsed.parents.get(name)
        if isinstance(parent, cst.AssignTarget) and parent.target is name:
            value = parsed.parents.get(parent).value
            if isinstance(value, CONTAINER_DISPLAYS) or isinstance(value, cst.Call) and \
                    parsed.imported_name(value.func) in CONTAINER_BUILDERS:
                return False
        elif isinstance(parent, (cst.Param, cst.For, cst.CompFor, cst.AsName, cst.NameItem, cst.AnnAssign,
                                 cst.NamedExpr, cst.ImportAlias)) or isinstance(parent, (cst.Tuple, cst.List,
                                                                                          cst.Element)):
            return False
    return True


def _indexed_by_tensor(parsed: ParsedModule, subscript: cst.Subscript) -> bool:
    """`table[index.view(-1)]`, `x[:, torch.arange(n)]`: an index that is a tensor of at least one dim gathers a copy,
    not a view. A 0-dim integer tensor indexes as an int does (`MASK[torch.tensor(1)]` is a view: a thirteenth
    breaker's), so an index of no visible rank is read as one."""
    for element in subscript.slice:
        index = element.slice
        value = index.value if isinstance(index, cst.Index) else None
        if has_dims(parsed, value):
            return True
        if isinstance(value, cst.Attribute) and is_self(value.value) and _dimmed_attribute(parsed, value.attr.value):
            return True
    return False


def has_dims(parsed: ParsedModule, value: cst.BaseExpression | None) -> bool:
    """A call whose result has at least one dim: `x.view(-1)`, `x.flatten()`, `torch.arange(n)`, `torch.tensor([...])`
    (not `x.view(())`, nor a shape given by `*args`)."""
    if not isinstance(value, cst.Call) or any(arg.star for arg in value.args):
        return False
    if isinstance(value.func, cst.Attribute) and parsed.imported_name(value.func) is None:
        method = value.func.attr.value
        empty = [arg for arg in value.args if isinstance(arg.value, (cst.Tuple, cst.List)) and not arg.value.elements]
        if method in SIZED_METHODS:
            return _sized(parsed, value, method != "new_full")
        return method in DIMMED_METHODS and (method not in ("view", "reshape") or bool(value.args) and not empty)
    dotted = parsed.imported_name(value.func)
    if dotted in SIZED_TORCH:
        return _sized(parsed, value, dotted != "torch.full")
    if dotted in LISTED_TORCH:
        return bool(value.args) and isinstance(value.args[0].value, (cst.List, cst.Tuple)) and \
            bool(value.args[0].value.elements)
    return dotted in DIMMED_TORCH


def _sized(parsed: ParsedModule, call: cst.Call, sizes_spread: bool) -> bool:
    """A creation call's shape has a dim: a non-empty tuple or list, a number (an int literal, arithmetic, a local
    bound once to one: timm's `index_size = (area + prefix) ** 2`), or (`sizes_spread`: each positional argument a
    size, `torch.zeros(n, n)`) two sizes or more."""
    positional = [arg.value for arg in call.args if arg.keyword is None]
    if not positional:
        return False
    return _a_size(parsed, positional[0]) or sizes_spread and len(positional) >= 2


def _a_size(parsed: ParsedModule, node: cst.BaseExpression, depth: int = 0) -> bool:
    """`node` is a non-empty shape or a number (arithmetic on numbers stays one; on a tuple, `(n,) * 2`, stays a
    non-empty tuple)."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return bool(node.elements)
    if isinstance(node, (cst.Integer, cst.BinaryOperation, cst.UnaryOperation)):
        return not isinstance(node, cst.BinaryOperation) or not any(
            isinstance(side, (cst.Tuple, cst.List)) and not side.elements for side in (node.left, node.right))
    function = parsed.innermost(node, cst.FunctionDef)
    if not isinstance(node, cst.Name) or function is None or depth > 2:
        return False
    definitions = parsed.flow(function).definitions_of(node)
    return len(definitions) == 1 and definitions[0].kind == "assign" and definitions[0].index is None and \
        definitions[0].value is not None and _a_size(parsed, definitions[0].value, depth + 1)


def _dimmed_attribute(parsed: ParsedModule, name: str) -> bool:
    """Every value the file's classes give `self.name` (assigned or registered as a buffer) has at least one dim."""
    values = [(parsed.parents.get(node), node) for node in parsed.attributes_named(name) if is_self(node.value)]
    assigned = [parsed.parents.get(target).value for target, node in values
                if isinstance(target, cst.AssignTarget) and target.target is node]
    calls = _buffer_registrations(parsed, name)
    if any(len(call.args) < 2 or call.args[1].keyword is not None or call.args[1].star for call in calls):
        return False  # registered with a value not given positionally
    registered = [call.args[1].value for call in calls]
    return bool(assigned or registered) and all(has_dims(parsed, value) for value in assigned + registered)


def _buffer_registrations(parsed: ParsedModule, name: str) -> list[cst.Call]:
    """Every `self.register_buffer("name", ...)` call."""
    found = []
    for node in parsed.attributes_named("register_buffer"):
        call = parsed.parents.get(node)
        if isinstance(call, cst.Call) and call.func is node and call.args and \
                isinstance(call.args[0].value, cst.SimpleString) and call.args[0].value.evaluated_value == name:
            found.append(call)
    return found


def _calls_left_alone(parsed: ParsedModule, function: cst.CSTNode | None, depth: int) -> bool:
    """A function or method of this file returning the tensor (`return self.table[...].unsqueeze(0)`): every call
    of it, by name or as `x.name(...)`, leaves the result alone, and it is used no other way. A module's `forward`
    and `__call__` are called through `nn.Module.__call__`, whose result no read here follows."""
    if not isinstance(function, cst.FunctionDef) or function.name.value in ("forward", "__call__"):
        return False
    name = function.name.value
    if _called_elsewhere(parsed, name):
        return False  # `model.causal_mask().fill_(1)` in another file of the tree (a thirteenth breaker's)
    uses = [node for node in parsed.names_spelled(name) if parsed.parents.get(node) is not function] + \
        parsed.attributes_named(name)
    for use in uses:
        if isinstance(use, cst.Name) and isinstance(parsed.parents.get(use), cst.Attribute):
            continue  # the attribute's own name: read with the attribute
        call = parsed.parents.get(use)
        if not (isinstance(call, cst.Call) and call.func is use and leaves_alone(parsed, call, depth + 1)):
            return False
    return True


def _called_elsewhere(parsed: ParsedModule, name: str) -> bool:
    """Another file of the scanned tree calls a method `name` on an object and hands its result on (it may write
    what a method of this file returns: static.escaping_reads)."""
    return bool(parsed.handed_on_elsewhere(f"{name}()"))


def _is_target(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    parent = parsed.parents.get(node)
    return isinstance(parent, (cst.AssignTarget, cst.Del)) or isinstance(parent, (cst.AugAssign, cst.AnnAssign)) \
        and parent.target is node


def _argument_left_alone(parsed: ParsedModule, arg: cst.Arg, depth: int, writes_seen: bool = False) -> bool:
    call = parsed.parents.get(arg)
    if not isinstance(call, cst.Call) or arg.star or arg.keyword is not None and arg.keyword.value == "inplace":
        return False
    dotted = parsed.imported_name(call.func) or ""
    family, _, name = dotted.rpartition(".")  # `F.dropout(m, p, training, True)`, `F.relu(m, True)`
    inplace_at = INPLACE_POSITIONS.get(name, len(call.args)) if family == "torch.nn.functional" else len(call.args)
    if len([a for a in call.args if a.keyword is None]) > inplace_at:
        return False
    out = arg.keyword is not None and arg.keyword.value == "out"
    if writes_seen and (out or dotted.startswith(("torch.", "operator."))):
        function = dotted.rsplit(".", 1)[-1]  # `nn.init.normal_(m.table)`, `operator.setitem(m.bias, i, v)`
        written = out or in_place_name(function) or \
            dotted.startswith("operator.") and f"__{function.strip('_')}__" in IN_PLACE_DUNDERS
        return written or leaves_alone(parsed, call, depth + 1, writes_seen)  # else its result may be a view
    if out:
        return False
    if dotted in TORCH_FRESH or dotted in HARMLESS_BUILTINS or dotted.startswith("math."):
        return True
    if dotted in TORCH_SHARING:
        return leaves_alone(parsed, call, depth + 1, writes_seen)
    called = _functions_called(parsed, call)
    if called:
        return all(_parameter_left_alone(owner, function, call, arg, depth, skip=skip)
                   for owner, function, skip in called)
    if isinstance(call.func, cst.Attribute) and not dotted:
        method, receiver = call.func.attr.value, call.func.value
        if method == "add" and shows_a_tensor(parsed, receiver):
            return True  # `scores.add(MASK)`: a new tensor (a set's `add` would keep it)
        return method in ARGUMENT_READING_METHODS and receiver is not arg.value and \
            (shows_a_tensor(parsed, receiver) or not _defines_method(parsed, method))
    return False  # another module's function, a callable built at run time, a decorator's wrapper: it may write it


def _functions_called(parsed: ParsedModule, call: cst.Call) -> list[tuple[ParsedModule, cst.FunctionDef, int]]:
    """(its file, the function, the leading parameters the call does not pass) for what the call runs, where the
    source shows it: a module's `forward` or the methods called on an instance (`self` not passed), else a function
    of this file or of its package (a compiled one's too); [] for anything else."""
    forward = _submodule_forward(parsed, call)
    if forward is not None:
        return [(parsed, forward, 1)]
    methods = _methods_called(parsed, call)
    if methods:
        return [(parsed, method, 1) for method in methods]
    func = _uncompiled(parsed, call.func)
    followed = called_function(parsed, func, parsed.outside_attribute_writes[0]) \
        if isinstance(func, cst.Name) else None
    return [(*followed, 0)] if followed is not None else []


EINOPS_TENSORS = frozenset({"einops.rearrange", "einops.repeat", "einops.reduce", "einops.einsum"})


def shows_a_tensor(parsed: ParsedModule, node: cst.BaseExpression, depth: int = 0) -> bool:
    """The source shows `node` is a tensor: a product (`q @ k`), a torch function or a tensor method that returns a
    new tensor or a view, arithmetic with one, or a local every plain assignment reaching it binds to one."""
    if depth > MAX_DEPTH:
        return False
    below = lambda child: shows_a_tensor(parsed, child, depth + 1)  # noqa: E731
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, cst.MatrixMultiply) or \
            isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.BitAnd, cst.BitOr)) and \
            (below(node.left) or below(node.right))
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        return below(node.left) or below(node.comparisons[0].comparator)  # `r[:, None] < r`: a bool tensor
    if isinstance(node, cst.UnaryOperation):
        return below(node.expression)
    if isinstance(node, cst.Subscript):
        return below(node.value)  # indexing a tensor gives one
    if isinstance(node, cst.Call):
        dotted = parsed.imported_name(node.func)
        if dotted is not None:
            return dotted in TORCH_FRESH | TORCH_SHARING and dotted not in ("torch.is_tensor", "torch.numel") or \
                dotted in EINOPS_TENSORS or dotted in SIZED_TORCH or dotted in DIMMED_TORCH
        return isinstance(node.func, cst.Attribute) and \
            node.func.attr.value in (FRESH_METHODS | SHARING_METHODS) - NUMBER_METHODS - {"all", "any"} and \
            below(node.func.value)
    function = parsed.frame(node) if isinstance(node, cst.Name) else None
    if function is None:
        return False
    flow = parsed.flow(function)
    definitions = flow.definitions_of(node)
    return bool(definitions) and not flow.sees_undefined(node) and all(
        d.kind == "assign" and d.index is None and d.value is not None and below(d.value) for d in definitions)


def _methods_called(parsed: ParsedModule, call: cst.Call) -> list[cst.FunctionDef]:
    """`self.helper(x, mask)`: every method of that name the file's classes define (a subclass may override it);
    [] for any other call, and where the file registers hooks or names a method it may replace."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and is_self(func.value)) or "hook" in parsed.source:
        return []
    name = func.attr.value
    found = parsed.methods_named(name)
    if any(function.decorators for function in found):
        return []  # a wrapper may run around the body, `staticmethod` binds the arguments otherwise
    stored = any(not (isinstance(parsed.parents.get(node), cst.Call) and parsed.parents[node].func is node)
                 for node in parsed.attributes_named(name))
    return [] if stored or name in ("forward", "__call__") else found


def _submodule_forward(parsed: ParsedModule, call: cst.Call) -> cst.FunctionDef | None:
    """`self.block(x, mask)` where the class builds `self.block` once, or `model(x, mask)` where the file binds
    `model` once at module level, or the calling function binds it once (`model = Attn().eval()`), or `Attn()(x,
    mask)`, as an instance of a module class of this file, or `torch.compile` of one: its `forward` (None where the
    file registers hooks, which would see the arguments too, or names a `forward` attribute it may replace)."""
    func = call.func
    if any(word in parsed.source for word in ("hook", ".forward", "__class__", "'forward'", '"forward"')):
        return None
    caller = parsed.innermost(call, cst.FunctionDef)
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        owner = parsed.owner_of(caller)
        built = owner.held_module(func.attr.value) if owner is not None else None
    elif isinstance(func, cst.Name) and caller is not None and parsed.flow(caller).definitions_of(func):
        built = _bound_once_here(parsed, caller, func)
    elif isinstance(func, cst.Name) and len(parsed.bindings.get(func.value, [])) == 1:
        built = _module_level_value(parsed, func.value)
    elif isinstance(func, cst.Call):  # `Attn()(x, MASK)`, `torch.compile(Attn())(x, MASK)`: called as built
        built = func
    else:
        return None
    built = compiled_instance(parsed, built) or built  # `torch.compile(Net())` calls that instance
    plain = without_self_returning_calls(built)
    if not (isinstance(plain, cst.Call) and isinstance(plain.func, cst.Name)):
        return None
    cls = parsed.top_level_classes.get(plain.func.value)
    if plain is not built and not returns_itself(parsed, cls):
        return None  # `Attend().eval()` where the class's `eval` may return something else
    if cls is None or cls.node.decorators or "__call__" in cls.methods or "__new__" in cls.methods or \
            any(parsed.imported_name(base.value) not in MODULE_BASES for base in cls.node.bases):
        return None  # what runs between the call and `forward` (a base's `__call__`) is not read here
    forward = cls.methods.get("forward")
    return forward if forward is not None and not forward.decorators else None



def _uncompiled(parsed: ParsedModule, func: cst.BaseExpression) -> cst.BaseExpression:
    """`f` where the call's callee is `torch.compile(f)`, or a name bound once to it (in the calling function, or at
    module level) and only ever called: a compiled function runs with the arguments it is given; else `func`."""
    if isinstance(func, cst.Name):
        caller = parsed.frame(func)
        if caller is not None and parsed.flow(caller).definitions_of(func):
            value = _bound_once_here(parsed, caller, func)
        elif len(parsed.bindings.get(func.value, [])) == 1 and func.value not in parsed.imports and \
                func.value not in parsed.outside_attribute_writes[0] and \
                parsed.global_rebound_by_computed_name(func.value) is None and \
                only_called(parsed, [n for n in parsed.names_spelled(func.value)
                                     if n is not parsed.bindings[func.value][0]]):
            value = _module_level_value(parsed, func.value)
        else:
            value = None
        return compiled_instance(parsed, value) or func
    return compiled_instance(parsed, func) or func


def _module_level_value(parsed: ParsedModule, name: str) -> cst.BaseExpression | None:
    """What the one binding of `name` assigns, where it is a plain assignment among the module's top statements."""
    assign = parsed.parents.get(parsed.parents.get(parsed.bindings[name][0]))
    return assign.value if isinstance(assign, cst.Assign) and assign in _module_statements(parsed) else None


def _bound_once_here(parsed: ParsedModule, function: cst.FunctionDef, name: cst.Name) -> cst.BaseExpression | None:
    """The value of the one plain assignment of the local `name` that reaches this read (None where a parameter,
    another binding or an unbound path may reach it)."""
    if "nonlocal" in parsed.source:
        return None  # a nested function may rebind it
    flow = parsed.flow(function)
    definitions = flow.definitions_of(name)
    if len(definitions) != 1 or flow.sees_undefined(name) or definitions[0].kind != "assign" or \
            definitions[0].index is not None or not only_called(parsed, flow.reads_of(definitions[0])):
        return None  # handed on, its `forward` or class may be replaced where this file does not show
    return definitions[0].value


def _module_statements(parsed: ParsedModule) -> set[cst.CSTNode]:
    """The small statements at the module's top level (not in an `if`, a loop or a function)."""
    return {small for line in parsed.module.body if isinstance(line, cst.SimpleStatementLine) for small in line.body}


def _spread_left_alone(parsed: ParsedModule, element: cst.CSTNode, depth: int) -> bool:
    """An element of a fixed display (static.spread_arguments) is handed to each call spreading it, at its position
    or under its key: every such call only reads it."""
    spread = element_destinations(parsed, element)
    return spread is not None and all(_slot_left_alone(parsed, call, slot, depth) for call, slot in spread)


def _slot_left_alone(parsed: ParsedModule, call: cst.Call, slot: int | str, depth: int) -> bool:
    """The call only reads the argument it gets at `slot` (a position among its positional arguments, or a
    keyword) from a spread: a function, a module's `forward` or a method of this file that only reads the parameter
    receiving it, or a builtin that only reads what it is given."""
    if (parsed.imported_name(call.func) or "") in HARMLESS_BUILTINS:
        return True
    called = _functions_called(parsed, call)
    return bool(called) and all(_parameter_left_alone(owner, function, call, None, depth, skip=skip, slot=slot)
                                for owner, function, skip in called)


def _parameter_left_alone(parsed: ParsedModule, function: cst.FunctionDef, call: cst.Call, arg: cst.Arg | None,
                          depth: int, skip: int = 0, slot: int | str | None = None) -> bool:
    """The function of this file the tensor is passed to only reads the parameter that receives it (`skip`: the
    leading parameters the call does not pass, `self` of a module's `forward`); `arg`, or the argument at `slot`
    (a position among the call's positional arguments, spread ones counted, or a keyword)."""
    params = function.params
    if isinstance(params.star_arg, cst.Param) or isinstance(params.star_kwarg, cst.Param):
        return False
    keyword = arg.keyword.value if arg is not None and arg.keyword is not None else slot \
        if isinstance(slot, str) else None
    if keyword is not None:
        if keyword in {p.name.value for p in params.posonly_params}:
            return False  # it binds no parameter of that name: a TypeError, or `**kwargs`
        name = keyword
    else:
        position = slot if arg is None else position_of(parsed, call, arg)  # `*args` spread before it counted
        if position is None:
            return False
        position += skip
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
        return all(leaves_alone(parsed, node, depth + 1) for node in _loads(parsed, parsed.module, name))
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
    """The one read `node` leaves the tensor it holds alone (see `leaves_alone`), trusting no callee it does not
    read: `reset(mask)` is followed into `reset`, `torch.nn.init.zeros_(q)` is not known to read only."""
    return leaves_alone(parsed, node, 0)


def local_reads_leave_alone(parsed: ParsedModule, function: cst.FunctionDef, name: str,
                            followed: tuple[cst.CSTNode, ...] = ()) -> bool:
    """Every read of the local `name` in `function` leaves the tensor it holds alone, as every read of a module-level
    tensor must (an alias written in place, `self.m = mask` then `self.m.fill_(...)`, would change it unseen; so
    would a function of another module it is passed to, `corrupt(m)`), except the reads `followed`, where the caller
    takes the tensor on (the buffer `register_buffer("m", m)` registers, the argument of the call site read)."""
    return _local_reads_left_alone(parsed, function, name, 0, followed=followed)


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
        if isinstance(parent, (cst.NameItem, cst.Del)) or isinstance(parent, cst.AugAssign) and \
                parent.target is node or not leaves_alone(parsed, node, depth + 1):
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


def builds_tensor(parsed: ParsedModule, value: cst.BaseExpression) -> bool:
    """Whether a class's value for an attribute is a tensor it builds: a torch function's result (a Parameter or a
    Buffer among torch.nn's classes, whose others are modules), a view, method or element of one, arithmetic on
    one. A name or a number is not read as one (`self.head_dim = dim // heads`)."""
    if isinstance(value, cst.Call):
        dotted = parsed.imported_name(value.func) or ""
        if dotted.startswith("torch."):
            return dotted not in NUMBER_INFO and (not dotted.startswith("torch.nn.") or dotted in TENSOR_CLASSES or
                                                  dotted.startswith("torch.nn.functional."))
        return isinstance(value.func, cst.Attribute) and builds_tensor(parsed, value.func.value)
    if isinstance(value, (cst.Subscript, cst.Attribute)):
        return builds_tensor(parsed, value.value)
    if isinstance(value, cst.BinaryOperation):
        return builds_tensor(parsed, value.left) or builds_tensor(parsed, value.right)
    if isinstance(value, cst.UnaryOperation):
        return builds_tensor(parsed, value.expression)
    return False


def registered_buffers(parsed: ParsedModule) -> frozenset[tuple[cst.ClassDef | None, str]]:
    """(class, name) of each `self.register_buffer("name", ...)`: whatever it is given, the attribute holds a
    tensor. Once per file."""
    def build(parsed: ParsedModule) -> frozenset[tuple[cst.ClassDef | None, str]]:
        found = set()
        for node in parsed.attributes_named("register_buffer"):
            call = parsed.parents.get(node)
            if isinstance(call, cst.Call) and call.func is node and is_self(node.value) and call.args and \
                    isinstance(call.args[0].value, cst.SimpleString):
                found.add((parsed.innermost(call, cst.ClassDef), call.args[0].value.evaluated_value))
        return frozenset(found)
    return parsed.derived("registered-buffers", build)
