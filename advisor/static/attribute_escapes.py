"""Whether a tensor a class builds for an attribute (a causal buffer, a learned table) still holds what the class
built when a block reads it: every read of the attribute in the file is followed (static/tensor_reads.py) until it
only computes a new tensor or reads metadata. A read that hands it on or writes through what holds it (`d =
{"b": m.bias}`, `lst.append(self.bias)`, `b = self.bias; b[0] = 1`, `.numpy()`, a call of a function no file shows)
may change it unseen by any reading of writes on `.bias` itself (breaker round 11). Reads on `self` count in the
class and the classes related to it by inheritance; reads on any other object count for every class.

Linear in the file: the reads of one attribute name are classified once (by the class whose `self` they read, or
none), whatever the number of classes that ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
import networkx as nx

from advisor.contracts.finding import display_path
from advisor.static.outside_writes import ANY_LISTED, ANY_TENSOR, ATTRIBUTE_TABLES, GETTERS, NARROWED
from advisor.static.dataflow import is_self
from advisor.static.state_swaps import state_swapped, tree_keeps_shapes
from advisor.static.tensor_reads import builds_tensor, leaves_alone, registered_buffers

if TYPE_CHECKING:
    from advisor.static.module_index import ClassInfo, ParsedModule


def attribute_escape(parsed: ParsedModule, owner: ClassInfo, attribute: str, elements_ok: bool = False,
                     finite_ok: bool = False) -> str | None:
    """Where a read of the tensor `owner` builds for `attribute` may write it or hand it on (None: every read leaves
    it alone, or the class builds no tensor there): a read of `.attribute` or `getattr(x, "attribute")`
    on any object but `self` (outside an `isinstance` test that narrows it to torch.nn classes, which an
    nn.Module-only class is not), or on `self` in a method of `owner` or a class related to it by inheritance.
    Writes through the name itself (`self.bias[0] = 1`) count where the receiver is `self` (on another object,
    static.outside_writes reads them), unless `elements_ok`: the caller reads only what writes into the elements
    keep (rank, dtype; the class's collector reads the writes that reshape). `finite_ok`: a torch.nn.init draw of
    moderate values into it does not count (`nn.init.trunc_normal_(self.table, std=.02)`: a learned table's values
    are any finite ones). Another file of the tree that hands a module's tensors on whole (ANY_TENSOR,
    static.escaping_reads), and this file or another running modules with state given by name (`functional_call`,
    static.state_swaps: not for a learned table, whose loaded values are trained ones), count for every such
    attribute."""
    if not any(builds_tensor(parsed, value) for value in owner.attributes.get(attribute, [])) and \
            (owner.node, attribute) not in registered_buffers(parsed):
        return None
    escapes = parsed.derived(("attribute-escapes", attribute, elements_ok, finite_ok),
                             lambda p: _escapes(p, attribute, elements_ok, finite_ok))
    lines = [escapes.on_self.get(cls) for cls in _families(parsed).get(owner.node, (owner.node,))]
    lines.append(escapes.elsewhere_unnarrowed if owner.plain_module else escapes.elsewhere)
    found = [line for line in lines if line is not None]
    if found:
        return f"a read of `.{attribute}` on line {min(found)}"
    swapped = state_swapped(parsed, elements_ok) if not finite_ok else None
    if swapped is not None:
        return f"{swapped}, which may put any tensor in `.{attribute}`'s place"
    return _handed_on_elsewhere(parsed, owner, attribute, elements_ok, finite_ok)


def _handed_on_elsewhere(parsed: ParsedModule, owner: ClassInfo, attribute: str, elements_ok: bool,
                         finite_ok: bool) -> str | None:
    """Where another file of the tree reads the attribute on an object that may be this class's instance in a way
    that may hand its tensor on, or hands any tensor on (`m._apply(f)`), or a module's tensors listed whole
    (`torch.save(model.state_dict(), f)`): not for a learned table, `finite_ok`, whose loaded values are trained
    ones; and a listing not for a reader of rank and dtype alone (`elements_ok`) where the tree keeps shapes
    (`state_swaps.tree_keeps_shapes`; rebinding the attribute is outside_writes' business)."""
    for entry, path in owner.handed_on(attribute):
        if not (NARROWED in entry and owner.plain_module):
            return f"a read of `.{attribute}` in `{display_path(path)}`"
    if finite_ok:
        return None
    listed = owner.handed_on(ANY_TENSOR)
    if not (elements_ok and tree_keeps_shapes(parsed)):
        listed += owner.handed_on(ANY_LISTED)
    return f"a module's tensors listed whole, read in `{display_path(listed[0][1])}`" if listed else None


@dataclass
class _Escapes:
    """The first line of an escaping read of one attribute name: on `self`, by the class it is read in; on other
    objects; on other objects outside `isinstance` tests narrowing them to torch.nn classes."""

    on_self: dict[cst.ClassDef, int] = field(default_factory=dict)
    elsewhere: int | None = None
    elsewhere_unnarrowed: int | None = None


def _escapes(parsed: ParsedModule, attribute: str, elements_ok: bool, finite_ok: bool) -> _Escapes:
    found = _Escapes()
    reads = [(node, node.value, False) for node in parsed.attributes_named(attribute)] + \
        _reads_by_name(parsed, attribute)
    for read, receiver, unseen in reads:
        if _binds(parsed, read) or finite_ok and _finite_draw_into(parsed, read) or _rebinding_itself(parsed, read):
            continue  # `self.bias = t`, `del m.bias`: a binding, which the class's collectors read
        on_self = is_self(receiver)
        if leaves_alone(parsed, read, 0, writes_seen=elements_ok or not (on_self or unseen)):
            continue
        line = parsed.line(read)
        if on_self:
            cls = parsed.innermost(read, cst.ClassDef)
            found.on_self[cls] = min(line, found.on_self.get(cls, line))
            continue
        found.elsewhere = min(line, found.elsewhere or line)
        if not _narrowed_to_torch_nn(parsed, read, receiver):
            found.elsewhere_unnarrowed = min(line, found.elsewhere_unnarrowed or line)
    return found


def _reads_by_name(parsed: ParsedModule, attribute: str) -> list[tuple[cst.BaseExpression, cst.BaseExpression, bool]]:
    """Reads that name the attribute in a string, with their receivers and whether a write straight through them goes
    unseen by static.outside_writes: `getattr(m, "bias")` (seen), `m.get_buffer("bias")`, `m._buffers["bias"]`,
    `m.state_dict()["attn.bias"]` (whose tensors share the buffers' storage), `vars(m)["bias"]`."""
    found = []
    for string in _strings(parsed).get(attribute, []):
        arg = parsed.parents.get(string)
        call = parsed.parents.get(arg)
        if isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and call.args:
            func = call.func
            if isinstance(func, cst.Name) and func.value == "getattr" and len(call.args) >= 2 and \
                    call.args[1] is arg:
                found.append((call, call.args[0].value, False))
            elif isinstance(func, cst.Attribute) and func.attr.value in GETTERS and call.args[0] is arg:
                found.append((call, func.value, True))
            continue
        subscript = parsed.parents.get(parsed.parents.get(arg))
        if isinstance(arg, cst.Index) and isinstance(subscript, cst.Subscript):
            table = subscript.value
            owner = table.value if isinstance(table, cst.Attribute) and table.attr.value in ATTRIBUTE_TABLES else \
                table.args[0].value if isinstance(table, cst.Call) and isinstance(table.func, cst.Name) and \
                table.func.value == "vars" and table.args else table
            found.append((subscript, owner, True))
    return found


def _strings(parsed: ParsedModule) -> dict[str, list[cst.SimpleString]]:
    """The file's string literals by the attribute name they end with (`"bias"`, `"attn.bias"`), once per file."""
    def build(parsed: ParsedModule) -> dict[str, list[cst.SimpleString]]:
        found: dict[str, list[cst.SimpleString]] = {}
        for node in parsed.nodes_of(cst.SimpleString):
            if len(node.value) > 80 or " " in node.value:
                continue  # a docstring or a message names no attribute
            value = node.evaluated_value
            if isinstance(value, str) and value.isascii() and value.replace(".", "").replace("_", "").isalnum():
                found.setdefault(value.rsplit(".", 1)[-1], []).append(node)
        return found
    return parsed.derived("strings-by-attribute", build)


def _families(parsed: ParsedModule) -> dict[cst.ClassDef, frozenset[cst.ClassDef]]:
    """Each class of the file -> the classes joined to it by inheritance within the file, by their base names (every
    class of its connected component: the classes it derives from and those deriving from it among them)."""
    def build(parsed: ParsedModule) -> dict[cst.ClassDef, frozenset[cst.ClassDef]]:
        classes = parsed.nodes_of(cst.ClassDef)
        by_name: dict[str, list[cst.ClassDef]] = {}
        for cls in classes:
            by_name.setdefault(cls.name.value, []).append(cls)
        graph = nx.Graph()
        graph.add_nodes_from(classes)
        graph.add_edges_from((cls, base) for cls in classes for arg in cls.bases
                             for base in by_name.get(_base_name(arg.value), ()))
        return {cls: frozenset(component) for component in nx.connected_components(graph) for cls in component}
    return parsed.derived("class-families", build)


def _rebinding_itself(parsed: ParsedModule, read: cst.CSTNode) -> bool:
    """`self.table = nn.Parameter(resize(self.table, ...))` (timm's `set_window_size`): the statement binds the
    attribute anew, so what the call does to the old tensor is never what the attribute holds afterwards (the new
    value is one more of the class's bindings, which its collectors read)."""
    statement = parsed.innermost(read, (cst.Assign, cst.BaseSmallStatement))
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1 and
            isinstance(statement.targets[0].target, cst.Attribute) and isinstance(read, cst.Attribute)):
        return False
    target = statement.targets[0].target
    return target.attr.value == read.attr.value and parsed.code(target.value) == parsed.code(read.value)


def _binds(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    parent = parsed.parents.get(node)
    return isinstance(parent, (cst.AssignTarget, cst.Del)) or isinstance(parent, cst.AnnAssign) and \
        parent.target is node


# torch.nn.init's draws, which libraries mirror under the same names (timm's `trunc_normal_`)
INIT_DRAWS = frozenset({"trunc_normal_", "normal_", "uniform_", "zeros_", "ones_", "constant_", "xavier_normal_",
                        "xavier_uniform_", "kaiming_normal_", "kaiming_uniform_", "orthogonal_", "eye_", "dirac_"})


def _finite_draw_into(parsed: ParsedModule, read: cst.CSTNode) -> bool:
    """`read` is what an init draw (torch.nn.init's, or a function of its names) draws into, every other argument a
    number below 1000 in magnitude."""
    arg = parsed.parents.get(read)
    call = parsed.parents.get(arg)
    if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and call.args[0] is arg):
        return False
    dotted = parsed.imported_name(call.func) or ""
    return (dotted.startswith("torch.nn.init.") or dotted.rsplit(".", 1)[-1] in INIT_DRAWS) and \
        all(_moderate_number(other.value) for other in call.args[1:])


def _moderate_number(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float)) and abs(float(node.evaluated_value)) < 1000


def _base_name(node: cst.BaseExpression) -> str | None:
    return node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else None


