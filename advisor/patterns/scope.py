"""What the attention proof must know about the code around a block: where it runs, what else writes what it
reads, and which code actually runs when it calls `self.x`.

A rewrite moves the whole computation to the value product and deletes the rest. That is exact only when
every deleted statement ran exactly as often and in the same context as the value product (loops, `with`),
nothing between them writes an attribute the SDPA call re-reads, no other name bound by a deleted statement
is still read, and the `self.` calls it inlines or deletes are the ones that run: no subclass in the file
overrides them, and no deleted module call is a hook point. Each check returns the reason it fails (None when
it holds); the matcher turns a reason into a refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
import networkx as nx

from advisor.contracts.finding import ScanError, display_path
from advisor.static.tensor_reads import read_leaves_alone
from advisor.patterns.argument_writes import argument_call, writes_arguments
from advisor.patterns.ops import SHAPE_ONLY_ARGUMENT
from advisor.patterns.storage_aliases import FRESH_TENSOR_OPS, METADATA_READS, binding_origins, may_alias
from advisor.static.class_sites import ANY_NAME, PLAIN_BASE_NAMES, UNNAMED_BASE, class_sites
from advisor.static.dataflow import Definition, FunctionFlow, expression_root, is_inplace_method, is_self_attribute, \
    loaded_names, target_names
from advisor.static.discover import read_source
from advisor.static.module_index import LIBRARY_ROOTS, ClassInfo, ParsedModule
from advisor.static.op_overrides import op_overrides
from advisor.static.opening_imports import opening_imports_end
from advisor.static.op_restores import replaces
from advisor.static.sdpa_kernels import math_kernel_excluded
from advisor.static.outside_writes import REPLACEABLE_ROOTS
from advisor.static.project import GLOBAL_CALL_HOOKS, HOOK_METHODS, HookSite, ProjectFacts, first_elsewhere, \
    func_transform_uses, fx_trace_uses, global_hook_calls, hooks_by_computed_name, jit_trace_uses, \
    real_trace_uses
from advisor.static.walk import children, descendants
from advisor.static.walk import walk as visit_tree

REPEATING = (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Lambda)
CONTEXTS = (cst.With, cst.Try)
SCRIPT_DECORATORS = {"torch.jit.script", "torch.jit.script_method"}


def enclosing_contexts(parsed: ParsedModule, node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    """Loops, comprehensions, lambdas, `with` and `try` statements around a node, inside its function."""
    found = []
    current = parsed.parents.get(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        if isinstance(current, REPEATING + CONTEXTS):
            found.append(current)
        current = parsed.parents.get(current)
    return tuple(reversed(found))


def same_context(parsed: ParsedModule, nodes: list[cst.CSTNode], output: cst.CSTNode) -> str | None:
    """The deleted statements must run exactly when the value product runs: under the same loops (else SDPA
    recomputes weights computed once, or reuses one dropout draw per iteration) and the same `with` blocks
    (`torch.no_grad()`, `autocast`: the scores' gradient or dtype would change)."""
    wanted = enclosing_contexts(parsed, output)
    for node in nodes:
        have = enclosing_contexts(parsed, node)
        if have == wanted:
            continue
        differing = [c for c in set(have) ^ set(wanted)]
        first = min(differing, key=lambda c: parsed.line(c))
        kind = type(first).__name__
        where = f"line {parsed.line(first)}"
        if isinstance(first, REPEATING):
            side = "value product" if first in wanted else "scores"
            return (f"the {side} run{'s' if side == 'value product' else ''} inside a loop or comprehension "
                    f"({where}) that the rest of the block is not in, so SDPA would not run as often as the "
                    f"original's steps")
        return f"the block spans a `{kind.lower()}` statement ({where}) whose context would no longer apply to all of it"
    return None


# calls that switch grad mode or autocast for every statement after them (not as a `with` item, which is a context)
MODE_SETTERS = frozenset({"set_grad_enabled", "_set_grad_enabled", "set_autocast_enabled", "set_autocast_dtype",
                          "set_autocast_cpu_enabled", "set_autocast_gpu_dtype", "set_autocast_cpu_dtype",
                          "_set_fwd_grad_enabled", "set_default_dtype", "_set_autocast_enabled"})


def mode_switched(parsed: ParsedModule, functions: list[cst.FunctionDef]) -> str | None:
    """`torch.set_grad_enabled(False)` called as a statement in a function of the block: the statements after it
    run without grad (or under another autocast) and those before it do not, which the `with`-based context check
    does not see; the deleted statements and the SDPA call would not run under the same mode."""
    for call in (call for name in MODE_SETTERS for call in parsed.calls_by_name.get(name, [])):
        if parsed.innermost(call, cst.FunctionDef) in functions and \
                not isinstance(parsed.parents.get(call), cst.WithItem):
            return (f"`{parsed.code(call)}` (line {parsed.line(call)}) switches grad mode or autocast for the "
                    f"statements after it, which the block's statements would no longer all run under")
    return None


def attribute_paths(parsed: ParsedModule, nodes: list[cst.CSTNode]) -> set[str]:
    """Dotted attribute reads (`self.mem_k`, `self.attn_drop.p`) in the expressions the SDPA call re-reads."""
    visitor = _AttributePaths(parsed)
    for node in nodes:
        visit_tree(node, visitor)
    return visitor.found


class _AttributePaths(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule):
        self.parsed = parsed
        self.found: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        path = _dotted(node)
        if path is not None and self.parsed.imported_name(node) is None:
            self.found.add(path)
        return True


def attribute_written_between(parsed: ParsedModule, function: cst.FunctionDef, owner: ClassInfo | None,
                              paths: set[str], first_line: int, last_line: int) -> str | None:
    """A statement between the scores and the value product that assigns, or writes in place, an attribute
    the SDPA call re-reads (itself, or through a method of this class it calls): the original read it before
    the write, the SDPA call would read it after."""
    if not paths:
        return None
    for node, written in _attribute_writes(parsed, function) + _writes_of_called_methods(parsed, function, owner):
        line = parsed.line(node)
        if first_line < line < last_line and any(_overlaps(path, written) for path in paths):
            return f"`{written}` is written at line {line}, between the scores and the value product"
    return None


def _overlaps(path: str, written: str) -> bool:
    return path == written or path.startswith(written + ".") or written.startswith(path + ".")


def _writes_of_called_methods(parsed: ParsedModule, function: cst.FunctionDef,
                              owner: ClassInfo | None) -> list[tuple[cst.CSTNode, str]]:
    """`self.update_cache(k)`: the `self.` attributes the called method writes, located at the call."""
    if owner is None:
        return []
    found: list[tuple[cst.CSTNode, str]] = []
    for node in _calls_of_self_methods(function):
        method = owner.methods.get(node.func.attr.value)
        if method is not None and method is not function:
            found.extend((node, written) for _, written in _attribute_writes(parsed, method)
                         if written == "self" or written.startswith("self."))  # `self.eval()`: all of it
            if parsed.derived(("writes by other names", method), lambda p: _writes_by_other_names(p.code(method))):
                found.append((node, "self"))
    return found


# a method that may write any attribute of `self` by another name: through an alias of `self` or its namespace
# (`s = self; s.hd = 4`, `self.__dict__["hd"] = 4`, `setattr`), or through an alias of its state that it assigns
# an attribute on (`cfg = self.config; cfg.output_attentions = True`)
WRITES_BY_OTHER_NAMES = re.compile(r"=\s*self\s*(?:$|[,;)\]#])|\b(?:__dict__|setattr|vars|__setattr__)\b", re.MULTILINE)
ALIAS_OF_SELF_STATE = re.compile(r"^\s*\w+\s*=\s*self(?:\.\w+)+\s*(?:#.*)?$", re.MULTILINE)
WRITE_THROUGH_A_NAME = re.compile(r"^\s*(?!self\b)\w+(?:\.\w+)+\s*=[^=]", re.MULTILINE)


def _writes_by_other_names(text: str) -> bool:
    return WRITES_BY_OTHER_NAMES.search(text) is not None or \
        ALIAS_OF_SELF_STATE.search(text) is not None and WRITE_THROUGH_A_NAME.search(text) is not None


def _calls_of_self_methods(function: cst.FunctionDef) -> list[cst.Call]:
    """`self.update_cache(k)`: the calls of a method of `self` in `function`."""
    visitor = _SelfMethodCalls()
    visit_tree(function, visitor)
    return visitor.found


class _SelfMethodCalls(cst.CSTVisitor):
    def __init__(self):
        self.found: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            self.found.append(node)


def storage_written_between(parsed: ParsedModule, flow: FunctionFlow, leaves: list[cst.CSTNode], first_line: int,
                            last_line: int, owner: ClassInfo | None = None, layers_trusted: bool = False,
                            removed: frozenset[cst.CSTNode] = frozenset(),
                            product: cst.CSTNode | None = None) -> str | None:
    """`kt = k.transpose(-2, -1)`, then `k.add_(1)` after the scores: the name the SDPA call reads is not
    rebound, but a tensor it was computed from (a view may share its storage) is written in place; so is one
    written through a name bound from it (`alias = q; alias.mul_(2)`, `row = q[0]`, `qs = [q]; qs[0].mul_(2)`,
    `self.kept = q; self.kept.zero_()`), where the original had read it already. `layers_trusted`: a torch.nn layer
    of `owner` built without `inplace=` runs torch's code on what it is given (no hook, no class replaced). The
    statements the patch `removed` (the block's own steps: its dropout layer's call) run in the original only. The
    value `product`'s operands count too: `w @ self.v_drop(v)` runs the in-place dropout after the scores in the
    original, before SDPA reads k (the same tensor as v) in the patch (breaker round 32)."""

    def between(node: cst.CSTNode) -> bool:
        return first_line < parsed.line(node) < last_line or product is not None and parsed.within(node, product)

    source_ids = _storage_sources(parsed, flow, leaves)
    sources = {flow.definitions[i].name for i in source_ids}
    names = sources | _bound_from(parsed, flow, sources)
    for definition in flow.definitions.values():
        if definition.kind in ("store", "inplace", "aug") and definition.name in names and \
                first_line < parsed.line(definition.statement) < last_line:
            how = "the SDPA call's inputs are computed from" if definition.name in sources else \
                "may share storage with the SDPA call's inputs"
            return (f"`{definition.name}`, which {how}, is written in place at line "
                    f"{parsed.line(definition.statement)}, between the scores and the value product")
    origins = [origin for i in source_ids for origin in binding_origins(flow.definitions[i])]
    kept_on = _attributes_bound_from(parsed, flow.function, names) | _attribute_roots(parsed, origins)
    names |= _comprehension_targets(parsed, flow.function, names)
    for receiver, deferred in _written_in_place(flow.function):
        line = parsed.line(receiver)
        shared = any(name.value in names for name in may_alias(parsed, receiver)) or \
            _root_code(parsed, receiver, kept_on) in kept_on
        if shared and (deferred or between(receiver)):
            where = "in a function defined in this one, which may run" if deferred else f"at line {line}"
            return (f"`{parsed.code(receiver)}`, which may share storage with the SDPA call's inputs, is written in "
                    f"place {where}, between the scores and the value product")
    reason = _kept_attribute_written_by_a_method(parsed, flow.function, kept_on, first_line, last_line)
    if reason is not None:
        return reason
    if any(flow.definitions[i].kind == "param" for i in source_ids) or \
            _reads_a_global(parsed, flow, leaves + origins):
        reason = _outer_name_written(parsed, flow, between)
        if reason is not None:
            return reason
    handed = names - {"self"}  # its attributes are checked apart
    for node in (name for name in loaded_names(flow.function.body) if name.value in handed):
        line = parsed.line(node)
        call = argument_call(parsed, node)
        if not (between(node) and call is not None) or call is product or _holds_no_tensor(parsed, flow, node) or \
                _off_the_path(parsed, flow, node) or removed and _within_any(parsed, node, removed):
            continue
        statement = isinstance(parsed.parents.get(call), cst.Expr)  # made for its effect: the tensor handed on
        if statement and not read_leaves_alone(parsed, node) or \
                not statement and writes_arguments(parsed, call, node, owner, layers_trusted):
            return (f"`{node.value}`, which may share storage with the SDPA call's inputs, is handed at line {line} "
                    f"to code that may write it in place, between the scores and the value product")
    return None


def _outer_name_written(parsed: ParsedModule, flow: FunctionFlow, between,
                        entered: frozenset[cst.FunctionDef] = frozenset()) -> str | None:
    """Where the inputs come from a caller, a write between the scores and the value product through a name the
    function never binds (a global, an enclosing function's local: `alias.mul_(2)` with `alias = q` outside; `global
    Q` then `Q += 1`), or a call of a function of this file or a method of its class that writes one of its own outer
    names (`def bump(): Q.mul_(2)`) or what it is given (`bump(STATE)` writing `box.t`), may write the tensor the
    caller passed (breaker rounds 39 and 40). `entered`: the functions whose calls led here, each read once
    (functions of the file that call each other)."""
    declared = {item.name.value for node in descendants(flow.function, (cst.Global, cst.Nonlocal))
                for item in node.names}
    local = own_bindings(flow.function) - declared | {"self"}
    for receiver, deferred in _written_in_place(flow.function) + _augmented_outer_names(flow.function, declared):
        outer = [name for name in may_alias(parsed, receiver) if name.value not in local and
                 not _library_name(parsed, name)]
        if outer and (deferred or between(receiver)):
            return (f"`{parsed.code(receiver)}` is written in place at line {parsed.line(receiver)}, between the "
                    f"scores and the value product, through `{outer[0].value}`, which this function does not bind: "
                    f"it may be a tensor the caller passed in")
    entered = entered | {flow.function}
    owner = parsed.owner_of(flow.function)
    for call in descendants(flow.function, (cst.Call,)):
        callee = parsed.module_functions.get(call.func.value) if isinstance(call.func, cst.Name) else \
            owner.methods.get(call.func.attr.value) if owner is not None and isinstance(call.func, cst.Attribute) \
            and isinstance(call.func.value, cst.Name) and call.func.value.value == "self" else None
        if callee is None or callee in entered or not between(call):
            continue
        if _outer_name_written(parsed, parsed.flow(callee), lambda node: True, entered) is not None or \
                _writes_through_parameters(callee) and any(
                    name.value not in local and not _library_name(parsed, name)
                    for arg in call.args for name in may_alias(parsed, arg.value)):
            return (f"`{parsed.code(call)}` (line {parsed.line(call)}) calls a function of this file that writes in "
                    f"place a name it does not bind or what it is given, between the scores and the value product: "
                    f"it may be a tensor the caller passed in")
    return None


def _augmented_outer_names(function: cst.FunctionDef, declared: set[str]) -> list[tuple[cst.BaseExpression, bool]]:
    """`global Q` then `Q += 1`: on a tensor, an augmented assignment writes it in place (the function's own)."""
    return [(node.target, False) for node in descendants(function, (cst.AugAssign,))
            if isinstance(node.target, cst.Name) and node.target.value in declared]


def _writes_through_parameters(function: cst.FunctionDef) -> bool:
    """The function writes in place through one of its parameters (`def bump(box): box.t.mul_(2)`)."""
    params = {p.name.value for p in (*function.params.posonly_params, *function.params.params,
                                      *function.params.kwonly_params)}
    return any(getattr(expression_root(receiver), "value", None) in params
               for receiver, _ in _written_in_place(function))


def _library_name(parsed: ParsedModule, name: cst.Name) -> bool:
    """A name bound by an import of a library module (`torch`, `F`): what it reaches holds no tensor a caller passed
    (`builtins.saved_query` may: breaker round 40)."""
    dotted = parsed.imports.get(name.value)
    return dotted is not None and dotted.split(".")[0] in LIBRARY_ROOTS


BINDING_TARGETS = {cst.AssignTarget: "target", cst.AnnAssign: "target", cst.AugAssign: "target", cst.For: "target",
                   cst.CompFor: "target", cst.NamedExpr: "target", cst.AsName: "name", cst.Param: "name",
                   cst.FunctionDef: "name", cst.ClassDef: "name"}


def own_bindings(function: cst.FunctionDef) -> set[str]:
    """The names the function binds in its own scope, on any path (its parameters, `with ... as`, imports, a nested
    def's or class's name, a `:=` in a comprehension), not those a nested function, lambda or comprehension binds
    for itself (`lambda Q: Q[0]` leaves a global `Q` global: breaker round 40)."""
    found: set[str] = set()
    pending = list(children(function))
    while pending:
        node = pending.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            found.add(node.name.value)  # its body, parameters and decorators bind nothing here
        elif isinstance(node, COMPREHENSIONS):
            found.update(name.value for walrus in descendants(node, (cst.NamedExpr,))
                         if not _inside_a_function(walrus, node) for name in target_names(walrus.target))
        elif not isinstance(node, cst.Lambda):
            field = BINDING_TARGETS.get(type(node))
            if field is not None:
                found.update(name.value for name in target_names(getattr(node, field)))
            pending.extend(children(node))
    return found


COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _inside_a_function(node: cst.CSTNode, within: cst.CSTNode) -> bool:
    """`node` lies in a lambda or def nested in `within` (whose own scope a `:=` there binds in)."""
    return any(node in set(descendants(inner, (type(node),)))
               for inner in descendants(within, (cst.Lambda, cst.FunctionDef)))


def _kept_attribute_written_by_a_method(parsed: ParsedModule, function: cst.FunctionDef, kept_on: set[str],
                                        first_line: int, last_line: int) -> str | None:
    """A `self.` method call between the scores and the value product where an attribute holds an input's storage
    (`self.k_cache = k`, then `self.decay_cache()` writing `self.k_cache` in place: breaker round 14): refused
    unless it is a method of the class writing none of those attributes in place, or a submodule the class assigns
    (what it is handed is checked apart)."""
    if not kept_on:
        return None
    owner = parsed.owner_of(function)
    for call in parsed.calls_and_classes[0]:
        line = parsed.line(call)
        if not (first_line < line < last_line and isinstance(call.func, cst.Attribute) and
                isinstance(call.func.value, cst.Name) and call.func.value.value == "self" and
                parsed.innermost(call, cst.FunctionDef) is function):
            continue
        name = call.func.attr.value
        if owner is not None and name not in owner.methods and name in owner.attributes:
            continue  # a submodule or callable the class assigns: it reaches the class's attributes only if given
        method = owner.methods.get(name) if owner is not None else None
        writes = _written_in_place(method) if method is not None else None
        if writes is None or any(_root_code(parsed, receiver, kept_on) in kept_on for receiver, _ in writes):
            return (f"`{parsed.code(call)}` at line {line}, between the scores and the value product, may write in "
                    f"place `{sorted(kept_on)[0]}`, which holds the SDPA call's inputs")
    return None


def _root_code(parsed: ParsedModule, node: cst.CSTNode, kept_on: set[str]) -> str:
    """The code of `node`, or of the attribute of `kept_on` it indexes or reads into."""
    while isinstance(node, (cst.Subscript, cst.Attribute)) and parsed.code(node) not in kept_on:
        node = node.value
    return parsed.code(node)


def _within_any(parsed: ParsedModule, node: cst.CSTNode, statements: frozenset[cst.CSTNode]) -> bool:
    while node is not None and node not in statements:
        node = parsed.parents.get(node)
    return node is not None


def _off_the_path(parsed: ParsedModule, flow: FunctionFlow, node: cst.Name) -> bool:
    """The read is in a branch the flow does not take (the SDPA path of a block whose scores take a helper under
    `if self.use_rel_pos:` runs only where the flag is off), not in a nested function it defines."""
    return node not in flow.reaching and parsed.innermost(node, (cst.FunctionDef, cst.Lambda)) is flow.function


def _holds_no_tensor(parsed: ParsedModule, flow: FunctionFlow, node: cst.Name, depth: int = 0) -> bool:
    """Every definition reaching the read binds a size, a number, a dtype or a device: unpacked from `.shape`, read
    as `.size(...)`, `.device`, `len(...)`, `int(...)`, a literal, or arithmetic on such (`B, N, C = x.shape`,
    `n, device = x.shape[1], x.device`: `N` or `device` passed on hands no storage)."""
    definitions = [flow.definitions[i] for i in flow.reaching.get(node, ())]
    return bool(definitions) and depth < 3 and all(
        d.kind == "assign" and _no_tensor(parsed, flow, *_assigned_part(d), depth) for d in definitions)


def _no_tensor(parsed: ParsedModule, flow: FunctionFlow, value: cst.BaseExpression | None, unpacked: bool,
               depth: int) -> bool:
    if isinstance(value, cst.Attribute) and value.attr.value in METADATA_READS or isinstance(value, cst.Call) and \
            isinstance(value.func, cst.Attribute) and value.func.attr.value in METADATA_READS:
        return True  # a size, a dtype, a device, or (unpacked) one of the sizes
    if unpacked:
        return False
    if isinstance(value, (cst.BaseNumber, cst.BaseString)):
        return True
    if isinstance(value, cst.Subscript):
        return _no_tensor(parsed, flow, value.value, True, depth)  # `x.shape[1]`
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("len", "int") and \
            value.func.value not in parsed.bound_names:
        return True
    if isinstance(value, cst.BinaryOperation):
        return all(_no_tensor(parsed, flow, side, False, depth) for side in (value.left, value.right))
    return isinstance(value, cst.Name) and _holds_no_tensor(parsed, flow, value, depth + 1)


def _assigned_part(definition: Definition) -> tuple[cst.BaseExpression | None, bool]:
    """(the value the definition binds, whether the name takes one element of it): `n, d = x.shape[1], x.device`
    binds `x.shape[1]`."""
    value, index = definition.value, definition.index
    if index is not None and isinstance(value, (cst.Tuple, cst.List)) and index < len(value.elements) and \
            not any(isinstance(e, cst.StarredElement) for e in value.elements):
        return value.elements[index].value, False
    return value, index is not None


def _bound_from(parsed: ParsedModule, flow: FunctionFlow, names: set[str]) -> set[str]:
    """The names bound, anywhere in the function, to a value that may share the storage of one of `names` or of
    these (`_may_alias`: an alias, a view, a container, a loop variable over it)."""
    found = set(names)
    changed = True
    while changed:
        changed = False
        for definition in flow.definitions.values():
            if definition.name in found or definition.kind == "param":
                continue
            if any(name.value in found for origin in binding_origins(definition) for name in may_alias(parsed, origin)):
                found.add(definition.name)
                changed = True
    return found - set(names)


def _attributes_bound_from(parsed: ParsedModule, function: cst.FunctionDef, names: set[str]) -> set[str]:
    """`self.kept` of `self.kept = q` (or `self.kept["k"] = q`) in the function, for q among `names`: the attribute
    holds q's storage."""
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if any(name.value in names for name in may_alias(parsed, node.value)):
                for target in (t.target for t in node.targets):
                    while isinstance(target, cst.Subscript):  # `self.store["k"] = q`: the container holds q
                        target = target.value
                    if isinstance(target, cst.Attribute):
                        found.add(parsed.code(target))

    visit_tree(function, Visitor())
    return found


def _attribute_roots(parsed: ParsedModule, origins: list[cst.CSTNode]) -> set[str]:
    """The `self.X` attributes whose storage the values of `origins` may share: `self.cache_k` of
    `self.cache_k[:, :, :n].transpose(-2, -1)` (indexing and a tensor's methods keep it; a fresh op does not)."""
    found: set[str] = set()
    pending = list(origins)
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Subscript):
            pending.append(node.value)
        elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            found.add(parsed.code(node))
        elif isinstance(node, cst.Attribute):
            pending.append(node.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value not in FRESH_TENSOR_OPS and parsed.imported_name(node.func) is None:
            pending.append(node.func.value)
        elif isinstance(node, cst.IfExp):
            pending += [node.body, node.orelse]
    return found


def _written_in_place(function: cst.FunctionDef) -> list[tuple[cst.BaseExpression, bool]]:
    """The receivers the function writes in place: of `x.add_(1)` (an in-place method), `x[i] = v`, `x[i] += v`
    and `out=x`, whatever expression x is; each with whether the write is deferred, inside a function or lambda
    defined in this one (`def f(): m.fill_(1)`), which a call anywhere may run."""
    found: list[tuple[cst.BaseExpression, bool]] = []

    class Visitor(cst.CSTVisitor):
        def __init__(self) -> None:
            self.depth = 0

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.depth += node is not function

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.depth -= original_node is not function

        def visit_Lambda(self, node: cst.Lambda) -> None:
            self.depth += 1

        def leave_Lambda(self, original_node: cst.Lambda) -> None:
            self.depth -= 1

        def visit_Call(self, node: cst.Call) -> None:
            if is_inplace_method(node.func):
                receiver = node.func.value  # `torch.Tensor.mul_(q, 2)` writes its first argument
                unbound = getattr(receiver, "attr", receiver).value == "Tensor" if isinstance(
                    receiver, (cst.Name, cst.Attribute)) else False
                found.append((node.args[0].value if unbound and node.args else receiver, self.depth > 0))
            elif _computed_method(node) and node.func.args:  # `getattr(q, "zero_")()`, `getattr(q, name)()`
                found.append((node.func.args[0].value, self.depth > 0))
            found.extend((arg.value, self.depth > 0) for arg in node.args
                         if arg.keyword is not None and arg.keyword.value == "out")

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            if isinstance(node.target, cst.Subscript) or _data_attribute(node.target):
                found.append((node.target.value, self.depth > 0))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Subscript) or _data_attribute(node.target):
                found.append((node.target.value, self.depth > 0))
            elif isinstance(node.target, cst.Attribute):  # `STATE.q += 1`: a tensor there is written in place
                found.append((node.target, self.depth > 0))

    visit_tree(function, Visitor())
    return found


