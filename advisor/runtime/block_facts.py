"""What each recorded call of a hand-written attention block saw: the facts a rewrite assumes, read off the op graph.

The runtime attention detector (advisor.runtime.detect.attention_graph) finds the block's ops (score product, the ops
to the softmax, the value product); their recorded tensor metadata gives q/k/v dtypes (traced back through the
casts and views on the block's own lines, which the rewrite absorbs), each mask operand's dtype and rank, and
whether a scale factor was a tensor; the recorder's mask tracker (advisor.runtime.masked_rows) gives the fully
masked rows at the softmax.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from advisor.contracts.evidence import BlockCall, MaskSeen
from advisor.runtime.detect.op_kinds import VIEWS, matmul_operands
from advisor.runtime.recorder import TensorMeta

_FILLS = frozenset({"masked_fill", "masked_fill_", "where"})
_ADDS = frozenset({"add", "add_", "sub", "sub_"})
_FACTORS = frozenset({"mul", "mul_", "div", "div_"})
_ABSORBED = VIEWS | {"_to_copy", "clone", "contiguous"}  # casts and layout ops the rewrite takes in with the block


@dataclass(frozen=True)
class BlockOps:
    """One call of a hand-written attention block in the recorded graph: its softmax, the ops from the softmax back
    to the score product (the product last), and those from the softmax to the value product (the product last)."""

    softmax: int
    score_path: list[int]
    value_path: list[int]


def block_call(graph, block: BlockOps) -> BlockCall:
    """What this call of the block saw."""
    qk, av = block.score_path[-1], block.value_path[-1]
    qk_loc, av_loc = graph.nodes[qk]["loc"], graph.nodes[av]["loc"]
    path = os.path.realpath(qk_loc.path)
    end_line = av_loc.line if av_loc is not None and os.path.realpath(av_loc.path) == path else qk_loc.line
    span = (path, min(qk_loc.line, end_line), max(qk_loc.line, end_line))
    query, key = (_entering(graph, qk, index, span) for index in matmul_operands(graph.nodes[qk]["op"]))
    value = _entering(graph, av, _value_operand(graph, block), span)
    masks, tensor_scale = [], False
    chain = [block.softmax, *block.score_path]
    for node, below in zip(chain[1:], chain[2:]):  # each op between the score product and the softmax
        data = graph.nodes[node]
        others = [meta for meta in data["inputs"] if meta is not None and meta.producer != below]
        scores = next((meta for meta in data["inputs"] if meta is not None and meta.producer == below), None)
        if data["op"] in _FILLS:
            condition = data["inputs"][1] if data["op"] != "where" else data["inputs"][0]
            masks.append(MaskSeen("fill", _name(condition), len(condition.shape),
                                  _grew(scores, data["outputs"][0])))
        elif data["op"] in _ADDS:
            masks += [MaskSeen("additive", _name(m), len(m.shape), _grew(scores, data["outputs"][0]))
                      for m in others if _numel(m) > 1]
        elif data["op"] in _FACTORS:
            tensor_scale |= bool(others)
    softmax_input = graph.nodes[block.softmax]["inputs"][0]
    return BlockCall(path, qk_loc.line, end_line, query, key, value, len(softmax_input.shape), tuple(masks),
                     tensor_scale, graph.nodes[block.softmax].get("masked_rows"),
                     _lengths_agree(graph, block, softmax_input), _batches_agree(graph, block))


def _lengths_agree(graph, block: BlockOps, scores: TensorMeta) -> bool | None:
    """Whether v had as many rows as there were keys (the scores' last size); None where the value product is
    not a matmul, or its v is broadcast along them (an einsum broadcasts a single row of v, as a stride of 0)."""
    av = block.value_path[-1]
    if graph.nodes[av]["op"] not in ("matmul", "bmm", "mm"):
        return None
    index = _value_operand(graph, block)
    value = graph.nodes[av]["inputs"][index]
    if value is None or len(value.shape) < 2 or not scores.shape:
        return None
    left, _ = matmul_operands(graph.nodes[av]["op"])
    axis = -1 if index == left else -2
    if value.stride[axis] == 0 and value.shape[axis] > 1:
        return None
    return value.shape[axis] == scores.shape[-1]


def _batches_agree(graph, block: BlockOps) -> bool | None:
    """Whether the products' factors q, k and v had one batch size (their first); None where one is not read."""
    qk, av = block.score_path[-1], block.value_path[-1]
    factors = [graph.nodes[qk]["inputs"][index] for index in matmul_operands(graph.nodes[qk]["op"])] + \
        [graph.nodes[av]["inputs"][_value_operand(graph, block)]]
    if any(meta is None or not meta.shape for meta in factors):
        return None
    return len({meta.shape[0] for meta in factors}) == 1


def _value_operand(graph, block: BlockOps) -> int:
    """The value product's factor that is not the weights: V in W·V, Vᵀ in Vᵀ·Wᵀ (channel-major einsum)."""
    av = block.value_path[-1]
    weights = block.value_path[-2] if len(block.value_path) > 1 else block.softmax
    left, right = matmul_operands(graph.nodes[av]["op"])
    return left if graph.get_edge_data(weights, av)["arg"] == right else right


def _entering(graph, node: int, index: int, span: tuple[str, int, int]) -> str:
    """The dtype of a product's operand before the casts and views of the block's own lines."""
    meta = graph.nodes[node]["inputs"][index]
    while meta.producer is not None:
        data = graph.nodes[meta.producer]
        loc = data["loc"]
        inside = loc is not None and os.path.realpath(loc.path) == span[0] and span[1] <= loc.line <= span[2]
        if data["op"] not in _ABSORBED or not inside or data["inputs"][0] is None:
            break
        meta = data["inputs"][0]
    return _name(meta)


def _grew(scores: TensorMeta | None, out: TensorMeta) -> bool:
    return scores is None or tuple(scores.shape) != tuple(out.shape)


def _numel(meta: TensorMeta) -> int:
    count = 1
    for size in meta.shape:
        count *= size
    return count


def _name(meta: TensorMeta) -> str:
    return str(meta.dtype).replace("torch.", "")