def _narrowed_to_torch_nn(parsed: ParsedModule, read: cst.CSTNode, receiver: cst.BaseExpression) -> bool:
    """`read` sits in the body of `if isinstance(module, nn.Linear):` and reads an attribute of `module` (or of what
    it indexes): the object is an instance of torch.nn classes other than Module (nanoGPT's `_init_weights`)."""
    while isinstance(receiver, (cst.Attribute, cst.Subscript)):
        receiver = receiver.value
    if not isinstance(receiver, cst.Name):
        return False
    node, above = read, parsed.parents.get(read)
    while above is not None:
        if isinstance(above, cst.If) and node is above.body and \
                _isinstance_torch_nn(parsed, above.test, receiver.value) and \
                not _rebound_within(parsed, above.body, receiver.value):
            return True
        node, above = above, parsed.parents.get(above)
    return False


def _isinstance_torch_nn(parsed: ParsedModule, test: cst.BaseExpression, name: str) -> bool:
    if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value == "isinstance" and
            len(test.args) == 2 and isinstance(test.args[0].value, cst.Name) and test.args[0].value.value == name):
        return False
    classes = test.args[1].value
    listed = [element.value for element in classes.elements] if isinstance(classes, cst.Tuple) else [classes]
    dotted = [parsed.imported_name(cls) or "" for cls in listed]
    return all(d.startswith("torch.nn.") and d.rsplit(".", 1)[-1] != "Module" for d in dotted)


def _rebound_within(parsed: ParsedModule, body: cst.CSTNode, name: str) -> bool:
    """Whether `name` is bound anew somewhere inside `body` (an assignment, a loop, a walrus)."""
    for node in parsed.names_spelled(name):
        parent = parsed.parents.get(node)
        binding = isinstance(parent, cst.AssignTarget) or \
            isinstance(parent, (cst.For, cst.CompFor, cst.NamedExpr, cst.AugAssign, cst.AnnAssign)) and \
            parent.target is node
        if binding and parsed.within(node, body):
            return True
    return False
