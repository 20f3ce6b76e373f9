"""The layout the output must keep, and the writes it must survive: SDPA's output has the product's values, not
always its strides (CPU and flash kernels follow the query's layout), and its fused kernels save it for the backward
where the eager product's matmul saved its operands.

The output's uses are followed (names, views, any method not known to make a fresh contiguous tensor, helpers of
the file, callers it is returned to, the names a caller unpacks it into): a `.view` or a stride read there, or a
reader out of sight, gets `.contiguous()` on the call; a write in place through it, or through what may share its
storage, gets a fresh contiguous copy.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import scope
from advisor.patterns.attention.candidate import MAX_CHAIN, Candidate, consumers, definition_of_value, flow_for, \
    function_of
from advisor.patterns.attention.helpers import bind_arguments, callee, calls_to
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import Refusal
from advisor.static.inplace_args import inplace_argument, inplace_keyword
from advisor.static.codegen import dotted, keyword
from advisor.static.dataflow import UNDEFINED, is_inplace_method, loaded_names
from advisor.static.outside_writes import NOT_WRITES, writes_its_receiver
from advisor.static.tensor_reads import SIZED_METHODS, SIZED_TORCH
from advisor.static.tensor_views import RANDOM_DRAWS, STRIDE_READS, torch_op_name
from advisor.static.walk import descendants

# methods whose result shares the input's storage with strides derived from the input's
STRIDED_VIEWS = {"transpose", "permute", "mT", "T", "unsqueeze", "squeeze", "expand", "swapaxes", "movedim",
                 "chunk", "split", "unbind", "tensor_split", "narrow", "select", "diagonal", "flatten", "unflatten",
                 "expand_as"}  # the last ones return views (or tuples of views) of the input's storage as well
PERMUTING = frozenset({"transpose", "permute", "mT", "T", "mH", "H", "swapaxes", "swapdims", "movedim", "moveaxis"})
READS_STRIDES, KEEPS_STRIDES, VALUES_ONLY = "reads strides", "keeps strides", "values only"  # see _layout_use
# methods whose result keeps the receiver's strides (elementwise ops and casts preserve the memory format)
# methods whose result may share the receiver's storage: a write through it writes the output (`.contiguous()` and
# `.reshape` return the receiver itself, or a view, where its strides allow)
ALIASING = frozenset({"view", "view_as", "reshape", "reshape_as", "contiguous", "detach", "data", "flatten",
                      "unflatten", "narrow", "select", "diagonal", "as_strided", "real", "conj", "resolve_conj",
                      "resolve_neg", "unfold", "movedim", "moveaxis", "swapdims", "mH", "H", "requires_grad_",
                      # casts and moves return the receiver itself where it already has that dtype or device
                      "to", "type", "type_as", "float", "double", "half", "bfloat16", "cpu", "cuda"}) | STRIDED_VIEWS
# an array of another library over the tensor's memory: its writes are not followed, and autograd does not see them
# (breaker round 17: `np.clip(y.detach().numpy(), ..., out=...)` changed what SDPA's backward read, silently)
FOREIGN_VIEWS = frozenset({"numpy", "__array__", "__dlpack__", "__cuda_array_interface__"})
# methods whose result is a fresh tensor of torch's default (contiguous) layout, or no tensor: the output's strides
# end there; any other method may keep them (`.clamp`, `.flip`, `.nan_to_num`, `.real`: breaker round 14)
FRESH_LAYOUT = frozenset({"contiguous", "reshape", "reshape_as", "sum", "mean", "amax", "amin", "max", "min",
                          "norm", "std", "var", "prod", "logsumexp", "all", "any", "argmax", "argmin", "item",
                          "tolist", "size", "dim", "numel", "shape", "dtype", "device", "is_floating_point",
                          "matmul", "mm", "bmm", "repeat", "masked_select", "nonzero", "element_size", "ndim",
                          "requires_grad", "is_cuda", "register_hook", "backward"})
# accepted where the output is returned out of sight: the original returns its product (or a copy of it), which
# autograd did not save; the patch may return SDPA's output, which its kernels save for the backward
OUT_OF_SIGHT_WRITES = "output-writes"
OUT_OF_SIGHT_WHY = ("as `out += x`, while autograd records the block makes the patch's backward raise (SDPA saves "
                    "its output): a loud failure, not another value, and the forward's values are the original's; "
                    "a write autograd does not see (through `.data` or `.numpy()`) gives other gradients instead")
# reads of a tensor's metadata, which no write of its values changes
METADATA = frozenset({"size", "shape", "dim", "ndim", "numel", "dtype", "device", "is_floating_point", "is_cuda",
                      "element_size", "requires_grad"})
READING_BUILTINS = frozenset({"print", "len", "isinstance", "type", "id", "repr", "str", "float", "int", "bool",
                              "hash", "format", "callable", "hasattr"})
RETURNS_INPUT = frozenset({"torch.nn.Identity", "torch.nn.Dropout", "torch.nn.Dropout1d", "torch.nn.Dropout2d"})
# torch.nn layers whose output is a fresh contiguous tensor whatever their input's strides; any other (GELU, SiLU,
# Tanh: elementwise, `empty_like` keeps the permuted layout) passes them on (breaker round 16: `.view` after GELU)
FRESH_LAYERS = frozenset({"torch.nn.Linear", "torch.nn.LazyLinear", "torch.nn.Bilinear", "torch.nn.LayerNorm",
                          "torch.nn.RMSNorm", "torch.nn.GroupNorm"})
# what draws random numbers in the tensor's memory order: the same seed gives another mask over SDPA's (permuted)
# output than over the product's contiguous one (breaker round 16: dropout on the per-head output, 0.29 apart)
RANDOM_LAYERS = frozenset({"torch.nn.Dropout", "torch.nn.Dropout1d", "torch.nn.Dropout2d", "torch.nn.Dropout3d",
                           "torch.nn.AlphaDropout", "torch.nn.FeatureAlphaDropout"})
# methods and torch functions whose result depends on the output's strides
LAYOUT_READERS = frozenset({"view", "view_as"}) | STRIDE_READS | RANDOM_DRAWS  # `empty_like(o).bernoulli_(p)`
CONTAINER_LAYERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})


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
    permuted: set[cst.CSTNode] = set()  # reached through a transpose or permute of the output
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
        if isinstance(parent, cst.Subscript) and parent.value is node or \
                isinstance(parent, (cst.UnaryOperation, cst.BooleanOperation)) or \
                isinstance(parent, cst.IfExp) and node in (parent.body, parent.orelse):
            frontier.append(parent)  # `o[0]`, `-o`, `o if c else q`, `None or o`: the expression holds its strides
            permuted.update((parent,) if node in permuted else ())
            continue
        for consumer, _ in consumers(c, node) + _reads_after_updates(c, node):
            use = _layout_use(c, consumer, node)
            if use == VALUES_ONLY and node not in permuted and _may_view_strides(c, consumer, node):
                use = KEEPS_STRIDES  # a reshape the strides allow is a view: `o.reshape(o.shape)` keeps SDPA's
            helper = _helper_reads(c, consumer, node) if use == READS_STRIDES else None
            if helper is not None:
                entered[helper[0]] = consumer
                frontier.extend(helper[1])
            elif use == READS_STRIDES:
                where = consumer if consumer is not None else c.parsed.parents.get(node)
                reader = f"is read by `{short(c.parsed, where)}` at line {c.parsed.line(where)}"
            elif use == KEEPS_STRIDES:
                frontier.append(consumer)
                if node in permuted or _permutes(c, consumer, node):
                    permuted.add(consumer)
    if reader is None:
        match.facts.proved("layout", "no `.view` or caller depends on the output's strides")
        return
    match.output_methods.append(("contiguous", ()))
    match.facts.proved("layout", f"the output is contiguous, as the original's product is, where it {reader}")


def _reads_after_updates(c: Candidate, node: cst.CSTNode) -> list[tuple[cst.Name, None]]:
    """The reads of a name bound to `node` that see it after an in-place update (`z = torch.zeros_like(y); z += y;
    z.view(...)`): `z += y` and `z.add_(y)` keep z's strides, so its later reads read them too (breaker round 27: the
    walk stopped at the update and the `.view` of SDPA's layout raised)."""
    definition = definition_of_value(c, node)
    if definition is None:
        return []
    flow, found, frontier, seen = flow_for(c, node), [], [definition.id], {definition.id}
    while frontier:
        updated = frontier.pop()
        for later in flow.definitions.values():
            if later.kind in ("aug", "inplace", "store") and updated in later.previous and later.id not in seen:
                found += [(read, None) for read in flow.reads_of(later)]
                frontier.append(later.id)
                seen.add(later.id)
    return found


