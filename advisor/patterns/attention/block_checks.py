"""Checks over the whole block, once every role is proved: the rewrite deletes the block's intermediates and
reads its leaves at the value product, so nothing else may read those intermediates, every name the SDPA call
reads must still mean what it meant, and the deleted statements must run exactly when the product runs (same
loops and `with` blocks, no writes in between, no overriding subclass or hook that the deletion would lose).
Weights used outside the block make the fix unsafe, or unavailable when even None cannot stand in for them.
"""

from __future__ import annotations

import re

import libcst as cst
import networkx as nx
from libcst.helpers import parse_template_expression

from advisor.patterns import scope
from advisor.patterns.attention.candidate import Candidate, defined_between, function_of, in_inlined, \
    product_read, statement_of
from advisor.patterns.attention.module_guard import MODULE_IDENTITY, NO_HOOKS, is_bias_module, module_kinds, \
    module_state_written
from advisor.patterns.attention.rendering import short
from advisor.patterns.foreign_calls import IMPLICIT_RUNNERS, foreign, foreign_sources, implicit_runs, \
    iteration_sources, modules_untrusted, runs_known_code
from advisor.patterns.attention.result import AttentionMatch, Refusal
from advisor.patterns.helper_bodies import reads_only_metadata
from advisor.static.package_functions import package_function
from advisor.patterns.ops import SHAPE_ONLY_ARGUMENT, bound_parameters, int_value
from advisor.static.codegen import atomic, is_atomic, method, number, parenthesized
from advisor.static.dataflow import UNDEFINED, Definition, loaded_names
from advisor.static.outside_writes import ANY_ON_CLASS
from advisor.static.walk import descendants
from advisor.static.module_index import LIBRARY_ROOTS
from advisor.static.tensor_reads import METADATA, shows_a_tensor
from advisor.patterns.module_values import runs_no_code


NEW_TENSOR_METHODS = ("new_ones", "new_zeros", "new_full", "new_empty", "new_tensor")
METADATA_ATTRIBUTES = frozenset({"dtype", "device", *NEW_TENSOR_METHODS})
TORCH_OPS = "torch-ops"  # assumed where the tree defines a mode, a `__torch_function__` or an aten kernel
SDPA_KERNELS = "sdpa-kernels"  # assumed where the tree restricts SDPA's kernels without the math kernel
LEGACY_HOOKS = "legacy-backward-hooks"  # assumed where the tree registers a non-full backward hook
GRADIENT_LAYOUT = "input-gradient-layout"  # assumed where the function hooks a tensor's gradient
GRADIENT_READERS = frozenset({"register_hook", "retain_grad", "register_post_accumulate_grad_hook"})


def check_reads(c: Candidate, consumed: list[Definition], chain_reads: set[cst.Name]) -> None:
    """Every read of a deleted intermediate is part of the block, or a read of the scores' metadata that
    survives by reading Q and K instead."""
    match = c.match
    score_ids = {d.id for d in c.chain.definitions}
    for definition in c.chain.definitions:
        function = function_of(c.parsed, definition.statement)
        if function is not None and definition.name in scope.outer_names(function):
            raise Refusal(f"the intermediate `{definition.name}` is declared global or nonlocal (line "
                          f"{c.parsed.line(definition.statement)}): code outside the function may read it")
    for definition in consumed:
        for read in c.flow.reads_of(definition):
            if read not in chain_reads and read not in match.escapes and definition.id in score_ids:
                translated = _translate_metadata_read(c, read)
                if translated is not None and _sees_the_product_s_operands(c, read, *translated):
                    match.renamed[translated[0]] = _bound_whole(c, *translated)
                    continue
            if read not in chain_reads and read not in match.escapes and not _shape_of_a_fill(c, read, score_ids):
                raise Refusal(f"the intermediate `{definition.name}` is also used at line "
                              f"{c.parsed.line(read)}")


def _bound_whole(c: Candidate, replaced: cst.CSTNode, replacement: cst.BaseExpression) -> cst.BaseExpression:
    """The replacement, parenthesised where a suffix or an operator around the replaced read would bind to part of
    it (`s.size()[-2:]` read as `q.size()[:-1] + k.size()[-2:-1]`: breaker round 48)."""
    around = c.parsed.parents.get(replaced)
    if is_atomic(replacement) or not isinstance(around, (cst.Attribute, cst.Subscript, cst.Call, cst.BinaryOperation,
                                                           cst.UnaryOperation)):
        return replacement
    return parenthesized(replacement)


def _uncast_scores(c: Candidate, read: cst.Name) -> bool:
    """`read` sees a step of the scores no cast precedes (`s = s.to(torch.float64)` makes `s.new_zeros(2)` float64
    where q is float32: breaker round 46); an added mask keeps q's dtype by the mask-dtype fact."""
    definitions = c.flow.definitions_of(read)
    if not definitions or any(d not in c.chain.definitions for d in definitions):
        return False
    steps = c.chain.definitions[:max(c.chain.definitions.index(d) for d in definitions) + 1]
    return all(step.kind != "assign" or step.value is None or
               (op := c.reader.read(step.value)) is not None and op.name != "cast"
               for step in steps)  # an in-place step (`s += bias`, `s.masked_fill_`) keeps the dtype


