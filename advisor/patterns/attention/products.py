"""The Q·K^T product: which operand is the query and which the key, and in what layout SDPA gets them.

matmul/bmm/baddbmm take K transposed: a provable last-two-dims transpose is undone, anything else is transposed
back explicitly (a view, always exact). baddbmm's alpha joins the scale and its input the masks. An einsum's spec
is read into axis roles and the operands permuted into SDPA's (..., L, E) layout. Scale factors written on the
operands (`(q * s) @ k`) are stripped into the scale. The rank the source states, when it does, proves the
softmax and transpose dims.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import einsum as es
from advisor.patterns.attention.candidate import Candidate
from advisor.patterns.attention.rendering import at_home, short
from advisor.patterns.attention.result import MaskTerm, Refusal
from advisor.patterns.attention.scores import tensor_and_factor
from advisor.patterns.copy_cast_roles import cast_dtype
from advisor.patterns.ops import CAST_METHODS, Op, int_value
from advisor.static.dataflow import Definition
from advisor.static.walk import descendants

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def core_roles(c: Candidate, core: Op) -> int | None:
    """Fill in the match's query and key (and baddbmm's terms); returns the scores' rank when known."""
    if core.name == "einsum":
        return _einsum_roles(c, core)
    left, right = core.operands
    q_leaf, q_factors = strip_factors(c, left)
    k_leaf, k_factors = strip_factors(c, right)
    c.factors = q_factors + k_factors
    ndim = 3 if core.name in ("bmm", "baddbmm") else (rank(c, q_leaf) or rank(c, k_leaf))

    def placed(strip: bool):
        query, q_cast = _uncast(c, q_leaf, strip)
        key, k_operand, k_cast = _key_from_transposed(c, k_leaf, ndim, strip)
        return at_home(c, query), key, query, k_operand, [op for op in (q_cast, k_cast) if op is not None]

    _place_operands(c, placed)
    if core.name == "baddbmm":
        _baddbmm_terms(c, core)
    return ndim


def _place_operands(c: Candidate, placed) -> None:
    """SDPA's query and key, `placed(strip)` giving (query, key, q operand, k operand, casts stripped). Float casts
    on the operands (`q.float() @ k.float().mT`) are casts of the scores: they go with the block (the precision
    fact judges them) and SDPA gets the operands uncast, or it would get a q and k of another dtype than the v the
    original multiplies by the weights cast back. Casts to two dtypes stay (the original raises on every input, and
so does SDPA). Recorded in `product_casts`: the product then no longer ties
    q's dtype to k's (see `tensor_facts._qkv_dtype_fact`). Where v is cast alike, the operands as written are kept
    (`keep_casts_with_value`)."""
    query, key, q_operand, k_operand, casts = placed(True)
    if casts and (has_cast(q_operand) or has_cast(k_operand) or  # `q.float() @ (k.float() * s).mT`: one kept
                  len({cast_dtype(c.parsed, op.node) for op in casts}) > 1):  # `q.float() @ k.double().mT` raises
        query, key, q_operand, k_operand, casts = *placed(False)[:4], []
    c.match.query, c.match.key, c.leaf_nodes = query, key, [q_operand, k_operand]
    c.product_casts = casts
    c.dtype_changes.extend(casts)
    c.operands_as_written = placed(False)[:4] if casts else None


def keep_casts_with_value(c: Candidate) -> None:
    """`softmax(q.float() @ k.float().mT) @ v.float()`: q, k and v all cast to one float dtype compute in it in
    SDPA as in the original, whatever the inputs' dtypes (no guard): the operands keep their casts."""
    target = cast_dtype(c.parsed, c.weights.value_node)
    if c.operands_as_written is None or len(c.product_casts) != 2 or \
            any(cast_dtype(c.parsed, op.node) != target for op in c.product_casts):
        return
    c.match.query, c.match.key, c.leaf_nodes[0], c.leaf_nodes[1] = c.operands_as_written
    c.dtype_changes = [op for op in c.dtype_changes if op not in c.product_casts]
    c.product_casts = []


