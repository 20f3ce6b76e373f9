"""The forward walk and what lies on it: from the softmax output through casts, dropout and transposes to the
weights·V product, then the value operand and dropout's probability (the layout the output must keep is
`attention.layout`'s).

Every read of the weights other than the one that continues the block escapes it (SDPA does not return the
weights); a read that transforms them on the way to a product is a refusal, since SDPA would skip it.
"""

from __future__ import annotations

import textwrap
from functools import lru_cache

import libcst as cst

from advisor.patterns import einsum as es
from advisor.patterns import scope
from advisor.patterns.attention.anchors import feeds_product
from advisor.patterns.attention.candidate import (
    MAX_CHAIN, Candidate, WeightPath, consumers, definition_of_value, function_of,
)
from advisor.patterns.attention.helpers import calls_to, leave_to_caller
from advisor.patterns.attention.products import last_two, rank, spec
from advisor.patterns.attention.rendering import at_home, short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.attention.scores import absorb
from advisor.patterns.dtypes import layer_class
from advisor.patterns.foreign_calls import IMPLICIT_RUNNERS, KNOWN_BUILTINS, call_of, callbacks, implicit_runs, \
    iterated_arguments, iteration_sources
from advisor.patterns.ops import Op, int_value, number_value
from advisor.static.codegen import atomic, number
from advisor.static.dataflow import UNDEFINED, Definition, bound_names, contains_call, is_self_attribute, loaded_names
from advisor.static.tensor_views import RANDOM_DRAWS, tensor_method_names, torch_op_name
from advisor.static.walk import descendants


# breaker round 35: the original's backward raised, the patch's ran
IN_PLACE_WEIGHTS = ("overwriting the softmax's output, which its backward needs: the original's backward raises "
                    "where SDPA's would run")


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
        elif op.name == "masked_fill" and op.operands[0] is node and number_value(op.params["fill"]) == 0 and \
                c.zeroing is None and not transposed:  # masked keys' weights set to 0 (attention.zeroed_rows)
            if op.inplace:
                raise Refusal(f"`{short(c.parsed, op.node)}` zeroes the attention weights in place, "
                              f"{IN_PLACE_WEIGHTS}")
            absorb(c, op)
            c.zeroing = op
            node = op.node
        elif op.name in ("transpose", "permute", "mT") and _swaps_last_two(op, ndim):
            transposed = not transposed
            node = op.node
        elif op.name in ("matmul", "bmm") and op.operands[int(transposed)] is node:
            return WeightPath(op, op.operands[1 - int(transposed)], definitions, escapes, dropouts, reads, transposed,
                              casts)
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
FX_DROPOUT_MODE = "fx-dropout-mode"


def dropout_role(c: Candidate, dropouts: list[Op]) -> None:
    """SDPA's dropout_p: the probability when dropout runs, under the original's training flag (and under the
    `if p:` that guards it, see `_guarded_dropout`)."""
    if len(dropouts) > 1:
        raise Refusal("dropout is applied twice to the attention weights")
    if not dropouts:
        return
    op = dropouts[0]
    if op.inplace:
        _in_place_fact(c, op)
    probability = _dropout_probability(c, op)
    if probability is not None:
        _no_draw_after(c, op)
    update = definition_of_value(c, op.node)
    if probability is not None and update is not None and _guarded_dropout_of(c, update) is not None:
        guard = update.guards[-1]
        c.leaf_nodes.append(guard.test)
        probability = cst.IfExp(test=at_home(c, guard.test), body=atomic(probability), orelse=number(0.0))
    c.match.dropout_p = probability


MODE_SWITCHES = frozenset({"train", "eval"})
# any of their functions may draw, read the generator's state or run code they are handed (a checkpointed function,
# a sampler's iteration: breaker round 33)
DRAWING_MODULES = ("torch.nn.init.", "torch.distributions.", "torch.testing.", "torch.utils.", "torch.quasirandom.",
                   "torch.random.")
