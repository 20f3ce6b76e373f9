"""Tensor scales folded into the query: `(q·kᵀ) * s == (q * s)·kᵀ` wherever `s` has size 1 in the key axis (a
learned per-head temperature of shape (H, 1, 1), a cosine-attention logit scale, a 0-d tensor, a per-query-row
factor), so SDPA gets `q * s` and `scale=1.0`. A tensor of another last size (an (L, L) tensor) multiplies each
score by its own value: a multiplicative mask, which SDPA cannot express.

Three facts carry the fold; each is proved from the source where it shows them, else guarded (a metadata check,
when `s` is a plain read) or assumed:
- `scale-broadcast`: `s` has size 1 in the key axis and no more dims than q (so `q * s` keeps q's batch layout);
- `scale-dtype`: `q * s` has q's dtype. Type promotion treats q·kᵀ as it treats q (same dtype, both with dims), so
  `q * s` always has the dtype the original's scaled scores had; SDPA also needs it to be k's and v's.
And the expression `s` moves to the SDPA call, so it must be a read or a pure torch expression of reads.
"""

from __future__ import annotations

import math

import libcst as cst

from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.attention.mask_terms import enclosing_views
from advisor.patterns.attention.rendering import at_home, short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.attention.tensor_facts import rank_bounds, reaching_values, roots
from advisor.patterns.masks import _subscript_bounds
from advisor.patterns.ops import Op, int_value
from advisor.patterns.values import float32
from advisor.static.codegen import atomic, parenthesized
from advisor.static.dataflow import loaded_names
from advisor.static.tensor_reads import SIZED_TORCH

BROADCAST, DTYPE, TENSOR_NONZERO = "scale-broadcast", "scale-dtype", "scale-divisor-nonzero"
# elementwise: the result has the broadcast shape of the tensors among the arguments
ELEMENTWISE = {"exp", "log", "clamp", "clamp_min", "clamp_max", "clip", "sigmoid", "softplus", "abs", "neg", "sqrt",
               "rsqrt", "reciprocal", "tanh", "pow", "mul", "div", "add", "sub", "square", "relu", "exp2", "log1p"}
# the receiver's shape, whatever the arguments (dtype and device changes, copies)
FOLD_RANGE = "fold-range"  # accepted: q * s in q's dtype, which in float16 can overflow where (q·kᵀ)·s does not
SHAPE_KEEPING = {"to", "float", "half", "bfloat16", "double", "type_as", "detach", "clone", "contiguous"}
WRAPPERS = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
REDUCTIONS = {"sum", "mean", "amax", "amin", "norm", "logsumexp"}
SHAPE_KEYWORDS = {"input", "other", "min", "max", "exponent"}  # keyword arguments that are operands

Shape = tuple[int | None, int | None]  # (the size it gives the last axis when broadcast: 1 also for 0-d, most dims)
NUMBER: Shape = (1, 0)
UNKNOWN: Shape = (None, None)


def fold_into_query(c: Candidate, ndim: int | None) -> None:
    """Prove or guard the fold of each tensor factor and write the query SDPA gets: `q * s1 / s2 ...`, a factor
    applied under an `if` as `(q * s if test else q)`."""
    if not c.tensor_factors:
        return
    q_low = max(rank_bounds(c).bounds(c.leaf_nodes[0])[0], ndim or 0, 2)  # SDPA's query has (..., L, E)
    shapes = [_shape(c, factor) for _, factor in c.tensor_factors]
    _broadcast_fact(c, shapes, q_low)
    _dtype_fact(c, shapes)
    _divisor_fact(c)
    c.match.facts.accepted(FOLD_RANGE, "`q * s` stays within the query dtype's range where the scaled scores do",
                           "the fold rounds and bounds `q * s` in q's dtype, where the original scales `q·kᵀ`: in "
                           "float16 (largest 65504) a query times a large scale can overflow to inf while the "
                           "scaled scores do not (queries of about 300 with a scale of 300 against keys of 0.01), "
                           "giving NaN rows; float32, bfloat16 and float64 share float32's range or wider, which "
                           "no scaled query of a working model reaches")
    query = c.unfolded_query = c.match.query
    for kind, factor in c.tensor_factors:
        scaled = cst.BinaryOperation(atomic(query), cst.Multiply() if kind == "mul" else cst.Divide(),
                                     atomic(at_home(c, factor)))
        guard = c.chain.factor_guards.get(factor)
        if guard is not None:
            negated = factor in c.chain.negated_factors
            scaled = parenthesized(cst.IfExp(test=at_home(c, guard.test), body=query if negated else scaled,
                                             orelse=scaled if negated else query))
        query = scaled
    c.match.query = query