def _baddbmm_terms(c: Candidate, core: Op) -> None:
    alpha, beta = core.params["alpha"], core.params["beta"]
    if alpha is not None:
        if not c.values.is_scalar(alpha):
            raise Refusal("baddbmm's alpha is not provably a Python number")
        c.factors.append(("mul", alpha))
    beta_value = None if beta is None else c.values.literal_number(beta)
    if beta is not None and beta_value == 0:
        return
    if beta is not None and beta_value != 1:
        raise Refusal("baddbmm's beta is neither 0 nor 1")
    bias = core.params["input"]
    c.match.masks.append(MaskTerm("float", at_home(c, bias), nodes=[bias], source=bias, same_dtype=True))


def strip_factors(c: Candidate, node: cst.BaseExpression):
    factors = []
    while True:
        op = c.reader.read(node)
        if op is None or op.name not in ("mul", "div") or op.inplace:
            return node, factors
        tensor, factor = tensor_and_factor(c, op)
        if factor is None:
            return node, factors
        factors.append((op.name, factor))
        node = tensor


def has_cast(node: cst.BaseExpression) -> bool:
    """`node` casts somewhere inside (`k.float() * s`, `q.type(torch.float32)`, `torch.Tensor.float(q)`): a
    tensor whose dtype its name does not give."""
    return any(isinstance(call.func, cst.Attribute) and call.func.attr.value in CAST_METHODS
               for call in descendants(node, (cst.Call,)))


def _uncast(c: Candidate, node: cst.BaseExpression, strip: bool) -> tuple[cst.BaseExpression, Op | None]:
    """With `strip`, the operand under a cast to a literal float dtype, and that cast (None: no such cast)."""
    op = c.reader.read(node) if strip else None
    if op is None or op.name != "cast" or cast_dtype(c.parsed, node) not in FLOAT_DTYPES:
        return node, None
    return op.operands[0], op


def _key_from_transposed(c: Candidate, node: cst.BaseExpression, ndim: int | None, strip: bool):
    """SDPA wants K as (..., S, E); the product used K^T. Undo a provable last-two-dims transpose (and, with
    `strip`, a float cast under it, `k.float().mT`), else transpose back explicitly (a view, always exact).
    Returns the key SDPA gets, the tensor it is a view of, and the cast stripped."""
    op = c.reader.read(node)
    operand, steps = node, [("transpose", (-2, -1))]
    if op is not None and op.name == "mT":
        operand, steps = op.operands[0], []
    elif op is not None and op.name == "transpose":
        dims = [int_value(d) for d in op.params["dims"]]
        if None not in dims and last_two(dims, ndim):
            operand, steps = op.operands[0], []
    elif op is not None and op.name == "permute":
        dims = [int_value(d) for d in op.params["dims"]]
        if None not in dims and len(dims) >= 2 and sorted(dims) == list(range(len(dims))):
            order = dims[:-2] + [dims[-1], dims[-2]]
            operand, steps = op.operands[0], es.permutation_steps(order, False)
    leaf, cast = _uncast(c, operand, strip)
    return at_home(c, leaf, steps), leaf, cast


def rank(c: Candidate, node: cst.BaseExpression, depth: int = 0) -> int | None:
    """Rank of a tensor when the source states it (view/reshape/permute/rearrange); else None."""
    if depth > 10:
        return None
    if isinstance(node, cst.Name):
        found = {_rank_of_definition(c, d, depth) for d in c.flow.definitions_of(node)}
        return found.pop() if len(found) == 1 else None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method, args = node.func.attr.value, node.args
        if method in ("view", "reshape") and args and not any(a.star for a in args):
            if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
                return len(args[0].value.elements)
            # one name may hold a whole shape (`x.view(hidden_shape)`, BLIP's): only one size is one dim
            return len(args) if len(args) > 1 or int_value(args[0].value) is not None else None
        if method == "permute" and args:
            return len(args) if len(args) > 1 else None
        if method in ("transpose", "contiguous", "float", "half", "to", "type_as", "clone", "mul", "div"):
            return rank(c, node.func.value, depth + 1)
    if isinstance(node, cst.Call):
        dotted = c.parsed.imported_name(node.func) or ""
        if dotted.endswith("rearrange") and len(node.args) >= 2 and \
                isinstance(node.args[1].value, cst.SimpleString):
            return _einops_rank(node.args[1].value.evaluated_value)
    return None