# torch's functions that draw (SDPA's own dropout) or read the generator's state besides RANDOM_DRAWS: the patch
# moves the dropout's draw past them (round 33)
GENERATOR_USERS = frozenset({"scaled_dot_product_attention", "get_rng_state", "initial_seed", "get_rng_state_all",
                             "graphsafe_get_state", "get_state", "set_state"})
# tensor methods that run a function they are given on every element (`t.apply_(draw_one)`: breaker round 34)
CALLING_METHODS = frozenset({"apply_", "map_", "map2_"})
# torch's generators themselves: any use reads or moves their state (`torch.default_generator.get_state()`: round 34)
GENERATORS = ("torch.default_generator", "torch.Generator", "torch.cuda.default_generators")
# torch.nn classes whose construction draws no initial values
PLAIN_CONSTRUCTIONS = frozenset({"Parameter", "Buffer", "Identity", "Flatten", "Unflatten"})


def _no_draw_after(c: Candidate, dropout: Op) -> None:
    """SDPA draws its dropout mask where the value product was, so a draw from torch's generator between the dropout
    and the value product would take the numbers the original's mask took (breaker round 27: `gate = torch.rand(1)`
    there changed both under one seed). Refuses where a call there may draw: one of RANDOM_DRAWS, a dropout layer,
    or anything but torch's other functions, tensor methods, builtins and torch.nn's other layers. A dropout in a
    helper counts from the start of the block's function."""
    parsed, product = c.parsed, c.weights.output.node
    first = parsed.line(dropout.node) if parsed.within(dropout.node, c.home) else parsed.line(c.home)
    last = parsed.line(product) if parsed.within(product, c.home) else parsed.end_line(c.home)
    for node in descendants(c.home, (cst.Call, cst.Attribute) + IMPLICIT_RUNNERS):  # the two lines included
        if not (first <= parsed.line(node) <= last and not _nested(parsed, node, dropout.node) and
                not (node is product or parsed.within(product, node))):  # `self.proj(w @ v)` runs after it
            continue  # `w @ self.v_drop(v)` runs before SDPA's draw in the patch, after the mask's in the original
        if isinstance(node, cst.Attribute):  # `self.gain`, a property of the class: its getter runs (round 30)
            if is_self_attribute(node) and c.owner is not None and node.attr.value in c.owner.methods and \
                    not _called(parsed, node):
                raise Refusal(f"`{short(parsed, node)}` (line {parsed.line(node)}) runs a method of the class, "
                              "which may draw random numbers between the dropout and the value product, where "
                              "SDPA draws its dropout mask: the draws would swap places")
            continue
        runs = [] if isinstance(node, cst.Call) else implicit_runs(parsed, node)
        drawing = next((run for run in runs if _iteration_may_draw(c, run)), None)
        if _may_draw(c, node) if isinstance(node, cst.Call) else drawing is not None:
            what = node.func if isinstance(node, cst.Call) else drawing
            raise Refusal(f"`{short(parsed, what)}` (line {parsed.line(node)}) may draw random numbers (or read "
                          "the generator's state) between the dropout and the value product, where SDPA draws its "
                          "dropout mask: the draws would swap places")


def _called(parsed, attribute: cst.Attribute) -> bool:
    """`self.f(...)`: the attribute is the function of a call (which the call's own check reads)."""
    parent = parsed.parents.get(attribute)
    return isinstance(parent, cst.Call) and parent.func is attribute


def _nested(parsed, call: cst.Call, node: cst.CSTNode) -> bool:
    """The call is `node`, inside it, or around it (`self.proj(w @ v)` runs after the product in both programs)."""
    return parsed.within(call, node) or parsed.within(node, call)