def _sees_the_product_s_operands(c: Candidate, read: cst.Name, replaced: cst.CSTNode,
                                 translation: cst.BaseExpression) -> bool:
    """A read of the scores' metadata translated to read Q and K sees them as the product did (breaker round 46):
    in the product's own function (not a lambda or closure called later), with Q's and K's names bound as at the
    product (`q = q[:, :, :2]` before it did); a read of their shape also between the product and the value
    product, the span whose in-place writes the storage checks read (`q.transpose_(-2, -1)` after it changed the
    shape; no in-place method changes a dtype or device)."""
    if c.core is None or function_of(c.parsed, read) is not function_of(c.parsed, c.core.node) or \
            c.parsed.innermost(read, cst.Lambda) is not None:
        return False
    statement = statement_of(c.parsed, read)
    first, last = (c.parsed.line(statement_of(c.parsed, node)) for node in (c.core.node, c.weights.output.node))
    dtype_only = isinstance(replaced, cst.Attribute) and replaced.attr.value in METADATA_ATTRIBUTES
    if not dtype_only and not first <= c.parsed.line(statement) <= last:
        return False
    env = c.flow.env_before.get(statement, {})
    for name in loaded_names(translation):
        seen = c.flow.reaching.get(name)
        if seen is not None and env.get(name.value, frozenset({UNDEFINED})) != seen:
            return False
    return True


LIKE_FILLS = frozenset({"torch.full_like", "torch.zeros_like", "torch.ones_like", "torch.empty_like"})


def _shape_of_a_fill(c: Candidate, read: cst.Name, score_ids: set[int]) -> bool:
    """`torch.where(mask, s, torch.full_like(s, -inf))`: the scores read for the shape, dtype and device of a fill,
    inside a statement of the score chain, which the patch deletes with the block (a reach census of round 18)."""
    argument = c.parsed.parents.get(read)
    call = c.parsed.parents.get(argument)
    if not (isinstance(argument, cst.Arg) and isinstance(call, cst.Call) and call.args[0] is argument and
            c.parsed.imported_name(call.func) in LIKE_FILLS and
            all(arg.keyword is None or arg.keyword.value == "fill_value" for arg in call.args)):
        return False
    statement = c.parsed.innermost(call, cst.SimpleStatementLine)
    return any(d.id in score_ids and c.parsed.innermost(d.statement, cst.SimpleStatementLine) is statement
               for d in c.chain.definitions)


def _translate_metadata_read(c: Candidate, read: cst.Name):
    """Reads of the scores' metadata survive the rewrite by reading Q and K instead: the scores have the
    query's dtype and device (all that `s.new_ones(...)` reads), shape (..., L, S) with L = Q.size(-2) and
    S = K.size(-2) in SDPA layout; the whole `s.size()` of a `bmm` product (no broadcast: its batch is Q's) is
    Q's size with the last one K's L. Returns (node to replace, its replacement) or None."""
    parent = c.parsed.parents.get(read)
    if isinstance(parent, cst.Arg) and _metadata_argument(c, read, parent):
        return read, atomic(c.match.query)
    call = scope.shape_argument(c.parsed, read)
    if call is not None:
        return _shape_of_product(c, read, call)
    if not (isinstance(parent, cst.Attribute) and parent.value is read):
        return None
    query, key = atomic(c.match.query), atomic(c.match.key)
    attribute = parent.attr.value
    outer = c.parsed.parents.get(parent)
    if attribute == "size" and isinstance(outer, cst.Call) and outer.func is parent and not outer.args and \
            _reads_bmm_product(c, read):
        return outer, parse_template_expression("{query}.size()[:-1] + {key}.size()[-2:-1]", query=query, key=key)
    whole = outer if attribute == "size" and isinstance(outer, cst.Call) and outer.func is parent and \
        not outer.args else parent if attribute == "shape" and not isinstance(outer, cst.Subscript) else None
    shape = _product_shape(c, read) if whole is not None else None
    if shape is not None:  # Mistral's `if attn_weights.size() != (bsz, heads, q_len, kv_len): raise ...`
        return whole, shape
    if c.chain.views:
        return None
    if (attribute in ("dtype", "device") or attribute in NEW_TENSOR_METHODS) and _uncast_scores(c, read):
        # the whole `s.dtype` (`s.new_ones`: a tensor on the scores' device and of their dtype, unless given):
        # a replaced name would lose the query's parentheses
        return parent, parent.with_changes(value=query)
    if attribute == "size" and isinstance(outer, cst.Call) and outer.func is parent and len(outer.args) == 1:
        dim = int_value(outer.args[0].value)
        return (outer, method({-1: key, -2: query}[dim], "size", number(-2))) if dim in (-1, -2) else None
    if attribute == "shape" and isinstance(outer, cst.Subscript) and len(outer.slice) == 1:
        index = outer.slice[0].slice
        if isinstance(index, cst.Index) and int_value(index.value) in (-1, -2):
            tensor = {-1: key, -2: query}[int_value(index.value)]
            return outer, parse_template_expression("{tensor}.shape[-2]", tensor=tensor)
        if isinstance(index, cst.Slice) and int_value(index.lower) == -2 and index.upper is None \
                and index.step is None:
            return outer, parse_template_expression("({query}.shape[-2], {key}.shape[-2])", query=query, key=key)
    return None