def _permutes(c: Candidate, consumer: cst.CSTNode, node: cst.CSTNode) -> bool:
    """`o.transpose(1, 2)`, `o.mT`, `torch.permute(o, ...)`: heads moved back beside the sequence, after which a
    reshape that merges them copies the patch's output as it does the original's product (breaker round 17: only
    a reshape right on the output was a view of SDPA's strides)."""
    if _method_on(consumer, node) in PERMUTING:
        return True
    dotted = (c.parsed.imported_name(consumer.func) or "") if isinstance(consumer, cst.Call) else ""
    return dotted.startswith("torch.") and dotted.rsplit(".", 1)[-1] in PERMUTING


def _may_view_strides(c: Candidate, consumer: cst.CSTNode, node: cst.CSTNode) -> bool:
    """A reshape right on the output that may be a view keeping SDPA's strides (breaker round 17: `o.reshape(
    o.shape)`, shape-keeping, then a caller's `.view`). One to at most two dims is contiguous whether it copies or
    views (SDPA's batch dim is outermost in every kernel's layout), so it ends the walk as a copy would."""
    method = _method_on(consumer, node)
    if method not in ("reshape", "reshape_as"):
        return False
    arguments = consumer.args if isinstance(consumer, cst.Call) and method == "reshape" else ()
    shape = arguments[0].value.elements if len(arguments) == 1 and isinstance(arguments[0].value, (
        cst.Tuple, cst.List)) else arguments
    return not shape or len(shape) > 2 or any(getattr(a, "star", "") for a in shape) or \
        len(arguments) == 1 and not isinstance(arguments[0].value, (cst.Tuple, cst.List, cst.Integer))


