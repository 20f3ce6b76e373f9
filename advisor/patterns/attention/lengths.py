"""Keys and values of one length: the original's value product raises where they differ, SDPA's CPU kernels do
not check it (they read past the values: breaker round 19b), so the fact is proved from the source or guarded.

A length is read as a *size term*: where the size of one axis of a tensor comes from, followed back through
steps that keep or move axes (names with one definition, views and reshapes with an explicit size there,
transposes, permutes, einops rearranges, tuple unpacking of `unbind`/`chunk`/`split` along another axis,
integer indexing of leading axes, casts, Python-number scaling, dropout, `nn.Linear` layers on the axes it
keeps, `torch.cat` along it or along another axis). Two reads with one term have one size: the same definition's
axis, the same literal, or the same size expression over the same bindings. Any step not known to keep the size
ends the walk with no term, and the fact stays assumed (a guard then checks it).
"""

from __future__ import annotations

import libcst as cst

from advisor.contracts.finding import display_path
from advisor.patterns import scope
from advisor.patterns.attention import products
from advisor.patterns.attention.candidate import Candidate, flow_for, function_of, one_assigned_value, \
    seen_from_behind
from advisor.patterns.attention.helpers import argument_of, helper_at
from advisor.patterns.attention.rendering import short
from advisor.patterns.foreign_calls import foreign_call, modules_untrusted
from advisor.patterns.dtypes import layer_class
from advisor.patterns.ops import int_value
from advisor.static.dataflow import UNDEFINED, loaded_names
from advisor.static.module_index import ParsedModule
from advisor.static.project import first_elsewhere
from advisor.static.state_swaps import SHAPE_CHANGING_NAMES
from advisor.static.walk import descendants

KV_LENGTH = "kv-length"
MAX_DEPTH = 24
# methods whose result has the receiver's shape (casts, moves, copies): sizes are read under them
SAME_SHAPE = frozenset({"contiguous", "float", "half", "double", "bfloat16", "to", "type_as", "clone", "detach",
                        "cpu", "cuda", "requires_grad_"})
TENSOR_METHODS = frozenset({"view", "reshape", "permute", "transpose", "contiguous", "unflatten", "flatten",
                            "squeeze", "unsqueeze", "matmul", "float", "half", "to"})
PARTS = frozenset({"chunk", "split", "unbind"})
SWAPS = frozenset({"transpose", "swapaxes", "swapdims"})
SAME_SHAPE_FUNCTIONS = frozenset({"torch.nn.functional.dropout", "torch.dropout", "torch.nn.functional.normalize"})
# torch.nn layers whose output keeps every axis of the input but the last (Linear) or every axis (the rest)
ALL_BUT_LAST = frozenset({"torch.nn.Linear"})
SHAPE_KEEPING_LAYERS = frozenset(f"torch.nn.{name}" for name in ("Dropout", "LayerNorm", "RMSNorm", "Identity",
                                                                   "GELU", "ReLU", "SiLU", "Tanh", "GroupNorm",
                                                                   "BatchNorm1d", "BatchNorm2d"))
# convolutions keep their spatial axes (the last n) where the kernel is 1, the stride 1 and no padding
POINTWISE_CONVOLUTIONS = {"torch.nn.Conv1d": 1, "torch.nn.Conv2d": 2, "torch.nn.Conv3d": 3}
TENSOR_LAYERS = ALL_BUT_LAST | SHAPE_KEEPING_LAYERS | set(POINTWISE_CONVOLUTIONS)  # return one tensor
# names that change a tensor's shape in place, or what a layer returns, where the walk does not look
SHAPE_HAZARDS = SHAPE_CHANGING_NAMES | {"register_forward_hook", "register_forward_pre_hook",
                                        "register_module_forward_hook", "register_module_forward_pre_hook",
                                        "_forward_hooks", "_forward_pre_hooks"}
Term = tuple  # ("axis", definition id, axis) | ("int", n) | ("size", code, bindings) | ("cat" | "group", terms)


def kv_length_fact(c: Candidate) -> None:
    """Record whether k and v provably have one length (SDPA's key axis, -2 of what it is passed)."""
    key, value = c.match.key, c.match.value
    statement = f"`{short(c.parsed, key)}` and `{short(c.parsed, value)}` have one length (keys)"
    hazard = block_shape_hazard(c)
    if hazard is not None:
        c.match.facts.assumed(KV_LENGTH, statement, f"{hazard}, so no size read in the file is proved; where they "
                                                    "differ the original raises and SDPA's CPU kernels do not")
        return
    walk = _Lengths(c)
    term = walk.term(key, -2)
    if term is not None and term == walk.term(value, -2) and not walk.overridden():
        c.match.facts.proved(KV_LENGTH, statement, "their key axes come from one size: "
                                                   f"{_describe(term)}")
    else:
        c.match.facts.assumed(KV_LENGTH, statement, "nothing in the source ties the key axis of k to v's; where "
                                                    "they differ the original raises and SDPA's CPU kernels do not "
                                                    "(they read past v)")


