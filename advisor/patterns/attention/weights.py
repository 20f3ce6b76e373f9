"""The forward walk and what lies on it: from the softmax output through casts, dropout and transposes to the
weights·V product, then the value operand, dropout's probability, and the layout the output must keep.

Every read of the weights other than the one that continues the block escapes it (SDPA does not return the
weights); a read that transforms them on the way to a product is a refusal, since SDPA would skip it.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import einsum as es
from advisor.patterns import scope
from advisor.patterns.attention.anchors import feeds_product
from advisor.patterns.attention.candidate import (
    MAX_CHAIN, Candidate, WeightPath, consumers, definition_of_value, flow_for, function_of,
)
from advisor.patterns.attention.helpers import bind_arguments, callee, calls_to, leave_to_caller
from advisor.patterns.attention.products import last_two, rank, spec
from advisor.patterns.attention.rendering import at_home, short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.attention.scores import absorb
from advisor.patterns.ops import Op, int_value, number_value
from advisor.static.codegen import atomic, dotted, keyword, number
from advisor.static.tensor_reads import SIZED_METHODS, SIZED_TORCH
from advisor.static.walk import walk as visit_tree
from advisor.static.dataflow import UNDEFINED, Definition, bound_names, contains_call, loaded_names

# methods whose result shares the input's storage with strides derived from the input's
STRIDED_VIEWS = {"transpose", "permute", "mT", "T", "unsqueeze", "squeeze", "expand", "swapaxes", "movedim",
                 "chunk", "split", "unbind", "tensor_split", "narrow", "select", "diagonal", "flatten", "unflatten",
                 "expand_as"}  # the last ones return views (or tuples of views) of the input's storage as well
READS_STRIDES, KEEPS_STRIDES, VALUES_ONLY = "reads strides", "keeps strides", "values only"  # see _layout_use
# what reads a tensor's memory layout, or builds a tensor from it
STRIDE_READS = frozenset({"stride", "is_contiguous", "data_ptr", "storage", "untyped_storage", "storage_offset",
                          "as_strided", "set_", "numpy", "unfold"})
# methods whose result keeps the receiver's strides (elementwise ops and casts preserve the memory format)
SAME_STRIDES = frozenset({"float", "half", "double", "bfloat16", "to", "type", "type_as", "clone", "detach", "mul",
                          "add", "sub", "div", "neg", "abs", "exp", "masked_fill", "relu", "gelu", "sigmoid",
                          "tanh", "sqrt", "pow", "data", "requires_grad_", "mul_", "add_", "div_", "sub_"})
# methods whose result may share the receiver's storage: a write through it writes the output (`.contiguous()` and
# `.reshape` return the receiver itself, or a view, where its strides allow)
ALIASING = frozenset({"view", "view_as", "reshape", "reshape_as", "contiguous", "detach", "data", "flatten",
                      "unflatten", "narrow", "select", "diagonal", "as_strided", "real"}) | STRIDED_VIEWS
NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad"})  # in-place by name, values untouched
# methods whose result is a fresh tensor of torch's default (contiguous) layout, or no tensor: the output's strides
# end there; any other method may keep them (`.clamp`, `.flip`, `.nan_to_num`, `.real`: breaker round 14)
FRESH_LAYOUT = frozenset({"contiguous", "reshape", "reshape_as", "sum", "mean", "amax", "amin", "max", "min",
                          "norm", "std", "var", "prod", "logsumexp", "all", "any", "argmax", "argmin", "item",
                          "tolist", "size", "dim", "numel", "shape", "dtype", "device", "is_floating_point",
                          "matmul", "mm", "bmm", "repeat", "masked_select", "nonzero", "element_size", "ndim",
                          "requires_grad", "is_cuda", "register_hook", "backward"})
RETURNS_INPUT = frozenset({"torch.nn.Identity", "torch.nn.Dropout", "torch.nn.Dropout1d", "torch.nn.Dropout2d"})
CONTAINER_LAYERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})


def follow_weights(c: Candidate, start: cst.CSTNode, ndim: int | None) -> WeightPath:
    """Walk from the softmax output to the value product; the walk may leave to the caller (`c.home`)."""
    node, dropouts, definitions, escapes, reads, casts = start, [], [], [], set(), []
    transposed = False
    for _ in range(MAX_CHAIN):
        parent = c.parsed.parents.get(node)
        definition = definition_of_value(c, node)
        if definition is not None:
            definitions.append(definition)
            escapes.extend(_outer_binding(c, definition))
            node = _next_weight_read(c, definition, escapes)
            reads.add(node)
            continue
        if isinstance(parent, cst.Return) and c.home is c.function and not c.inlined:
            node = leave_to_caller(c, parent)
            continue
        consumer, op = consumers(c, node)[0]
        if op is None:
            if isinstance(parent, cst.Assign) and isinstance(parent.targets[0].target, cst.Attribute):
                raise Refusal(f"the attention weights are stored in `{short(c.parsed, parent.targets[0].target)}` "
                              f"(line {c.parsed.line(parent)}), where code outside the block may read them")
            if isinstance(parent, (cst.Element, cst.Return)) or consumer is None:
                raise Refusal("the attention weights are returned before any value product")
            raise Refusal(f"the attention weights flow into `{short(c.parsed, consumer)}`")
        if op.name in ("cast", "identity"):
            absorb(c, op)
            if op.name == "cast":
                c.dtype_changes.append(op)
                casts.append(op)
            node = op.node
        elif op.name == "dropout":
            dropouts.append(op)
            node = op.node
        elif op.name in ("transpose", "permute", "mT") and _swaps_last_two(op, ndim):
            transposed = not transposed
            node = op.node
        elif op.name in ("matmul", "bmm") and op.operands[int(transposed)] is node:
            return WeightPath(op, op.operands[1 - int(transposed)], definitions, escapes, dropouts, reads, transposed, casts)
        elif op.name == "einsum" and node in op.operands:
            other = op.operands[1] if op.operands[0] is node else op.operands[0]
            return WeightPath(op, other, definitions, escapes, dropouts, reads, transposed, casts)
        elif op.name == "mul":
            raise Refusal(f"the attention weights are multiplied by "
                          f"`{short(c.parsed, op.operands[1] if op.operands[0] is node else op.operands[0])}` "
                          f"(a head mask or reweighting) before the value product")
        else:
            why = "heads or positions are mixed" if op.name in ("view", "transpose", "permute", "mT") else \
                "SDPA applies nothing between its softmax and its value product"
            raise Refusal(f"the attention weights pass through `{short(c.parsed, op.node)}` before the value "
                          f"product ({why})")
    raise Refusal("the weights are followed too far without reaching a value product")


def _outer_binding(c: Candidate, definition: Definition) -> list[cst.Name]:
    """The target `w` of `w = <weights>` when the function declares `w` global or nonlocal: the binding outlives
    the call (another function may read it), so the weights escape there."""
    function = function_of(c.parsed, definition.statement)
    if function is None or definition.name not in scope.outer_names(function):
        return []
    return [target for target in bound_names(definition.statement) if target.value == definition.name]


def _swaps_last_two(op: Op, ndim: int | None) -> bool:
    if op.name == "mT":
        return True
    dims = [int_value(d) for d in op.params["dims"]]
    if None in dims:
        return False
    if op.name == "transpose":
        return last_two(dims, ndim)
    n = len(dims)
    return n >= 2 and dims == list(range(n - 2)) + [n - 1, n - 2]


def _next_weight_read(c: Candidate, definition: Definition, escapes: list[cst.Name]) -> cst.Name:
    """Of the reads of a weights variable, the one that continues the block; the others escape it."""
    flow, twin = c.flow, c.chain.twin
    continuing, others, unread = [], [], []
    update = _guarded_dropout(c, definition)
    updated = _guarded_dropout_of(c, definition)
    for read in flow.reads_of(definition):
        twins = {twin.id} if twin is not None and definition.id not in {twin.id} else set()
        if update is not None and flow.reaching.get(read) == frozenset({definition.id, update.id}):
            continue  # read after the `if`: followed from the update
        if updated is not None:
            twins = {updated.id}
        if flow.reaching.get(read) not in (frozenset({definition.id}), frozenset({definition.id} | twins)):
            guarded = [flow.definitions[i] for i in flow.reaching.get(read, ()) if i != UNDEFINED
                       and flow.definitions[i].guards]
            where = f" under `if {short(c.parsed, guarded[-1].guards[-1].test)}`" if guarded else ""
            raise Refusal(f"the attention weights are reassigned{where} before the value product")
        consumer, op = consumers(c, read)[0]
        if isinstance(c.parsed.parents.get(read), cst.Return) and not c.inlined and \
                calls_to(c.parsed, c.function, c.owner):
            continuing.append(read)
        elif op is not None and op.name == "cast" and read is not op.operands[0]:
            others.append(read)  # `w.type_as(w)`: the argument's dtype only (see `_argument_of_cast`)
        elif op is not None and (op.name in ("cast", "identity", "dropout", "transpose", "permute", "mT") or
                                 op.name in ("matmul", "bmm") or
                                 (op.name == "einsum" and read in op.operands)):
            continuing.append(read)
        elif op is not None and op.name in ("mul", "add", "sub", "div", "einsum", "matmul", "bmm",
                                            "softmax", "masked_fill", "where") and feeds_product(c, read):
            raise Refusal(f"the attention weights are transformed by `{short(c.parsed, op.node)}` "
                          f"before the value product")
        else:
            others.append(read)
            if op is None and isinstance(consumer, cst.Call) and feeds_product(c, read):
                unread.append(consumer)
    if not continuing and unread:  # fairseq's `self.dropout_module(w)`: a module whose forward has a branch
        raise Refusal(f"the attention weights pass through `{short(c.parsed, unread[0])}`, which is not read as "
                      f"dropout, a cast or a view, before the value product")
    if len(continuing) != 1:
        raise Refusal("the attention weights are used by more than one operation" if continuing
                      else "the attention weights never reach a value product")
    escapes.extend(read for read in others if not _argument_of_cast(c, read, continuing[0]))
    return continuing[0]


def _guarded_dropout(c: Candidate, weights: Definition) -> Definition | None:
    """MPT's `if dropout_p: w = dropout(w, p=dropout_p, ...)`: the update of the weights made under a test of
    dropout's own probability, which is false only where dropout is the identity (p == 0) or would raise
    (None); SDPA's dropout_p carries the test (`dropout_role`). None for any other update."""
    for read in c.flow.reads_of(weights):
        _, op = consumers(c, read)[0]
        update = definition_of_value(c, op.node) if op is not None and op.name == "dropout" and \
            op.operands[0] is read else None
        if update is None or update.name != weights.name or len(update.guards) != len(weights.guards) + 1 \
                or update.guards[:-1] != weights.guards:
            continue
        guard = update.guards[-1]
        p = op.params.get("p")
        if guard.orelse is None and len(guard.body.body) == 1 and p is not None and not contains_call(guard.test) \
                and c.parsed.code(guard.test).replace(" ", "") == c.parsed.code(p).replace(" ", ""):
            return update
    return None