def _computed_method(node: cst.Call) -> bool:
    """`getattr(x, "zero_")(...)` or `getattr(x, name)(...)`: a method looked up by a name that is in place or
    not visible."""
    getter = node.func
    if not (isinstance(getter, cst.Call) and isinstance(getter.func, cst.Name) and getter.func.value == "getattr"
            and len(getter.args) >= 2):
        return False
    name = getter.args[1].value
    return not isinstance(name, cst.SimpleString) or name.evaluated_value.endswith("_")


def _data_attribute(target: cst.BaseExpression) -> bool:
    """`x.data = y` (or `x.data += y`): x's values are replaced in place."""
    return isinstance(target, cst.Attribute) and target.attr.value == "data"


def _comprehension_targets(parsed: ParsedModule, function: cst.FunctionDef, names: set[str]) -> set[str]:
    """The targets of comprehensions over a value that may share the storage of one of `names` (`[x.fill_(1) for x
    in m]`: each `x` a view of `m`); the function's flow does not bind them. Scope-blind."""
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_CompFor(self, node: cst.CompFor) -> None:
            if any(alias.value in names for alias in may_alias(parsed, node.iter)):
                found.update(name.value for name in loaded_names(node.target))

    visit_tree(function, Visitor())
    return found


def rebound_by_nested_function(function: cst.FunctionDef, names: set[str]) -> str | None:
    """A function nested in this one that declares one of `names` nonlocal: a call of it (anywhere, even inside a
    module the block calls) may rebind that name between the scores and the value product."""
    found: list[tuple[str, str]] = []

    class Visitor(cst.CSTVisitor):
        def __init__(self) -> None:
            self.inner: list[str] = []

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.inner.append(node.name.value)

        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.inner.pop()

        def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
            found.extend((item.name.value, self.inner[-1]) for item in node.names if item.name.value in names)

    visit_tree(function.body, Visitor())
    if not found:
        return None
    name, inner = found[0]
    return f"`{name}` is declared nonlocal by the nested function `{inner}`, whose calls may rebind it"