def check_placement(c: Candidate, applied: list[tuple[Op, object]]) -> None:
    """A tensor factor must scale the scores before any mask (SDPA masks after scaling, and a -inf fill times a
    tensor that may hold 0 is NaN), outside a view-and-back pair, and move to the call without running user code."""
    first_mask = next((i for i, (op, _) in enumerate(applied) if op.name not in ("mul", "div", "view")), None)
    for position, (op, _) in enumerate(applied):
        factor = op.params.get("tensor_factor")
        if factor is None:
            continue
        text = short(c.parsed, factor)
        if first_mask is not None and position > first_mask:
            raise Refusal(f"the scores are scaled by the tensor `{text}` after a mask, and SDPA masks after "
                          f"scaling (a filled score times a tensor that may hold 0 or a negative is not the fill)")
        if enclosing_views(c, position) is not None:
            raise Refusal(f"the scores are scaled by the tensor `{text}` while reshaped, so its axes are not the "
                          f"query's")
        if not _movable(c, factor):
            raise Refusal(f"the tensor scale `{text}` calls code the rewrite would move to the SDPA call")
        c.tensor_factors.append((op.name, factor))
        c.leaf_nodes.append(factor)


def _broadcast_fact(c: Candidate, shapes: list[Shape], q_low: int) -> None:
    statement = "the tensor scale has size 1 in the key axis and no more dims than q, so (q·kᵀ)·s = (q·s)·kᵀ"
    for (_, factor), (last, _) in zip(c.tensor_factors, shapes):
        if last is not None and last != 1:
            raise Refusal(f"the scores are multiplied by `{short(c.parsed, factor)}`, whose last axis has size "
                          f"{last}, not 1: each score gets its own factor (a multiplicative mask), which SDPA "
                          f"cannot express")
    key_names = {name.value for name in loaded_names(c.leaf_nodes[1])}
    for (_, factor), (last, _) in zip(c.tensor_factors, shapes):
        if last is None and key_names & {name.value for name in loaded_names(factor)}:
            raise Refusal(f"the scores are multiplied by `{short(c.parsed, factor)}`, computed from the keys with a "
                          f"last axis of unknown size: a per-key factor does not broadcast over the query rows, "
                          f"and SDPA's query cannot carry it")
    unknown = [factor for (_, factor), (last, most) in zip(c.tensor_factors, shapes)
               if last is None or most is None or most > q_low]
    if not unknown:
        c.match.facts.proved(BROADCAST, statement, "its shape is built with a last size of 1 (or no dims) and no "
                             "more dims than the query")
        return
    c.tensor_scale_reads[BROADCAST] = unknown
    c.match.facts.assumed(BROADCAST, statement, f"the shape of `{short(c.parsed, unknown[0])}` is not visible here "
                          f"(a last axis of another size would make it a multiplicative mask)")


