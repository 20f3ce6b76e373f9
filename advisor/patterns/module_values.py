"""The value of a module-level tensor (`MASK = torch.randn(1, 1, L, L)`), where the file shows that every read sees
exactly what its one definition built.

Facts read from that definition (a mask's dtype, rank, values) hold at a read only when nothing else can have
changed the tensor: the name is bound once in the whole file, at module level, and never imported over, deleted,
declared `global` or reached through `globals()`/`setattr`; and every read of it leaves it alone
(static/tensor_reads.py: it only computes new tensors from it or reads its metadata). The other files of the
scanned tree that import it are held to the same reads (static/global_writes.py); modules outside the tree are not
seen: a fact proved here assumes none of them writes the tensor. A local tensor of a function (`mask =
torch.zeros(...)`, read by call-site facts) is held to the same reads, except that a function imported from another
module may be passed it (the callee the facts are about is one).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.static.dataflow import UNDEFINED
from advisor.static.global_reach import objects_reached_unseen, reached_by_name
from advisor.static.global_writes import through_globals, written_elsewhere
from advisor.static.module_index import ParsedModule
from advisor.static.tensor_reads import local_reads_leave_alone, read_leaves_alone
from advisor.static.walk import descendants



@dataclass(frozen=True)
class ModuleValue:
    value: cst.BaseExpression  # what the one definition assigns
    line: int  # where


def module_value(parsed: ParsedModule, name: str,
                 registered: tuple[cst.CSTNode, ...] = ()) -> ModuleValue | None:
    """The one module-level definition of `name`, when every read of it in the file sees that tensor unchanged.
    `registered`: reads that register it as a buffer (`self.register_buffer("mask", MASK)`), excused where the proof
    reads that buffer, whose uses the class's attribute reading holds to the same."""
    found = parsed.derived(("module-value", name), lambda p: _module_value(p, name))
    if found is None and any(_registers_buffer(parsed, read) for read in registered):
        return _module_value(parsed, name, registered)
    return found


STEP_METHODS = frozenset({"masked_fill_", "fill_", "fill_diagonal_", "triu_", "tril_", "add_", "sub_", "mul_",
                          "div_", "clamp_", "zero_", "neg_"})  # tensor methods a module-level step may write with


@dataclass(frozen=True)
class ModuleName:
    """The module-level variable `name`: its bindings and every occurrence of it, leaving out the locals of
    functions that bind the same name (`def forward(self, attn_mask)` beside a module-level `attn_mask`)."""

    bindings: list[cst.Name]
    occurrences: list[cst.Name]


def module_name(parsed: ParsedModule, name: str) -> ModuleName:
    return parsed.derived(("module-name", name), lambda p: _module_name(p, name))


def _module_name(parsed: ParsedModule, name: str) -> ModuleName:
    """A function or lambda that binds `name` (a parameter, an assignment, a loop or `with` target) makes it local
    there and in what it encloses that does not bind it again. Where the file declares the name `global` or
    `nonlocal`, or binds it in a class body or a comprehension (scopes with their own rules), every occurrence
    counts, as if all were the module's."""
    bindings = parsed.bindings.get(name, [])
    occurrences = [node for node in parsed.nodes_of(cst.Name) if node.value == name]
    scopes = [_binding_scope(parsed, binding) for binding in bindings]
    declared = any(item.name.value == name for node in parsed.nodes_of(cst.Global, cst.Nonlocal)
                   for item in node.names)
    if declared or any(scope is _OTHER for scope in scopes):
        return ModuleName(bindings, occurrences)
    local = {id(scope) for scope in scopes if scope is not None}
    return ModuleName([b for b, scope in zip(bindings, scopes) if scope is None],
                      [node for node in occurrences if not _local_in(parsed, node, local)])


_OTHER = object()  # a class body's or a comprehension's binding