def _rank_of_definition(c: Candidate, definition: Definition, depth: int) -> int | None:
    if definition.kind != "assign":
        return None
    value = definition.value
    if definition.index is None:
        return rank(c, value, depth + 1)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
            value.func.attr.value in ("chunk", "split", "unbind"):
        base = rank(c, value.func.value, depth + 1)
        return base - 1 if base and value.func.attr.value == "unbind" else base
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "map" \
            and value.args and isinstance(value.args[0].value, cst.Lambda):
        return rank(c, value.args[0].value.body, depth + 1)
    base = rank(c, value, depth + 1)  # `q, k, v = t.permute(2, 0, 3, 1, 4)`: unpacking iterates the first dim
    return base - 1 if base else None


def _einsum_roles(c: Candidate, core: Op) -> int:
    query, key = core.operands
    try:
        (q_axes, k_axes), out_axes = spec(c, core)
        if len(out_axes) >= 2 and out_axes[-2] in k_axes and out_axes[-1] in q_axes:
            (q_axes, k_axes), (query, key) = (k_axes, q_axes), (key, query)  # 'bhjd,bhid->bhij', k, q
        layout = es.score_layout(q_axes, k_axes, out_axes)
    except es.EinsumMismatch as exc:
        raise Refusal(f"the Q·K^T einsum is not plain attention: {exc}") from None
    c.layout = layout
    c.has_ellipsis = es.ELLIPSIS in out_axes
    q_leaf, q_factors = strip_factors(c, query)
    k_leaf, k_factors = strip_factors(c, key)
    c.factors = q_factors + k_factors
    q_steps = es.permutation_steps(layout.q_order, c.has_ellipsis)
    k_steps = es.permutation_steps(layout.k_order, c.has_ellipsis)
    if q_steps is None or k_steps is None:
        raise Refusal("the einsum moves an ellipsis axis")
    k_steps += es.broadcast_steps(layout.k_unsqueeze)

    def placed(strip: bool):
        (query, q_cast), (key, k_cast) = (_uncast(c, leaf, strip) for leaf in (q_leaf, k_leaf))
        return at_home(c, query, q_steps), at_home(c, key, k_steps), query, key, \
            [op for op in (q_cast, k_cast) if op is not None]

    _place_operands(c, placed)
    return None if c.has_ellipsis else layout.ndim


def spec(c: Candidate, op: Op):
    """An einsum's (input axes, output axes), for a two-operand einsum with a literal spec."""
    if op.params["spec"] is None:
        op.params["spec"] = c.values.constant_string(op.params["spec_node"])
    if op.params["spec"] is None:
        raise Refusal(f"the einsum spec `{short(c.parsed, op.params['spec_node'])}` is not a literal (an f-string "
                      f"with placeholders), so its axes cannot be read")
    inputs, output = es.parse_spec(op.params["spec"], op.params["einops"])
    if len(inputs) != 2:
        raise es.EinsumMismatch("the einsum does not take two operands")
    return inputs, output


def check_softmax_dim(c: Candidate, softmax: Op, ndim: int | None) -> None:
    if softmax.name == "sequential":
        softmax = softmax.params["stages"][0]
    dim = int_value(softmax.params.get("dim"))
    if softmax.params.get("dim") is None:
        raise Refusal("softmax has no explicit dim, so the key dimension cannot be proved")
    if dim is None:
        raise Refusal(f"softmax's dim `{short(c.parsed, softmax.params['dim'])}` is not a literal")
    if dim != -1 and not (ndim is not None and dim == ndim - 1):
        raise Refusal(f"softmax runs over dim {dim}, which is not provably the key dimension")


def last_two(dims: list[int], ndim: int | None) -> bool:
    """The two dims are the last two of a tensor of rank `ndim` (negative dims need no rank)."""
    if sorted(dims) == [-2, -1]:
        return True
    if ndim is None:
        return False
    return sorted(d % ndim for d in dims) == [ndim - 2, ndim - 1]


def _einops_rank(pattern: str) -> int | None:
    if "->" not in pattern:
        return None
    right = pattern.split("->")[1]
    depth, count, token = 0, 0, False
    for char in right:
        if char == "(":
            depth += 1
            if depth == 1:
                count += 1
        elif char == ")":
            depth -= 1
        elif depth == 0:
            if char.isspace():
                token = False
            elif not token:
                token = True
                count += 1
        if char in "()":
            token = False
    return count
