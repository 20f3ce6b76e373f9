"""Where modules may run with other tensors in their buffers' and parameters' places than their classes built: a
call running a module with state given by name (`torch.func.functional_call(model, {"prior": t}, (x,))`), or a write
into a tensor reached through a module's own listing of its buffers. A proof that reads a tensor attribute's
construction (a zeros bias swallows no row, a causal triangle) holds only where neither occurs in the tree."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from advisor.static.dataflow import target_names
from advisor.static.outside_writes import NOT_WRITES, RESHAPING_IN_PLACE, in_place_name
from advisor.static.text_screens import then_on_line
from advisor.static.walk import descendants, walk

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule

# what runs a module with parameters and buffers given by name (any of them may be another tensor at that call)
STATE_SWAPS = frozenset({"torch.func.functional_call", "torch.nn.utils.stateless.functional_call",
                         "torch._functorch.functional_call.functional_call",
                         "torch.nn.utils.stateless._reparametrize_module",
                         "functorch.make_functional_with_buffers"})
# methods returning a module's buffers themselves (not copies): writing into what they return writes the buffers
STATE_VIEWS = frozenset({"named_buffers", "buffers", "state_dict"})
MAX_ROUNDS = 8  # names followed from name to name
# names that change a tensor's shape in place: its methods, and `torch.utils.swap_tensors`
SHAPE_CHANGING_NAMES = RESHAPING_IN_PLACE | {"swap_tensors"}
# a word naming one (a call, or a name passed on: `getattr(t, "resize_")`), a `.data` assignment (by its
# descriptor's setter too, `torch.Tensor.data.__set__(t, x)`: any `__set__`, breaker round 38), torch's swap of
# two tensors' data
SHAPE_CHANGE = re.compile(r"\b(?:%s)\b|\.data\s*=(?!=)|" % "|".join(sorted(SHAPE_CHANGING_NAMES)) +
                          then_on_line(r"setattr(?:__)?\(", r"[\"']data[\"']", r")\n") +
                          r"|\b__set__\b|_swap_tensor_impl\b")


# module methods that replace every parameter and buffer by what a function returns, or by uninitialised memory
REBUILDERS = frozenset({"_apply", "to_empty"})
# calls a listing may be handed to that only read it or copy what it holds (`torch.save(m.state_dict(), path)`)
LISTING_READERS = frozenset({"list", "tuple", "iter", "next", "enumerate", "zip", "sorted", "reversed", "len", "dict",
                             "set", "isinstance", "print", "sum", "any", "all", "torch.save", "copy.deepcopy",
                             "load_state_dict", "keys", "values", "items"})
MAY_SWAP = re.compile(r"functional_call|_reparametrize_module|make_functional_with_buffers|buffers\(|state_dict\(|"
                      r"_apply\(|to_empty\(|\.apply\(")


def may_swap(text: str) -> bool:
    """A screen for `state_swaps`: the words without which a file swaps no state."""
    return MAY_SWAP.search(text) is not None


def state_runs(parsed: ParsedModule) -> list[cst.CSTNode]:
    """The calls of STATE_SWAPS, and of REBUILDERS with a function of the file's (not an override's pass-through):
    modules run with, or left holding, any tensor, of any shape or dtype, in their buffers' places."""
    if not may_swap(parsed.source):
        return []
    return list(parsed.uses_of(STATE_SWAPS)) + [
        node for node in parsed.nodes_of(cst.Call) if isinstance(node.func, cst.Attribute) and
        node.func.attr.value in REBUILDERS and not _passed_through(parsed, node)]