def _may_draw(c: Candidate, call: cst.Call) -> bool:
    """Whether the call may draw from torch's generator: by name (RANDOM_DRAWS, a dropout), or as code not read
    here (this file's functions are not followed: a helper may draw)."""
    func, dotted = call.func, c.parsed.imported_name(call.func) or ""
    name = torch_op_name(dotted) if dotted else func.attr.value if isinstance(func, cst.Attribute) else ""
    if name in RANDOM_DRAWS or name in GENERATOR_USERS or "dropout" in name.lower() or name in CALLING_METHODS or \
            dotted.startswith(DRAWING_MODULES) or dotted.startswith(GENERATORS) or function_may_draw(dotted) or \
            _unbound_layer_method(dotted):
        return True
    if name in MODE_SWITCHES and not (is_self_attribute(func) and c.owner is not None and name in c.owner.methods):
        return False  # nn.Module's own `train`/`eval` (a class's own one may draw)
    layer = layer_class(c.parsed, c.owner, call)
    if layer is not None:
        return not layer.startswith("torch.nn.") or layer_may_draw(layer)
    if dotted.startswith("torch.nn.") and name[:1].isupper():  # a layer built there: its initial values are drawn
        return name not in PLAIN_CONSTRUCTIONS or any(_iteration_may_draw(c, arg.value, unknown=False)
                                                      for arg in call.args)
    if dotted.startswith(("torch.", "math.")):  # a generator made before and consumed there (`torch.Size(g)`)
        return any(_iteration_may_draw(c, arg.value, unknown=False) for arg in call.args)
    if isinstance(func, cst.Name) and func.value in KNOWN_BUILTINS and func.value not in c.parsed.bound_names and \
            func.value not in c.parsed.imports:  # what the builtin calls or iterates may draw (`map(draw, xs)`)
        return any(_may_draw(c, call_of(f)) for f in callbacks(call) if not isinstance(f, cst.Lambda)) or \
            any(_iteration_may_draw(c, iterable) for iterable in iterated_arguments(call))
    return not (isinstance(func, cst.Attribute) and not dotted and name in tensor_method_names() and
                not _object_of_a_class_here(c, func.value))


def _object_of_a_class_here(c: Candidate, receiver: cst.BaseExpression) -> bool:
    """`JIT.add(x)` where `JIT = Jitter()`, a class of this file, or `JIT = make_jitter()`, a function of this file
    that may return one (breaker round 36): its method of a tensor method's name is that class's code, which may
    draw (breaker round 34), not the tensor method."""
    if not isinstance(receiver, cst.Name):
        return False
    made_here, parsed = set(c.parsed.top_level_classes) | set(c.parsed.module_functions), c.parsed
    definitions = c.flow.definitions_of(receiver)  # the function's own bindings; without any, the module's
    values = [d.value for d in definitions if d.kind == "assign"] if definitions else \
        [parsed.parents[parsed.parents[b]].value for b in parsed.bindings.get(receiver.value, [])
         if isinstance(parsed.parents.get(b), cst.AssignTarget) and
         parsed.innermost(b, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) is None]
    return any(isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in made_here
               for value in values)


def _iteration_may_draw(c: Candidate, iterable: cst.BaseExpression, unknown: bool = True) -> bool:
    """Iterating may run a generator made before (`g = draws(2)`; `list(g)`), or code of a caller. `unknown`: the
    answer where what the value is cannot be told (a parameter: a caller's generator, or, handed to a torch function,
    almost always a tensor)."""
    sources = iteration_sources(c.parsed, c.owner, iterable)
    if sources is None:
        return unknown
    return any(_may_draw(c, call) for source in sources for call in descendants(source, (cst.Call,)))


@lru_cache(maxsize=None)
def function_may_draw(dotted: str) -> bool:
    """A torch function whose signature takes a dropout, a generator or random samples
    (`F.multi_head_attention_forward(..., dropout_p, training=True)`, `F.fractional_max_pool2d_with_indices`:
    breaker round 34), or one written in Python whose code draws (`python_code_draws`), read from torch's own
    function; False for anything else."""
    import inspect

    found = _torch_object(dotted)
    if found is None or isinstance(found, type) or not callable(found):
        return False
    try:
        parameters = inspect.signature(found).parameters
    except (TypeError, ValueError):
        parameters = {}
    return any(word in parameter for parameter in parameters for word in ("dropout", "generator", "random")) or \
        python_code_draws(found)


MAX_CALLEES = 64  # functions of torch read for one question: torch's Python helpers call few of their own