# reads of a tensor that give a new value, never a view of its storage (`torch.zeros(..., device=s.device)`)


def shape_argument(parsed: ParsedModule, name: cst.Name) -> cst.Call | None:
    """The call `x.expand_as(name)` (or `reshape_as`, `view_as`) when `name` is its one argument."""
    argument = parsed.parents.get(name)
    call = parsed.parents.get(argument)
    if isinstance(argument, cst.Arg) and argument.value is name and argument.keyword is None and \
            not argument.star and isinstance(call, cst.Call) and len(call.args) == 1 and \
            isinstance(call.func, cst.Attribute) and call.func.attr.value in SHAPE_ONLY_ARGUMENT:
        return call
    return None


def _storage_sources(parsed: ParsedModule, flow: FunctionFlow, leaves: list[cst.CSTNode]) -> set[int]:
    """The definitions whose tensors `leaves` may share storage with: followed back through each definition's
    reads, but not through reads of metadata alone (T5's bias built with `device=scores.device` is not the
    scores' storage, so `scores += bias` does not write it)."""
    found: set[int] = set()
    pending = [name for leaf in leaves for name in loaded_names(leaf)]
    while pending:
        name = pending.pop()
        parent = parsed.parents.get(name)
        if isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in METADATA_READS or \
                shape_argument(parsed, name):
            continue
        for def_id in flow.reaching.get(name, ()):
            definition = flow.definitions.get(def_id)
            if definition is None or def_id in found:
                continue
            found.add(def_id)
            if definition.value is not None and definition.kind == "assign":
                pending.extend(loaded_names(definition.value))
            else:
                found |= nx.ancestors(flow.graph, def_id) if def_id in flow.graph else set()
    return found