def state_swaps(parsed: ParsedModule) -> list[cst.CSTNode]:
    """Where the file may run or leave modules with other tensors in their buffers' places: a call of STATE_SWAPS,
    or a write into a tensor reached through STATE_VIEWS (`for n, b in m.named_buffers(): b.copy_(band)`,
    `sd = m.state_dict(); sd["attn.bias"].fill_(1)`, `m.state_dict()[k][...] = 0`)."""
    if not may_swap(parsed.source):
        return []
    found = state_runs(parsed) + [node for node in parsed.nodes_of(cst.Call) if isinstance(node.func, cst.Attribute)
                                  and node.func.attr.value == "apply" and any(
                                      _makes_a_callable(parsed, arg.value) and not isinstance(arg.value, cst.Lambda)
                                      for arg in node.args)]  # `m.apply(partial(...))`
    views = _StateViews(parsed)
    found += views.handed
    for node in parsed.parents:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                in_place_name(node.func.attr.value) and node.func.attr.value not in NOT_WRITES and \
                views.reached(node.func.value, 0):
            found.append(node)
        elif isinstance(node, cst.Call) and any(  # `torch.ones(b.shape, out=b)` (breaker round 27),
                (arg.keyword is not None and arg.keyword.value == "out" or _in_place_function(node.func)) and
                views.reached(arg.value, 0) for arg in node.args):
            found.append(node)  # `nn.init.ones_(b)`, `torch._foreach_add_(list(m.buffers()), 1)` (round 28)
        elif isinstance(node, cst.AssignTarget) and views.reached(node.target, 1) or \
                isinstance(node, cst.AugAssign) and views.reached(node.target, 0):
            found.append(node)  # `b += 1` on a tensor is in place (breaker round 27)
    return found


def _passed_through(parsed: ParsedModule, call: cst.Call) -> bool:
    """`super()._apply(fn, *args, **kwargs)` in an override `def _apply(self, fn, ...)` (timm's LeViT clears a cache
    there): torch's own `_apply`, with the function its caller gave (`.to()`, `.half()`: torch's calls, which no
    file of the tree makes here), not a function of the file's."""
    receiver, name = call.func.value, call.func.attr.value
    if not (isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and receiver.func.value == "super"
            and not receiver.args and call.args and call.args[0].keyword is None and not call.args[0].star and
            isinstance(call.args[0].value, cst.Name)):
        return False
    method = parsed.innermost(call, cst.FunctionDef)
    parameters = method.params.params if method is not None else ()
    return method is not None and method.name.value == name and len(parameters) >= 2 and \
        parameters[1].name.value == call.args[0].value.value and \
        all(d.kind == "param" for d in parsed.flow(method).definitions.values() if d.name == parameters[1].name.value)