def _metadata_argument(c: Candidate, read: cst.Name, argument: cst.Arg) -> bool:
    """The Q·K^T product itself (not a later, maybe cast, step of the scores) passed to a helper of the tree that
    reads only its dtype, device or `new_*` tensors of that parameter (timm's `resolve_self_attn_mask(N, attn, ...)`):
    the query, of the product's dtype and device, reads the same there."""
    call = c.parsed.parents.get(argument)
    core = c.chain.definitions[-1] if c.chain.definitions else None
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name) or c.chain.views or core is None or \
            c.flow.reaching.get(read) != frozenset({core.id}):
        return False
    found = package_function(c.parsed, call.func.value)
    bound = bound_parameters(found[1], call, skip_first=False) if found is not None else None
    if bound is None:
        return False
    names = [name for name, value in bound.items() if value is read]
    return len(names) == 1 and reads_only_metadata(found[1], names[0], METADATA_ATTRIBUTES)


SHAPE_TAKING = {name: name.removesuffix("_as") for name in SHAPE_ONLY_ARGUMENT}  # `expand_as` -> `expand`
# views that read no data: the shape of `k.transpose(1, 2)` costs what the shape of `k` does
SHAPE_FREE_VIEWS = frozenset({"transpose", "permute", "view", "unsqueeze", "expand", "squeeze"})


def _shape_of_product(c: Candidate, read: cst.Name, call: cst.Call):
    """`bias.reshape_as(s)`, `mask.expand_as(s)`, `x.view_as(s)` (SAM's decomposed relative positions, XLM's mask)
    where `s` is the Q·K^T product itself: `other.size()` is all those methods read, and a matmul's is Q's and K's
    batch dims broadcast, then (L, S). Read from the SDPA call's Q and K where their shapes cost no compute."""
    shape = _product_shape(c, read, scaled_ok=False)
    if shape is None:
        return None
    return call, call.with_changes(func=call.func.with_changes(attr=cst.Name(SHAPE_TAKING[call.func.attr.value])),
                                   args=[cst.Arg(shape)])


def _product_shape(c: Candidate, read: cst.Name, scaled_ok: bool = True) -> cst.BaseExpression | None:
    """The shape of the Q·K^T product `read` sees (`scaled_ok`: or of that product scaled by a number), read from
    the SDPA call's Q and K where their shapes cost no compute: Q's and K's batch dims broadcast, then (L, S)."""
    torch_name = c.parsed.module_aliases.get("torch")
    query, key = c.match.query, c.match.key
    if product_read(c, read, scaled_ok=scaled_ok) is None or torch_name is None or \
            not (_shape_free(query) and _shape_free(key)) or \
            scope.is_scripted(c.parsed, c.home, c.owner) or scope.fx_traced(c.parsed) is not None:
        return None  # TorchScript compiles no torch.broadcast_shapes, torch.fx traces none of Proxies
    return parse_template_expression(
        "{torch}.broadcast_shapes({query}.shape[:-2], {key}.shape[:-2]) + ({query}.shape[-2], {key}.shape[-2])",
        torch=cst.Name(torch_name), query=atomic(query), key=atomic(key))


def _shape_free(node: cst.BaseExpression) -> bool:
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            node.func.attr.value in SHAPE_FREE_VIEWS:
        node = node.func.value
    return isinstance(node, (cst.Name, cst.Attribute))


def _reads_bmm_product(c: Candidate, read: cst.Name) -> bool:
    """`read` sees only the score product itself, a `bmm` of the block's Q and K (3-D, one batch size)."""
    return product_read(c, read, ("bmm",)) is not None


def check_bindings(c: Candidate, output_statement: cst.CSTNode) -> None:
    """Every name the SDPA call reads must mean at the value product what it meant where it was read."""
    env = c.flow.env_before.get(output_statement, {})
    nodes = list(c.leaf_nodes)
    mask_nodes = [node for term in c.match.masks for node in term.nodes]
    nodes.extend(mask_nodes)
    for call, _ in c.inlined.values():
        nodes.extend(arg.value for arg in call.args)
    # the emitted masks read the scores' metadata from Q and K instead (`attn_mask.metadata_translated`)
    translated = {id(name) for read in c.match.renamed for name in loaded_names(read)}
    mask_ids = {id(node) for node in mask_nodes}
    for node in nodes:
        if in_inlined(c, node):
            continue
        for name in loaded_names(node):
            if id(node) in mask_ids and id(name) in translated:
                continue
            seen = c.flow.reaching.get(name)
            if seen is None:
                continue
            now = env.get(name.value, frozenset({UNDEFINED}))
            if now == seen:
                rebound = defined_between(c, name, name, output_statement, start_at_end=True)
                if rebound is None:
                    continue
                raise Refusal(f"`{name.value}` is {_how_rebound(c, frozenset({rebound.id}))} between the scores "
                              "and the value product (in a loop, which brings the new value back to both)")
            if seen <= {d.id for d in c.chain.definitions}:
                use = c.parsed.parents.get(name, name)
                if isinstance(c.parsed.parents.get(use), cst.Call):
                    use = c.parsed.parents[use]  # `s.size(-1)`, not `s.size`
                raise Refusal(f"`{short(c.parsed, use)}` reads the scores, which the rewrite removes")
            raise Refusal(f"`{name.value}` is {_how_rebound(c, now - seen)} between the scores and the value "
                          f"product")