def _guarded_dropout_of(c: Candidate, definition: Definition) -> Definition | None:
    """The weights that `definition` updates when it is such a guarded dropout (see `_guarded_dropout`)."""
    if definition.kind != "assign" or not definition.guards:
        return None
    op = c.reader.read(definition.value)
    if op is None or op.name != "dropout" or not isinstance(op.operands[0], cst.Name):
        return None
    before = c.flow.definitions_of(op.operands[0])
    if len(before) != 1 or _guarded_dropout(c, before[0]) is not definition:
        return None
    return before[0]


def _argument_of_cast(c: Candidate, read: cst.Name, continuing: cst.Name) -> bool:
    """`w.type_as(w)`: the cast that continues the block reads only the dtype of its argument, and goes away
    with the block (its arguments are absorbed), so that read is no use of the weights outside it."""
    _, op = consumers(c, continuing)[0]
    if op is None or op.name != "cast" or not isinstance(op.node, cst.Call):
        return False
    return any(read in loaded_names(arg.value) for arg in op.node.args)


def value_roles(c: Candidate, core: Op) -> None:
    """V as SDPA wants it, (..., S, Ev), and the methods that give the output the original's layout."""
    match, output, value_node = c.match, c.weights.output, c.weights.value_node
    match.value = at_home(c, value_node)
    c.leaf_nodes.append(value_node)
    if c.weights.transposed:  # V @ P^T == (P @ V^T)^T
        match.value = at_home(c, value_node, [("transpose", (-2, -1))])
        match.output_methods = [("transpose", (-2, -1))]
    if output.name == "einsum":
        if core.name != "einsum":
            raise Refusal("the value product is an einsum but the score product is not")
        try:
            (first, second), out_axes = spec(c, output)
            p_axes, v_axes = (first, second) if output.operands[1] is value_node else (second, first)
            if c.weights.transposed:  # the einsum names the axes of P^T: P's own are its last two swapped
                p_axes = p_axes[:-2] + p_axes[-1:] + p_axes[-2:-1]
            layout = es.value_layout(c.layout, p_axes, v_axes, out_axes)
        except es.EinsumMismatch as exc:
            raise Refusal(f"the weights·V einsum is not plain attention: {exc}") from None
        v_steps = es.permutation_steps(layout.v_order, c.has_ellipsis)
        out_steps = es.permutation_steps(layout.out_order, c.has_ellipsis)
        if v_steps is None or out_steps is None:
            raise Refusal("the einsum moves an ellipsis axis")
        match.value = at_home(c, value_node, v_steps + es.broadcast_steps(layout.v_unsqueeze))
        match.output_methods = out_steps
    elif core.name == "einsum" and c.layout.ndim != (rank(c, value_node) or c.layout.ndim):
        raise Refusal("V's rank differs from the scores' rank")

