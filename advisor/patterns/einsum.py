"""Einsum specs as roles: which axis is batch, query, key, head-dim; what permutation puts an operand in SDPA order.

`torch.einsum('bhid,bhjd->bhij', q, k)`, `einops.einsum(q, k, 'b h i d, b h j d -> b h i j')` and a
channel-major `'bhdi,bhdj->bhij'` all state the same product. Axis names are arbitrary; only their positions
in the operands and the output carry meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.static.codegen import MethodStep

ELLIPSIS = "..."


class EinsumMismatch(ValueError):
    """The spec is not the product the caller asked about; the message says why."""


def parse_spec(spec: str | None, einops_style: bool) -> tuple[list[list[str]], list[str]]:
    """Split 'ab,cd->e' (torch: one letter per axis) or 'a b, c d -> e' (einops: space-separated words)."""
    if not isinstance(spec, str):
        raise EinsumMismatch("the spec is not a literal string (an f-string or a computed value)")
    if "->" not in spec:
        raise EinsumMismatch("the einsum has no explicit output")
    left, right = spec.split("->")
    inputs = [_axes(part, einops_style) for part in left.split(",")]
    return inputs, _axes(right, einops_style)


def _axes(part: str, einops_style: bool) -> list[str]:
    part = part.strip()
    if einops_style:
        if "(" in part:
            raise EinsumMismatch("grouped axes in an einops pattern")
        return part.split()
    axes, rest = [], part.replace(" ", "")
    while rest:
        if rest.startswith(ELLIPSIS):
            axes.append(ELLIPSIS)
            rest = rest[3:]
        else:
            axes.append(rest[0])
            rest = rest[1:]
    return axes


@dataclass
class ScoreLayout:
    """Roles of the Q·K^T einsum: batch axes (in output order), query axis, key axis, contracted axis."""

    batch: list[str]
    query_axis: str
    key_axis: str
    q_order: list[int]  # permutation taking q to (batch..., query, head_dim)
    k_order: list[int]  # permutation taking k to (its batch..., key, head_dim)
    ndim: int
    k_unsqueeze: list[int]  # batch positions K lacks (shared across heads, MQA): broadcast there


def score_layout(q_axes: list[str], k_axes: list[str], out_axes: list[str]) -> ScoreLayout:
    if any(len(axes) != len(set(axes)) for axes in (q_axes, k_axes, out_axes)):
        raise EinsumMismatch("the einsum repeats an axis (a diagonal)")
    if len(out_axes) < 2:
        raise EinsumMismatch("the scores have fewer than two axes")
    query, key, batch = out_axes[-2], out_axes[-1], out_axes[:-2]
    for axes, other in ((q_axes, k_axes), (k_axes, q_axes)):
        if query in axes and key in axes and len(other) == 2:
            raise EinsumMismatch("an einsum of the scores with a (heads, heads) matrix mixes the heads (talking "
                                 "heads), which SDPA cannot express")
    if query not in q_axes or query in k_axes or key not in k_axes or key in q_axes:
        raise EinsumMismatch("the scores are not laid out as (..., query, key)")
    contracted = [a for a in q_axes if a in k_axes and a not in out_axes]
    if len(contracted) != 1:
        raise EinsumMismatch("the einsum is not a product over exactly one head dimension")
    k_batch = [a for a in batch if a in k_axes]
    if any(a not in q_axes for a in batch) or len(q_axes) != len(batch) + 2 or len(k_axes) != len(k_batch) + 2:
        raise EinsumMismatch("Q and K do not share their batch and head axes")
    missing = [i for i, a in enumerate(batch) if a not in k_axes]
    if missing and ELLIPSIS in out_axes:
        raise EinsumMismatch("K lacks a batch axis next to an ellipsis")
    return ScoreLayout(batch, query, key,
                       [q_axes.index(a) for a in batch + [query, contracted[0]]],
                       [k_axes.index(a) for a in k_batch + [key, contracted[0]]], len(out_axes), missing)


@dataclass
class ValueLayout:
    v_order: list[int]  # permutation taking v to (its batch..., key, value_dim)
    out_order: list[int]  # permutation taking SDPA's (batch..., query, value_dim) to the einsum's output
    v_unsqueeze: list[int]  # batch positions V lacks (shared across heads): broadcast there


def value_layout(scores: ScoreLayout, p_axes: list[str], v_axes: list[str], out_axes: list[str]) -> ValueLayout:
    """The weights·V einsum; its axis names may differ from the first einsum's, so map them by position."""
    if len(p_axes) != scores.ndim:
        raise EinsumMismatch("the weights operand has a different rank from the scores")
    roles = dict(zip(p_axes, scores.batch + [scores.query_axis, scores.key_axis]))
    batch = [a for a in p_axes if roles[a] in scores.batch]
    query, key = p_axes[-2], p_axes[-1]
    value_dims = [a for a in v_axes if a not in p_axes]
    v_batch = [a for a in batch if a in v_axes]
    if len(value_dims) != 1 or len(v_axes) != len(v_batch) + 2 or \
            set(v_axes) != set(v_batch) | {key} | set(value_dims):
        raise EinsumMismatch("V is not laid out as (batch..., key, value_dim) up to a permutation")
    missing = [i for i, a in enumerate(batch) if a not in v_axes]
    if missing and ELLIPSIS in out_axes:
        raise EinsumMismatch("V lacks a batch axis next to an ellipsis")
    if len(out_axes) != len(batch) + 2 or set(out_axes) != set(batch) | {query} | set(value_dims):
        raise EinsumMismatch("the output is not (batch..., query, value_dim) up to a permutation")
    if key in out_axes:
        raise EinsumMismatch("the key axis is not summed over")
    sdpa_order = batch + [query, value_dims[0]]
    return ValueLayout([v_axes.index(a) for a in v_batch + [key, value_dims[0]]],
                       [sdpa_order.index(a) for a in out_axes], missing)


def broadcast_steps(positions: list[int]) -> list[MethodStep]:
    """`.unsqueeze(i)` for each batch axis an operand lacks; SDPA broadcasts it like the einsum did."""
    return [("unsqueeze", (i,)) for i in sorted(positions)]


def permutation_steps(order: list[int], has_ellipsis: bool) -> list[MethodStep] | None:
    """The methods that apply `order` to a tensor: none (identity), `.transpose(-2, -1)` or `.permute(...)`; None
    if the order cannot be written (an ellipsis axis that moves)."""
    n = len(order)
    if order == list(range(n)):
        return []
    if order == list(range(n - 2)) + [n - 1, n - 2]:
        return [("transpose", (-2, -1))]
    if has_ellipsis:
        return None
    return [("permute", tuple(order))]