def _how_rebound(c: Candidate, new: frozenset[int]) -> str:
    kinds = {c.flow.definitions[i].kind for i in new if i != UNDEFINED}
    if UNDEFINED in new and not kinds:
        return "deleted"
    return "written in place" if kinds and kinds <= {"store", "inplace", "aug"} else "reassigned"


def check_scope(c: Candidate, output_statement: cst.CSTNode, consumed: list[Definition]) -> None:
    """What the code around the block may change: see patterns.scope."""
    match, parsed = c.match, c.parsed
    deleted = [s for s in match.removed if function_of(parsed, s) is c.home]
    reason = scope.same_context(parsed, deleted, match.output_node)
    steps = [d.statement for d in consumed] + [c.softmax.node]
    inlined = [s for s in steps if in_inlined(c, s) and scope.enclosing_contexts(parsed, s)]
    if reason is None and inlined:  # a helper's step runs once per call only at its top level
        reason = (f"a step of the helper `{function_of(parsed, inlined[0]).name.value}` runs inside a loop or "
                  f"`with` block (line {parsed.line(inlined[0])})")
    if reason is None:
        reason = scope.mode_switched(parsed, [c.home, *c.inlined])
    if reason is not None:
        raise Refusal(reason)
    match.facts.proved("scope", "the deleted statements run exactly when the value product runs",
                       "same loops, comprehensions and `with` blocks")
    reason = scope.other_targets_read(parsed, c.flow, match.removed, {d.id for d in consumed})
    if reason is not None:
        raise Refusal(reason)
    kept = list(c.leaf_nodes) + [node for term in match.masks for node in term.nodes]
    first = min([parsed.line(s) for s in deleted] + [parsed.line(output_statement)])
    paths = scope.attribute_paths(parsed, kept)
    # through the value product's own statement: `y = self._mix(w, self.widen(v))` runs `widen` before SDPA reads
    reason = scope.attribute_written_between(parsed, c.home, c.owner, paths, first,
                                             parsed.end_line(output_statement) + 1)
    if reason is None:
        reason = scope.storage_written_between(parsed, c.flow, kept, first, parsed.line(output_statement), c.owner,
                                               modules_untrusted(parsed) is None, frozenset(match.removed),
                                               c.weights.output.node)
    if reason is None:
        reason = scope.rebound_by_nested_function(c.home, {name.value for node in kept for name in loaded_names(node)})
    if reason is None:
        reason = _unseen_code_between(c, first, parsed.line(output_statement))
    if reason is not None:
        raise Refusal(reason)
    if paths:
        match.facts.proved("no-writes", "no attribute the SDPA call reads is written inside the block")
    _dispatch_facts(c, deleted + [match.output_node], kept)


def _unseen_code_between(c: Candidate, first: int, last: int) -> str | None:
    """Why code the analysis does not see may run between the scores and the value product, where the SDPA call
    reads q, k and v again (breaker round 22): a `yield` or `await` (the caller runs meanwhile) or a call that may
    run another file's or a caller's code (`cb()`, a helper writing a global tensor) in a statement the rewrite
    keeps (a statement assigning the scores on a path of its own aside: that path runs the original)."""
    parsed = c.parsed
    removed = set(c.match.removed)
    for node in descendants(c.home, (cst.Yield, cst.Await)):
        if first < parsed.line(node) < last:
            return (f"the function suspends between the scores and the value product (line {parsed.line(node)}): its "
                    "caller may change q, k or v before the SDPA call reads them")
    implicit = _implicit_code_between(c, first, last, removed)
    if implicit is not None:
        return implicit
    scores = {definition.name for definition in c.chain.definitions}
    trusted = modules_untrusted(parsed) is None
    for node in descendants(c.home, (cst.Call,) + IMPLICIT_RUNNERS):
        line = parsed.line(node)
        around = list(_ancestors(parsed, node))
        if not first < line < last or any(parent in removed for parent in around) or \
                any(_assigns(parent, scores) for parent in around):
            continue
        if isinstance(node, cst.Call) and foreign(parsed, c.owner, node, trusted):
            return (f"`{short(parsed, node.func)}` runs between the scores and the value product (line {line}); "
                    "code this analysis does not see may write q, k or v in place before the SDPA call reads them")
        for run in [] if isinstance(node, cst.Call) else implicit_runs(parsed, node):
            sources = iteration_sources(parsed, c.owner, run)
            made = None if sources is None else next((source for source in sources if parsed.line(source) <= first
                                                      and not runs_known_code(parsed, source)), None)
            if sources is None or made is not None or foreign_sources(parsed, c.owner, sources, trusted):
                where = "" if made is None else f", made at line {parsed.line(made)}"
                return (f"`{short(parsed, run)}` is iterated or entered between the scores and the value product "
                        f"(line {line}{where}): code this analysis does not see there (a generator's body, "
                        "`__enter__`) may write q, k or v in place")
    return None