def _written_in_place(c: Candidate) -> str | None:
    """Where the output, or a tensor that may share its storage (names, views, `.contiguous()`, `.reshape`,
    `.detach()`, basic indexing; in this file's callers where it is returned), is written in place: an in-place
    method, `x += y`, `x[i] = y`, `out=x`. Breaker round 14: `o.mul_(2.0)` after the block broke the patch's
    backward (SDPA's CPU flash kernel saves its output), and `y = o.contiguous(); y.mul_(2.0)` wrote the original's
    contiguous product through `y` but a copy of the patch's transposed output. None where nothing writes.

    A callee not shown to leave its argument unwritten (a function of another file, a module of the user's) counts
    as a write where the output is read anywhere else too (breaker round 15: `scale_(o.contiguous())` then `o`
    read), since aliases the original shares and the patch may not could then show the write; where it is the
    output's one use down a chain of single reads, a write there can only make the backward raise (`output-writes`,
    accepted as for callers out of sight)."""
    frontier, seen, steps, unseen, branched = [c.match.output_node], set(), 0, [], False
    while frontier and steps < 4 * MAX_CHAIN:
        steps += 1
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        parent = _returned(c, node)
        top = _written_at_top(c, parent) if isinstance(parent, cst.Return) else None
        if top is not None:
            return f"is returned to a call at line {c.parsed.line(top)}, whose result is written there"
        if isinstance(parent, cst.Return):
            held = _held_by_callers(c, node, parent)
            if held is None:  # a caller or a forward hook out of sight may write it in place: loud
                _accept_writes_out_of_sight(c, "a caller outside this file (or a forward hook)")
            branched |= held is not None and len(held) > 1
            frontier.extend(held or ())
            continue
        write = _write_of(c, node, parent) or _written_through_aliases(c, node)
        if write is not None:
            return f"is written by `{short(c.parsed, write)}` at line {c.parsed.line(write)}"
        call = c.parsed.parents.get(parent) if isinstance(parent, cst.Arg) and parent.value is node else None
        if isinstance(call, cst.Call) and call.func is not node:
            helper = _helper_reads(c, call, node)
            if helper is not None:  # a helper of this file: its parameter's reads are followed as the block's own
                frontier.extend(helper[1])
                branched |= len(helper[1]) > 1
                continue
            chosen = _built_in_place_by_a_caller(c, call)
            if chosen is not None:
                return (f"is passed to `{short(c.parsed, call)}` at line {c.parsed.line(call)}, a module built from "
                        f"the class its caller chooses, which {chosen} makes write its input in place")
            if not _reads_arguments_only(c, call):
                unseen.append(call)
        if isinstance(parent, cst.Subscript) and parent.value is node or \
                isinstance(parent, cst.IfExp) and node in (parent.body, parent.orelse):
            frontier.append(parent)
            continue
        if isinstance(parent, (cst.Element, cst.DictElement, cst.StarredElement)):
            frontier.append(c.parsed.parents.get(parent))  # a display holding it: its uses are the output's
            continue
        held = _bound_for_other_functions(c, node)
        if held is not None:
            return f"is held in `{short(c.parsed, held)}` at line {c.parsed.line(held)}, where it may be written"
        if _copied_into_a_tensor(c, parent, node):
            continue
        if isinstance(parent, cst.Assign) and parent.value is node and not all(
                isinstance(target, cst.Name) for target in _assigned_targets(parent)):
            return f"is stored by `{short(c.parsed, parent)}` at line {c.parsed.line(parent)}, where it may be written"
        uses = consumers(c, node)
        branched |= sum(_reads_values(c, consumer, node) for consumer, _ in uses) > 1
        for consumer, _ in uses:
            method = _method_on(consumer, node)
            if isinstance(consumer, cst.Name) or method in ALIASING or _einops_of(c, consumer, node):
                frontier.append(consumer)
    if unseen and branched:
        return (f"is passed to `{short(c.parsed, unseen[0])}` at line {c.parsed.line(unseen[0])}, which this file "
                "does not show to leave it unwritten, and read elsewhere too")
    if unseen:
        _accept_writes_out_of_sight(c, f"`{short(c.parsed, unseen[0])}` (line {c.parsed.line(unseen[0])})")
    return None