def one_size(c: Candidate, tensors: list[cst.BaseExpression], axes: tuple[int, ...]) -> bool:
    """Whether the tensors provably have one size in an axis read as any of `axes` (one axis of a known rank,
    counted from either end: 0 and -3 of a 3-D operand): a size term they all share there."""
    walk = _Lengths(c)
    shared = set.intersection(*({walk.term(tensor, axis) for axis in axes} - {None} for tensor in tensors))
    return bool(shared) and not walk.overridden()


SIZED_CREATIONS = frozenset(f"torch.{name}" for name in ("empty", "zeros", "ones", "rand", "randn"))


def broadcasts_to_scores(c: Candidate, created: cst.BaseExpression, query: cst.BaseExpression,
                         key_factor: cst.BaseExpression) -> bool:
    """Whether `created` (or the one definition of its name) is a torch creation whose stated sizes
    (`torch.empty(b, n, m, dtype=...)`, or one tuple of them) broadcast to the scores `query @ key_factor` of a 3-D
    product: at most three, each 1 or the size term of the scores' axis there (the query's first two, the key
    factor's last), each axis counted from either end (the product raises on factors of another rank)."""
    walk = _Lengths(c)
    if isinstance(created, cst.Name):
        created = one_assigned_value(c, created)
    if not (isinstance(created, cst.Call) and c.parsed.imported_name(created.func) in SIZED_CREATIONS) or \
            block_shape_hazard(c) or any(arg.star for arg in created.args):
        return False
    sizes = [arg.value for arg in created.args if arg.keyword is None]
    if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
        if any(isinstance(e, cst.StarredElement) for e in sizes[0].elements):
            return False
        sizes = [element.value for element in sizes[0].elements]
    if not sizes or len(sizes) > 3:
        return False
    method, key, dims = _method(key_factor)
    dims = [int_value(arg.value) for arg in dims]
    swapped = method in SWAPS and None not in dims and sorted(dims) in ([-2, -1], [1, 2])
    if isinstance(key_factor, cst.Attribute) and key_factor.attr.value == "mT":
        swapped, key = True, key_factor.value
    scores = ([(key_factor, -1)] + ([(key, 1), (key, -2)] if swapped else []), [(query, -2), (query, 1)],
              [(query, -3), (query, 0)])
    for size, reads in zip(reversed(sizes), scores):
        if int_value(size) == 1:
            continue
        if any(_same_axis(c, size, tensor, axis) for tensor, axis in reads):
            continue
        term = walk.size_term(size)
        if term is None or all(term != walk.term(tensor, axis) for tensor, axis in reads):
            return False
    return not walk.overridden()


def _same_axis(c: Candidate, size: cst.BaseExpression, tensor: cst.BaseExpression, axis: int) -> bool:
    """`size` reads axis `axis` of `tensor` off a name with the same bindings (`query.shape[0]` and the factor
    `query` after `if upcast: query = query.float()`; `q.shape[0]` and the factor `q[:, i:end]`, whose slices keep
    the axes before theirs): both reads see one tensor, whatever its definitions."""
    read, index = _axis_read(size)
    if index is None or index != axis or descendants(read, (cst.Call,)):
        return False
    tensors = [tensor]
    while isinstance(tensor, cst.Subscript) and axis >= 0 and len(tensor.slice) > axis and \
            all(isinstance(e.slice, cst.Slice) for e in tensor.slice) and \
            all(p.lower is None and p.upper is None and p.step is None
                for p in (e.slice for e in tensor.slice[:axis + 1])):
        tensor = tensor.value
        tensors.append(tensor)
    code = c.parsed.code(read)
    return any(c.parsed.code(candidate) == code and _same_bindings(c, read, candidate) for candidate in tensors)


def _axis_read(node: cst.BaseExpression) -> tuple[cst.BaseExpression | None, int | None]:
    """(x, i) of `x.shape[i]` or `x.size(i)` with a literal i, whatever x is; else (None, None)."""
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) and \
            node.value.attr.value == "shape" and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        index = int_value(node.slice[0].slice.value)
        return (node.value.value, index) if index is not None else (None, None)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size" and \
            len(node.args) == 1 and node.args[0].keyword is None:
        index = int_value(node.args[0].value)
        return (node.func.value, index) if index is not None else (None, None)
    return None, None