def _reads_a_global(parsed: ParsedModule, flow: FunctionFlow, read: list[cst.CSTNode]) -> bool:
    """The inputs are computed from a name the function does not bind (`q, k, v = QKV.unbind(0)` with a global
    `QKV`), other than a library's or a function or class of the file: other names may hold the same tensor. `read`:
    the inputs and the values their storage sources were bound from."""
    names = [name for node in read for name in loaded_names(node)]
    return any(flow.sees_undefined(name) and not _library_name(parsed, name) and name.value != "self" and
               name.value not in parsed.module_functions and name.value not in parsed.top_level_classes and
               name.value not in BUILTIN_NAMES for name in names)


BUILTIN_NAMES = frozenset(dir(__import__("builtins")))

# builtins that read their arguments only: passing `self` to them writes nothing
READING_BUILTINS = frozenset({"isinstance", "hasattr", "getattr", "len", "id", "type", "print", "repr", "str",
                              "callable", "issubclass", "iter", "bool", "int", "float", "max", "min", "range",
                              "tuple", "list", "sum", "abs", "round", "divmod", "format"})
# library modules whose functions call what they are given (`functools.partial(nn.Module.train, m)`)
HIGHER_ORDER_MODULES = frozenset({"functools", "operator", "builtins"})


def _attribute_writes(parsed: ParsedModule, function: cst.FunctionDef) -> list[tuple[cst.CSTNode, str]]:
    """The attribute paths each statement of `function` may write. Beyond assignments and in-place methods, a
    call that may change what `self` holds counts as a write of it (or of the `self.` attribute it is given): one
    given `self` or a `self.` attribute (`freeze(self)`, `methodcaller("train", False)(self.drop)`), a method looked
    up by name (`getattr(self.drop, "train")(False)`), `apply`, a method of a module's namespace or attribute tables
    (`self.drop.__dict__.update(p=1.0)`), `exec`/`eval`; an attribute written on any other object may be one of
    `self`'s modules (`for m in self.modules(): m.p = 1.0`)."""
    writes: list[tuple[cst.CSTNode, str]] = []
    aliases = _self_aliases(function)

    class Visitor(cst.CSTVisitor):
        def __init__(self) -> None:
            self.statement: cst.CSTNode | None = None

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                self._target(node, target.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            self._target(node, node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            self._target(node, node.target)

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            while isinstance(func, cst.Attribute) and func.attr.value == "__call__":  # `self.drop.train.__call__()`
                func = func.value
            if is_inplace_method(func):
                self._target(node, func.value)
            if isinstance(func, cst.Attribute) and func.attr.value in ("train", "eval", "apply", "__setattr__"):
                writes.append((node, _module_written(func.value)))  # the `training` of it and every child
            elif is_self_attribute(func) and func.attr.value in parsed.derived("stored methods", _stored_methods):
                writes.append((node, "self"))  # `self.tf = self.train` in __init__, `self.tf(False)` here
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in aliases:
                namespace = _namespace_of(aliases[func.value.value])  # `ns = self.__dict__; ns.update(q=...)`
                if namespace is not None:
                    writes.append((node, _module_written(namespace)))
            if isinstance(func, cst.Attribute) and _namespace_of(func.value) is not None:
                writes.append((node, _module_written(_namespace_of(func.value))))
            if isinstance(func, cst.Call) and isinstance(func.func, cst.Name) and func.func.value == "getattr" and \
                    func.args:  # a method looked up by name and called
                writes.append((node, _module_written(func.args[0].value)))
            callee = parsed.imported_name(func) or ""
            if isinstance(func, cst.Name) and func.value in ("exec", "eval"):
                writes.append((node, "self"))
            elif (callee.split(".")[0] in HIGHER_ORDER_MODULES or
                  not callee and isinstance(func, (cst.Name, cst.Call))) and \
                    not (isinstance(func, cst.Name) and func.value in READING_BUILTINS and
                         func.value not in parsed.bound_names):
                # a library function (`math.sqrt`) or a tensor's method cannot know `self`'s modules; a function
                # of this file, or a callable built at run time (`methodcaller("train", False)`), may
                given = [arg.value for arg in node.args if _self_rooted(arg.value)]
                writes.extend((node, _module_written(value)) for value in given)
            if isinstance(node.func, cst.Name) and node.func.value == "setattr" and len(node.args) >= 2:
                name = node.args[1].value  # `setattr(self.drop, "training", v)`: a write of that attribute
                owner = _dotted(node.args[0].value)
                literal = name.evaluated_value if isinstance(name, cst.SimpleString) else None
                writes.append((node, f"{owner}.{literal}" if owner and isinstance(literal, str) else "self"))
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value == "out":
                    self._target(node, arg.value)

        def _target(self, node: cst.CSTNode, target: cst.BaseExpression) -> None:
            if isinstance(target, (cst.Tuple, cst.List)):
                for element in target.elements:
                    self._target(node, element.value)
                return
            stored = isinstance(target, cst.Subscript)
            while isinstance(target, cst.Subscript):
                target = target.value
            if stored and isinstance(target, cst.Name) and target.value in aliases:  # `ns = self.__dict__; ns["q"] = v`
                target = aliases[target.value]
            if isinstance(target, cst.Call) and _namespace_of(target) is not None:  # `vars(self.drop)["p"] = v`
                writes.append((node, _module_written(_namespace_of(target))))
                return
            path = _dotted(target) if isinstance(target, cst.Attribute) else None
            if isinstance(target, cst.Attribute) and path is None:
                path = "self"  # `getattr(self, "drop").p = v`: on an object found at run time
            if path is not None and path.split(".")[-1] in MODULE_STATE:
                path = _module_written(target)
            if path is not None and path.split(".")[0] not in ("self",) + tuple(parsed.imports):
                path = "self"  # another object, which may be one of `self`'s modules
            if path is not None:
                writes.append((node, path))

    visit_tree(function, Visitor())
    return writes


MODULE_STATE = {"training", "__dict__", "_modules", "_parameters", "_buffers"}  # what a module runs with


def _self_aliases(function: cst.FunctionDef) -> dict[str, cst.BaseExpression]:
    """Local names the function binds to `self`'s state or namespace (`ns = self.__dict__`, `mods = vars(self)`,
    `cache = self.cache`): a store into one, or a namespace method called on one, writes that state (breaker round
    27: `ns["q"] = ns["q"] * 2` rebound the `self.q` SDPA re-reads). A name bound so anywhere counts everywhere."""
    found: dict[str, cst.BaseExpression] = {}
    for assign in descendants(function, (cst.Assign,)):
        value = assign.value
        namespace = _namespace_of(value)
        if _self_rooted(namespace if namespace is not None else value) and value is not None:
            for target in assign.targets:
                if isinstance(target.target, cst.Name):
                    found[target.target.value] = value
    return found


def _stored_methods(parsed: ParsedModule) -> frozenset[str]:
    """Attributes of `self` bound to an attribute read of `self` or of an import, not a call (`self.tf = self.train`,
    `self.f = nn.Module.eval`): a method stored there, which a call of it (`self.tf(False)`) runs on whatever object
    it was read from (`self.dropout = config.p` stores a number, read from neither)."""
    return frozenset(target.target.attr.value for node in parsed.nodes_of(cst.Assign)
                     if isinstance(node.value, cst.Attribute) and _self_or_imported(parsed, node.value)
                     for target in node.targets
                     if isinstance(target.target, cst.Attribute) and is_self_attribute(target.target))


def _self_or_imported(parsed: ParsedModule, node: cst.Attribute) -> bool:
    root = node
    while isinstance(root, cst.Attribute):
        root = root.value
    return isinstance(root, cst.Name) and root.value == "self" or parsed.imported_name(node) is not None


def _self_rooted(node: cst.BaseExpression) -> bool:
    """`self` or a `self.` attribute, passed as it is."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name) and node.value == "self"


def _namespace_of(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` of `vars(x)` or of `x.__dict__` (`x._modules`, `x._buffers`, `x._parameters` alike)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "vars" and node.args:
        return node.args[0].value
    if isinstance(node, cst.Attribute) and node.attr.value in MODULE_STATE - {"training"}:
        return node.value
    return None


def _module_written(node: cst.BaseExpression) -> str:
    """What a mode switch or a write of module state changes, as a path: the `self.` module it names, or, on a
    module it does not name (`m` of `self.apply(lambda m: m.train())`, `nn.Module.train(self)`), all of `self`."""
    if isinstance(node, cst.Attribute) and node.attr.value in MODULE_STATE:
        node = node.value
    path = _dotted(node)
    return path if path is not None and (path == "self" or path.startswith("self.")) else "self"


def _dotted(node: cst.BaseExpression) -> str | None:
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    return ".".join([node.value] + parts[::-1])


def other_targets_read(parsed: ParsedModule, flow: FunctionFlow, removed: list[cst.CSTNode],
                       consumed_ids: set[int]) -> str | None:
    """`scores = logits = q @ k.T`: deleting the statement also deletes `logits`, which may still be read."""
    removed_ids = {id(statement) for statement in removed}
    for definition in flow.definitions.values():
        if id(definition.statement) in removed_ids and definition.id not in consumed_ids:
            reads = flow.reads_of(definition)
            if reads:
                return (f"`{definition.name}` is bound by a statement the rewrite deletes and is read at line "
                        f"{parsed.line(reads[0])}")
    return None


def outer_names(function: cst.FunctionDef) -> frozenset[str]:
    """Names the function declares `global` or `nonlocal`: what it binds to them outlives the call, so code
    outside the function (another function, a later call) may read it."""
    visitor = _Declared(function)
    visit_tree(function, visitor)
    return frozenset(visitor.found)


class _Declared(cst.CSTVisitor):
    """The names `function` itself (not a function or class nested in it) declares global or nonlocal."""

    def __init__(self, function: cst.FunctionDef):
        self.function = function
        self.found: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.function

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Global(self, node: cst.Global) -> None:
        self.found.update(item.name.value for item in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.found.update(item.name.value for item in node.names)


def nested_names(function: cst.FunctionDef) -> frozenset[str]:
    """Names that occur in the functions, lambdas, classes and comprehensions nested in `function`: a closure may
    read a local of it there (`def peek(): return w`), which its own flow does not count as a read."""
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def __init__(self) -> None:
            self.depth = 0

        def _enter(self, node: cst.CSTNode) -> bool:
            if node is not function:
                self.depth += 1
            return True

        def _leave(self, node: cst.CSTNode) -> None:
            if node is not function:
                self.depth -= 1

        visit_FunctionDef = visit_Lambda = visit_ClassDef = _enter
        visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _enter
        leave_FunctionDef = leave_Lambda = leave_ClassDef = _leave
        leave_ListComp = leave_SetComp = leave_DictComp = leave_GeneratorExp = _leave

        def visit_Name(self, node: cst.Name) -> None:
            if self.depth:
                found.add(node.value)

    visit_tree(function, Visitor())
    return frozenset(found)


def out_argument(call: cst.CSTNode) -> cst.BaseExpression | None:
    """`torch.bmm(p, v, out=buf)`: the product writes into a buffer SDPA cannot fill."""
    if isinstance(call, cst.Call):
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "out":
                return arg.value
    return None


# dynamic dispatch ----------------------------------------------------------------------------------------------

@dataclass
class ClassTable:
    """Every class of the file, with what it defines, to see which subclasses override what a block uses."""

    parsed: ParsedModule
    classes: dict[str, list[ClassInfo]] = field(default_factory=dict)

    @classmethod
    def of(cls, parsed: ParsedModule) -> "ClassTable":
        table = cls(parsed)
        for node in parsed.calls_and_classes[1]:
            info = ClassInfo(node)
            for statement in node.body.body:
                if isinstance(statement, cst.FunctionDef):
                    info.methods[statement.name.value] = statement
            table.classes.setdefault(node.name.value, []).append(info)
        return table

    @cached_property
    def _derived(self) -> dict[str, list[str]]:
        """Base name -> the names of the classes that list it among their bases, in the file's order."""
        derived: dict[str, list[str]] = {}
        for name, infos in self.classes.items():
            for base in dict.fromkeys(_base_name(base.value) for info in infos for base in info.node.bases):
                if base is not None:
                    derived.setdefault(base, []).append(name)
        return derived

    def mixed_into(self, subclasses: list[ClassInfo], owner: ClassInfo) -> list[ClassInfo]:
        """The classes of this file that a subclass of `owner` also derives from (`class Sub(Mix, Attn)`), with
        their bases in the file: in the subclass's method resolution order they may come before `owner`."""
        found, pending, seen = [], [], {owner.node.name.value} | {sub.node.name.value for sub in subclasses}
        for sub in subclasses:
            pending.extend(_base_name(base.value) for base in sub.node.bases)
        while pending:
            name = pending.pop()
            if name is None or name in seen or name not in self.classes:
                continue
            seen.add(name)
            for info in self.classes[name]:
                found.append(info)
                pending.extend(_base_name(base.value) for base in info.node.bases)
        return found

    def subclasses(self, owner: ClassInfo) -> list[ClassInfo]:
        """Classes of this file that derive from `owner`, directly or not (by name)."""
        found, frontier = [], [owner.node.name.value]
        seen = set(frontier)
        while frontier:
            base = frontier.pop()
            for name in self._derived.get(base, ()):
                if name not in seen:
                    seen.add(name)
                    frontier.append(name)
                    found.extend(self.classes[name])
        return found


def overridden(table: ClassTable, owner: ClassInfo | None, names: set[str]) -> str | None:
    """A subclass that redefines a method the block inlines, or rebinds an attribute it reads: instances of that
    subclass would run the base's rewritten code with the base's meaning. Looked for in this file (with the classes
    mixed into a subclass before the owner) and, by name, anywhere in the scanned tree: a class statement, a
    `type(...)` call, a class defining `__getattribute__` or `__getattr__` (any name may resolve otherwise)."""
    if owner is None or not names:
        return None
    subclasses = table.subclasses(owner)
    for sub in subclasses + table.mixed_into(subclasses, owner):
        for name in sorted(names | LOOKUP_HOOKS):
            if name in sub.methods:
                return f"`{sub.node.name.value}` overrides `{name}`, which this rewrite inlines from the base class"
            if name in sub.attributes or name in sub.mutated:
                return f"`{sub.node.name.value}` rebinds `self.{name}`, which this rewrite reads as the base class sets it"
    parsed = table.parsed
    project = parsed.project if parsed.project is not None else parsed.derived("class sites", _own_classes)
    sites = project.subclasses(owner.node.name.value)
    chain = {owner.node.name.value} | {site.name for site in sites}
    for site in sites:
        redefined = sorted(site.defines & (names | LOOKUP_HOOKS | {ANY_NAME}))
        if redefined:
            what = "any name" if redefined[0] == ANY_NAME else f"`{redefined[0]}`"
            return (f"`{site.name}` ({display_path(site.path)}:{site.line}) derives from "
                    f"`{owner.node.name.value}` and defines {what}, which this rewrite inlines or reads as the base "
                    f"class binds it")
        own = set(table.classes) if site.path == parsed.path else set()  # the class table read the file's own
        mixed = _mixed_in(project, site, chain | own, names | LOOKUP_HOOKS | {ANY_NAME})
        if mixed is not None:
            return (f"`{site.name}` ({display_path(site.path)}:{site.line}) derives from "
                    f"`{owner.node.name.value}` and mixes in `{mixed}`, which may define what this rewrite inlines")
    for name in sorted(names & set(owner.methods)):
        if owner.written_outside(name) is not None:
            return f"`{name}`, a method this rewrite inlines, is assigned on another object (a class or an instance)"
    return None


def _mixed_in(project: ProjectFacts, site, chain: set[str], names: set[str]) -> str | None:
    """A base of `site` off the chain down from the owner, which may come before the owner in the subclass's method
    resolution order: one no class site of the tree describes (`class Mixin:` derives from nothing, so none does),
    or one that, or a base of which, defines one of `names`. A base no name gives (a call's result) is not
    followed: it stands for any class, which would make every class of such a tree a mixin."""
    pending, seen = [base for base in site.bases if base not in chain | PLAIN_BASE_NAMES | {UNNAMED_BASE}], set()
    while pending:
        base = pending.pop()
        if base in seen:
            continue
        seen.add(base)
        described = project.named(base)
        if not described or any(found.defines & names for found in described):
            return base
        pending.extend(b for found in described for b in found.bases if b not in PLAIN_BASE_NAMES | {UNNAMED_BASE})
    return None


def _own_classes(parsed: ParsedModule) -> ProjectFacts:
    """A file scanned alone is its own tree."""
    return ProjectFacts(classes=tuple(class_sites(parsed.path, parsed.source)))


# a class defining one may resolve any name otherwise, or bind any attribute otherwise than the base's code reads
# (`def register_buffer(self, name, t): super().register_buffer(name, torch.ones_like(t))`, `_apply`: breaker 13)
LOOKUP_HOOKS = frozenset({"__getattribute__", "__getattr__", "__setattr__", "register_buffer", "register_parameter",
                          "register_module", "add_module", "_apply"})


def self_names(nodes: list[cst.CSTNode]) -> set[str]:
    """`x` for every `self.x` in the nodes."""
    found: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                found.add(node.attr.value)

    for node in nodes:
        visit_tree(node, Visitor())
    return found


def _base_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


# hooks ----------------------------------------------------------------------------------------------------------

def deleted_module_calls(parsed: ParsedModule, owner: ClassInfo | None, nodes: list[cst.CSTNode],
                         kept: list[cst.CSTNode]) -> dict[str, cst.Attribute]:
    """Attribute `x` -> the first `self.x` of the deleted `self.x(...)` module calls (those not inside an
    expression the SDPA call keeps): their forward hooks stop firing."""
    if owner is None:
        return {}
    kept_ids = set()
    for node in kept:
        kept_ids.update(id(n) for n in walk(node))
    found: dict[str, cst.Attribute] = {}
    for node in nodes:
        for call in walk(node):
            if isinstance(call, cst.Call) and id(call) not in kept_ids and isinstance(call.func, cst.Attribute) \
                    and isinstance(call.func.value, cst.Name) and call.func.value.value == "self" \
                    and call.func.attr.value not in owner.methods:
                found.setdefault(call.func.attr.value, call.func)
    return found


def is_hook_point(parsed: ParsedModule, owner: ClassInfo, attribute: str) -> bool:
    """A module that computes nothing (`nn.Identity()`, a TransformerLens-style `HookPoint`): it exists only to
    carry hooks, so deleting its call is never neutral."""
    value = owner.only_value(attribute)
    if not isinstance(value, cst.Call):
        return False
    dotted = parsed.imported_name(value.func) or ""
    name = dotted or (value.func.value if isinstance(value.func, cst.Name) else "")
    if dotted == "torch.nn.Identity" or name.endswith("HookPoint"):
        return True
    first_by_name = parsed.derived(_classes_by_name, _classes_by_name)
    local = first_by_name.get(value.func.value) if isinstance(value.func, cst.Name) else None
    return local is not None and _forward_returns_input(local)


def _classes_by_name(parsed: ParsedModule) -> dict[str, cst.ClassDef]:
    """The file's first class of each name (once per file: one walk of the classes per block grew with their
    square)."""
    found: dict[str, cst.ClassDef] = {}
    for node in parsed.calls_and_classes[1]:
        found.setdefault(node.name.value, node)
    return found


def _forward_returns_input(node: cst.ClassDef) -> bool:
    forward = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
    if forward is None or len(forward.params.params) < 2:
        return False
    body = forward.body.body
    last = body[-1] if body else None
    return (len(body) == 1 and isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)
            and isinstance(last.body[0].value, cst.Name)
            and last.body[0].value.value == forward.params.params[1].name.value)


def hook_registration(parsed: ParsedModule) -> str | None:
    """Why a deleted module call may carry a hook (None: nothing registers one that this scan sees): a hook on
    every module (`register_module_forward_hook` and its variants) in this file or in any file of the scanned
    tree, or a module hook registered anywhere in this file or another file of the tree (a training script's
    `model.blocks[0].attn.attn_drop.register_forward_hook(save_map)`). Read from the whole file once, whatever the
    number of blocks that ask."""
    return parsed.derived(_hook_registration, _hook_registration)


def _hook_registration(parsed: ParsedModule) -> str | None:
    calls = global_hook_calls(parsed, GLOBAL_CALL_HOOKS) + hooks_by_computed_name(parsed)
    if calls:
        call, name = calls[0]
        return HookSite(parsed.path, parsed.line(call), name).describe(parsed.path)
    if parsed.project is not None and parsed.project.call_hooks:
        return parsed.project.call_hooks[0].describe(parsed.path)
    if any(isinstance(call.func, cst.Attribute) and call.func.attr.value in HOOK_METHODS
           for call in parsed.calls_and_classes[0]):
        return "this file registers module hooks"
    elsewhere = first_elsewhere(parsed.project.module_hooks, parsed.path) if parsed.project is not None else None
    if elsewhere is not None:
        return f"`{display_path(elsewhere.path)}` registers module hooks (`{elsewhere.name}`, line {elsewhere.line})"
    return None


# what the emitted call runs: a file of the tree that replaces it (`F.scaled_dot_product_attention = f`, for the
# project's own fused layers) changes the patched block and not the original
INTRODUCED = {"torch.nn.functional.scaled_dot_product_attention", "torch._C._nn.scaled_dot_product_attention"}
# the modules the emitted call is reached through: another file rebinding the name this file imports them as
# (`import model; model.F = shim.F`) makes both the block's calls and the emitted one read that object instead
EMITTED_THROUGH = ("torch", "torch.nn.functional", "torch.nn")


def emitted_name_rebound(parsed: ParsedModule) -> str | None:
    """Why the name the SDPA call is read through may not be torch's module when it runs (breaker round 18): a star
    import of a module outside torch after the imports that open the module, where an added import goes (it may
    bind any name; an import of the module's own before it is not reused), or `F`, which the rewrite adds when the
    module has no name for torch.nn.functional, assigned on a module object in a file of the tree."""
    position = opening_imports_end(parsed)
    late = next((node for index, node in parsed.star_imports if index >= position), None)
    if late is not None:
        return (f"`{parsed.code(late).strip()}` (line {parsed.line(late)}) runs after the imports that open the module: "
                "it may bind any name, the one the SDPA call would be read through too")
    if parsed.binds_any_global:
        return ("the file may bind any of its names at run time (`exec`, `eval`, `globals()`, `vars()`), the one "
                "the SDPA call would be read through too")
    spelled = parsed.torch_functional_spelling  # the name the SDPA call reuses, where it reuses one
    reused = spelled.split(".")[0] if spelled is not None else None
    if reused in parsed.rebound_by_imports:
        return (f"`{reused}` may be bound anew after its import (a second import, a star import), and the SDPA call "
                "would be read through it")
    writer = _assigned_on_a_module(parsed, "F")
    if writer is not None and "F" not in parsed.imports:
        return (f"`F`, the name the rewrite would import torch.nn.functional as, is assigned on a module in "
                f"{writer}: it may not be torch's when the code runs")
    importer = parsed.tree.star_importer_spelling(parsed, "F") if parsed.tree is not None and \
        "F" not in parsed.imports and "torch.nn.functional" not in parsed.module_aliases and \
        parsed.literal_all is None else None  # a computed `__all__` may list `F` (breaker round 46)
    if importer is not None:
        return (f"`F`, the name the rewrite would import torch.nn.functional as, would reach "
                f"{display_path(importer)}, which imports this module's `*` and has an `F` of its own")
    return None


def replaced_torch_function(parsed: ParsedModule, nodes: list[cst.CSTNode]) -> str | None:
    """Why a torch function or tensor method the rewrite deletes or introduces may not be torch's when the code runs
    (None: no file of the scan assigns one): a training script's `F.softmax = tempered_softmax` changes what the
    eager block computes, and the SDPA call never calls it; `F.scaled_dot_product_attention = f` changes what the
    patched block computes; another file's `model.F = shim.F` rebinds the module-level name the block's calls (and
    the emitted one) are read through."""
    written = parsed.outside_attribute_writes[0]
    replaced = {name for name in written if name.split(".")[0] in REPLACEABLE_ROOTS and "." in name}
    introduced = sorted(entry for name in INTRODUCED if (entry := replacing(name, replaced)) is not None and
                        (entry != name or _replaced_not_restored(parsed, name)))
    if introduced:
        return (f"`{introduced[0]}`, which the rewrite introduces a call of, is assigned in "
                f"{parsed.outside_writer(introduced[0])}: it may not be torch's when the code runs")
    operator = next((name for name in sorted(replaced) if name.startswith("torch.Tensor.__") or
                     name in ("torch", "torch.Tensor")), None)
    if operator is not None or "*class" in written and "Tensor" in written:
        # `q @ k`, `s * scale`: the block's operators are no calls the walk below sees (breaker round 18)
        shown = f"`{operator}` is" if operator else "an attribute of `torch.Tensor` set by a computed name is"
        return (f"{shown} assigned in {parsed.outside_writer(operator or '*class')}: the block's tensor operators "
                "may not be torch's when the code runs")
    imported = {name for name in parsed.imports if name not in parsed.bound_names and
                (name in written and not _inside_a_torch_write(parsed.imports[name], name, replaced) or
                 parsed.global_rebound_by_computed_name(name, spelled=True) is not None)}
    if not replaced and not imported:
        return None
    found: list[str] = []
    roots: set[str] = {name for name in imported if parsed.imports[name] in EMITTED_THROUGH}

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = parsed.imported_name(node.func)
            method = f"torch.Tensor.{node.func.attr.value}" if isinstance(node.func, cst.Attribute) else None
            found.extend(entry for n in (name, method) if n is not None and
                         (entry := replacing(n, replaced)) is not None)
            root = node.func
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name) and root.value in imported:
                roots.add(root.value)

    for node in nodes:
        visit_tree(node, Calls())
    if found:
        return (f"`{found[0]}`, which the rewrite deletes a call of, is assigned in "
                f"{parsed.outside_writer(found[0])}: it may not be {found[0].split('.')[0]}'s when the code runs")
    if roots:
        root = min(roots)
        writer = _assigned_on_a_module(parsed, root)
        return (f"`{root}` (this file's `{parsed.imports[root]}`) is assigned on this module in "
                f"{writer}: the block's calls, and the one the rewrite introduces, may not be "
                "torch's when the code runs")
    return None