def python_code_draws(function) -> bool:
    """Whether a function of torch written in Python calls a draw (RANDOM_DRAWS by name), itself or through the
    functions of torch its code calls by name, read from their source (`torch.svd_lowrank` draws its sketch with
    `torch.randn` two calls down, and its signature says nothing of it: breaker round 35), a method of a class of
    that module included (`spectral_norm` draws in `SpectralNorm.apply`: round 36's helper). A built-in function
    (C++) has no source here: its signature is all there is."""
    import ast
    import inspect

    pending, seen = [function], set()
    while pending and len(seen) < MAX_CALLEES:
        current = inspect.unwrap(pending.pop())
        if current in seen or not inspect.isfunction(current) or \
                not (current.__module__ or "").startswith("torch"):
            continue
        seen.add(current)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(current)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in RANDOM_DRAWS:
                return True
            pending.append(current.__globals__.get(called))
            owner = current.__globals__.get(node.func.value.id) if isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) else None
            if isinstance(owner, type):  # `SpectralNorm.apply(...)`: a method of a class of that module
                pending.append(getattr(owner, called, None))
    return False


def _unbound_layer_method(dotted: str) -> bool:
    """`nn.Dropout.forward(self.drop, x)`, `nn.Module.__call__(m, x)`: a method of a torch.nn layer class called
    on a module it is handed, which may be any layer (a dropout: breaker round 35), whatever class names it."""
    import torch

    owner = _torch_object(dotted.rpartition(".")[0])
    return isinstance(owner, type) and issubclass(owner, torch.nn.Module)


@lru_cache(maxsize=None)
def layer_may_draw(layer: str) -> bool:
    """Whether calling a torch.nn layer of this class may draw: a dropout, RReLU, fractional pooling, a layer built
    with a `dropout` of its own (a Transformer layer, an RNN, MultiheadAttention), or a container, whose children
    are not read here (breaker round 33: `nn.Sequential(nn.Linear(...), nn.Dropout(...))`). Read from torch's class
    (torch imported only where a proof asks); a name torch does not have may be anything."""
    import inspect

    import torch

    name = layer.rsplit(".", 1)[-1]
    found = _torch_object(layer)
    if not isinstance(found, type) or not issubclass(found, torch.nn.Module):
        return True
    if "dropout" in name.lower() or name in ("RReLU", "FractionalMaxPool2d", "FractionalMaxPool3d"):
        return True
    if issubclass(found, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)):
        return True
    try:  # the constructors up the class's bases too: `nn.GRU(*args, **kwargs)` passes `dropout` to RNNBase's
        return any("dropout" in parameter for kind in found.__mro__ if "__init__" in vars(kind)
                   for parameter in inspect.signature(vars(kind)["__init__"]).parameters)
    except (TypeError, ValueError):
        return True


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
        _training_fact(c, training)
    else:
        _fx_mode_fact(c, op)
    if op.params.get("module") and (_may_be_identity(c, op) or scope.is_scripted(c.parsed, c.home, c.owner)):
        # `getattr(self.attn_drop, "p", 0.0)`: an Identity drops nothing; TorchScript compiles the SDPA branch of a
        # guarded patch too, where the module may be an Identity with no `p` (the check sends it to the original)
        probability = cst.Call(func=cst.Name("getattr"), args=[
            cst.Arg(probability.value), cst.Arg(cst.SimpleString('"p"')), cst.Arg(number(0.0))])
    return cst.IfExp(test=at_home(c, training), body=atomic(probability), orelse=number(0.0))


def _fx_mode_fact(c: Candidate, op: Op) -> None:
    """torch.fx keeps a Dropout module's call as a call of the module, which reads its `training` flag when the
    graph runs; the patch reads the flag in a Python branch the tracer takes once (breaker round 30: traced in
    training, the graph kept dropping out after `gm.eval()`). Where the tree traces with torch.fx, the patch checks
    that q is a tensor, which it is not while tracing (a Proxy): the tracer records the original."""
    traced = scope.fx_traced(c.parsed)
    if traced is not None:
        c.match.facts.assumed(FX_DROPOUT_MODE, f"`{short(c.parsed, op.node.func)}`, whose call the rewrite deletes, "
                              "is not traced by torch.fx (whose graph would keep the training flag the trace saw)",
                              traced)


