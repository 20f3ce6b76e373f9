"""The dtype casts of a recorded step, with what reads them, for the cast rules (advisor.rules.copies_casts). A
cast straight back to its input's dtype pairs with it as one round trip: the back cast is not a cast of its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.runtime.detect.op_kinds import consumers

CAST_CALLS = frozenset({"to", "float", "half", "bfloat16", "double", "type_as"})


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class DtypeChange:
    """One recorded `_to_copy` that changed the dtype, its readers (through views), and whether every reader casts
    straight back (a round trip; only for a cast of an activation, not of a parameter or buffer)."""

    node: int
    loc: object  # advisor.runtime.frames.Location
    source: object  # TensorMeta of the input
    result: object  # TensorMeta of the output
    users: tuple[int, ...]
    user_ops: frozenset[str]
    round_trip: bool

    @property
    def change(self) -> str:
        return f"{dtype_name(self.source.dtype)}->{dtype_name(self.result.dtype)}"

    @property
    def evidence(self) -> dict:
        return {"from": dtype_name(self.source.dtype), "to": dtype_name(self.result.dtype),
                "shape": list(self.source.shape), "bytes": self.result.nbytes}


def dtype_changes(graph) -> Iterator[DtypeChange]:
    """Every dtype-changing cast with a source location, in recorded order, except the back half of a round trip."""
    paired = set()
    for node in graph.nodes:
        data = graph.nodes[node]
        if data["op"] != "_to_copy" or data["loc"] is None or node in paired:
            continue
        source, result = data["inputs"][0], data["outputs"][0]
        if source.dtype == result.dtype:
            continue
        users = consumers(graph, node, through_views=True)
        round_trip = source.param is None and bool(users) and all(_casts_to(graph, u, source.dtype) for u in users)
        if round_trip:
            paired.update(users)
        yield DtypeChange(node, data["loc"], source, result, tuple(users),
                          frozenset(graph.nodes[u]["op"] for u in users), round_trip)


def _casts_to(graph, user: int, dtype) -> bool:
    data = graph.nodes[user]
    return data["op"] == "_to_copy" and data["outputs"][0].dtype == dtype