DROPOUT_RANGE = "dropout-range"


def dropout_role(c: Candidate, dropouts: list[Op]) -> None:
    """SDPA's dropout_p: the probability when dropout runs, under the original's training flag (and under the
    `if p:` that guards it, see `_guarded_dropout`)."""
    if len(dropouts) > 1:
        raise Refusal("dropout is applied twice to the attention weights")
    if not dropouts:
        return
    op = dropouts[0]
    probability = _dropout_probability(c, op)
    update = definition_of_value(c, op.node)
    if probability is not None and update is not None and _guarded_dropout_of(c, update) is not None:
        guard = update.guards[-1]
        c.leaf_nodes.append(guard.test)
        probability = cst.IfExp(test=at_home(c, guard.test), body=atomic(probability), orelse=number(0.0))
    c.match.dropout_p = probability


def _dropout_probability(c: Candidate, op: Op) -> cst.BaseExpression | None:
    p = op.params.get("p")
    if p is None:
        probability = number(0.5)
    else:
        probability = at_home(c, p)
        c.leaf_nodes.append(p)
        _range_fact(c, op, p)
    if number_value(p) == 0:
        return None
    training = op.params.get("training")
    if training is None and not op.params.get("default_training", False):
        raise Refusal("dropout's training flag is not given")
    if training is None:
        return probability
    if isinstance(training, cst.Name) and training.value in ("True", "False"):
        return probability if training.value == "True" else None
    if not op.params.get("module"):
        c.leaf_nodes.append(training)
    elif _may_be_identity(c, op) or scope.is_scripted(c.parsed, c.home, c.owner):
        # `getattr(self.attn_drop, "p", 0.0)`: an Identity drops nothing; TorchScript compiles the SDPA branch of a
        # guarded patch too, where the module may be an Identity with no `p` (the check sends it to the original)
        probability = cst.Call(func=cst.Name("getattr"), args=[
            cst.Arg(probability.value), cst.Arg(cst.SimpleString('"p"')), cst.Arg(number(0.0))])
    return cst.IfExp(test=at_home(c, training), body=atomic(probability), orelse=number(0.0))