# the functional each of torch's modules whose calls a patch deletes calls in its forward
MODULE_FUNCTIONALS = {"nn.Dropout": "torch.nn.functional.dropout", "nn.Softmax": "torch.nn.functional.softmax"}


def _assigned_on_a_module(parsed: ParsedModule, name: str) -> str | None:
    """Where a file of the tree assigns `name` on some object (this module's, maybe), by that name or by a computed
    one that spells it on a module looked up by name; None where none does."""
    if name in parsed.outside_attribute_writes[0]:
        return parsed.outside_writer(name)
    return parsed.global_rebound_by_computed_name(name, spelled=True)


def replacing(name: str, replaced: set[str]) -> str | None:
    """The entry of `replaced` (torch's dotted names assigned in the tree) that replaces torch's `name`: the name
    itself, or a module holding it assigned whole (`torch.nn.functional = shim`, `F.__class__ = M`: breaker round
    25)."""
    if name in replaced:
        return name
    return next((entry for entry in sorted(replaced) if name.startswith(entry + ".")), None)


def _replaced_not_restored(parsed: ParsedModule, name: str) -> bool:
    """Whether a file writing torch's `name` may put another function there: not where each only puts back what it
    took (`sdpa = F.__dict__.pop(...)` ... `setattr(F, ..., sdpa)`, hiding the op while a model is built)."""
    texts = [parsed.source] if name in parsed.own_outside_writes[0] else []
    for writes in parsed.project.writes_elsewhere(parsed.path) if parsed.project is not None else ():
        source = read_source(writes.path) if name in writes.names else None
        if source is not None:
            texts.append(None if isinstance(source, ScanError) else source.text)
    return any(text is None or replaces(text, name.rsplit(".", 1)[-1]) for text in texts)  # unreadable: may