def _divisor_fact(c: Candidate) -> None:
    """`(q·kᵀ) / s` is ±inf or NaN where `s` holds a 0, and `(q / s)·kᵀ` is not the same (a 0 of q gives NaN, the
    product mixes infinities): exact only where `s` holds no 0, which no metadata check shows. Proved for a
    constant built from a nonzero literal (`torch.tensor(8 ** 0.5)`), else assumed (a learned temperature)."""
    divisors = [factor for kind, factor in c.tensor_factors if kind == "div"]
    unknown = [factor for factor in divisors if not _nonzero_constant(c, factor, 0)]
    held = [_tensor_of(c, factor) for factor in unknown]
    c.tensor_scale_reads[TENSOR_NONZERO] = held if None not in held else []
    if unknown:
        c.match.facts.assumed(TENSOR_NONZERO, f"the tensor divisor `{short(c.parsed, unknown[0])}` holds no 0",
                              "its values are not constants of the source (a 0 gives the original NaN, the "
                              "folded query other values)")
    elif divisors:
        c.match.facts.proved(TENSOR_NONZERO, "the tensor divisors hold no 0", "built from nonzero literals")


def _tensor_of(c: Candidate, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """x of `torch.tensor(x, ...)`, or of its square root (`torch.sqrt(torch.tensor(x))`, `.sqrt()`): a tutorial's
    `/ torch.sqrt(torch.tensor(self.d_k, dtype=torch.float32))`, which holds a 0 exactly where an int x is 0 (a
    guard checks that, see attention.guards); None for any other divisor."""
    if isinstance(node, cst.Call) and c.parsed.imported_name(node.func) == "torch.sqrt" and len(node.args) == 1:
        node = node.args[0].value
    elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "sqrt" \
            and not node.args:
        node = node.func.value
    if not (isinstance(node, cst.Call) and c.parsed.imported_name(node.func) == "torch.tensor"):
        return None
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    others = [a.keyword.value for a in node.args if a.keyword is not None]
    return positional[0] if len(positional) == 1 and set(others) <= {"dtype", "device"} else None


def _nonzero_constant(c: Candidate, node: cst.BaseExpression, depth: int) -> bool:
    """`torch.tensor(x)`, `torch.full(size, x)`, `torch.ones(...)` with x a nonzero finite literal, read through
    names, `self.` attributes assigned only that, and dtype changes; never a parameter (it learns)."""
    if depth > 8:
        return False
    if isinstance(node, cst.Name):
        values = reaching_values(c, node)
        return bool(values) and all(_nonzero_constant(c, v, depth + 1) for v in values)
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self" \
            and c.owner is not None:
        built = c.owner.only_value(node.attr.value)
        return built is not None and _nonzero_constant(c, built, depth + 1)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power) or \
            isinstance(node, cst.Call) and c.parsed.imported_name(node.func) == "torch.sqrt":
        value = _constant_value(c, node)
        return value is not None and value != 0 and math.isfinite(value)
    if not isinstance(node, cst.Call):
        return False
    dotted = c.parsed.imported_name(node.func) or ""
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    if dotted == "torch.ones":
        return True
    if dotted in ("torch.tensor", "torch.full") and len(positional) >= (1 if dotted == "torch.tensor" else 2):
        value = c.values.literal_number(positional[-1 if dotted == "torch.tensor" else 1])
        return value is not None and value != 0 and value == value and abs(value) != float("inf")
    return isinstance(node.func, cst.Attribute) and node.func.attr.value in SHAPE_KEEPING and \
        _nonzero_constant(c, node.func.value, depth + 1)