def _range_fact(c: Candidate, op: Op, p: cst.BaseExpression) -> None:
    """F.dropout raises for a probability outside [0, 1] even where it does not train, and the patch drops it there:
    a literal is read, a dropout module's `p` was checked when it was built; any other is assumed (guarded
    `0.0 <= p <= 1.0` where it can be read again, see attention.guards). A literal outside the range is refused."""
    value = number_value(p)
    if value is not None and not 0.0 <= value <= 1.0:
        raise Refusal(f"dropout's probability {short(c.parsed, p)} is outside [0, 1]: the original raises")
    if value is not None or op.params.get("module"):
        return
    c.dropout_reads.append(p)
    c.match.facts.assumed(DROPOUT_RANGE, f"dropout's probability `{short(c.parsed, p)}` lies in [0, 1]",
                          "it is not a literal (the original's dropout raises outside that range, even when not "
                          "training; the patch would not)")


def _may_be_identity(c: Candidate, op: Op) -> bool:
    """`self.attn_drop(w)` where the class builds `nn.Dropout(p) if p else nn.Identity()`, or where the file may
    swap dropout modules for `nn.Identity()` under computed names (an export helper) and nothing else rebinds
    `attn_drop`: the call is a dropout or an identity when it runs."""
    func = op.node.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
            and c.owner is not None):
        return False
    attribute = func.attr.value
    if not op.params.get("maybe_identity") and (c.owner.rebound(attribute) is None or
                                                c.owner.rebound(attribute, identity_ok=True) is not None):
        return False
    c.identity_ok.add(attribute)
    return True


def layout_role(c: Candidate) -> None:
    """SDPA's output has a fresh matmul's values but not always its strides (CPU and flash kernels return a
    transposed layout). A `.view` that reads the output, directly or through views, needs the original's
    contiguous strides, and so may a caller the output is returned to: emit `.contiguous()` for those
    (a no-op when already contiguous). Every other use reads values only."""
    match = c.match
    written = _written_in_place(c)
    if written is not None:  # a fresh contiguous tensor: aliases as the product's do, and autograd saved none of it
        torch = c.parsed.module_aliases.get("torch")  # one copy, as ADV204 would fold `.contiguous().clone()`
        match.output_methods += [("clone", (keyword("memory_format", dotted(f"{torch}.contiguous_format")),))] \
            if torch is not None else [("contiguous", ()), ("clone", ())]
        match.facts.proved("layout", "the output is a fresh contiguous tensor, as the original's product is, where "
                           f"it or a view of it {written} (SDPA's kernels save their output for the backward)")
        return
    frontier, steps, reader = [match.output_node], 0, None
    entered: dict[cst.FunctionDef, cst.Call] = {}  # helpers followed into, each with the call that entered it
    while frontier and steps < MAX_CHAIN and reader is None:
        steps += 1
        node = frontier.pop()
        parent = _returned(c, node)
        if isinstance(parent, cst.Return) and function_of(c.parsed, parent) in entered:
            frontier.append(entered[function_of(c.parsed, parent)])  # the helper's result: its call's value
            continue
        if isinstance(parent, cst.Return):
            held = _held_by_callers(c, node, parent)
            if held is None:
                reader = "is returned to a caller outside this file, or one unpacking it out of sight"
            frontier.extend(held or ())  # a helper of this file: follow its callers
            continue
        if isinstance(parent, cst.Subscript) and parent.value is node or isinstance(parent, cst.UnaryOperation) or \
                isinstance(parent, cst.IfExp) and node in (parent.body, parent.orelse):
            frontier.append(parent)  # `o[0]`, `-o`, `o if c else q`: the expression holds its strides
            continue
        for consumer, _ in consumers(c, node):
            use = _layout_use(c, consumer, node)
            helper = _helper_reads(c, consumer, node) if use == READS_STRIDES else None
            if helper is not None:
                entered[helper[0]] = consumer
                frontier.extend(helper[1])
            elif use == READS_STRIDES:
                where = consumer if consumer is not None else c.parsed.parents.get(node)
                reader = f"is read by `{short(c.parsed, where)}` at line {c.parsed.line(where)}"
            elif use == KEEPS_STRIDES:
                frontier.append(consumer)
    if reader is None:
        match.facts.proved("layout", "no `.view` or caller depends on the output's strides")
        return
    match.output_methods.append(("contiguous", ()))
    match.facts.proved("layout", f"the output is contiguous, as the original's product is, where it {reader}")


