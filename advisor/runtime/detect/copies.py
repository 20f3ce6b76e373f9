"""The layout copies of a recorded step, with what reads them, for the copy rules (advisor.rules.copies_casts).
Whether a reader takes the un-copied (strided) tensor is checked by replaying its view chain on a meta tensor, so a
copy that a later `.view()` needs is never called useless."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.runtime.detect.op_kinds import STRIDED_OK, VIEWS, consumers


@dataclass(frozen=True)
class LayoutCopy:
    """One recorded clone (what `.contiguous()` of a strided tensor dispatches) that something reads."""

    node: int
    loc: object  # advisor.runtime.frames.Location
    source: object  # the input's recorded TensorMeta
    users: tuple[int, ...]
    user_ops: frozenset[str]

    @property
    def size(self) -> str:
        return f"{list(self.source.shape)} ({self.source.nbytes} bytes)"

    @property
    def evidence(self) -> dict:
        return {"shape": list(self.source.shape), "stride": list(self.source.stride), "bytes": self.source.nbytes,
                "users": sorted(self.user_ops)}


def layout_copies(graph) -> Iterator[LayoutCopy]:
    """Every clone with a source location and at least one reader, in recorded order."""
    for node in graph.nodes:
        data = graph.nodes[node]
        if data["op"] != "clone" or data["loc"] is None:
            continue
        users = consumers(graph, node)
        if users:
            yield LayoutCopy(node, data["loc"], data["inputs"][0], tuple(users),
                             frozenset(graph.nodes[u]["op"] for u in users))


def takes_strides(graph, user: int, layout) -> bool:
    """Would `user` (and the views after it) work on the un-copied tensor? Replays views on a meta tensor."""
    import torch

    data = graph.nodes[user]
    if data["op"] in STRIDED_OK:
        return True
    if data["op"] not in VIEWS:
        return False
    meta = torch.empty_strided(layout.shape, layout.stride, dtype=layout.dtype, device="meta")
    overload = getattr(getattr(torch.ops.aten, data["op"]), data["overload"])
    try:
        replayed = overload(meta, *data["args"][1:], **data["kwargs"])
    except (RuntimeError, TypeError, IndexError):
        return False
    if not isinstance(replayed, torch.Tensor):  # split/unbind: several outputs, keep it simple and keep the copy
        return False
    return all(takes_strides(graph, u, _Layout(replayed)) for u in consumers(graph, user))


class _Layout:
    """Shape, stride and dtype of a replayed meta tensor, read like a recorded TensorMeta."""

    def __init__(self, tensor):
        self.shape, self.stride, self.dtype = tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype
