"""Positional arguments spread from a fixed display: `inputs = [q, k, v, MASK]`, then `model(*inputs)` (how a
compiler's attention tests, and programs written like them, call a model).

A name bound once, to a list or tuple display with no starred element, and read only as `*name` in calls (a spread
copies the elements into the call, so nothing can add, drop or replace one) binds each element to the parameter at
its position, as if the call wrote the element there. The elements are the display's expressions, evaluated where
the display is: readers resolve them there (a module-level `MASK` read at the display is the global's one binding).
Any other read of the name (`inputs.append(x)`, `inputs[3] = m`, `f(inputs)`, a string naming it, `globals()`), a
second binding, `**kwargs`, or another file of the tree naming it leaves the call's arguments unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from advisor.static.global_reach import reached_by_name

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule


def spread_positionals(parsed: ParsedModule, call: cst.Call, tree=None) -> list[cst.BaseExpression] | None:
    """The call's positional arguments in order, each `*name` spread of a fixed display replaced by its elements;
    None where a spread is anything else (or `**` spreads keywords). `tree`: the scanned tree (static.call_sites.Tree),
    whose other files must not name a module-level display."""
    return _positionals(parsed, call.args, tree)


def _positionals(parsed: ParsedModule, args, tree) -> list[cst.BaseExpression] | None:
    found: list[cst.BaseExpression] = []
    for arg in args:
        if arg.star == "**":
            return None
        if arg.keyword is not None:
            continue
        if not arg.star:
            found.append(arg.value)
            continue
        elements = fixed_display(parsed, arg.value, tree) if isinstance(arg.value, cst.Name) else None
        if elements is None:
            return None
        found.extend(elements)
    return found


def fixed_display(parsed: ParsedModule, read: cst.Name, tree=None) -> list[cst.BaseExpression] | None:
    """The elements of the one display the name `read` holds, where every other occurrence of the name in the file
    is a `*name` spread of a call (see the module's docstring); None otherwise."""
    tree = tree if tree is not None else parsed.tree
    return parsed.derived(("fixed-display", read.value, id(tree)), lambda p: _display(p, read.value, tree))


def element_positions(parsed: ParsedModule, element: cst.Element) -> list[tuple[cst.Call, int]] | None:
    """Where an element of a fixed display goes: each call spreading the display, with the position among its
    positional arguments the element takes; None where the element is in no fixed display (or a call's spreads are
    not all fixed)."""
    display = parsed.parents.get(element)
    target = parsed.parents.get(display) if display is not None else None
    if not isinstance(display, (cst.List, cst.Tuple)) or not isinstance(target, cst.Assign) or \
            target.value is not display or len(target.targets) != 1 or \
            not isinstance(target.targets[0].target, cst.Name):
        return None
    name = target.targets[0].target
    if fixed_display(parsed, name) is None:
        return None
    index = list(display.elements).index(element)
    found = []
    for read in parsed.nodes_of(cst.Name):
        arg = parsed.parents.get(read)
        if read.value != name.value or not (isinstance(arg, cst.Arg) and arg.value is read and arg.star == "*"):
            continue
        call = parsed.parents.get(arg)
        position = position_of(parsed, call, arg)
        if position is None:
            return None
        found.append((call, position + index))
    return found


def position_of(parsed: ParsedModule, call: cst.Call, arg: cst.Arg) -> int | None:
    """How many positional arguments the call passes before `arg` (the elements of fixed displays spread before it
    counted); None where a spread before it is no fixed display."""
    before = []
    for given in call.args:
        if given is arg:
            break
        before.append(given)
    found = _positionals(parsed, before, parsed.tree)
    return len(found) if found is not None else None


def _display(parsed: ParsedModule, name: str, tree) -> list[cst.BaseExpression] | None:
    binding: cst.Assign | None = None
    spreads: list[cst.Name] = []
    for node in parsed.nodes_of(cst.Name):
        if node.value != name:
            continue
        parent = parsed.parents.get(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node or \
                isinstance(parent, cst.Arg) and parent.keyword is node:
            continue  # `x.inputs`, `f(inputs=...)`: other names
        if isinstance(parent, cst.Arg) and parent.value is node and parent.star == "*":
            spreads.append(node)
            continue
        assign = parsed.parents.get(parent) if isinstance(parent, cst.AssignTarget) else None
        if binding is not None or not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None  # a second binding, or any other read
        binding = assign
    if binding is None or not isinstance(binding.value, (cst.List, cst.Tuple)) or \
            any(isinstance(element, cst.StarredElement) for element in binding.value.elements):
        return None
    frame = parsed.frame(binding)
    if frame is None and parsed.innermost(binding, cst.ClassDef) is not None or \
            frame is not None and any(parsed.frame(read) is not frame for read in spreads):
        return None  # a class attribute; a local another function's read does not see
    if frame is None and (
            name in parsed.imports or reached_by_name(parsed, name) or
            name in parsed.outside_attribute_writes[0] or parsed.global_rebound_by_computed_name(name) is not None or
            tree is not None and any(path != parsed.path for path in tree.mentioning(name))):
        return None  # a global: rebound or reached where no occurrence shows it, here or in another file
    return [element.value for element in binding.value.elements]