def _inside_a_torch_write(module: str, name: str, replaced: set[str]) -> bool:
    """`nn` (torch.nn) among the names written where a dotted write of torch's names it on the way
    (`torch.nn.functional.dropout = f` writes `nn`, `functional` and `dropout` of their receivers)."""
    return module.rsplit(".", 1)[-1] == name and any(written.startswith(module + ".") for written in replaced)


def replaced_module_class(parsed: ParsedModule, kinds: tuple[str, ...]) -> str | None:
    """Why a deleted call of a module of torch's `kinds` (`nn.Dropout`) may not run torch's code (None: no file of
    the scan replaces it): the class itself assigned (`nn.Dropout = MCDropout` before the model is built, breaker
    round 18: the check's own `torch.nn.Dropout` then names it too), a method of that class or of `nn.Module`
    assigned (`nn.Dropout.forward = f`, `nn.Module.__call__ = f`), or the functional it calls (`F.dropout = f`). The
    run-time module check reads the instance, not the class, so this refuses."""
    replaced = sorted(name for name in parsed.outside_attribute_writes[0] if name.startswith("torch."))
    for kind in kinds:
        whole = next((entry for name in (f"torch.{kind}", MODULE_FUNCTIONALS.get(kind)) if name is not None and
                      (entry := replacing(name, set(replaced))) is not None and entry != name), None)
        if whole is not None:  # `torch.nn = shim`, `torch.nn.functional = shim`
            return (f"`{whole}` is assigned in {parsed.outside_writer(whole)}: a `{kind}` call may not run "
                    f"torch's code")
        cls = kind.rsplit(".", 1)[-1]
        for name in replaced:
            owner, last = name.rsplit(".", 1)
            if owner.startswith("torch.nn") and (owner.rsplit(".", 1)[-1] in (cls, "Module") or last == cls) or \
                    name == MODULE_FUNCTIONALS.get(kind):
                return (f"`{name}` is assigned in {parsed.outside_writer(name)}: a `{kind}` call may not run "
                        f"torch's code")
    return None