def _same_bindings(c: Candidate, one: cst.BaseExpression, other: cst.BaseExpression) -> bool:
    """Whether the names two expressions of one code load see the same definitions (none undefined, none from
    behind: candidate.seen_from_behind)."""
    ones, others = loaded_names(one), loaded_names(other)
    seen = [flow_for(c, name).reaching.get(name) for name in ones]
    return bool(seen) and all(s and UNDEFINED not in s for s in seen) and \
        seen == [flow_for(c, name).reaching.get(name) for name in others] and \
        not any(seen_from_behind(c, name) for name in ones + others)


def shape_hazard(parsed: ParsedModule) -> str | None:
    """`_shape_hazard`, read once per file."""
    return parsed.derived(_shape_hazard, _shape_hazard)


def _shape_hazard(parsed: ParsedModule) -> str | None:
    """What in the file, or in another file of the scanned tree, may change a tensor's shape, or a layer's output,
    out of the walk's sight: an in-place shape change (by name anywhere, strings included: `getattr(t, "resize_")`),
    a `.data` assignment, a hook (another file's helper may be handed k's input, a training script may hook the
    value layer: breaker round 20's residuals), a torch function or class replaced in any file of the tree."""
    words = parsed.words & SHAPE_HAZARDS
    if words:
        return f"the file calls or names `{sorted(words)[0]}`"
    for assign in parsed.nodes_of(cst.Assign, cst.AugAssign, cst.AnnAssign):
        targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
        if any(isinstance(t, cst.Attribute) and t.attr.value == "data" for t in targets):
            return "the file assigns a tensor's `.data`"
    for call in parsed.calls_and_classes[0]:
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
        keys = [arg.value.evaluated_value for arg in call.args[:2] if isinstance(arg.value, cst.SimpleString)]
        if name in ("setattr", "__setattr__") and (not keys or "data" in keys):
            return f"the file sets an attribute by `{name}`, which may be a tensor's `.data`"
    untrusted = modules_untrusted(parsed)  # `F.dropout = drop_one_key` elsewhere: nn.Dropout calls it (round 23)
    return f"{untrusted}: the torch layers and functions the walk reads may not be torch's" if untrusted else None


def block_shape_hazard(c: Candidate) -> str | None:
    """What may change k's or v's shape out of the walk's sight, in this file or from another (`shape_hazard`,
    `_tree_shape_hazard`)."""
    return shape_hazard(c.parsed) or _tree_shape_hazard(c)


def _tree_shape_hazard(c: Candidate) -> str | None:
    """What another file of the scanned tree may do to k's or v's shape between their constructions: an in-place
    shape change it names (ProjectFacts.shape_changes), where the candidate's functions call code that may be that
    file's (`foreign_call`). A block whose calls are all torch's, builtins, torch.nn layers and this file's own
    functions runs no other file's code (the hooks another file registers are `shape_hazard`'s)."""
    parsed = c.parsed
    elsewhere = first_elsewhere(parsed.project.shape_changes, parsed.path) if parsed.project is not None else None
    if elsewhere is None:
        return None
    functions = {c.function, c.home, *c.inlined}
    call = next(filter(None, (foreign_call(parsed, c.owner, function) for function in functions)), None)
    if call is None:
        return None
    return (f"`{display_path(elsewhere.path)}` names `{elsewhere.code}` (line {elsewhere.line}) and the block calls "
            f"`{short(parsed, call.func if isinstance(call, cst.Call) else call)}`, which may run it")


def _describe(term: Term) -> str:
    kind = term[0]
    if kind == "axis":
        return "one tensor's axis, through steps that keep it"
    if kind == "int":
        return f"the literal {term[1]}"
    if kind == "size":
        return f"the size `{term[1]}`, read from the same bindings"
    if kind == "group":
        return "the same axes, grouped into one"
    return "the same sizes, concatenated"


