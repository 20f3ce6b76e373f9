"""Masks rebuilt on every forward: an S x S tensor computed only from factories (ones/full/arange) and
tril/triu/comparisons, i.e. from nothing the inputs change, that then meets the model's data."""

from __future__ import annotations

from advisor.contracts.detection import Detection
from advisor.contracts.rule import Rule
from advisor.runtime.detect.op_kinds import FACTORIES, in_sdpa_call

_RANDOM = frozenset({"bernoulli_", "bernoulli", "rand", "randn", "rand_like", "randn_like", "normal_", "uniform_",
                     "native_dropout", "randint"})


def detect(op_graph, device: str, rule: Rule) -> list[Detection]:
    graph = op_graph.graph
    constant: set[int] = set()
    for node in sorted(graph.nodes):  # node ids are in execution order, so producers come first
        data = graph.nodes[node]
        tensors = [m for m in data["inputs"] if m is not None]
        if data["op"] in _RANDOM or in_sdpa_call(op_graph, node):
            continue  # a dropout mask is new every step by design; SDPA's internals are not the user's mask
        if data["op"] in FACTORIES or (tensors and all(m.producer in constant for m in tensors)):
            constant.add(node)
    found = []
    for node in sorted(constant):
        out = graph.nodes[node]["outputs"]
        if not out or len(out[0].shape) < 2 or out[0].shape[-1] != out[0].shape[-2] or out[0].shape[-1] < 2:
            continue
        if not any(user not in constant for user in graph.successors(node)):
            continue  # not where the mask meets the data yet
        region = _constant_ancestors(graph, node, constant)
        first = min((n for n in region if graph.nodes[n]["loc"] is not None), default=node)
        start = graph.nodes[first]["loc"]
        if start is None:
            continue
        # The span stays inside the function that starts building the mask.
        lines = [graph.nodes[n]["loc"].line for n in region if graph.nodes[n]["loc"] is not None
                 and (graph.nodes[n]["loc"].path, graph.nodes[n]["loc"].function) == (start.path, start.function)]
        size = out[0].shape[-1]
        found.append(Detection(
            rule.code, start, max(lines, default=start.line), frozenset(region),
            f"{size}x{size} mask rebuilt on every forward ({', '.join(sorted({graph.nodes[n]['op'] for n in region}))}):"
            " build it once in __init__ (register_buffer) and slice it, or pass is_causal=True to SDPA",
            {"shape": list(out[0].shape), "dtype": str(out[0].dtype).replace("torch.", ""), "bytes": out[0].nbytes}))
    return found


def _constant_ancestors(graph, node: int, constant: set[int]) -> set[int]:
    region, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in region:
            continue
        region.add(current)
        stack.extend(p for p in graph.predecessors(current) if p in constant)
    return region