def _implicit_code_between(c: Candidate, first: int, last: int, removed: set[cst.CSTNode]) -> str | None:
    """Code no call shows that may run between the scores and the value product (breaker rounds 40 and 41), in a
    statement the patch keeps: the first node `_runs_unseen` names."""
    parsed = c.parsed
    own = scope.own_bindings(c.home)
    parameters = {param.name.value for param in descendants(c.home.params, (cst.Param,))}  # the caller holds them
    kinds = (cst.FunctionDef, cst.ClassDef, cst.Del, cst.Name, cst.Import, cst.ImportFrom, cst.Call, cst.Attribute,
             cst.AssignTarget, cst.FormattedStringExpression)
    for node in descendants(c.home, kinds):
        line = parsed.line(node)
        if node is c.home or not first < line < last or any(parent in removed for parent in _ancestors(parsed, node)):
            continue
        reason = _runs_unseen(c, node, parameters, own)
        if reason is not None:
            return (f"{reason} between the scores and the value product (line {line}): code this analysis does not "
                    "see may write q, k or v in place")
    return None


TENSOR_ATTRIBUTES = METADATA | {"T", "mT", "H", "mH", "data", "grad", "real", "imag"}  # a tensor's own, read as such
DUNDER_BUILTINS = frozenset({"str", "repr", "format", "hash", "len", "bool", "int", "float", "iter", "next"})


def _runs_unseen(c: Candidate, node: cst.CSTNode, parameters: set[str], own: set[str]) -> str | None:
    """What makes `node` run code no call of the block shows: a decorator or a class statement (`__init_subclass__`,
    a metaclass); `del` of a local that may hold an object with `__del__` (not a parameter, whose object the caller
    holds too, nor a tensor), or rebinding a local that holds an object of the file's class; a read of a
    module-level object of the program's own (its property, `__setattr__`, `__repr__` under `print`, `__index__`
    under indexing, `__bool__` under `assert`); an import (a module's first import runs it); `print` (it writes to
    `sys.stdout`, which a program may replace); a builtin or an f-string given an object (`str(cfg)`, `len(cfg)`),
    which calls the object's own method; a property of the tree read on an object a caller or an import passes in
    (`cfg.verbose`)."""
    parsed = c.parsed
    if isinstance(node, cst.ClassDef) or isinstance(node, cst.FunctionDef) and node.decorators:
        return "a class statement" if isinstance(node, cst.ClassDef) else "a decorator"
    if isinstance(node, cst.Del) and any(not _holds_tensors(c, name.value) and name.value not in parameters
                                         for name in descendants(node, (cst.Name,))):
        return f"`{parsed.code(node)}` (it may run an object's `__del__`)"
    if isinstance(node, cst.Name) and _program_object(parsed, node, own):
        return f"`{node.value}`, a module-level object of the program's own (its attributes, operators or conversions),"
    if isinstance(node, (cst.Import, cst.ImportFrom)):
        return "an import"
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value not in parsed.bindings:
        if node.func.value == "print":
            return "`print` (it calls `sys.stdout.write`, which the program may replace)"
        if node.func.value in DUNDER_BUILTINS and any(_an_object(c, arg.value) for arg in node.args):
            return f"`{short(parsed, node)}` (it calls a method of what it is given)"
    if isinstance(node, cst.FormattedStringExpression) and _an_object(c, node.expression):
        return "an f-string of an object (it calls the object's `__format__`)"
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and \
            (node.value.value in parameters - {"self", "cls"} or _imported_object(parsed, node.value)) and \
            node.attr.value not in TENSOR_ATTRIBUTES and _property_in_tree(parsed, node.attr.value):
        return f"`{short(parsed, node)}`, a property the tree defines,"
    if isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name) and \
            _holds_a_program_object(c, node.target.value):
        return f"rebinding `{node.target.value}`, which holds an object of a class of the program (its `__del__`),"
    return None


def _an_object(c: Candidate, node: cst.BaseExpression) -> bool:
    """A name the source does not show to hold a tensor or a number (a parameter, a global, an object)."""
    return isinstance(node, cst.Name) and node.value not in ("None", "True", "False") and \
        not shows_a_tensor(c.parsed, node) and not runs_no_code(c.parsed, node.value) and \
        not _holds_tensors(c, node.value)


def _imported_object(parsed, name: cst.Name) -> bool:
    """A name imported from a module that is not a library's (`from cfgmod import CFG`)."""
    dotted = parsed.imports.get(name.value)
    return dotted is not None and dotted.split(".")[0] not in LIBRARY_ROOTS


def _property_in_tree(parsed, attribute: str) -> bool:
    """A property of that name defined in this file or another file of the tree (`@property def verbose`), searched
    once per file and name."""
    return parsed.derived(("property-in-tree", attribute), lambda p: _searched_property(p, attribute))


