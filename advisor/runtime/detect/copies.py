"""Copies that buy nothing: .contiguous() of a contiguous tensor, a layout copy whose users take strides, one
immediately transposed again, one copied again. A copy is kept (no finding) whenever a user needs it, e.g. a
.view() that fails on the strided layout: that is checked by replaying the view chain on a meta tensor."""

from __future__ import annotations

import torch

from advisor.runtime.detect import Detection
from advisor.runtime.detect.ops import COPIES, STRIDED_OK, TRANSPOSES, VIEWS, consumers
from advisor.rules import copies_casts as copy_cast_rules


def detect(op_graph, device: str) -> list[Detection]:
    graph = op_graph.graph
    found = [Detection(copy_cast_rules.ALREADY_CONTIGUOUS.code, call.loc, call.loc.line, frozenset(),
                       f"`.contiguous()` on a tensor that is already contiguous {list(call.self_meta.shape)}: "
                       "it returns its input, remove it", {"shape": list(call.self_meta.shape)})
             for call in op_graph.calls
             if call.name == "contiguous" and call.first_op == call.last_op and call.loc is not None]
    for node in graph.nodes:
        data = graph.nodes[node]
        if data["op"] != "clone" or data["loc"] is None:
            continue
        source, users = data["inputs"][0], consumers(graph, node)
        if not users:
            continue
        user_ops = {graph.nodes[u]["op"] for u in users}
        evidence = {"shape": list(source.shape), "stride": list(source.stride), "bytes": source.nbytes,
                    "users": sorted(user_ops)}
        size = f"{list(source.shape)} ({source.nbytes} bytes)"
        if user_ops <= COPIES:
            found.append(Detection(copy_cast_rules.COPY_COPY.code, data["loc"], data["loc"].line, frozenset({node}),
                                   f"copy of {size} is copied again by {', '.join(sorted(user_ops))}: "
                                   "fold the two into one copy", evidence))
        elif not source.contiguous and user_ops <= TRANSPOSES:
            found.append(Detection(copy_cast_rules.UNDONE.code, data["loc"], data["loc"].line, frozenset({node}),
                                   f"layout copy of {size} is transposed again right away: drop the "
                                   "`.contiguous()` or the transpose", evidence))
        elif not source.contiguous and all(_takes_strides(graph, u, source) for u in users):
            found.append(Detection(copy_cast_rules.STRIDED_OK.code, data["loc"], data["loc"].line, frozenset({node}),
                                   f"`.contiguous()` copy of {size} feeds only ops that accept strided input "
                                   f"({', '.join(sorted(user_ops))}): remove it", evidence))
    return found


def _takes_strides(graph, user: int, layout) -> bool:
    """Would `user` (and the views after it) work on the un-copied tensor? Replays views on a meta tensor."""
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
    return all(_takes_strides(graph, u, _Layout(replayed)) for u in consumers(graph, user))


class _Layout:
    """Shape, stride and dtype of a replayed meta tensor, read like a recorded TensorMeta."""

    def __init__(self, tensor: torch.Tensor):
        self.shape, self.stride, self.dtype = tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype
