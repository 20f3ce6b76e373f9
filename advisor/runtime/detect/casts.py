"""Casts that buy nothing: to the dtype the tensor has, round trips A->B->A, a parameter or buffer recast on
every call, and an upcast whose only user is softmax (softmax's dtype= argument does it in one op)."""

from __future__ import annotations

from advisor.runtime.detect import Detection
from advisor.runtime.detect.ops import SOFTMAXES, consumers, in_call
from advisor.rules.copies_casts import PARAM_CAST, ROUND_TRIP, SAME_DTYPE, SOFTMAX_UPCAST

_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "type_as"})


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def detect(op_graph, device: str) -> list[Detection]:
    graph = op_graph.graph
    found = [Detection(SAME_DTYPE.code, call.loc, call.loc.line, frozenset(),
                       f"`.{call.name}(...)` casts to {_name(call.options['dtype'])}, the dtype the tensor already "
                       "has: it does nothing, remove it", {"dtype": _name(call.options["dtype"])})
             for call in op_graph.calls
             if call.name in _CASTS and call.loc is not None and call.first_op == call.last_op
             and call.options.get("dtype") == call.self_meta.dtype]
    paired = set()
    for node in graph.nodes:
        data = graph.nodes[node]
        if data["op"] != "_to_copy" or data["loc"] is None or node in paired:
            continue
        source, result = data["inputs"][0], data["outputs"][0]
        if source.dtype == result.dtype:
            continue
        users = consumers(graph, node, through_views=True)
        user_ops = {graph.nodes[u]["op"] for u in users}
        change = f"{_name(source.dtype)}->{_name(result.dtype)}"
        evidence = {"from": _name(source.dtype), "to": _name(result.dtype), "shape": list(source.shape),
                    "bytes": result.nbytes}
        if source.param is not None:
            found.append(Detection(PARAM_CAST.code, data["loc"], data["loc"].line, frozenset({node}),
                                   f"`{source.param}` is cast {change} on every call: store it in "
                                   f"{_name(result.dtype)} or cast the module once", evidence | {"param": source.param}))
        elif users and all(_casts_back(graph, u, source.dtype) for u in users):
            paired.update(users)
            end = max(graph.nodes[u]["loc"].line for u in users if graph.nodes[u]["loc"] is not None)
            found.append(Detection(ROUND_TRIP.code, data["loc"], end, frozenset({node, *users}),
                                   f"round trip {change}->{_name(source.dtype)} with nothing in between that "
                                   f"needs {_name(result.dtype)}: remove both casts", evidence))
        elif users and user_ops <= SOFTMAXES and result.dtype.itemsize > source.dtype.itemsize \
                and not in_call(op_graph, node, "softmax"):  # softmax(x, dtype=...) casting for itself: the fix
            found.append(Detection(SOFTMAX_UPCAST.code, data["loc"], data["loc"].line, frozenset({node}),
                                   f"upcast {change} only feeds softmax: pass dtype=torch.{_name(result.dtype)} "
                                   "to softmax instead", evidence))
    return found


def _casts_back(graph, user: int, dtype) -> bool:
    data = graph.nodes[user]
    return data["op"] == "_to_copy" and data["outputs"][0].dtype == dtype