def _written_in_place(c: Candidate) -> str | None:
    """Where the output, or a tensor that may share its storage (names, views, `.contiguous()`, `.reshape`,
    `.detach()`, basic indexing; in this file's callers where it is returned), is written in place: an in-place
    method, `x += y`, `x[i] = y`, `out=x`. Breaker round 14: `o.mul_(2.0)` after the block broke the patch's
    backward (SDPA's CPU flash kernel saves its output), and `y = o.contiguous(); y.mul_(2.0)` wrote the original's
    contiguous product through `y` but a copy of the patch's transposed output. None where nothing writes."""
    frontier, seen, steps = [c.match.output_node], set(), 0
    while frontier and steps < 4 * MAX_CHAIN:
        steps += 1
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        parent = _returned(c, node)
        if isinstance(parent, cst.Return):
            frontier.extend(_held_by_callers(c, node, parent) or ())
            continue
        write = _write_of(c, node, parent)
        if write is not None:
            return f"is written by `{short(c.parsed, write)}` at line {c.parsed.line(write)}"
        if isinstance(parent, cst.Subscript) and parent.value is node or \
                isinstance(parent, cst.IfExp) and node in (parent.body, parent.orelse):
            frontier.append(parent)
            continue
        if _copied_into_a_tensor(c, parent, node):
            continue
        if isinstance(parent, cst.Assign) and parent.value is node and not all(
                isinstance(target, cst.Name) for target in _assigned_targets(parent)):
            return f"is stored by `{short(c.parsed, parent)}` at line {c.parsed.line(parent)}, where it may be written"
        for consumer, _ in consumers(c, node):
            method = _method_on(consumer, node)
            if isinstance(consumer, cst.Name) or method in ALIASING:
                frontier.append(consumer)
    return None