def _constant_value(c: Candidate, node: cst.BaseExpression) -> float | None:
    """The value of `torch.tensor(x) ** p`, `torch.sqrt(torch.tensor(x))` (x, p literals), rounded to float32 as the
    tensor holds it (a power that underflows to 0 is 0); None for anything else."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        base, exponent = _constant_value(c, node.left), c.values.literal_number(node.right)
        if base is None or exponent is None:
            return None
        try:
            return _as_float32(base ** exponent)
        except (OverflowError, ZeroDivisionError, TypeError):  # a complex root of a negative base is no scale
            return None
    if not isinstance(node, cst.Call):
        return None
    dotted = c.parsed.imported_name(node.func) or ""
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    if dotted == "torch.sqrt" and len(positional) == 1:
        base = _constant_value(c, positional[0])
        return _as_float32(math.sqrt(base)) if base is not None and base >= 0 else None
    if dotted == "torch.tensor" and len(positional) == 1 and not any(a.keyword for a in node.args):
        value = c.values.literal_number(positional[0])
        return _as_float32(float(value)) if value is not None else None
    return None


def _as_float32(value: float | complex) -> float | None:
    return None if isinstance(value, complex) else float32(value)


def _dtype_fact(c: Candidate, shapes: list[Shape]) -> None:
    statement = ("`q * s` has q's dtype (it has the dtype of the original's scaled scores, since q·kᵀ has q's "
                 "dtype and dims; SDPA also needs it to be k's and v's)")
    query, key, value = c.leaf_nodes[0], c.leaf_nodes[1], c.weights.value_node
    v_like_q = roots(c).same(value, query) or roots(c).same(value, key)
    in_place = any(op.inplace for op, _ in c.chain.ops if op.params.get("tensor_factor") is not None)
    if all(most == 0 for _, most in shapes):
        c.match.facts.proved(DTYPE, statement, "a 0-d tensor does not change a float tensor's dtype in type "
                             "promotion")
    elif v_like_q and not c.dtype_changes and not in_place:
        c.match.facts.proved(DTYPE, statement, "the scaled scores reach the value product uncast, and it raises "
                             "unless they have v's dtype, which is q's")
    else:
        wide = [f for (_, f), (_, most) in zip(c.tensor_factors, shapes) if most != 0]
        c.tensor_scale_reads[DTYPE] = wide
        c.match.facts.assumed(DTYPE, statement, f"the dtype of `{short(c.parsed, wide[0])}` is not linked to q's "
                              f"(a wider one would widen the query SDPA gets)")


def _shape(c: Candidate, node: cst.BaseExpression, depth: int = 0) -> Shape:
    """What the source proves of `node`'s last size and rank (the rank bounds' where these rules leave it open);
    UNKNOWN where it does not show them."""
    last, most = _own_shape(c, node, depth)
    return last, most if most is not None or depth > 12 else rank_bounds(c).bounds(node)[1]


def _own_shape(c: Candidate, node: cst.BaseExpression, depth: int) -> Shape:
    if depth > 12:
        return UNKNOWN
    below = lambda child: _shape(c, child, depth + 1)  # noqa: E731
    if c.values.scalar_guess(node) is None:
        return NUMBER
    if isinstance(node, cst.Name):
        values = reaching_values(c, node)
        return _union([below(v) for v in values]) if values else UNKNOWN
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self" \
            and c.owner is not None:
        built = c.owner.only_value(node.attr.value)
        return below(built) if built is not None else UNKNOWN
    if isinstance(node, cst.UnaryOperation):
        return below(node.expression)
    if isinstance(node, cst.BinaryOperation):
        return _broadcast([below(node.left), below(node.right)])
    if isinstance(node, cst.Subscript):
        last_index = node.slice[-1].slice
        _, most = _subscript_bounds(node, (0, below(node.value)[1]))
        none_last = isinstance(last_index, cst.Index) and isinstance(last_index.value, cst.Name) and \
            last_index.value.value == "None"
        return (1 if none_last else None), most
    if isinstance(node, cst.Call):
        return _call_shape(c, node, below)
    return UNKNOWN


def _call_shape(c: Candidate, node: cst.Call, below) -> Shape:
    dotted = c.parsed.imported_name(node.func) or ""
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    if any(a.star == "*" for a in node.args) or any(a.star for a in node.args) and dotted not in SIZED_TORCH:
        return UNKNOWN  # `**dd` passes a creator keywords only (device, dtype): its sizes stay positional
    if dotted == "torch.tensor" and positional and c.values.is_scalar(positional[0]):
        return NUMBER
    if dotted in SIZED_TORCH and positional:
        sizes = positional[:1] if dotted == "torch.full" else positional
        if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
            sizes = [element.value for element in sizes[0].elements]
        return (int_value(sizes[-1]) if sizes else 1), len(sizes)
    if dotted in WRAPPERS and positional:
        return below(positional[0])
    operands = positional + [a.value for a in node.args if a.keyword is not None and a.keyword.value in
                             SHAPE_KEYWORDS]
    if dotted.startswith("torch.") and dotted.rsplit(".", 1)[-1] in ELEMENTWISE and operands:
        return _broadcast([below(operand) for operand in operands])
    if not isinstance(node.func, cst.Attribute) or dotted.startswith("torch."):
        return UNKNOWN
    method, receiver = node.func.attr.value, node.func.value
    if method in SHAPE_KEEPING:
        return below(receiver)
    if method in ELEMENTWISE:
        return _broadcast([below(receiver)] + [below(operand) for operand in operands])
    if method in ("view", "reshape") and positional:
        sizes = positional
        if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
            sizes = [element.value for element in sizes[0].elements]
        last = int_value(sizes[-1]) if sizes else 1
        return (None if last == -1 else last), len(sizes)
    if method == "unsqueeze" and len(positional) == 1 and int_value(positional[0]) == -1:
        most = below(receiver)[1]
        return 1, None if most is None else most + 1
    if method in REDUCTIONS and _keeps_last(node):
        return 1, below(receiver)[1]
    return UNKNOWN


def _keeps_last(call: cst.Call) -> bool:
    """`x.sum(-1, keepdim=True)`, `x.norm(dim=-1, keepdim=True)`: the last axis reduced to size 1."""
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    positional = [a.value for a in call.args if a.keyword is None]
    dim = keywords.get("dim", positional[0] if positional and call.func.attr.value != "norm" else
                       positional[1] if len(positional) > 1 else None)
    keep = keywords.get("keepdim")
    return int_value(dim) == -1 and isinstance(keep, cst.Name) and keep.value == "True"


def _broadcast(shapes: list[Shape]) -> Shape:
    lasts = {last for last, _ in shapes}
    mosts = [most for _, most in shapes]
    sized = lasts - {1}
    last = None if None in lasts else (sized.pop() if len(sized) == 1 else 1 if not sized else None)
    return last, None if None in mosts else max(mosts)


def _union(shapes: list[Shape]) -> Shape:
    """One of several values: a last size all of them share, and the most dims of any."""
    lasts = {last for last, _ in shapes}
    mosts = [most for _, most in shapes]
    return (lasts.pop() if len(lasts) == 1 else None), None if None in mosts else max(mosts)


def _movable(c: Candidate, node: cst.BaseExpression) -> bool:
    """Reads, numbers, arithmetic and pure torch calls (elementwise, shape-keeping, views, tensors of numbers):
    evaluating it at the SDPA call instead runs no user code and draws no random numbers."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Attribute):
        return _movable(c, node.value)
    if isinstance(node, cst.UnaryOperation):
        return _movable(c, node.expression)
    if isinstance(node, cst.BinaryOperation):
        return _movable(c, node.left) and _movable(c, node.right)
    if isinstance(node, cst.Subscript):
        return _movable(c, node.value) and all(isinstance(e.slice, cst.Index) and _movable(c, e.slice.value)
                                               or isinstance(e.slice, cst.Slice) for e in node.slice)
    if isinstance(node, cst.Call):
        dotted = c.parsed.imported_name(node.func) or ""
        name = dotted.rsplit(".", 1)[-1] if dotted.startswith(("torch.", "math.")) else None
        pure = name in ELEMENTWISE | {"tensor", "sqrt", "log", "exp"} if name else \
            isinstance(node.func, cst.Attribute) and node.func.attr.value in \
            ELEMENTWISE | SHAPE_KEEPING | REDUCTIONS | {"view", "reshape", "unsqueeze"} and _movable(c, node.func.value)
        return bool(pure) and all(_movable(c, a.value) for a in node.args if not a.star)
    return False