def _searched_property(parsed, attribute: str) -> bool:
    pattern = re.compile(rf"@\w*(?:\.\w+)*property\b[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+{re.escape(attribute)}\b")
    if pattern.search(parsed.source):
        return True
    tree = parsed.tree
    return tree is not None and any(pattern.search(tree.text(path) or "") for path in tree.mentioning(attribute))


def _holds_a_program_object(c: Candidate, name: str) -> bool:
    """A local the block's function binds to an instance of a class of this file (`keeper = Dropper(k)`)."""
    flow = c.parsed.flow(c.home)
    return any(d.name == name and d.kind == "assign" and isinstance(d.value, cst.Call) and
               isinstance(d.value.func, cst.Name) and d.value.func.value in c.parsed.top_level_classes
               for d in flow.definitions.values())


def _holds_tensors(c: Candidate, name: str) -> bool:
    """Every binding of the local `name` in the block's function assigns a value the source shows is a tensor."""
    flow = c.parsed.flow(c.home)
    bindings = [d for d in flow.definitions.values() if d.name == name]
    return bool(bindings) and all(d.kind == "assign" and d.index is None and d.value is not None and
                                  shows_a_tensor(c.parsed, d.value) for d in bindings)


def _program_object(parsed, name: cst.Name, own: set[str]) -> bool:
    """A read of a module-level name holding anything but a number, a string or a torch tensor (an instance of the
    program's own class), not a function, class or import (their calls are checked apart)."""
    parent = parsed.parents.get(name)
    if isinstance(parent, cst.Attribute) and parent.attr is name or isinstance(parent, cst.Arg) and \
            parent.keyword is name or name.value in own or name.value in parsed.imports or \
            name.value in parsed.module_functions or name.value in parsed.top_level_classes or \
            name.value in scope.BUILTIN_NAMES and name.value not in parsed.bindings or \
            isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef, cst.Global, cst.Nonlocal, cst.NameItem)):
        return False
    function = parsed.innermost(name, cst.FunctionDef)
    if function is not None and parsed.innermost(parsed.parents.get(function), cst.FunctionDef) is not None:
        return False  # a nested function's name may be its enclosing function's local (a closure)
    return not runs_no_code(parsed, name.value)


def _assigns(statement: cst.CSTNode, names: set[str]) -> bool:
    """`attn = self.rel_pos(attn)`: a statement that assigns the scores on a path of its own, which the patch leaves
    to the original (SDPA takes only the paths that skip it: attention.score_paths)."""
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else \
        [statement.target] if isinstance(statement, (cst.AugAssign, cst.AnnAssign)) else []
    return any(isinstance(target, cst.Name) and target.value in names for target in targets)


def _ancestors(parsed, node: cst.CSTNode):
    while node is not None:
        yield node
        node = parsed.parents.get(node)


