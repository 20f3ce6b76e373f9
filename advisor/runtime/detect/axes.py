"""Where one dimension of a recorded tensor goes through layout and elementwise ops.

The value matmul must contract the attention weights over their softmax axis; einsum and channel-major code
reach it through permutes, views and the transposed product (Vᵀ·Wᵀ), so the axis is followed op by op.
"""

from __future__ import annotations

from math import prod

# Ops that regroup dimensions in row-major order: the axis is the output dim with the same prefix and size.
_REGROUPS = frozenset({"view", "_unsafe_view", "_reshape_alias", "unsqueeze", "squeeze", "flatten", "unflatten"})


def follow_axis(op: dict, arg: int, axis: int) -> int | None:
    """The output dim of `op` that carries dim `axis` of its input number `arg`; None when it is merged or dropped."""
    source, out = op["inputs"][arg], op["outputs"][0] if op["outputs"] else None
    if source is None or out is None:
        return None
    shape, out_shape, args, name = source.shape, out.shape, op["args"], op["op"]
    axis = normalise(axis, len(shape))
    if name in ("transpose", "t"):
        first, second = (args[1], args[2]) if name == "transpose" else (0, 1)
        swap = {normalise(first, len(shape)): normalise(second, len(shape))}
        swap.update({v: k for k, v in swap.items()})
        return swap.get(axis, axis)
    if name == "permute":
        order = [normalise(d, len(shape)) for d in args[1]]
        return order.index(axis)
    if name == "select":
        dim = normalise(args[1], len(shape))
        return None if dim == axis else axis - (dim < axis)
    if name in _REGROUPS:
        return _regrouped(shape, out_shape, axis)
    lead = len(out_shape) - len(shape)  # expand and broadcasting elementwise ops add leading dims
    if lead < 0 or out_shape[axis + lead] != shape[axis]:
        return None
    return axis + lead


def normalise(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _regrouped(shape, out_shape, axis: int) -> int | None:
    before, size = prod(shape[:axis]), shape[axis]
    for dim, out_size in enumerate(out_shape):
        if out_size == size and prod(out_shape[:dim]) == before:
            return dim
    return None