class _StateViews:
    """The names that may hold a module's buffers themselves, or a listing of them: names a loop binds from an
    expression that calls a STATE_VIEWS method or reads such a name (the tensors), names an assignment, a `:=` or a
    `with` binds from one (an assignment of the listing itself, or of a literal holding it: the dict or list
    holding them), followed from name to name (`g = iter(m.buffers())`, then `for t in g`, `next(g)`), anywhere in
    the file (a scope-blind over-approximation), except a comprehension's, which Python binds inside the
    comprehension alone (`{x for x in self.state_dict().keys()}` says nothing of an `x` elsewhere; its `:=` binds
    outside). A lambda passed beside a listing (`map(lambda b: b.fill_(1), m.buffers())`) binds its parameters as a
    loop, and a helper of the file given one binds its parameters as listings; any other call given one, but those
    that only read it (LISTING_READERS), may write what it holds (`handed`)."""

    def __init__(self, parsed: ParsedModule) -> None:
        self.parsed = parsed
        self.tensors: set[str] = set()
        self.containers: dict[str, int] = {}  # name -> the indexings that reach a tensor in what it holds
        self.comprehended: dict[str, list[cst.CSTNode]] = {}  # name -> the comprehensions binding it
        self.handed: list[cst.Call] = []  # calls given a listing that may write what it holds
        bindings = [node for node in parsed.parents if isinstance(node, (
            cst.For, cst.CompFor, cst.Call, cst.Assign, cst.NamedExpr, cst.WithItem))]
        for _ in range(MAX_ROUNDS):  # until no binding adds a name (a chain of names is followed one per round)
            known = self._bound()
            for node in bindings:
                self._bind(node)
            if self._bound() == known:
                break

    def _bound(self) -> int:
        return len(self.tensors) + len(self.containers) + sum(map(len, self.comprehended.values()))

    def _bind(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.For) and self._reads_views(node.iter):
            self.tensors.update(name.value for name in target_names(node.target))
        elif isinstance(node, cst.CompFor) and self._reads_views(node.iter):
            comprehension = self._comprehension(node)
            for name in target_names(node.target):
                if comprehension not in self.comprehended.setdefault(name.value, []):
                    self.comprehended[name.value].append(comprehension)
        elif isinstance(node, cst.Call) and any(self._reads_views(a.value) for a in node.args):
            lambdas = [a.value for a in node.args if isinstance(a.value, cst.Lambda)]
            for function in lambdas:
                self.tensors.update(p.name.value for p in function.params.params)
            called = self.parsed.module_functions.get(node.func.value) if isinstance(node.func, cst.Name) else None
            if called is not None:  # `zap(m.buffers())`: the helper's parameters hold the listing
                self.containers.update({p.name.value: 1 for p in called.params.params
                                        if p.name.value not in self.containers})
            elif not lambdas and not self._reads_only(node) and node not in self.handed:
                self.handed.append(node)  # `map(partial(torch.Tensor.fill_, value=1), m.buffers())`
        elif isinstance(node, cst.Assign) and self._reads_views(node.value):
            depth = _listing_depth(node.value)
            for target in node.targets:  # `sd = m.state_dict()`: the listing; `(b,) = m.buffers()`,
                if depth and isinstance(target.target, cst.Name):  # `b = next(m.buffers())`: maybe a tensor
                    self.containers[target.target.value] = min(depth, self.containers.get(target.target.value,
                                                                                            depth))
                else:
                    self.tensors.update(name.value for name in target_names(target.target))
        elif isinstance(node, cst.NamedExpr) and self._reads_views(node.value) or \
                isinstance(node, cst.WithItem) and node.asname is not None and self._reads_views(node.item):
            target = node.target if isinstance(node, cst.NamedExpr) else node.asname.name
            self.tensors.update(name.value for name in target_names(target))

    def _reads_only(self, call: cst.Call) -> bool:
        """A call that only reads a listing it is given, or copies what it holds (LISTING_READERS), given no callable
        it may run on the tensors (`sorted(m.buffers(), key=partial(torch.Tensor.sub_, other=1))`: breaker round
        41)."""
        if any(arg.keyword is not None and arg.keyword.value == "key" or _makes_a_callable(self.parsed, arg.value)
               for arg in call.args):
            return False
        dotted = self.parsed.imported_name(call.func)
        name = dotted if dotted is not None else call.func.attr.value if isinstance(call.func, cst.Attribute) else \
            call.func.value if isinstance(call.func, cst.Name) and call.func.value not in self.parsed.bindings else ""
        return name in LISTING_READERS

    def _reads_views(self, node: cst.BaseExpression) -> bool:
        """`node` calls a STATE_VIEWS method or reads a name that may hold what one gives."""
        return _calls_state_view(node) or any(self._tensor_name(name) or name.value in self.containers
                                              for name in descendants(node, (cst.Name,)))

    def _comprehension(self, node: cst.CompFor) -> cst.CSTNode:
        while isinstance(self.parsed.parents.get(node), cst.CompFor):  # `for a in x for b in a`: nested fors
            node = self.parsed.parents[node]
        return self.parsed.parents.get(node, node)

    def _tensor_name(self, name: cst.Name) -> bool:
        return name.value in self.tensors or any(self.parsed.within(name, comprehension)
                                                 for comprehension in self.comprehended.get(name.value, ()))

    def reached(self, node: cst.BaseExpression, beyond: int) -> bool:
        """Whether `node` (a receiver, or an assignment target with `beyond` = 1) reaches a buffer itself through
        more than `beyond` indexings and attributes (`.data`) of a loop's tensor or of an expression computed from a
        listing, or one more of a container name or a STATE_VIEWS call: `b[0] = 1` and `sd["bias"][0] = 1` write a
        buffer, `sd["bias"] = t` only the dict."""
        depth = 0
        while isinstance(node, (cst.Subscript, cst.Attribute)):
            node, depth = node.value, depth + 1
        if isinstance(node, cst.Name) and self._tensor_name(node):
            return depth >= beyond
        if isinstance(node, cst.Name) and node.value in self.containers:
            return depth >= beyond + self.containers[node.value]
        if _is_state_view_call(node):
            return depth >= beyond + 1
        return not isinstance(node, cst.Name) and self._reads_views(node) and depth >= beyond  # `next(m.buffers())`,
        # `[b for b in m.buffers()][0]`: may be a tensor itself (breaker round 27)