IN_PLACE_DROPOUT = "dropout-in-place"
DROPOUT_TRAINING = "dropout-training-bool"


def _training_fact(c: Candidate, training: cst.BaseExpression) -> None:
    """F.dropout raises unless its training flag is a bool (`training=0` raises TypeError: breaker round 49), where
    the patch reads only its truth. Proved for a module's `.training` (nn.Module keeps a bool there: `train()`
    rejects anything else), a `not` (a bool whatever it negates), a comparison of Python numbers (proved, or a
    dropout probability the range check reads as one: `p > 0.5`), and a name every binding of which is a bool
    literal; not for other comparisons (a tensor's or numpy's gives no bool) nor a `bool` annotation, which Python
    does not enforce (breaker round 50). Else assumed (guarded `isinstance(t, bool)` where it can be read again)."""
    if isinstance(training, cst.Attribute) and training.attr.value == "training" or \
            isinstance(training, cst.UnaryOperation) and isinstance(training.operator, cst.Not) or \
            isinstance(training, cst.Comparison) and all(
                _number_operand(c, node) for node in (training.left, *(t.comparator for t in training.comparisons))):
        return
    if isinstance(training, cst.Name) and not c.flow.sees_undefined(training):
        definitions = c.flow.definitions_of(training)
        if definitions and all(d.kind == "assign" and d.index is None and isinstance(d.value, cst.Name) and
                               d.value.value in ("True", "False") for d in definitions):
            return
    c.training_reads.append(training)
    c.match.facts.assumed(DROPOUT_TRAINING, f"dropout's training flag `{short(c.parsed, training)}` is a bool",
                          "F.dropout raises on any other (an int, a tensor), while the patch reads only its truth")


def _number_operand(c: Candidate, node: cst.BaseExpression) -> bool:
    """A Python number: proved from the source, or a dropout probability the range check reads as one (where it
    fails, the original runs)."""
    return c.values.scalar_guess(node) is None or isinstance(node, cst.Name) and any(
        isinstance(read, cst.Name) and read.value == node.value for read in c.dropout_reads)


def _in_place_fact(c: Candidate, op: Op) -> None:
    """A dropout in place (`nn.Dropout(p, inplace=True)`, timm's TNT) overwrites the softmax's output, which its
    backward needs, wherever it drops anything: the original's backward raises in training with p > 0 (breaker
    round 35), SDPA's would not. Where it drops nothing (not training, or p == 0) it writes nothing, and the patch
    is exact: that is the fact, checked where the training flag and `p` can be read again (attention.guards), so
    the original runs, and raises, where it would drop out."""
    p, training = op.params.get("p"), op.params.get("training")
    if p is not None and number_value(p) == 0 or isinstance(training, cst.Name) and training.value == "False":
        return
    if training is None or p is None or number_value(p) is not None and \
            isinstance(training, cst.Name) and training.value == "True":  # it always drops out
        raise Refusal(f"`{short(c.parsed, op.node)}` drops out the attention weights in place (`inplace=True`), "
                      f"{IN_PLACE_WEIGHTS}")
    if op.params.get("module"):  # read off the module the call names (its `p` and `training` are made up)
        module = op.node.func
        training, p = (cst.Attribute(module, cst.Name(name)) for name in ("training", "p"))
    c.inplace_dropout = (training, p)
    c.match.facts.assumed(IN_PLACE_DROPOUT, f"`{short(c.parsed, op.node)}`, which drops out in place, drops "
                          "nothing (not training, or p == 0)", IN_PLACE_WEIGHTS)


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


def _torch_object(dotted: str):
    """What torch's dotted name (`torch.nn.GRU`) holds, read off the imported module; None for another name or one
    torch does not have (torch imported only where a proof asks)."""
    if not dotted.startswith("torch."):
        return None
    import torch

    found = torch
    for part in dotted.split(".")[1:]:
        found = getattr(found, part, None)
    return found