class _Lengths:
    """Size terms of the axes of expressions in one candidate's functions."""

    def __init__(self, c: Candidate) -> None:
        self.c = c
        self._bound: dict[cst.FunctionDef, dict[str, cst.BaseExpression]] = {}  # helpers being followed
        self._mapped: dict[cst.Lambda, tuple[cst.BaseExpression, int]] = {}  # map(lambda t: ...) being followed
        self._self_reads: set[str] = set()  # helper methods followed and layers read (a subclass may redefine them)

    def term(self, node: cst.BaseExpression, axis: int, depth: int = 0) -> Term | None:
        """The size term of `axis` of `node` (negative: from the end; else from the front)."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(node, cst.Name):
            return self._name(node, axis, depth)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
            for tensor, other in ((node.left, node.right), (node.right, node.left)):
                if self.c.values.scalar_guess(other) is None:  # a number proved, not guessed: a tensor broadcasts
                    return self.term(tensor, axis, depth + 1)
            return None
        if isinstance(node, cst.Subscript):
            return self._indexed(node, axis, depth)
        if isinstance(node, cst.Call):
            return self._call(node, axis, depth)
        return None

    def _name(self, node: cst.Name, axis: int, depth: int) -> Term | None:
        mapped = self._mapped_item(node)
        if mapped is not None:
            return self._item_term(*mapped, axis, depth)
        definition = self._definition(node)
        if definition is None or definition.kind not in ("assign", "param"):
            return None
        if definition.kind == "param":
            return self._parameter(node, definition, axis, depth)
        if definition.index is not None:
            plain = _plain_targets(definition.statement)
            return self._unpacked(definition.value, definition.index, axis, depth) if plain else None
        found = self.term(definition.value, axis, depth + 1)
        return found if found is not None or self._followed(node) else ("axis", definition.id, axis)

    def _followed(self, node: cst.CSTNode) -> bool:
        """Whether `node` lies in a helper being followed (not inlined): its bindings differ from call to call."""
        return function_of(self.c.parsed, node) in self._bound

    def _parameter(self, node: cst.Name, definition, axis: int, depth: int) -> Term | None:
        """A parameter of a helper being followed, or of an inlined one, is the argument its call passes; one of
        the block's own functions is its own tensor; any other (a lambda's, a nested function's) is unknown."""
        c = self.c
        function = function_of(c.parsed, node)
        if function is None or isinstance(c.parsed.innermost(node, cst.Lambda), cst.Lambda):
            return None
        bound = self._bound.get(function)
        argument = bound.get(node.value) if bound else argument_of(c, node)
        if argument is not None:
            return self.term(argument, axis, depth + 1)
        if function in self._bound or function not in (c.home, c.function) and function not in c.inlined:
            return None
        return ("axis", definition.id, axis)

    def _definition(self, node: cst.Name):
        flow = flow_for(self.c, node)
        definitions = flow.definitions_of(node)
        return definitions[0] if len(definitions) == 1 and not flow.sees_undefined(node) else None

    def _mapped_item(self, node: cst.Name) -> tuple[cst.BaseExpression, int] | None:
        """(the sequence, the item) a `map(lambda t: ..., seq)` being followed maps, where `node` is its `t`."""
        lam = self.c.parsed.innermost(node, cst.Lambda)
        if lam in self._mapped and [p.name.value for p in lam.params.params] == [node.value]:
            return self._mapped[lam]
        return None

    def _item_term(self, sequence: cst.BaseExpression, index: int, axis: int, depth: int) -> Term | None:
        """Axis `axis` of item `index` of a tuple literal, or of any part of one `chunk`/`split`/`unbind`."""
        if isinstance(sequence, cst.Name):
            definition = self._definition(sequence)
            if definition is None or definition.kind != "assign" or definition.index is not None:
                return None
            sequence = definition.value
        if isinstance(sequence, cst.Tuple) or _method(sequence)[0] in PARTS:  # a list may change in place
            return self._unpacked(sequence, index, axis, depth)
        return None

    def _unpacked(self, value: cst.BaseExpression, index: int, axis: int, depth: int) -> Term | None:
        """An item of `a, b = t.unbind(d)` / `t.chunk(n, d)` / `t.split(s, d)`, of a tuple literal, or of a tensor
        iterated over its dim 0 (`q, k, v = qkv.permute(2, 0, 3, 1, 4)`)."""
        if isinstance(value, (cst.Tuple, cst.List)):
            items = value.elements
            starred = [i for i, e in enumerate(items) if isinstance(e, cst.StarredElement)]
            if not starred and index < len(items) or starred and index < starred[0]:
                return self.term(items[index].value, axis, depth + 1)
            if starred == [len(items) - 1] and _method(items[-1].value)[0] in PARTS:  # `(q, *kv.chunk(2, -1))`
                return self._unpacked(items[-1].value, index - starred[0], axis, depth)
            return None
        mapped = _mapping(value)
        if mapped is not None:
            return self._followed_map(*mapped, index, axis, depth)
        method, receiver, args = _method(value)
        if method in ("chunk", "split"):
            dim = _dim(args, 1)
            if not self._is_tensor(receiver):  # parts of a nested tensor need not share a shape
                return None
            if dim is not None and (dim < 0) != (axis < 0):  # the receiver's stated rank decides
                rank = products.rank(self.c, receiver)
                dim, axis = (dim % rank, axis % rank) if rank else (dim, axis)
            return self.term(receiver, axis, depth + 1) if dim is not None and _apart(dim, axis) else None
        if method == "unbind":
            return self._unbound(receiver, _dim(args, 0), axis, depth) if self._is_tensor(receiver) else None
        return self._unbound(value, 0, axis, depth) if self._is_tensor(value) else None

    def _followed_map(self, lam: cst.Lambda, sequence: cst.BaseExpression, index: int, axis: int, depth: int
                      ) -> Term | None:
        """Item `index` of `map(lambda t: body, seq)`: the body's term, `t` read as that item of `seq`."""
        if lam in self._mapped:
            return None
        self._mapped[lam] = (sequence, index)
        try:
            return self.term(lam.body, axis, depth + 1)
        finally:
            del self._mapped[lam]

    def _unbound(self, receiver: cst.BaseExpression, dim: int | None, axis: int, depth: int) -> Term | None:
        """Axis `axis` of an item of `receiver` taken apart along `dim`."""
        if dim is None:
            return None
        if axis < 0 and dim < 0:
            return self.term(receiver, axis if axis > dim else axis - 1, depth + 1)
        if axis < 0 and dim == 0 or axis >= 0 and dim >= 0:
            return self.term(receiver, axis if axis < 0 else axis + (axis >= dim), depth + 1)
        return None

    def _is_tensor(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """Whether the source shows a tensor (not a tuple of them): a method or function that returns one."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, cst.Name):
            definition = self._definition(node)
            return definition is not None and definition.kind == "assign" and definition.index is None and \
                self._is_tensor(definition.value, depth + 1)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            return True
        method, _, _ = _method(node)
        if method in TENSOR_METHODS:
            return True
        dotted = (self.c.parsed.imported_name(node.func) or "") if isinstance(node, cst.Call) else ""
        return dotted in ("torch.cat", "torch.stack") or dotted.endswith("rearrange") or \
            isinstance(node, cst.Call) and layer_class(self.c.parsed, self.c.owner, node) in TENSOR_LAYERS

    def _indexed(self, node: cst.Subscript, axis: int, depth: int) -> Term | None:
        """`qkv[1]`, `x[0, :, :]`: integer indices of a tensor's leading axes, then full slices, keep its trailing
        axes; `parts[1]` of `parts = t.chunk(3, -1)` is that item."""
        kinds = []
        for element in node.slice:
            part = element.slice
            if isinstance(part, cst.Index) and int_value(part.value) is not None and part.star is None:
                kinds.append("int")
            elif isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None:
                kinds.append("full")
            else:
                return None
        if kinds == ["int"] and isinstance(node.value, cst.Name):
            definition = self._definition(node.value)
            if definition is not None and definition.kind == "assign" and definition.index is None and \
                    _method(definition.value)[0] in PARTS:
                index = int_value(node.slice[0].slice.value)
                return self._unpacked(definition.value, index, axis, depth) if index >= 0 else None
        if "full" in kinds and "int" in kinds[kinds.index("full"):] or not self._is_tensor(node.value):
            return None
        dropped = kinds.count("int")
        return self.term(node.value, axis if axis < 0 else axis + dropped, depth + 1)

    def _call(self, call: cst.Call, axis: int, depth: int) -> Term | None:
        c = self.c
        method, receiver, args = _method(call)
        if method in SAME_SHAPE:
            return self.term(receiver, axis, depth + 1)
        if method in ("view_as", "reshape_as") and len(args) == 1:
            return self.term(args[0].value, axis, depth + 1)
        if method in SWAPS and len(args) == 2:
            return self._swapped(receiver, [int_value(a.value) for a in args], axis, depth)
        if method == "permute":
            return self._permuted(receiver, args, axis, depth)
        if method in ("view", "reshape"):
            return self._sized(args, axis, depth)
        dotted = c.parsed.imported_name(call.func) or ""
        if dotted in SAME_SHAPE_FUNCTIONS and call.args and call.args[0].keyword is None:
            return self.term(call.args[0].value, axis, depth + 1)
        if dotted == "torch.cat":
            return self._concatenated(call, axis, depth)
        if dotted.endswith("rearrange") and len(call.args) >= 2:
            return self._rearranged(call, axis, depth)
        helper = helper_at(c, call)
        if helper is not None:
            return self._followed_helper(*helper, axis, depth)
        layer = layer_class(c.parsed, c.owner, call)
        if layer is not None:
            self._self_reads.add(call.func.attr.value)
        if layer in SHAPE_KEEPING_LAYERS or layer in ALL_BUT_LAST and axis != -1 and axis < 0 or \
                layer in POINTWISE_CONVOLUTIONS and self._spatial(layer, axis) and self._pointwise(call):
            return self.term(call.args[0].value, axis, depth + 1)
        return None

    def overridden(self) -> bool:
        """Whether a subclass (in the file or the tree) redefines a helper the walk followed or rebinds a layer it
        read: instances of it compute other sizes."""
        return bool(self._self_reads) and \
            scope.overridden(self.c.scope.classes(), self.c.owner, self._self_reads) is not None

    def _followed_helper(self, returned: cst.BaseExpression, function: cst.FunctionDef, bound: dict, axis: int,
                         depth: int) -> Term | None:
        """A helper method's one return (`self.transpose_for_scores(self.key(h))`), its parameters read as the
        call passes them."""
        if function in self._bound:
            return None
        self._self_reads.add(function.name.value)
        self._bound[function] = bound
        try:
            return self.term(returned, axis, depth + 1)
        finally:
            del self._bound[function]

    @staticmethod
    def _spatial(layer: str, axis: int) -> bool:
        """A spatial axis of a convolution's input: one of the last n, or from 2 on (batched (B, C, ...) or not)."""
        return -POINTWISE_CONVOLUTIONS[layer] <= axis < 0 or axis >= 2

    def _pointwise(self, call: cst.Call) -> bool:
        """`self.q(x)` of `nn.Conv2d(c, c, kernel_size=1, stride=1, padding=0)` (the defaults aside from the
        kernel): each output position is the input's."""
        built = self.c.owner.only_value(call.func.attr.value)
        names = ("in_channels", "out_channels", "kernel_size", "stride", "padding")
        given = {a.keyword.value if a.keyword else names[i]: a.value for i, a in enumerate(built.args)
                 if a.keyword is not None or i < len(names)}
        return int_value(given.get("kernel_size")) == 1 and int_value(given.get("stride", cst.Integer("1"))) == 1 \
            and int_value(given.get("padding", cst.Integer("0"))) == 0

    def _swapped(self, receiver: cst.BaseExpression, dims: list, axis: int, depth: int) -> Term | None:
        if None in dims:
            return None
        if any((d < 0) != (axis < 0) for d in dims):  # mixed ends: the rank would tell, when the source states it
            rank = products.rank(self.c, receiver)
            if rank is None:
                return None
            dims, axis = [d % rank for d in dims], axis % rank
        first, second = dims
        moved = second if axis == first else first if axis == second else axis
        return self.term(receiver, moved, depth + 1)

    def _permuted(self, receiver: cst.BaseExpression, args, axis: int, depth: int) -> Term | None:
        dims = [int_value(a.value) for a in args]
        if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
            dims = [int_value(e.value) for e in args[0].value.elements]
        if not dims or None in dims or any(a.star for a in args):
            return None
        rank = len(dims)
        if not -rank <= axis < rank:
            return None
        source = dims[axis % rank]
        return self.term(receiver, source - rank if source >= 0 and axis < 0 else source, depth + 1)

    def _sized(self, args, axis: int, depth: int) -> Term | None:
        """The size a view or reshape gives the axis: its own argument there (not -1), or the element there of
        the shape it is given (`x.view(new_shape)`, `x.view(*shape[:-1], h, d)`)."""
        if len(args) == 1 and not args[0].star and int_value(args[0].value) is None:
            return self._shape_element(args[0].value, axis, depth)
        return self._element(((a.value, bool(a.star)) for a in args), axis, depth)

    def _element(self, elements, axis: int, depth: int) -> Term | None:
        """Axis `axis` of a shape listed as (value, starred) elements: a size, or an axis of a starred shape
        (past it, the positions of the rest are not known)."""
        elements = list(elements)
        target = -axis - 1 if axis < 0 else axis
        for value, starred in (reversed(elements) if axis < 0 else elements):
            if starred:
                return self._shape_element(value, -target - 1 if axis < 0 else target, depth + 1)
            if target == 0:
                return self.size_term(value)
            target -= 1
        return None

    def _shape_element(self, node: cst.BaseExpression, axis: int, depth: int) -> Term | None:
        """Axis `axis` of a shape-valued expression: a tuple, a sum of tuples, `x.size()`, `x.shape`, a slice
        `x.shape[:-1]`, or a name bound to one of them."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(node, (cst.Tuple, cst.List)):
            return self._element(((e.value, isinstance(e, cst.StarredElement)) for e in node.elements), axis, depth)
        if isinstance(node, cst.Name):
            definition = self._definition(node)
            if definition is None or definition.kind != "assign" or definition.index is not None:
                return None
            return self._shape_element(definition.value, axis, depth + 1)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            near, far = (node.right, node.left) if axis < 0 else (node.left, node.right)
            if not isinstance(near, (cst.Tuple, cst.List)) or \
                    any(isinstance(e, cst.StarredElement) for e in near.elements):
                return None
            count = len(near.elements)
            if (-axis if axis < 0 else axis + 1) <= count:
                return self._shape_element(near, axis, depth + 1)
            return self._shape_element(far, axis + count if axis < 0 else axis - count, depth + 1)
        if isinstance(node, cst.Attribute) and node.attr.value == "shape" or \
                isinstance(node, cst.Call) and _method(node)[0] == "size" and not node.args:
            return self.term(node.value if isinstance(node, cst.Attribute) else node.func.value, axis, depth + 1)
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Slice):
            part = node.slice[0].slice
            upper = int_value(part.upper) if part.upper is not None else None
            if part.lower is None and part.step is None and upper is not None:
                if upper < 0 and axis < 0:
                    return self._shape_element(node.value, axis + upper, depth + 1)
                if 0 <= axis < upper:
                    return self._shape_element(node.value, axis, depth + 1)
        return None

    def size_term(self, node: cst.BaseExpression) -> Term | None:
        """A size argument as a term: a literal, or an expression of names, numbers, arithmetic and shape reads
        (`T`, `x.size(1)`, `n * 2`), keyed by what each name it reads is bound to there."""
        literal = int_value(node)
        if literal is not None:
            return ("int", literal) if literal >= 0 else None
        read = self._shape_read(node)
        if read is not None:
            return read
        if not _size_expression(node) or any(self.c.values.scalar_guess(name) is not None for name in _operands(node)):
            return None  # a parameter may hold an object whose `__index__` answers each reshape anew (round 48)
        bindings = []
        for name in loaded_names(node):
            seen = flow_for(self.c, name).reaching.get(name)
            if not seen or UNDEFINED in seen or self._followed(name) or name.value in _rebound_elsewhere(self.c) or \
                    seen_from_behind(self.c, name):
                return None
            bindings.append((name.value, seen))
        return ("size", cst.Module([]).code_for_node(node), tuple(bindings))

    def _shape_read(self, node: cst.BaseExpression) -> Term | None:
        """A size read off a tensor, as that tensor's axis: `x.shape[1]`, `x.size(1)`, or `n` of `b, n, d =
        x.shape` (the unpacking fixes x's rank: n is axis -2)."""
        if isinstance(node, (cst.Subscript, cst.Call)) and _size_expression(node):
            tensor = node.value.value if isinstance(node, cst.Subscript) else node.func.value
            index = int_value(node.slice[0].slice.value if isinstance(node, cst.Subscript) else node.args[0].value)
            return self.term(tensor, index, 1)
        if not isinstance(node, cst.Name):
            return None
        definition = self._definition(node)
        if definition is None or definition.kind != "assign" or definition.index is None or \
                not _plain_targets(definition.statement):
            return None
        value = definition.value
        shaped = value.value if isinstance(value, cst.Attribute) and value.attr.value == "shape" else \
            value.func.value if isinstance(value, cst.Call) and _method(value)[0] == "size" and not value.args else None
        if shaped is None:
            return None
        count = len(definition.statement.targets[0].target.elements)
        return self.term(shaped, definition.index - count, 1)

    def _concatenated(self, call: cst.Call, axis: int, depth: int) -> Term | None:
        """`torch.cat([past, new], dim=-2)`: along the axis, the sizes in order; along another, the first's (cat
        raises unless they agree)."""
        if not call.args or not isinstance(call.args[0].value, (cst.List, cst.Tuple)):
            return None
        dim = _dim(call.args[1:], 0)
        items = call.args[0].value.elements
        if dim is None or not items or any(isinstance(e, cst.StarredElement) for e in items):
            return None
        if dim != axis:  # every item's size there (a legacy empty tensor is skipped by cat, not matched)
            terms = {self.term(e.value, axis, depth + 1) for e in items}
            return terms.pop() if len(terms) == 1 and None not in terms and _apart(dim, axis) else None
        terms = tuple(self.term(e.value, axis, depth + 1) for e in items)
        return ("cat", terms) if None not in terms else None

    def _rearranged(self, call: cst.Call, axis: int, depth: int) -> Term | None:
        """einops `rearrange(x, 'b n (h d) -> b h n d', h=h)`: an output axis that is one input axis keeps its
        size; one inside an input group is sized by its keyword."""
        pattern = call.args[1].value
        if not isinstance(pattern, cst.SimpleString) or call.args[0].keyword is not None:
            return None
        parsed = _einops_sides(pattern.evaluated_value)
        if parsed is None:
            return None
        left, right = parsed
        if not -len(right) <= axis < len(right):
            return None
        names = right[axis] if isinstance(right[axis], tuple) else (right[axis],)
        terms = tuple(self._einops_axis(call, left, name, depth) for name in names)
        if None in terms or not terms:
            return None
        return terms[0] if len(terms) == 1 else ("group", terms)

    def _einops_axis(self, call: cst.Call, left: list, name: str, depth: int) -> Term | None:
        """The size of one named axis: the input's axis of that name, or the keyword that sizes it."""
        if name in left:  # the input has exactly these axes: the one named is both these positions
            position = left.index(name)
            return self.term(call.args[0].value, position - len(left), depth + 1) or \
                self.term(call.args[0].value, position, depth + 1)
        sized = [a.value for a in call.args[2:] if a.keyword is not None and a.keyword.value == name]
        return self.size_term(sized[0]) if sized else None


def _plain_targets(statement: cst.CSTNode | None) -> bool:
    """Whether an unpacking binds each target to the item at its position: a flat tuple of names, no starred or
    nested target (`k, *_, v = ...`, `(k, v), s = ...` bind by other positions)."""
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return False
    target = statement.targets[0].target
    return isinstance(target, (cst.Tuple, cst.List)) and \
        all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements)


def _rebound_elsewhere(c: Candidate) -> frozenset[str]:
    """Names a `global` or `nonlocal` statement of the file declares: a call may rebind them between two reads."""
    return c.parsed.derived(_rebound_elsewhere, lambda parsed: frozenset(
        name.name.value for statement in parsed.nodes_of(cst.Global, cst.Nonlocal) for name in statement.names))


def _mapping(node: cst.BaseExpression) -> tuple[cst.Lambda, cst.BaseExpression] | None:
    """(the lambda, the sequence) of `map(lambda t: ..., seq)`."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "map" and \
            len(node.args) == 2 and isinstance(node.args[0].value, cst.Lambda) and \
            len(node.args[0].value.params.params) == 1 and not any(a.keyword or a.star for a in node.args):
        return node.args[0].value, node.args[1].value
    return None


def _method(node: cst.BaseExpression) -> tuple[str | None, cst.BaseExpression | None, tuple]:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value, node.func.value, node.args
    return None, None, ()


def _dim(args, position: int) -> int | None:
    """The dim argument (by position, or as `dim=` or torch's `axis=`), or its default 0 where none is given."""
    by_keyword = [a for a in args if a.keyword is not None and a.keyword.value in ("dim", "axis")]
    positional = [a for a in args if a.keyword is None]
    if by_keyword:
        return int_value(by_keyword[0].value)
    if len(positional) > position:
        return int_value(positional[position].value)
    return 0


def _apart(dim: int, axis: int) -> bool:
    """Whether `dim` and `axis` provably name different axes without the rank: both counted from the same end
    (dim 0 and axis -4 are one axis of a 4-D tensor: breaker round 20)."""
    return (dim < 0) == (axis < 0) and dim != axis


def _size_expression(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Name, cst.Integer)):
        return True
    if isinstance(node, cst.BinaryOperation):
        return _size_expression(node.left) and _size_expression(node.right)
    if isinstance(node, cst.Subscript):  # `x.shape[1]`
        return isinstance(node.value, cst.Attribute) and node.value.attr.value == "shape" and \
            isinstance(node.value.value, cst.Name) and len(node.slice) == 1 and \
            isinstance(node.slice[0].slice, cst.Index) and int_value(node.slice[0].slice.value) is not None
    if isinstance(node, cst.Call):  # `x.size(1)`
        return isinstance(node.func, cst.Attribute) and node.func.attr.value == "size" and \
            isinstance(node.func.value, cst.Name) and len(node.args) == 1 and int_value(node.args[0].value) is not None
    return False


def _operands(node: cst.BaseExpression) -> list[cst.Name]:
    """The names a size expression computes with (not the tensors whose shape it reads)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, cst.BinaryOperation):
        return _operands(node.left) + _operands(node.right)
    return []


def _einops_sides(pattern: str) -> tuple[list, list] | None:
    """Both sides of an einops pattern: a name per axis, a tuple for a group; None with an ellipsis."""
    if "->" not in pattern or "..." in pattern or pattern.count("->") != 1:
        return None
    sides = []
    for side in pattern.split("->"):
        axes, group = [], None
        for token in side.replace("(", " ( ").replace(")", " ) ").split():
            if token == "(":
                if group is not None:
                    return None
                group = []
            elif token == ")":
                if group is None:
                    return None
                axes.append(tuple(group))
                group = None
            elif group is not None:
                group.append(token)
            else:
                axes.append(token)
        if group is not None:
            return None
        sides.append(axes)
    return sides[0], sides[1]