# hooks that attach to the grad_fn of a module's output (torch's deprecated, non-full backward hooks)
LEGACY_BACKWARD_HOOKS = frozenset({"register_backward_hook", "register_module_backward_hook"})


def legacy_backward_hooks(parsed: ParsedModule) -> str | None:
    """Where a legacy backward hook is registered in this file or another of the tree (None: nowhere): it sees the
    gradients of the last autograd node of a module's forward, which the rewrite may replace (SDPA's backward gives
    dq, dk and dv where the eager product gave one gradient: breaker round 16, grads 0.29 apart)."""
    own = parsed.derived(legacy_backward_hooks, lambda p: next(
        (call for call in p.calls_and_classes[0]
         if isinstance(call.func, cst.Attribute) and call.func.attr.value in LEGACY_BACKWARD_HOOKS), None))
    if own is not None:
        return f"this file registers a legacy backward hook (`{parsed.code(own.func)}`, line {parsed.line(own)})"
    sites = (*parsed.project.module_hooks, *parsed.project.call_hooks) if parsed.project is not None else ()
    elsewhere = next((site for site in sites if site.name in LEGACY_BACKWARD_HOOKS and site.path != parsed.path),
                     None)
    if elsewhere is not None:
        return (f"`{display_path(elsewhere.path)}` registers a legacy backward hook (`{elsewhere.name}`, line "
                f"{elsewhere.line})")
    return None