def _makes_a_callable(parsed: ParsedModule, node: cst.BaseExpression) -> bool:
    """A lambda, or a callable built by `functools.partial`/`operator.methodcaller` (which may call anything, an
    in-place method or `register_buffer`, on what it is given)."""
    return isinstance(node, cst.Lambda) or isinstance(node, cst.Call) and parsed.imported_name(node.func) in (
        "functools.partial", "operator.methodcaller", "functools.partialmethod")


def _listing_depth(value: cst.BaseExpression) -> int | None:
    """The indexings that reach a tensor in a listing (`m.state_dict()`: 1), or in a literal holding listings as its
    elements (`{"epoch": e, "model": m.state_dict()}`: 2; `{**m.state_dict()}`: 1); None where the listing is
    reached otherwise (`next(m.buffers())`, `list(...)`: maybe a tensor itself)."""
    if _is_state_view_call(value):
        return 1
    if not isinstance(value, (cst.Dict, cst.List, cst.Tuple, cst.Set)):
        return None
    depths = []
    for element in value.elements:
        if isinstance(element, cst.DictElement) and _calls_state_view(element.key):
            return None
        inner = element.value
        if not _calls_state_view(inner):
            continue
        if isinstance(element, (cst.StarredDictElement, cst.StarredElement)):
            depths.append(_listing_depth(inner))  # its items are this literal's own
        else:
            found = _listing_depth(inner)
            depths.append(None if found is None else found + 1)
    return None if not depths or None in depths else min(depths)


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


def state_swapped(parsed: ParsedModule, elements_ok: bool = False) -> str | None:
    """Why any tensor attribute of the file's classes may hold another tensor than the class assigned when the code
    runs (None: nothing shows it): this file or another of the tree runs modules with state given by name or writes
    into buffers reached by name (`named_buffers()`, `state_dict()`), so a value read from the class's assignment (a
    causal triangle, a zeros prior) is not the one the code sees. `elements_ok`: the caller reads only rank and
    dtype, which a write into a buffer's elements keeps (timm's `bn_buf /= world_size` over `named_buffers()`), so
    only modules run with state given by name count, unless a file of the tree names an in-place shape change."""
    project = parsed.project
    runs_only = elements_ok and tree_keeps_shapes(parsed)
    own = parsed.derived((state_swapped, runs_only),
                         lambda p: next(iter(state_runs(p) if runs_only else state_swaps(p)), None))
    if own is not None:
        return f"this file replaces or writes modules' buffers by name (line {parsed.line(own)})"
    sites = (project.state_runs if runs_only else project.state_swaps) if project is not None else ()
    elsewhere = next((site for site in sites if site.path != parsed.path), None)
    if elsewhere is not None:
        return f"{elsewhere.describe()}, which replaces or writes modules' buffers by name"
    return None


def tree_keeps_shapes(parsed: ParsedModule) -> bool:
    """No file of the scanned tree names an in-place shape change (ProjectFacts.shape_changes: `unsqueeze_`, `set_`,
    a `.data` assignment), the only ways code handed a tensor changes its rank or dtype without rebinding it. A file
    scanned alone (no project facts, a tree of one file) is its own tree: its own text decides (it counted as
    changing shapes, so a file scanned alone never read a buffer's rank past `m.apply(partial(...))`)."""
    if parsed.project is not None:
        return not parsed.project.shape_changes
    alone = parsed.tree is not None and len(parsed.tree.paths) == 1  # not a file the call-site index read
    return alone and parsed.derived(tree_keeps_shapes, lambda p: first_shape_change(p.source) is None)


def first_shape_change(text: str) -> re.Match | None:
    """The text's first word that may change a tensor's shape where no reader of another file sees it (strings and
    comments too: what it is handed may be any tensor of the tree)."""
    return SHAPE_CHANGE.search(text)