def _binding_scope(parsed: ParsedModule, binding: cst.Name):
    """The function or lambda whose local `binding` binds; None at module level; _OTHER in a class body or a
    comprehension (its target, or a walrus inside one)."""
    parent = parsed.parents.get(binding)
    if isinstance(parent, cst.Param):
        return parsed.parents.get(parsed.parents.get(parent))
    child, node = binding, parent
    while node is not None:
        if isinstance(node, (cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            return _OTHER
        if isinstance(node, (cst.FunctionDef, cst.Lambda)) and child is node.body:
            return node
        child, node = node, parsed.parents.get(node)
    return None


def _local_in(parsed: ParsedModule, occurrence: cst.Name, local: set[int]) -> bool:
    """The occurrence is in the body (or is a parameter) of a function or lambda that binds the name."""
    child, node = occurrence, parsed.parents.get(occurrence)
    while node is not None:
        if isinstance(node, (cst.FunctionDef, cst.Lambda)) and id(node) in local and \
                (child is node.body or child is node.params and isinstance(parsed.parents.get(occurrence), cst.Param)
                 and parsed.parents.get(occurrence).name is occurrence):
            return True
        child, node = node, parsed.parents.get(node)
    return False


def module_steps(parsed: ParsedModule, name: str,
                 registered: tuple[cst.CSTNode, ...] = ()) -> list[cst.BaseSmallStatement] | None:
    """The module-level statements that build the tensor `name` when no one definition does: assignments of the
    name (`MASK = torch.zeros(n, n)`, then `MASK = MASK.masked_fill(...)`), element writes (`MASK[..., -3:] =
    -1e9`) and in-place method calls (`MASK.fill_diagonal_(0.0)`), all at the module's top level, in order, with
    nothing between them but assignments that call torch alone; every other read of it in the file leaves it alone,
    as for `module_value` (`registered` as there). None for anything else."""
    variable = module_name(parsed, name)
    if len(variable.bindings) < 2 and module_value(parsed, name) is not None or \
            name in parsed.imports or reached_by_name(parsed, name) or name in parsed.outside_attribute_writes[0] \
            or parsed.global_rebound_by_computed_name(name) is not None or objects_reached_unseen(parsed):
        return None
    top = [small for line in parsed.module.body if isinstance(line, cst.SimpleStatementLine) for small in line.body]
    steps = [small for small in top if _step_of(parsed, small, name)]
    bindings = variable.bindings
    if not steps or not isinstance(steps[0], cst.Assign) or \
            not all(any(parsed.within(binding, step) for step in steps) for binding in bindings):
        return None
    if any(calls_replaced(parsed, step) for step in steps):
        return None
    inside = set(steps)
    for node in variable.occurrences:
        if not any(parsed.within(node, step) for step in inside) and \
                not _read_only_use(parsed, node, bindings[0]) and \
                not (node in registered and _registers_buffer(parsed, node)):
            return None
    first, last = parsed.module.body.index(_line_of(parsed, steps[0])), \
        parsed.module.body.index(_line_of(parsed, steps[-1]))
    if any(first <= parsed.top_statement_index(node) <= last for node in variable.occurrences
           if not any(parsed.within(node, step) for step in inside)):
        return None  # read between the steps (`SNAP = MASK + 0`): that read sees the tensor half built (round 42)
    for line in parsed.module.body[first:last + 1]:
        if not isinstance(line, cst.SimpleStatementLine) or any(
                small not in inside and not _calls_torch_only(parsed, small) for small in line.body):
            return None  # a statement between that may run the program's code (or a block that may not run)
    if parsed.tree is not None and written_elsewhere(parsed, parsed.tree, name) is not None:
        return None
    return steps


def calls_replaced(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """Whether `node` calls a function a file of the scan assigns (`torch.randn = lambda *s: torch.full(s, -1e9)`,
    breaker round 62): its value is not what torch's function of that name gives."""
    written = parsed.outside_attribute_writes[0]
    return any((parsed.imported_name(call.func) or "") in written for call in descendants(node, (cst.Call,)))


def _step_of(parsed: ParsedModule, small: cst.BaseSmallStatement, name: str) -> bool:
    """`name = ...`, `name[...] = ...` or `name.fill_(...)` as a statement."""
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        return isinstance(target, cst.Name) and target.value == name or isinstance(target, cst.Subscript) and \
            isinstance(target.value, cst.Name) and target.value.value == name
    call = small.value if isinstance(small, cst.Expr) else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
        call.func.attr.value in STEP_METHODS and isinstance(call.func.value, cst.Name) and call.func.value.value == name


def _line_of(parsed: ParsedModule, small: cst.CSTNode) -> cst.CSTNode:
    return parsed.parents.get(small)


def _calls_torch_only(parsed: ParsedModule, small: cst.CSTNode) -> bool:
    """An assignment or import whose calls are all torch's or math's, or methods of what those return: it runs no
    code of the program's (a function of it called there could run the block on the tensor half built)."""
    def library(call: cst.Call) -> bool:
        func = call.func
        while parsed.imported_name(func) is None and isinstance(func, cst.Attribute) and \
                isinstance(func.value, cst.Call):
            if func.attr.value in CALLABLE_METHODS:
                return False
            func = func.value.func  # `torch.ones(n, n).tril()`: a method of torch's result
        dotted = parsed.imported_name(func) or ""
        return dotted.startswith(("math.", "torch.nn.functional.", "torch.nn.init.")) or \
            dotted.count(".") == 1 and dotted.startswith("torch.") and dotted[len("torch."):] not in CALLABLE_TAKING

    return isinstance(small, (cst.Assign, cst.AnnAssign, cst.Import, cst.ImportFrom)) and \
        not descendants(small, (cst.Lambda,)) and all(library(call) for call in descendants(small, (cst.Call,)))


# torch's functions (beside its submodules: `torch.utils.checkpoint.checkpoint`, `torch.autograd.Function.apply`,
# `torch.func.*`, `torch.jit.*`) and tensor methods that run a callable they are given: the program's code, which
# may read a tensor built in steps half built (breaker round 42)
CALLABLE_TAKING = frozenset({"cond", "vmap", "compile", "while_loop", "map", "export", "scan", "associative_scan",
                             "jit", "library"})
CALLABLE_METHODS = frozenset({"apply_", "map_", "map2_", "register_hook", "register_post_accumulate_grad_hook"})


def _registers_buffer(parsed: ParsedModule, read: cst.CSTNode) -> bool:
    """`read` is the tensor `self.register_buffer(name, read)` registers."""
    arg = parsed.parents.get(read)
    call = parsed.parents.get(arg)
    return isinstance(arg, cst.Arg) and arg.value is read and isinstance(call, cst.Call) and \
        len(call.args) >= 2 and call.args[1] is arg and arg.keyword is None and \
        isinstance(call.func, cst.Attribute) and call.func.attr.value == "register_buffer" and \
        isinstance(call.func.value, cst.Name) and call.func.value.value == "self"


def _module_value(parsed: ParsedModule, name: str, registered: tuple[cst.CSTNode, ...] = ()) -> ModuleValue | None:
    variable = module_name(parsed, name)
    bindings = variable.bindings
    if len(bindings) != 1 or name in parsed.imports or reached_by_name(parsed, name) or \
            objects_reached_unseen(parsed) or \
            name in parsed.outside_attribute_writes[0] or \
            parsed.global_rebound_by_computed_name(name) is not None:  # `program.MASK.fill_(...)` here or elsewhere
        return None
    target, value = _unpacked(parsed, bindings[0])
    assign = parsed.parents.get(target)
    if value is None or not isinstance(assign, cst.Assign) or len(assign.targets) != 1 \
            or parsed.innermost(assign, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) is not None \
            or calls_replaced(parsed, value):
        return None
    names = variable.occurrences
    immutable = _immutable(value)  # a number: no read can change it, only another binding
    if not all(_read_only_use(parsed, node, bindings[0], immutable) or
               node in registered and _registers_buffer(parsed, node) for node in names):
        return None
    if parsed.tree is not None and (through_globals(parsed, parsed.tree) if immutable else
                                    written_elsewhere(parsed, parsed.tree, name)) is not None:
        return None
    return ModuleValue(value, parsed.line(assign))


def _unpacked(parsed: ParsedModule, binding: cst.Name) -> tuple[cst.CSTNode | None, cst.BaseExpression | None]:
    """(the assignment target, the value the name gets): `MASK = value`, or `B, S = 2, 16` (a tuple display of as
    many elements, none starred, unpacked into names); (target, None) for any other binding."""
    parent = parsed.parents.get(binding)
    if isinstance(parent, cst.AssignTarget):
        return parent, parsed.parents.get(parent).value if isinstance(parsed.parents.get(parent), cst.Assign) else None
    names = parsed.parents.get(parent)
    target = parsed.parents.get(names)
    assign = parsed.parents.get(target)
    if not (isinstance(parent, cst.Element) and isinstance(names, (cst.Tuple, cst.List)) and
            isinstance(target, cst.AssignTarget) and target.target is names and isinstance(assign, cst.Assign) and
            isinstance(assign.value, (cst.Tuple, cst.List))):
        return None, None
    values = assign.value.elements
    if len(values) != len(names.elements) or any(isinstance(e, cst.StarredElement) for e in (*values, *names.elements)):
        return None, None
    return target, values[list(names.elements).index(parent)].value


def runs_no_code(parsed: ParsedModule, name: str) -> bool:
    """The module-level `name` holds a number, a string or a tensor torch builds, bound once and never written: its
    attributes, operators and conversions run no code of the program's (an object of the program's own class may
    run any: a property, `__repr__`, `__index__`, `__del__`)."""
    found = module_value(parsed, name)
    if found is None:
        return False
    value = found.value
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
            parsed.imported_name(value.func) is None:
        value = value.func.value  # `torch.zeros(n, n).masked_fill(...)`: a tensor's methods give tensors
    return _immutable(found.value) or isinstance(value, cst.Call) and \
        (parsed.imported_name(value.func) or "").startswith("torch.")


def _immutable(value: cst.BaseExpression) -> bool:
    """A number, a string or arithmetic of them (a tuple of them too): no other module can change it in place, only
    rebind its own name or this module's attribute (static.outside_writes reads the latter)."""
    if isinstance(value, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(value, cst.Name):
        return value.value in ("True", "False", "None")
    if isinstance(value, cst.UnaryOperation):
        return _immutable(value.expression)
    if isinstance(value, cst.BinaryOperation):
        return _immutable(value.left) and _immutable(value.right)
    return isinstance(value, cst.Tuple) and all(isinstance(e, cst.Element) and _immutable(e.value)
                                                for e in value.elements)


def _read_only_use(parsed: ParsedModule, node: cst.Name, binding: cst.Name, immutable: bool = False) -> bool:
    """One occurrence of the name: its binding, a name that is not this one (an attribute's, a keyword's), or a
    read that leaves the tensor alone (any read, for an `immutable` value)."""
    parent = parsed.parents.get(node)
    if isinstance(parent, cst.Attribute) and parent.attr is node:  # `sys.modules[__name__].MASK`, not `self.MASK`
        return isinstance(parent.value, cst.Name) and parent.value.value == "self"
    if node is binding or isinstance(parent, cst.Arg) and parent.keyword is node:
        return True
    if isinstance(parent, cst.Param) and parent.default is node:  # `def f(mask=MASK)`: every call omitting it
        function = parsed.innermost(parent, cst.FunctionDef)  # holds the tensor under the parameter's name
        return function is not None and (immutable or local_reads_leave_alone(parsed, function, parent.name.value))
    if isinstance(parent, (cst.Param, cst.NameItem, cst.Del, cst.AsName, cst.ImportAlias, cst.FunctionDef,
                           cst.ClassDef, cst.AssignTarget, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr)) \
            and not (isinstance(parent, (cst.AugAssign, cst.For, cst.CompFor)) and
                     getattr(parent, "target", None) is not node):
        return False  # another binding, a deletion or `global`: the file's one definition is not what every read sees
    return immutable or read_leaves_alone(parsed, node)


def assigned_values(parsed: ParsedModule, name: cst.Name,
                    followed: tuple[cst.CSTNode, ...] = ()) -> list[cst.BaseExpression] | None:
    """What the read `name` can hold: the plain assignments of its function that reach it, when every other read
    there leaves the tensor alone (`local_reads_leave_alone`, `followed` as there), or a module-level tensor's one
    definition (`module_value`); None when anything else may reach it (a parameter, an unpacking, an in-place
    write, an alias)."""
    function = parsed.frame(name)
    flow = parsed.flow(function) if function is not None else None
    if flow is None or flow.reaching.get(name) == frozenset({UNDEFINED}):  # a global read
        found = module_value(parsed, name.value, followed)
        return [found.value] if found is not None else None
    definitions = flow.definitions_of(name)
    if not definitions or flow.sees_undefined(name) or any(d.kind != "assign" or d.index is not None
                                                              for d in definitions):
        return None
    if not local_reads_leave_alone(parsed, function, name.value, followed):
        return None  # an alias, a view or a callee may write the tensor the assignment built
    return [d.value for d in definitions]