def sdpa_kernels_restricted(parsed: ParsedModule) -> str | None:
    """Why the SDPA call a patch introduces may find no kernel that takes it (None: nothing in the tree restricts
    SDPA's kernels without its math kernel): `with sdpa_kernel(SDPBackend.FLASH_ATTENTION):` or
    `enable_math_sdp(False)` in this file or another of the tree (static.sdpa_kernels)."""
    own = parsed.derived(sdpa_kernels_restricted, lambda p: next(iter(math_kernel_excluded(p.source)), None))
    if own is not None:
        return f"this file has `{own[1]}` (line {own[0]})"
    sites = parsed.project.sdpa_restrictions if parsed.project is not None else ()
    elsewhere = first_elsewhere(sites, parsed.path)
    if elsewhere is not None:
        return f"`{display_path(elsewhere.path)}` has `{elsewhere.code}` (line {elsewhere.line})"
    return None


def ops_overridden(parsed: ParsedModule) -> str | None:
    """Why torch's ops may not compute what torch's kernels do when the block runs (None: nothing in the tree shows
    it): this file or another of the tree defines a `__torch_function__` or `__torch_dispatch__` (a mode entered
    anywhere sees every call; a tensor subclass every call on its instances), or registers a kernel for an `aten`
    op (static.op_overrides)."""
    own = parsed.derived(ops_overridden, lambda p: next(iter(op_overrides(p.source)), None))
    if own is not None:
        where = f"this file has `{own[1]}` (line {own[0]})"
    else:
        elsewhere = first_elsewhere(parsed.project.op_overrides, parsed.path) if parsed.project is not None else None
        if elsewhere is None:
            return None
        where = f"`{display_path(elsewhere.path)}` has `{elsewhere.code}` (line {elsewhere.line})"
    return f"{where}, which may change what the block's torch ops compute where it is in force"


def fx_traced(parsed: ParsedModule) -> str | None:
    """Why the file's modules may be traced by torch.fx (None: nothing in the tree shows it): the file or another of
    the tree reads torch.fx or a library tracing with it (static.project.fx_trace_uses). Traced code runs on
    Proxies, so a check of dtypes or dims raises TraceError where the original traced."""
    return _traced(parsed, fx_traced, fx_trace_uses, lambda project: project.fx_traces, "torch.fx")


def real_tensor_traced(parsed: ParsedModule) -> str | None:
    """Why the file's modules may be traced on tensors by make_fx or aot_function (None: nothing in the tree shows
    it): a guard's checks pass on the example and the recorded graph keeps the SDPA path for any input (breaker
    round 31: a 1-D mask then raised in the patched graph only)."""
    return _traced(parsed, real_tensor_traced, real_trace_uses, lambda project: project.real_traces,
                   "make_fx or aot_function")


def jit_traced(parsed: ParsedModule) -> str | None:
    """Why the file's modules may be traced by torch.jit.trace or ONNX export (None: nothing in the tree shows
    it): a check is decided once, by the example inputs, and the recorded branch then runs on any input."""
    return _traced(parsed, jit_traced, jit_trace_uses, lambda project: project.jit_traces, "torch.jit.trace")


def func_transformed(parsed: ParsedModule) -> str | None:
    """Why the file's modules may run under torch.func's transforms (vmap, grad, ...; None: nothing in the tree
    shows it), which an autograd.Function without their support (flash_attn's) cannot run under."""
    return _traced(parsed, func_transformed, func_transform_uses, lambda project: project.func_transforms,
                   "torch.func")


def _traced(parsed: ParsedModule, key, uses, sites_of, tracer: str) -> str | None:
    """Where the file (`uses`, memoised under `key`) or another of the tree (the ProjectFacts field `sites_of`
    gives) uses `tracer`, in words; None where none does."""
    own = parsed.derived(key, lambda p: next(iter(uses(p)), None))
    if own is not None:
        return f"this file traces modules with {tracer} (line {parsed.line(own)})"
    elsewhere = first_elsewhere(sites_of(parsed.project), parsed.path) if parsed.project is not None else None
    return f"{elsewhere.describe()}, which traces modules with {tracer}" if elsewhere is not None else None


# TorchScript ----------------------------------------------------------------------------------------------------

def is_scripted(parsed: ParsedModule, function: cst.FunctionDef, owner: ClassInfo | None) -> bool:
    """Whether TorchScript may compile this function: decorated `@torch.jit.script(_method)`, a method of a
    `torch.jit.ScriptModule`, a method of a module the file passes to `torch.jit.script(...)` (which compiles
    forward and everything it calls, submodules included: any class of the file may be reached), a module-level
    function where the file scripts one (it compiles the functions it calls), or any function where another file
    of the scanned tree uses TorchScript's compiler (static.project: a scripted model or function may reach it)."""
    if any(parsed.imported_name(_decorator_callee(d.decorator)) in SCRIPT_DECORATORS for d in function.decorators):
        return True
    if owner is not None and any(parsed.imported_name(base.value) == "torch.jit.ScriptModule"
                                 for base in owner.node.bases):
        return True
    modules, functions = parsed.derived(_what_the_file_scripts, _what_the_file_scripts)
    if owner is not None and modules:
        return True
    if owner is None and functions and parsed.module_functions.get(function.name.value) is function:
        return True
    if parsed.derived(_announces_torchscript, _announces_torchscript):
        return True
    return parsed.project is not None and first_elsewhere(parsed.project.scripts, parsed.path) is not None


# torch.jit's names that never compile the code they touch: tracing records what runs, save and load take archives
NOT_COMPILING = frozenset({"torch.jit.trace", "torch.jit.trace_module", "torch.jit.is_tracing", "torch.jit.save",
                           "torch.jit.load"})


def _announces_torchscript(parsed: ParsedModule) -> bool:
    """Whether the file says its code is meant for TorchScript, wherever the compiler is called (a user's script
    outside the tree): it reads anything of `torch.jit` but tracing (`torch.jit.Final`, `@torch.jit.ignore`,
    `torch.jit.is_scripting()`, `getattr(torch.jit, "script")`) or declares a class's `__constants__`."""
    if "jit" not in parsed.source and "__constants__" not in parsed.source:
        return False
    return "__constants__" in parsed.bound_names or any(
        (parsed.imported_name(node) or "").startswith("torch.jit") and parsed.imported_name(node) not in NOT_COMPILING
        for node in parsed.uses_of(None))


def _what_the_file_scripts(parsed: ParsedModule) -> tuple[bool, bool]:
    """(whether the file passes anything but one of its module-level functions to `torch.jit.script(...)`, whether
    it scripts one of them: passed to it or decorated)."""
    modules = functions = False
    for call in parsed.calls_and_classes[0]:
        if parsed.imported_name(call.func) == "torch.jit.script" and call.args:
            argument = call.args[0].value
            if isinstance(argument, cst.Name) and argument.value in parsed.module_functions:
                functions = True
            else:
                modules = True
    functions = functions or any(parsed.imported_name(_decorator_callee(d.decorator)) == "torch.jit.script"
                                 for f in parsed.module_functions.values() for d in f.decorators)
    return modules, functions


def _decorator_callee(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.func if isinstance(node, cst.Call) else node


def walk(node: cst.CSTNode):
    """`node` and every node under it."""
    yield node
    for child in children(node):
        yield from walk(child)