def _dispatch_facts(c: Candidate, block: list[cst.CSTNode], kept: list[cst.CSTNode]) -> None:
    """The `self.` methods and modules the proof resolved are the ones that run, and deleting a module
    call loses nothing but its computation (no hooks)."""
    owner, match = c.owner, c.match
    replaced = scope.replaced_torch_function(c.parsed, block) or scope.emitted_name_rebound(c.parsed)
    if replaced is not None:
        raise Refusal(replaced)
    hooked = next((call for function in (c.home, *c.inlined) for call in descendants(function, (cst.Call,))
                   if isinstance(call.func, cst.Attribute) and call.func.attr.value in GRADIENT_READERS), None)
    if hooked is not None:
        match.facts.assumed(GRADIENT_LAYOUT, "nothing reads the strides of the gradients q, k and v get (SDPA's "
                            "backward gives them the inputs' layout, the product's backward contiguous ones: a hook "
                            "viewing one raised)", f"`{short(c.parsed, hooked)}` at line {c.parsed.line(hooked)}")
    legacy = scope.legacy_backward_hooks(c.parsed)
    if legacy is not None:
        match.facts.assumed(LEGACY_HOOKS, "no legacy (non-full) backward hook sees the block's autograd nodes (it "
                            "takes the gradients of a module output's last node, which the rewrite may replace)",
                            legacy)
    restricted = scope.sdpa_kernels_restricted(c.parsed)
    if restricted is not None:
        match.facts.assumed(SDPA_KERNELS, "SDPA may pick any of its kernels where the block runs (its math kernel "
                            "takes every call; a fused one refuses dropout in training on CPU, 3-D inputs or a mask "
                            "that requires grad, and then `No available kernel` raises)", restricted)
    overridden = scope.ops_overridden(c.parsed)
    if overridden is not None:
        match.facts.assumed(TORCH_OPS, "torch's ops compute as torch's kernels do (no mode, tensor subclass or "
                            "registered kernel changes softmax, matmul or SDPA)", overridden)
    if owner is None:
        return
    names = scope.self_names(block + kept) | {f.name.value for f in c.inlined if f in owner.methods.values()}
    reason = scope.overridden(c.scope.classes(), owner, names)
    if reason is not None:
        raise Refusal(reason)
    _methods_bound_by_computed_names(c, names & set(owner.methods))
    if c.scope.classes().subclasses(owner):
        match.facts.proved("dispatch", "no subclass overrides a method or attribute the block uses",
                           "checked for the subclasses in this file")
    deleted = scope.deleted_module_calls(c.parsed, owner, block, kept)
    for term in match.masks:  # a bias module's call, also where a hoisted branch replaces it by its term
        if term.module is not None:
            deleted.setdefault(term.module[0], term.module[2])
    c.deleted_modules = {attribute: (read, module_kinds(c, attribute)) for attribute, read in deleted.items()}
    for _, kinds in c.deleted_modules.values():
        replaced = scope.replaced_module_class(c.parsed, kinds or ())
        if replaced is not None:
            raise Refusal(replaced)
    for attribute in deleted:  # the emitted code reads the module as the class builds it (`self.drop.p`)
        if is_bias_module(c, attribute):
            _bias_module_facts(match, attribute)
            continue
        identity_ok = attribute in c.identity_ok
        rebound = owner.rebound(attribute, identity_ok=identity_ok) or \
            module_state_written(owner, c.deleted_modules[attribute][1] or ())
        if rebound is None:
            continue
        refusal = (f"`self.{attribute}`, whose call the rewrite deletes, may not be the module the class builds "
                   f"when the code runs: {rebound}")
        elsewhere = owner.rebound_only_by_names_computed_elsewhere(attribute, identity_ok)
        if not elsewhere and c.deleted_modules[attribute][1] is None:
            raise Refusal(refusal)
        if not elsewhere:  # exact where a run-time check finds the class's module there: else refused (guards)
            c.module_refusal = c.module_refusal or refusal
        match.facts.assumed(MODULE_IDENTITY, f"`self.{attribute}`, whose call the rewrite deletes, is the module "
                            "the class builds when the code runs", rebound)
    hooked = scope.hook_registration(c.parsed)
    for attribute in deleted:
        if is_bias_module(c, attribute):
            continue
        statement = f"no forward hook is registered on `self.{attribute}`, whose call the rewrite deletes"
        if scope.is_hook_point(c.parsed, owner, attribute):
            match.facts.assumed(NO_HOOKS, statement, "it computes nothing, so it exists to carry hooks")
        elif hooked:
            match.facts.assumed(NO_HOOKS, statement, hooked)
        else:
            match.facts.proved(NO_HOOKS, statement, "no hook is registered in this file")


def _methods_bound_by_computed_names(c: Candidate, methods: set[str]) -> None:
    """A method the block calls or inlines may be another function when the code runs where the class binds its
    attributes by computed names (`setattr(self, name, f)`: refused), or where a file binds them so on what may be
    a class (`setattr(Attn, name, f)` in a loop, `type.__setattr__(cls, name, f)`): refused in this file, assumed
    where only other files of the tree do (as for the attributes the block reads). Computed bindings on instances
    elsewhere (`setattr(model, name, layer)`, a pruning utility's) are not read as replacing methods. A write of
    the method's own name is `scope.overridden`'s."""
    if not methods:
        return
    name = sorted(methods)[0]
    if c.owner.binds_computed_names:
        raise Refusal(f"`self.{name}`, a method the block runs, may be another function when the code runs: "
                      f"`{c.owner.node.name.value}` sets its attributes by computed names (`setattr(self, name, ...)`)")
    written = c.owner.written_outside(ANY_ON_CLASS)
    if written is None:
        return
    rebound = f"{c.owner.writer(written)} sets attributes by computed names on what may be a class, or functions"
    if c.owner.writer(written) == "this file":
        raise Refusal(f"`self.{name}`, a method the block runs, may be another function when the code runs: "
                      f"{rebound}")
    c.match.facts.assumed("dispatch", f"the methods the block runs (`self.{name}`) are the class's when the code "
                          "runs", rebound)


def _bias_module_facts(match: AttentionMatch, attribute: str) -> None:
    """A bias module's term is read in its class (`module_terms`): exact for a module of that class exactly on which
    no hook fires, which only a run-time check shows (another class, a subclass, a hook added anywhere)."""
    match.facts.assumed(MODULE_IDENTITY, f"`self.{attribute}`, whose call the rewrite replaces by its term, is of a "
                        "class the term is read in", "its class is read from the source, the instance's only at run "
                        "time")
    match.facts.assumed(NO_HOOKS, f"no forward hook is registered on `self.{attribute}`, whose call the rewrite "
                        "replaces by its term", "hooks are registered at run time")


