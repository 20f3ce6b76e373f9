"""Arguments spread from a fixed display: `inputs = [q, k, v, MASK]`, then `model(*inputs)` (how a compiler's
attention tests, and programs written like them, call a model), or `kw = {"attn_mask": MASK}`, then
`model(q, k, v, **kw)`.

A name bound once, to a list or tuple display with no starred element (read only as `*name` in calls), or to a
dictionary display of distinct string keys with no `**` inside (read only as `**name`), binds each element to the
parameter at its position (or of its key), as if the call wrote the element there: a spread copies the elements
into the call, so nothing can add, drop or replace one. The elements are the display's expressions, evaluated where
the display is: readers resolve them there (a module-level `MASK` read at the display is the global's one binding).
Any other read of the name (`inputs.append(x)`, `inputs[3] = m`, `kw.update(...)`, `f(inputs)`, a string naming
it, `globals()`), a second binding, another spread, or another file of the tree naming it leaves the call's
arguments unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from advisor.static.global_reach import objects_reached_unseen, reached_by_name

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule


def spread_positionals(parsed: ParsedModule, call: cst.Call, tree=None) -> list[cst.BaseExpression] | None:
    """The call's positional arguments in order, each `*name` spread of a fixed display replaced by its elements;
    None where a spread is anything else. `tree`: the scanned tree (static.call_sites.Tree), whose other files must
    not name a module-level display."""
    return _positionals(parsed, call.args, tree)


def spread_keywords(parsed: ParsedModule, call: cst.Call, tree=None) -> dict[str, cst.BaseExpression] | None:
    """The call's keyword arguments by name, each `**name` spread of a fixed dictionary display (`kw = {"mask": M}`,
    string keys) replaced by its entries; None where a `**` spread is anything else."""
    found: dict[str, cst.BaseExpression] = {}
    for arg in call.args:
        if arg.keyword is not None:
            found[arg.keyword.value] = arg.value
        elif arg.star == "**":
            entries = fixed_mapping(parsed, arg.value, tree) if isinstance(arg.value, cst.Name) else None
            if entries is None:
                return None
            found.update(entries)
    return found


def _positionals(parsed: ParsedModule, args, tree) -> list[cst.BaseExpression] | None:
    found: list[cst.BaseExpression] = []
    for arg in args:
        if arg.keyword is not None:
            continue
        if arg.star == "**":
            if not isinstance(arg.value, cst.Name) or fixed_mapping(parsed, arg.value, tree) is None:
                return None
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
    """The elements of the one list or tuple display the name `read` holds, where every other occurrence of the
    name in the file is a `*name` spread of a call (see the module's docstring); None otherwise."""
    display = _fixed(parsed, read, tree)[0]
    return [element.value for element in display.elements] if isinstance(display, (cst.List, cst.Tuple)) else None


def fixed_mapping(parsed: ParsedModule, read: cst.Name, tree=None) -> dict[str, cst.BaseExpression] | None:
    """The entries of the one dictionary display with string keys the name `read` holds, where every other
    occurrence of the name is a `**name` spread of a call; None otherwise."""
    display = _fixed(parsed, read, tree)[0]
    return {element.key.evaluated_value: element.value for element in display.elements} \
        if isinstance(display, cst.Dict) else None


def _fixed(parsed: ParsedModule, read: cst.Name, tree) -> tuple[cst.BaseExpression | None, list[cst.Arg]]:
    tree = tree if tree is not None else parsed.tree
    return parsed.derived(("fixed-display", read.value, id(tree)), lambda p: _display(p, read.value, tree))


def element_destinations(parsed: ParsedModule, element: cst.CSTNode) -> list[tuple[cst.Call, int | str]] | None:
    """Where an element of a fixed display goes: each call spreading the display, with the position among its
    positional arguments the element takes (a list's or a tuple's) or the keyword it binds (a dictionary's); None
    where the element is in no fixed display (or a call's spreads before it are not all fixed)."""
    display = parsed.parents.get(element)
    target = parsed.parents.get(display) if display is not None else None
    if not isinstance(display, (cst.List, cst.Tuple, cst.Dict)) or not isinstance(target, cst.Assign) or \
            target.value is not display or len(target.targets) != 1 or \
            not isinstance(target.targets[0].target, cst.Name):
        return None
    fixed, spreads = _fixed(parsed, target.targets[0].target, None)
    if fixed is not display:
        return None
    found: list[tuple[cst.Call, int | str]] = []
    for arg in spreads:
        call = parsed.parents.get(arg)
        if isinstance(display, cst.Dict):
            found.append((call, element.key.evaluated_value))
            continue
        position = position_of(parsed, call, arg)
        if position is None:
            return None
        found.append((call, position + list(display.elements).index(element)))
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


def _display(parsed: ParsedModule, name: str, tree) -> tuple[cst.BaseExpression | None, list[cst.Arg]]:
    """The display the name is bound to once, where its every other occurrence is a spread of the display's kind
    (`*` of a list or tuple, `**` of a dictionary with distinct string keys), and those spreads; (None, [])
    otherwise."""
    binding: cst.Assign | None = None
    spreads: list[cst.Arg] = []
    stars: set[str] = set()
    for node in parsed.nodes_of(cst.Name):
        if node.value != name:
            continue
        parent = parsed.parents.get(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node or \
                isinstance(parent, cst.Arg) and parent.keyword is node:
            continue  # `x.inputs`, `f(inputs=...)`: other names
        if isinstance(parent, cst.Arg) and parent.value is node and parent.star:
            spreads.append(parent)
            stars.add(parent.star)
            continue
        assign = parsed.parents.get(parent) if isinstance(parent, cst.AssignTarget) else None
        if binding is not None or not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None, []  # a second binding, or any other read
        binding = assign
    if binding is None or not _display_of(binding.value, stars) or objects_reached_unseen(parsed):
        return None, []
    frame = parsed.frame(binding)
    if frame is None and parsed.innermost(binding, cst.ClassDef) is not None or \
            frame is not None and any(parsed.frame(read) is not frame for read in spreads):
        return None, []  # a class attribute; a local another function's read does not see
    if frame is None and (
            name in parsed.imports or reached_by_name(parsed, name) or
            name in parsed.outside_attribute_writes[0] or parsed.global_rebound_by_computed_name(name) is not None or
            tree is not None and any(path != parsed.path for path in tree.mentioning(name))):
        return None, []  # a global: rebound or reached where no occurrence shows it, here or in another file
    return binding.value, spreads


def _display_of(value: cst.BaseExpression, stars: set[str]) -> bool:
    """A list or tuple display with no starred element spread only by `*`, or a dictionary display of distinct
    string keys (no `**` inside) spread only by `**`."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return stars <= {"*"} and not any(isinstance(e, cst.StarredElement) for e in value.elements)
    if not isinstance(value, cst.Dict) or not stars <= {"**"}:
        return False
    keys = [e.key.evaluated_value if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) else None
            for e in value.elements]
    return all(isinstance(key, str) for key in keys) and len(set(keys)) == len(keys)