def _einops_of(c: Candidate, consumer: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    """`rearrange(o, "b h n d -> b n (h d)")` and einops' other reshapes: a view of the output where its memory
    order allows, so a write through the result writes it (breaker round 16: `out += x` after `rearrange`)."""
    return isinstance(consumer, cst.Call) and bool(consumer.args) and consumer.args[0].value is node and \
        (c.parsed.imported_name(consumer.func) or "").startswith("einops.")


def _reads_values(c: Candidate, consumer: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    """Whether `consumer` may read the values `node` holds: not a metadata read (`o.size()`, or a name read only
    for that, as BERT's `c.size()[:-2]` before `c.view(...)`)."""
    if _method_on(consumer, node) in METADATA:
        return False
    if not isinstance(consumer, cst.Name):
        return True
    parent = c.parsed.parents.get(consumer)
    call = c.parsed.parents.get(parent) if isinstance(parent, cst.Attribute) else None
    return _method_on(call if isinstance(call, cst.Call) and call.func is parent else parent, consumer) not in METADATA


def _accept_writes_out_of_sight(c: Candidate, writer: str) -> None:
    c.match.facts.accepted(OUT_OF_SIGHT_WRITES, "nothing out of sight writes the output in place while autograd "
                           "records the block", f"{writer} writing it in place, {OUT_OF_SIGHT_WHY}")


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
    if not sites and owner is not None and function.name.value == "forward":
        sites = [call for call in _module_calls(c, function) if function_of(c.parsed, call) is not None]
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


def _module_calls(c: Candidate, forward: cst.FunctionDef) -> list[cst.Call]:
    """The calls of the module whose `forward` returns the output, where the tree shows every one and all lie in this
    file (`net = Attn(8, 2).double(); y = net(x)`, then `y.mul_(2)`: breaker round 42, where SDPA's saved output
    was written through a view and the patch's backward raised); [] otherwise (callers out of sight)."""
    tree = c.parsed.tree
    parameters = [p.name.value for p in forward.params.params[1:]]
    found = tree.sites(c.parsed, forward, parameters[0]) if tree is not None and parameters else None
    return [site.call for site in found] if found and all(site.parsed is c.parsed for site in found) else []


def _written_at_top(c: Candidate, returned: cst.Return) -> cst.CSTNode | None:
    """A write, at the module's top level, into what a call there of the module returning the output gives, or
    through views of it (`y = net(x)`, then `y.mul_(2)`); a read of such a name inside a function counts as one
    (its writes are not followed)."""
    function = function_of(c.parsed, returned)
    if c.owner is None or function is None or function.name.value != "forward":
        return None
    for call in _module_calls(c, function):
        if function_of(c.parsed, call) is not None:
            continue
        pending = [call]
        while pending:
            node = pending.pop()
            parent = c.parsed.parents.get(node)
            write = _write_of(c, node, parent)
            if write is not None:
                return write
            if isinstance(parent, cst.Subscript) and parent.value is node:
                pending.append(parent)
            elif isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in ALIASING:
                outer = c.parsed.parents.get(parent)
                pending.append(outer if isinstance(outer, cst.Call) and outer.func is parent else parent)
            elif isinstance(parent, cst.Assign) and parent.value is node:
                for target in _assigned_targets(parent):
                    if not isinstance(target, cst.Name):
                        return parent  # stored where its writes are not followed
                    for read in c.parsed.names_spelled(target.value):
                        if read is target or isinstance(c.parsed.parents.get(read), cst.AssignTarget):
                            continue
                        frame = c.parsed.frame(read)
                        if frame is None:
                            pending.append(read)
                        elif c.parsed.flow(frame).reaching.get(read) == frozenset({UNDEFINED}):
                            return read  # the global read in a function, whose writes are not followed
    return None


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
    if isinstance(parent, cst.Attribute) and parent.value is node and is_inplace_method(parent) and \
            parent.attr.value not in NOT_WRITES:
        return c.parsed.parents.get(parent)
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in FOREIGN_VIEWS:
        return c.parsed.parents.get(parent)  # `y.detach().numpy()[0] = 0`: written where autograd cannot see
    if isinstance(parent, cst.AugAssign) and parent.target is node:
        return parent
    holder = c.parsed.parents.get(parent) if isinstance(parent, cst.Subscript) and parent.value is node else None
    if isinstance(holder, cst.AssignTarget) or isinstance(holder, cst.AugAssign) and holder.target is parent:
        return c.parsed.parents.get(holder) if isinstance(holder, cst.AssignTarget) else holder
    if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "out":
        return c.parsed.parents.get(parent)
    call = c.parsed.parents.get(parent) if isinstance(parent, cst.Arg) and parent.keyword is None else None
    if isinstance(call, cst.Call) and call.args and call.args[0] is parent and _writes_first_argument(c, call):
        return call  # `F.relu(x, inplace=True)`, `torch.relu_(x)`, `self.act(x)` with `nn.ReLU(inplace=True)`
    return None


def _bound_for_other_functions(c: Candidate, node: cst.CSTNode) -> cst.CSTNode | None:
    """The assignment binding `node` to a name other functions may read and write: a `global` or `nonlocal` one, or
    one a function or lambda nested in this one reads (its writes are not in this function's flow: breaker round 15,
    `def g(): y.mul_(2)` then `g()`, 0.92 in the forward)."""
    definition = definition_of_value(c, node)
    function = function_of(c.parsed, node)
    if definition is None or function is None:
        return None
    if definition.name in scope.outer_names(function):
        return definition.statement
    nested = [inner for inner in descendants(function.body, (cst.FunctionDef, cst.Lambda))
              if definition.name not in
              {param.name.value for param in (*inner.params.params, *inner.params.kwonly_params,
                                              *inner.params.posonly_params)}]  # a parameter of its own
    return definition.statement if any(name.value == definition.name for inner in nested
                                       for name in loaded_names(inner)) else None


def _written_through_aliases(c: Candidate, node: cst.CSTNode) -> cst.CSTNode | None:
    """The statement writing in place the value a name is bound to from `node`, where the function's flow sees the
    write through a name that may alias it (`for t in y: t.mul_(2)`, `ys = list(y); ys[0].mul_(3)`,
    `torch.reshape(o, ...)`, a `:=` binding: breaker round 15, each 0.9 to 1.2 in the forward)."""
    definition = definition_of_value(c, node)
    if definition is None:
        return None
    flow = flow_for(c, node)
    return next((later.statement for later in flow.definitions.values()
                 if later.name == definition.name and later.kind in ("store", "inplace", "aug") and
                 (definition.id in later.previous or not later.previous) and
                 c.parsed.line(later.statement) >= c.parsed.line(definition.statement)), None)


def _reads_arguments_only(c: Candidate, call: cst.Call) -> bool:
    """A callee that writes no argument but as `_write_of` reads (an `inplace=` keyword, `out=`, a name ending in
    `_`): a torch function, einops, a torch.nn layer of the class, a builtin that only reads. Any other (a function
    of another file, a module class of the user's, a list's `append`) may write what it is given in place (breaker
    round 15: `scale_(o)` of another file wrote SDPA's saved output)."""
    dotted = c.parsed.imported_name(call.func) or ""
    if dotted.startswith(("torch.", "einops.")) or _torch_layer(c, call.func) is not None:
        return True
    return dotted in READING_BUILTINS  # a builtin's name where the file binds it nowhere (imported_name)


def _writes_first_argument(c: Candidate, call: cst.Call) -> bool:
    """A call that writes its first argument in place: an `inplace` argument not visibly False (`F.relu(x, True)`,
    `inplace=True`), a torch function whose name says it writes in place (`torch.relu_`), or a module of the class
    built so (`nn.ReLU(True)`, inside an `nn.Sequential` too). Breaker round 14: `F.relu(x, inplace=True)` on a view
    of the output broke the patch's backward; round 15: `nn.Sequential(nn.ReLU(inplace=True))` wrote through a
    reshape that is a copy in the original and a view in the patch (0.75 in the forward)."""
    if inplace_argument(c.parsed, call):
        return True
    dotted = c.parsed.imported_name(call.func) or ""
    if dotted.startswith("torch.") and writes_its_receiver(dotted.rsplit(".", 1)[-1]):
        return True
    func = call.func
    if c.owner is None or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and
                               func.value.value == "self"):
        return False
    return any(_built_inplace(c, value) for value in c.owner.attributes.get(func.attr.value, []))


def _built_in_place_by_a_caller(c: Candidate, call: cst.Call) -> str | None:
    """Where a construction of the class in the tree makes `self.<attr>(...)` write its input in place, `self.<attr>`
    being built from a class `__init__` is given (`self.act = act_layer()` with a caller's `act_layer=partial(
    nn.ReLU, inplace=True)`: breaker round 15, the patch's backward raised); None where no call in the tree shows
    one (callers out of sight stay the accepted `output-writes`)."""
    func, init = call.func, c.owner.methods.get("__init__") if c.owner is not None else None
    if init is None or c.parsed.tree is None or not (isinstance(func, cst.Attribute) and
                                                     isinstance(func.value, cst.Name) and func.value.value == "self"):
        return None
    parameters = {p.name.value for p in [*init.params.params, *init.params.kwonly_params]}
    for built in c.owner.attributes.get(func.attr.value, []):
        if not (isinstance(built, cst.Call) and isinstance(built.func, cst.Name) and built.func.value in parameters):
            continue
        for site in c.parsed.tree.sites(c.parsed, init, built.func.value) or ():
            if site.argument is not None and _makes_in_place(site.argument, built):
                return f"the call at {site.where}"
    return None


def _makes_in_place(chosen: cst.BaseExpression, built: cst.Call) -> bool:
    """Whether `chosen`, a class (or factory) the constructor calls as `built`, yields a module writing its input in
    place: `built` passes `inplace` itself, or `chosen` is a call (`partial(nn.ReLU, inplace=True)`) or a lambda's
    (`lambda: nn.ReLU(inplace=True)`) that passes it."""
    if isinstance(chosen, cst.Lambda):
        chosen = chosen.body
    return inplace_keyword(built) or isinstance(chosen, cst.Call) and inplace_keyword(chosen)


def _built_inplace(c: Candidate, value: cst.BaseExpression) -> bool:
    """A module built to write its input in place, or a container of torch.nn layers holding one."""
    if not isinstance(value, cst.Call):
        return False
    layer = c.parsed.imported_name(value.func) or ""
    if layer.startswith("torch.nn.") and layer.rsplit(".", 1)[-1] in CONTAINER_LAYERS:
        return any(_built_inplace(c, arg.value) for arg in value.args)
    return inplace_argument(c.parsed, value)


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
    VALUES_ONLY (a fresh tensor, `.contiguous()`, `.reshape`, a metadata read, a torch.nn layer of the class making
    a fresh tensor: FRESH_LAYERS)."""
    if consumer is None:  # never read, or held where its reads are not followed: a container (`ys = [y]`), an
        parent = c.parsed.parents.get(node)  # attribute (`self.cache = y`, read by another method), a global name,
        held = isinstance(parent, (cst.Element, cst.DictElement, cst.StarredElement, cst.Yield, cst.NamedExpr,
                                   cst.Match)) or \
            isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and parent.value is node and not all(
                isinstance(target, cst.Name) and target.value not in _outer_names(c, node)
                for target in _assigned_targets(parent))  # `yield y`, `(o := y)`: breaker round 14
        return READS_STRIDES if held else VALUES_ONLY  # a `match` subject: its captures are not followed
    if isinstance(consumer, (cst.Name, cst.BinaryOperation, cst.UnaryOperation)):
        return KEEPS_STRIDES
    method = _method_on(consumer, node)
    if method is not None:
        if method in LAYOUT_READERS:
            return READS_STRIDES
        return VALUES_ONLY if method in FRESH_LAYOUT else KEEPS_STRIDES  # any other method may keep them
    if not isinstance(consumer, cst.Call):
        return READS_STRIDES
    dotted = c.parsed.imported_name(consumer.func) or ""
    if dotted.startswith("einops."):
        return KEEPS_STRIDES  # rearranged by views where it can be
    if dotted.startswith("torch."):
        return READS_STRIDES if torch_op_name(dotted) in LAYOUT_READERS else KEEPS_STRIDES
    layer = _torch_layer(c, consumer.func)
    if layer is not None:
        return READS_STRIDES if layer in RANDOM_LAYERS else VALUES_ONLY if layer in FRESH_LAYERS else KEEPS_STRIDES
    return READS_STRIDES


def _outer_names(c: Candidate, node: cst.CSTNode) -> frozenset[str]:
    """What the function holding `node` declares `global` or `nonlocal` (read by other functions)."""
    function = function_of(c.parsed, node)
    return scope.outer_names(function) if function is not None else frozenset()


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
    """The torch.nn class `value` builds; an `nn.Sequential` of torch.nn layers as the first of them that draws
    random numbers or makes a fresh tensor (what the output meets before its layout is gone), else its first that
    does not return its input (an `nn.Identity` where every one does)."""
    layer = c.parsed.imported_name(value.func) if isinstance(value, cst.Call) else None
    if layer is None or not layer.startswith("torch.nn.") or layer.rsplit(".", 1)[-1] not in CONTAINER_LAYERS:
        return layer if layer is not None and layer.startswith("torch.nn.") else None
    if layer.rsplit(".", 1)[-1] != "Sequential" or any(arg.star or arg.keyword for arg in value.args):
        return None
    inner = [_layer(c, arg.value) for arg in value.args]
    if not inner or None in inner:
        return None
    first = next((found for found in inner if found in RANDOM_LAYERS | FRESH_LAYERS), None)  # what the output
    return first or next((found for found in inner if found not in RETURNS_INPUT), "torch.nn.Identity")  # meets


def _method_on(consumer: cst.CSTNode | None, receiver: cst.CSTNode) -> str | None:
    """`view` for `receiver.view(...)`, `mT` for `receiver.mT`; None when `consumer` is no method of it."""
    if isinstance(consumer, cst.Call) and isinstance(consumer.func, cst.Attribute) and consumer.func.value is receiver:
        return consumer.func.attr.value
    if isinstance(consumer, cst.Attribute) and consumer.value is receiver:
        return consumer.attr.value
    return None
