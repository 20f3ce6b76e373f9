"""Where modules may run with other tensors in their buffers' and parameters' places than their classes built: a
call running a module with state given by name (`torch.func.functional_call(model, {"prior": t}, (x,))`), or a write
into a tensor reached through a module's own listing of its buffers. A proof that reads a tensor attribute's
construction (a zeros bias swallows no row, a causal triangle) holds only where neither occurs in the tree."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from advisor.static.dataflow import target_names
from advisor.static.outside_writes import NOT_WRITES, in_place_name
from advisor.static.walk import walk

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule

# what runs a module with parameters and buffers given by name (any of them may be another tensor at that call)
STATE_SWAPS = frozenset({"torch.func.functional_call", "torch.nn.utils.stateless.functional_call",
                         "torch._functorch.functional_call.functional_call",
                         "torch.nn.utils.stateless._reparametrize_module",
                         "functorch.make_functional_with_buffers"})
# methods returning a module's buffers themselves (not copies): writing into what they return writes the buffers
STATE_VIEWS = frozenset({"named_buffers", "buffers", "state_dict"})


MAY_SWAP = re.compile(r"functional_call|_reparametrize_module|make_functional_with_buffers|buffers\(|state_dict\(")


def may_swap(text: str) -> bool:
    """A screen for `state_swaps`: the words without which a file swaps no state."""
    return MAY_SWAP.search(text) is not None


def state_swaps(parsed: ParsedModule) -> list[cst.CSTNode]:
    """Where the file may run or leave modules with other tensors in their buffers' places: a call of STATE_SWAPS,
    or a write into a tensor reached through STATE_VIEWS (`for n, b in m.named_buffers(): b.copy_(band)`,
    `sd = m.state_dict(); sd["attn.bias"].fill_(1)`, `m.state_dict()[k][...] = 0`)."""
    if not may_swap(parsed.source):
        return []
    found: list[cst.CSTNode] = list(parsed.uses_of(STATE_SWAPS))
    tensors, containers = _names_bound_to_state_views(parsed)
    for node in parsed.parents:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                in_place_name(node.func.attr.value) and node.func.attr.value not in NOT_WRITES and \
                _reaches_state_view(node.func.value, tensors, containers, 0):
            found.append(node)
        elif isinstance(node, cst.Call) and any(  # `torch.ones(b.shape, out=b)` (breaker round 27),
                (arg.keyword is not None and arg.keyword.value == "out" or _in_place_function(node.func)) and
                _reaches_state_view(arg.value, tensors, containers, 0) for arg in node.args):
            found.append(node)  # `nn.init.ones_(b)`, `torch._foreach_add_(list(m.buffers()), 1)` (round 28)
        elif isinstance(node, cst.AssignTarget) and _reaches_state_view(node.target, tensors, containers, 1) or \
                isinstance(node, cst.AugAssign) and _reaches_state_view(node.target, tensors, containers, 0):
            found.append(node)  # `b += 1` on a tensor is in place (breaker round 27)
    return found


def _names_bound_to_state_views(parsed: ParsedModule) -> tuple[set[str], set[str]]:
    """(names a loop binds from an expression that calls a STATE_VIEWS method: the tensors, names an assignment
    binds from one: the dict or list holding them), anywhere in the file (a scope-blind over-approximation). A
    comprehension's `for` is a loop; so is a lambda passed beside one (`map(lambda b: b.fill_(1), m.buffers())`)."""
    tensors: set[str] = set()
    containers: set[str] = set()
    for node in parsed.parents:
        if isinstance(node, (cst.For, cst.CompFor)) and _calls_state_view(node.iter):
            tensors.update(name.value for name in target_names(node.target))
        elif isinstance(node, cst.Call) and any(_calls_state_view(a.value) for a in node.args):
            for argument in node.args:
                if isinstance(argument.value, cst.Lambda):
                    tensors.update(p.name.value for p in argument.value.params.params)
        elif isinstance(node, cst.Assign) and _calls_state_view(node.value):
            for target in node.targets:  # `sd = m.state_dict()`: the listing; `(b,) = m.buffers()`,
                listing = _is_state_view_call(node.value) and isinstance(target.target, cst.Name)
                (containers if listing else tensors).update(  # `b = next(m.buffers())`: maybe a tensor itself
                    name.value for name in target_names(target.target))
    return tensors, containers


def _in_place_function(func: cst.BaseExpression) -> bool:
    """A function (not a method) named as writing its arguments: a trailing underscore, or a swap of tensors."""
    name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
    return in_place_name(name) or name == "swap_tensors"


def _is_state_view_call(node: cst.CSTNode) -> bool:
    """`m.buffers()`, `m.state_dict()` itself (not something computed from it)."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in STATE_VIEWS


def _calls_state_view(node: cst.CSTNode) -> bool:
    found = False

    class Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            nonlocal found
            found = found or isinstance(call.func, cst.Attribute) and call.func.attr.value in STATE_VIEWS

    walk(node, Calls())
    return found


def _reaches_state_view(node: cst.BaseExpression, tensors: set[str], containers: set[str], beyond: int) -> bool:
    """Whether `node` (a receiver, or an assignment target with `beyond` = 1) reaches a buffer itself through more
    than `beyond` indexings and attributes (`.data`) of a loop's tensor or of an expression computed from a listing,
    or one more of a container name or a STATE_VIEWS call: `b[0] = 1` and `sd["bias"][0] = 1` write a buffer,
    `sd["bias"] = t` only the dict."""
    depth = 0
    while isinstance(node, (cst.Subscript, cst.Attribute)):
        node, depth = node.value, depth + 1
    if isinstance(node, cst.Name) and node.value in tensors:
        return depth >= beyond
    if isinstance(node, cst.Name) and node.value in containers or _is_state_view_call(node):
        return depth >= beyond + 1
    return not isinstance(node, cst.Name) and _calls_state_view(node) and depth >= beyond  # `next(m.buffers())`,
    # `[b for b in m.buffers()][0]`: may be a tensor itself (breaker round 27)


def state_swapped(parsed: ParsedModule) -> str | None:
    """Why any tensor attribute of the file's classes may hold another tensor than the class assigned when the code
    runs (None: nothing shows it): this file or another of the tree runs modules with state given by name or writes
    into buffers reached by name (`named_buffers()`, `state_dict()`), so a value read from the class's assignment (a
    causal triangle, a zeros prior) is not the one the code sees."""
    own = parsed.derived(state_swapped, lambda p: next(iter(state_swaps(p)), None))
    if own is not None:
        return f"this file replaces or writes modules' buffers by name (line {parsed.line(own)})"
    sites = parsed.project.state_swaps if parsed.project is not None else ()
    elsewhere = next((site for site in sites if site.path != parsed.path), None)
    if elsewhere is not None:
        return f"{elsewhere.describe()}, which replaces or writes modules' buffers by name"
    return None