def _copied_into_a_tensor(c: Candidate, parent: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    """`r[:, i:j] = node` where every value of `r` is a tensor torch creates from sizes (`torch.zeros(...)`,
    `x.new_zeros(...)`): the element store copies the values, so writes to `r` are not writes to the output (a
    container's element store would keep a reference: not this)."""
    if not (isinstance(parent, cst.Assign) and parent.value is node and parent.targets):
        return False
    for target in parent.targets:
        base = target.target.value if isinstance(target.target, cst.Subscript) else None
        if not isinstance(base, cst.Name):
            return False
        flow = flow_for(c, base)
        bindings = [flow.definitions[i] for i in flow.reaching.get(base, ()) if i in flow.definitions]
        created = [d for d in bindings if d.kind not in ("store", "inplace", "aug")]  # those write r itself
        if not created or any(d.kind != "assign" or not _sized_creation(c, d.value) for d in created):
            return False
    return True


def _sized_creation(c: Candidate, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    return c.parsed.imported_name(value.func) in SIZED_TORCH or \
        isinstance(value.func, cst.Attribute) and value.func.attr.value in SIZED_METHODS


def _held_by_callers(c: Candidate, node: cst.CSTNode, returned: cst.Return) -> list[cst.CSTNode] | None:
    """What holds `node`'s value in the callers of the function of this file returning it: its calls, or where it
    is an element of a returned tuple, the reads of the names a call unpacks that element into (breaker round 14:
    `o, _ = attention(q, k, v)` then `o.view(...)`); None where a caller is outside the file, or a call unpacks it
    into something other than names."""
    function = function_of(c.parsed, returned)
    owner = c.owner if function is c.function or function is c.home else None
    sites = calls_to(c.parsed, function, owner) if function is not None else []
    if not sites:
        return None
    element = c.parsed.parents.get(node)
    row = c.parsed.parents.get(element) if isinstance(element, cst.Element) else None
    if not isinstance(row, cst.Tuple) or row is not returned.value:
        return list(sites)
    position = row.elements.index(element)
    held: list[cst.CSTNode] = []
    for call in sites:
        assign = c.parsed.parents.get(call)
        targets = assign.targets if isinstance(assign, cst.Assign) and assign.value is call else []
        unpacked = [t.target for t in targets if isinstance(t.target, (cst.Tuple, cst.List))]
        if not unpacked:
            held.append(call)  # used whole: `res = f(...)` then `res[0]`, followed as any value
            continue
        names = [_element_reads(c, assign, target, position) for target in unpacked]
        if None in names:
            return None
        held += [read for reads in names for read in reads]
    return held


def _element_reads(c: Candidate, assign: cst.Assign, target: cst.Tuple | cst.List,
                   position: int) -> list[cst.Name] | None:
    """The reads of the name `target` (a tuple or list of an assignment) binds at `position`; None where that is
    not a plain name (a starred element, an attribute, a subscript)."""
    if any(isinstance(element, cst.StarredElement) for element in target.elements) or \
            position >= len(target.elements) or not isinstance(target.elements[position].value, cst.Name):
        return None
    name = target.elements[position].value.value
    flow = flow_for(c, assign)
    bound = [d for d in flow.definitions.values() if d.name == name and d.statement is assign]
    return [read for definition in bound for read in flow.reads_of(definition)] if bound else None


def _write_of(c: Candidate, node: cst.CSTNode, parent: cst.CSTNode | None) -> cst.CSTNode | None:
    """The statement or call writing the tensor `node` holds in place, if its parent is one."""
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value.endswith("_") and \
            not parent.attr.value.startswith("_") and parent.attr.value not in NOT_WRITES:
        return c.parsed.parents.get(parent)
    if isinstance(parent, cst.AugAssign) and parent.target is node:
        return parent
    holder = c.parsed.parents.get(parent) if isinstance(parent, cst.Subscript) and parent.value is node else None
    if isinstance(holder, cst.AssignTarget) or isinstance(holder, cst.AugAssign) and holder.target is parent:
        return c.parsed.parents.get(holder) if isinstance(holder, cst.AssignTarget) else holder
    if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "out":
        return c.parsed.parents.get(parent)
    return None


def _helper_reads(c: Candidate, call: cst.CSTNode | None, node: cst.CSTNode) \
        -> tuple[cst.FunctionDef, list[cst.Name]] | None:
    """(the helper, its parameter's reads) for a call of a function or method of this file that takes `node` as one
    parameter (GPT-2's `self._merge_heads(a)`): its uses there are followed as the block's own, and its return as
    the call's value. None for anything else, and for a method a subclass may override."""
    function = callee(c, call) if isinstance(call, cst.Call) else None
    if function is None or c.owner is not None and function in c.owner.methods.values() and \
            scope.overridden(c.scope.classes(), c.owner, {function.name.value}) is not None:
        return None
    try:
        bound = bind_arguments(c, function, call)
    except Refusal:
        return None
    names = [name for name, value in bound.items() if value is node]
    flow = c.parsed.flow(function)
    parameters = [d for d in flow.definitions.values() if d.kind == "param" and d.name in names]
    return (function, flow.reads_of(parameters[0])) if len(names) == len(parameters) == 1 else None


def _returned(c: Candidate, node: cst.CSTNode) -> cst.CSTNode | None:
    """What holds `node`: the `return` of a tuple it is an element of (`return out, None`: its callers take it
    apart), else its parent."""
    parent = c.parsed.parents.get(node)
    row = c.parsed.parents.get(parent) if isinstance(parent, cst.Element) else None
    statement = c.parsed.parents.get(row) if isinstance(row, cst.Tuple) else None
    return statement if isinstance(statement, cst.Return) else parent


def _layout_use(c: Candidate, consumer: cst.CSTNode | None, node: cst.CSTNode) -> str:
    """How `consumer` uses the tensor `node` holds: READS_STRIDES (a `.view`, a stride read, `as_strided`, a call of
    anything this file does not show to read values only, a container), KEEPS_STRIDES (a view, an elementwise op or
    a cast, whose result has the same strides: breaker round 13's `y = y * 2.0` then `.view`, followed), or
    VALUES_ONLY (a fresh tensor, `.contiguous()`, `.reshape`, a metadata read, a torch.nn layer of the class)."""
    if consumer is None:  # never read, or held where its reads are not followed: a container (`ys = [y]`), an
        parent = c.parsed.parents.get(node)  # attribute (`self.cache = y`, read by another method), a global name,
        held = isinstance(parent, (cst.Element, cst.DictElement, cst.StarredElement, cst.Yield, cst.NamedExpr)) or \
            isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and parent.value is node and not all(
                isinstance(target, cst.Name) and target.value not in _declared_outside(c, node)
                for target in _assigned_targets(parent))  # `yield y`, `(o := y)`: breaker round 14
        return READS_STRIDES if held else VALUES_ONLY
    if isinstance(consumer, (cst.Name, cst.BinaryOperation, cst.UnaryOperation)):
        return KEEPS_STRIDES
    method = _method_on(consumer, node)
    if method is not None:
        if method in ("view", "view_as") or method in STRIDE_READS:
            return READS_STRIDES
        return VALUES_ONLY if method in FRESH_LAYOUT else KEEPS_STRIDES  # any other method may keep them
    if not isinstance(consumer, cst.Call):
        return READS_STRIDES
    dotted = c.parsed.imported_name(consumer.func) or ""
    if dotted.startswith("einops."):
        return KEEPS_STRIDES  # rearranged by views where it can be
    if dotted.startswith("torch."):
        name = dotted.rsplit(".", 1)[-1]
        return READS_STRIDES if name in ("view", "view_as") or name in STRIDE_READS else KEEPS_STRIDES
    layer = _torch_layer(c, consumer.func)
    if layer is not None:
        return KEEPS_STRIDES if layer in RETURNS_INPUT else VALUES_ONLY
    return READS_STRIDES


def _declared_outside(c: Candidate, node: cst.CSTNode) -> set[str]:
    """The names the function holding `node` declares `global` or `nonlocal` (read by other functions)."""
    function = function_of(c.parsed, node)
    found: set[str] = set()

    class Declarations(cst.CSTVisitor):
        def visit_Global(self, statement: cst.Global) -> None:
            found.update(item.name.value for item in statement.names)

        def visit_Nonlocal(self, statement: cst.Nonlocal) -> None:
            found.update(item.name.value for item in statement.names)

    if function is not None:
        visit_tree(function, Declarations())
    return found


def _assigned_targets(statement: cst.Assign | cst.AnnAssign | cst.AugAssign) -> list[cst.BaseExpression]:
    return [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]


def _torch_layer(c: Candidate, func: cst.BaseExpression) -> str | None:
    """The torch.nn class every assignment of the class builds `self.<attr>` with (`self.proj = nn.Linear(...)`),
    for a call `self.<attr>(...)`; None for anything else."""
    if c.owner is None or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and
                               func.value.value == "self"):
        return None
    values = c.owner.attributes.get(func.attr.value, [])
    layers = {_layer(c, value) for value in values}
    if len(layers) != 1 or c.owner.rebound(func.attr.value) is not None:
        return None
    return layers.pop()


def _layer(c: Candidate, value: cst.BaseExpression) -> str | None:
    """The torch.nn class `value` builds; an `nn.Sequential` of torch.nn layers as its one that makes a new tensor
    (as an `nn.Identity` where every one returns its input)."""
    layer = c.parsed.imported_name(value.func) if isinstance(value, cst.Call) else None
    if layer is None or not layer.startswith("torch.nn.") or layer.rsplit(".", 1)[-1] not in CONTAINER_LAYERS:
        return layer if layer is not None and layer.startswith("torch.nn.") else None
    if layer.rsplit(".", 1)[-1] != "Sequential" or any(arg.star or arg.keyword for arg in value.args):
        return None
    inner = [_layer(c, arg.value) for arg in value.args]
    if not inner or None in inner:
        return None
    return next((found for found in inner if found not in RETURNS_INPUT), "torch.nn.Identity")


def _method_on(consumer: cst.CSTNode | None, receiver: cst.CSTNode) -> str | None:
    """`view` for `receiver.view(...)`, `mT` for `receiver.mT`; None when `consumer` is no method of it."""
    if isinstance(consumer, cst.Call) and isinstance(consumer.func, cst.Attribute) and consumer.func.value is receiver:
        return consumer.func.attr.value
    if isinstance(consumer, cst.Attribute) and consumer.value is receiver:
        return consumer.attr.value
    return None
