"""Hand-written attention on the runtime graph: a matmul, elementwise scale/mask ops, softmax, matmul with V.

Roles are read from tensor flow, not from names: the score matmul is the one whose output reaches the
softmax through scale/mask/cast ops only, the value matmul is the one the (possibly dropped-out) weights feed and
contract over their softmax axis: W·V, or Vᵀ·Wᵀ as channel-major einsums record it.
line is the Q.K^T op's user line and end_line the weights.V op's, the same span the static rule reports.
"""

from __future__ import annotations

from advisor.contracts.detection import Detection
from advisor.contracts.rule import Rule
from advisor.contracts.evidence import BlockCall
from advisor.runtime.block_facts import BlockOps, block_call
from advisor.runtime.detect.axes import follow_axis, normalise
from advisor.runtime.detect.op_kinds import MATMULS, SOFTMAXES, VIEWS, in_sdpa_call, matmul_operands

# Between scores and softmax (scale, mask, soft-capping, casts); between softmax and the value matmul (dropout).
_SCORE_OPS = VIEWS | {"div", "mul", "add", "sub", "masked_fill", "where", "_to_copy", "clone", "tanh", "clamp",
                      "div_", "mul_", "add_", "sub_", "masked_fill_"}
_WEIGHT_OPS = VIEWS | {"native_dropout", "mul", "div", "div_", "_to_copy", "clone", "masked_fill", "where"}


def blocks(op_graph) -> list[BlockOps]:
    graph = op_graph.graph
    found = []
    for node in graph.nodes:
        if graph.nodes[node]["op"] not in SOFTMAXES or in_sdpa_call(op_graph, node):
            continue
        score_path = _back_to_matmul(graph, node)
        value_path = _forward_to_matmul(graph, node)
        if score_path is not None and value_path is not None and graph.nodes[score_path[-1]]["loc"] is not None:
            found.append(BlockOps(node, score_path, value_path))
    return found


def block_calls(op_graph) -> list[BlockCall]:
    """What every recorded call of every attention block saw (a model's layers call one block many times)."""
    return [block_call(op_graph.graph, block) for block in blocks(op_graph)]


def detect(op_graph, device: str, rule: Rule) -> list[Detection]:
    graph = op_graph.graph
    found = []
    for block in blocks(op_graph):
        node, score_path, value_path = block.softmax, block.score_path, block.value_path
        qk, av = score_path[-1], value_path[-1]
        qk_loc, av_loc = graph.nodes[qk]["loc"], graph.nodes[av]["loc"]
        scores = graph.nodes[node]["inputs"][0]
        block_nodes = set(score_path) | {node} | set(value_path)
        block_nodes |= {p for m in (qk, av) for p in graph.predecessors(m) if graph.nodes[p]["op"] in VIEWS}
        block_nodes |= {s for m in (qk, av) for s in graph.successors(m) if graph.nodes[s]["op"] in VIEWS}
        end_line = av_loc.line if av_loc is not None and av_loc.path == qk_loc.path else qk_loc.line
        shape = list(scores.shape)
        found.append(Detection(
            rule.code, qk_loc, end_line, frozenset(block_nodes),
            f"hand-written attention (scores {shape[-2]}x{shape[-1]}, {scores.nbytes} bytes per call materialised): "
            "use torch.nn.functional.scaled_dot_product_attention (see ADV101)",
            {"score_shape": shape, "score_dtype": str(scores.dtype).replace("torch.", ""),
             "score_bytes": scores.nbytes, "ops": sorted(graph.nodes[n]["op"] for n in block_nodes)},
            per_call={"observed": block_call(graph, block).to_json()}))
    return found


def _back_to_matmul(graph, softmax: int) -> list[int] | None:
    path, node = [], softmax
    while True:
        inputs = [m for m in graph.nodes[node]["inputs"] if m is not None and m.producer is not None]
        if not inputs:
            return None
        producer = max(inputs, key=lambda m: m.nbytes).producer  # follow the score tensor, not the mask
        op = graph.nodes[producer]["op"]
        path.append(producer)
        if op in MATMULS:
            return path
        if op not in _SCORE_OPS:
            return None
        node = producer


def _forward_to_matmul(graph, softmax: int) -> list[int] | None:
    """The first matmul the weights reach with their softmax axis as the contracted one, and the path to it."""
    frontier, seen = [(softmax, _softmax_axis(graph.nodes[softmax]), [])], set()
    while frontier:
        node, axis, path = frontier.pop(0)
        for user in graph.successors(node):
            if user in seen:
                continue
            seen.add(user)
            op, arg = graph.nodes[user], graph.get_edge_data(node, user)["arg"]
            if op["op"] in MATMULS:
                if _contracts(op, arg, axis):
                    return path + [user]
            elif op["op"] in _WEIGHT_OPS:
                user_axis = follow_axis(op, arg, axis)
                if user_axis is not None:
                    frontier.append((user, user_axis, path + [user]))
    return None


def _softmax_axis(op: dict) -> int:
    dim = op["args"][1] if len(op["args"]) > 1 else op["kwargs"]["dim"]
    return normalise(dim, len(op["outputs"][0].shape))


def _contracts(op: dict, arg: int, axis: int) -> bool:
    """Does the matmul sum over `axis` of its input number `arg` (the last dim of A, the second-last of B in A·B)?"""
    left, right = matmul_operands(op["op"])
    ndim = len(op["inputs"][arg].shape)
    return (arg, axis) in ((left, ndim - 1), (right, ndim - 2))