def check_escapes(c: Candidate) -> None:
    """Weights read outside the block: the fix becomes unsafe (SDPA does not return them), and unavailable
    when they flow back into the scores or where None cannot stand in for them."""
    match = c.match
    hidden = _hidden_read(c)
    if hidden is not None:
        raise Refusal(f"{hidden}: the rewrite would delete them")
    if not match.escapes:
        return
    where = ", ".join(sorted({str(c.parsed.line(read)) for read in match.escapes}))
    match.reason = (f"the attention weights are used outside the block (line {where}), and SDPA does not "
                    f"return them")
    score_ids = {d.id for d in c.chain.definitions}
    graph = c.flow.graph
    feedback = [d for d in c.weights.definitions if d.id in graph and nx.descendants(graph, d.id) & score_ids]
    if feedback:  # residual attention: the weights reach the next iteration's scores
        match.unsafe_reason = (f"the weights `{feedback[0].name}` flow back into the scores (a loop), so they "
                               f"cannot be replaced by None")
        return
    for read in match.escapes:
        parent = c.parsed.parents.get(read)
        if isinstance(parent, cst.AssignTarget) or isinstance(parent, (cst.AnnAssign, cst.AugAssign)) \
                and parent.target is read:
            match.unsafe_reason = (f"the weights are bound to `{read.value}` (line {c.parsed.line(read)}), which "
                                   f"the function declares global or nonlocal: code outside it reads that binding, "
                                   f"which the rewrite would delete")
            return
        if not isinstance(parent, (cst.Element, cst.Return, cst.Assign)):
            match.unsafe_reason = _why_not_none(c, read, parent)
            return
    match.dropped = _dropped_claims(c)


NAMESPACE_READERS = frozenset({"locals", "vars", "eval", "exec"})  # builtins that read a function's locals


def _hidden_read(c: Candidate) -> str | None:
    """A read of the weights the flow does not follow: a nested `def`, lambda or class body that names them (it runs
    whenever it is called), or `locals()`, `vars()`, `eval` or `exec` in the function (any local by name)."""
    names = {definition.name for definition in c.weights.definitions}
    readers = c.parsed.derived(_hidden_readers, _hidden_readers)
    for node in (node for function in {c.home, c.function} for node in readers.get(function, ())):
        if isinstance(node, cst.Call):
            return (f"`{node.func.value}(...)` at line {c.parsed.line(node)} may read the weights "
                    f"`{sorted(names)[0]}` by name")
        read = next((name for name in loaded_names(node) if name.value in names), None)
        if read is not None:
            nested = "lambda" if isinstance(node, cst.Lambda) else f"`{node.name.value}`"
            return (f"the weights `{read.value}` are read by the nested {nested} (line "
                    f"{c.parsed.line(read)}), which may run after the block")
    return None


def _hidden_readers(parsed) -> dict[cst.FunctionDef, list[cst.CSTNode]]:
    """For each function of the file, its nested `def`s, lambdas and classes, and its calls of `locals()`, `vars()`,
    `eval` or `exec` (builtins the file does not rebind): what reads its locals out of the flow's sight. Once per
    file."""
    found: dict[cst.FunctionDef, list[cst.CSTNode]] = {}
    for node in parsed.nodes_of(cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Call):
        if isinstance(node, cst.Call):
            func = node.func
            if not (isinstance(func, cst.Name) and func.value in NAMESPACE_READERS and
                    func.value not in parsed.bound_names and func.value not in parsed.imports and
                    not (func.value == "vars" and node.args)):
                continue
            outer = function_of(parsed, node)
        else:
            outer = function_of(parsed, parsed.parents.get(node))
        if outer is not None:
            found.setdefault(outer, []).append(node)
    return found


def _dropped_claims(c: Candidate) -> tuple:
    """Where the weights leave only as one element of the tuples the function returns: the claim that every call
    drops that element (then None stands in for them exactly, see `call_site_facts.settle_dropped_weights`). None
    for `forward` and `__call__`: a module is called in more ways than any index of its calls sees (hooks written
    into `_forward_hooks`, `model.apply`, `_modules.values()`, a class's own `__call__`, IPython magics)."""
    from advisor.patterns.call_site_facts import DROPS, Claim

    function, parsed = c.function, c.parsed
    if c.home is not function or c.inlined or function.name.value in ("forward", "__call__"):
        return ()
    positions = set()
    for read in c.match.escapes:
        element = parsed.parents.get(read)
        row = parsed.parents.get(element)
        if not (isinstance(element, cst.Element) and isinstance(row, cst.Tuple) and
                isinstance(parsed.parents.get(row), cst.Return) and function_of(parsed, row) is function):
            return ()
        positions.add(next(i for i, e in enumerate(row.elements) if e is element))
    parameters = [p.name.value for p in function.params.params]
    if c.owner is not None:
        parameters = parameters[1:]
    if len(positions) != 1 or not parameters:
        return ()
    return (Claim(function, parameters[0], DROPS, position=positions.pop()),)


def _why_not_none(c: Candidate, read: cst.Name, parent: cst.CSTNode) -> str:
    """Why the weights cannot simply be replaced by None where they escape, naming the real use."""
    line = c.parsed.line(read)
    if isinstance(parent, cst.Attribute) and parent.value is read:
        return f"the weights' `.{parent.attr.value}` is used at line {line}, and None has none"
    if isinstance(parent, cst.Arg):
        call = c.parsed.parents.get(parent)
        callee = short(c.parsed, call.func) if isinstance(call, cst.Call) else short(c.parsed, parent)
        return f"the weights are passed to `{callee}` at line {line}, which cannot take None"
    return f"the weights are used in `{short(c.parsed, parent)}` at line {line}, which cannot take None"
