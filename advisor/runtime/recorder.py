"""Record one step's aten ops (dtypes, shapes, strides, storage, first user frame) as a networkx tensor-flow graph.

A TorchDispatchMode sees every op that reaches a kernel; a TorchFunctionMode alongside it sees the calls that
dispatch nothing (`.contiguous()` on a contiguous tensor, `.float()` on a float) and which SDPA kernel a call
chose. Only one step is recorded, so the graph's memory is bounded however long the workload runs; tensors are
tracked through weak references, so recording never keeps an activation alive.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from advisor.runtime.frames import Location, first_user_frame
from advisor.runtime.masked_rows import MaskedRows

MAX_OPS = 200_000
_WATCHED_CALLS = frozenset({"contiguous", "to", "float", "half", "bfloat16", "double", "type_as",
                            "scaled_dot_product_attention", "softmax"})  # softmax: the cast its dtype= dispatches
_CAST_METHODS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}


@dataclass(frozen=True)
class TensorMeta:
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    contiguous: bool
    storage: int
    offset: int
    producer: int | None  # node that produced this tensor object, None for inputs, parameters, constants
    param: str | None  # parameter or buffer name when the storage is one of the model's

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * self.dtype.itemsize


@dataclass
class Call:
    """A watched Python-level call and the recorded ops [first_op, last_op) it dispatched."""

    name: str
    loc: Location | None
    first_op: int
    last_op: int
    self_meta: TensorMeta | None
    inputs: list[TensorMeta | None]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpGraph:
    graph: nx.DiGraph
    calls: list[Call]
    truncated: bool

    def op(self, node: int) -> dict:
        return self.graph.nodes[node]


class _Modes:
    def __init__(self, params: dict[int, str]):
        self.graph = nx.DiGraph()
        self.calls: list[Call] = []
        self.params = params
        self.producers = WeakIdKeyDictionary()
        self.rows = MaskedRows()
        self.truncated = False

    def meta(self, tensor: torch.Tensor) -> TensorMeta:
        try:
            storage = tensor.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
            storage = 0
        return TensorMeta(tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.is_contiguous(),
                          storage, tensor.storage_offset(), self.producers.get(tensor), self.params.get(storage))

    def record_op(self, func, args, kwargs, out) -> None:
        node = self.graph.number_of_nodes()
        if node >= MAX_OPS:
            self.truncated = True
            return
        flat_in, _ = tree_flatten((args, kwargs))
        inputs = [self.meta(a) if isinstance(a, torch.Tensor) else None for a in flat_in]
        flat_out, _ = tree_flatten(out)
        outputs = [self.meta(t) for t in flat_out if isinstance(t, torch.Tensor)]
        schema = func._schema
        name = schema.name.split("::")[-1]
        self.graph.add_node(node, op=name, overload=func._overloadname, loc=first_user_frame(
            sys._getframe(2)), inputs=inputs, outputs=outputs, args=_strip_tensors(args),
            kwargs=_strip_tensors(kwargs), mutable=schema.is_mutable)
        rows = self.rows.on_op(name, func, args, kwargs, out, self.params)
        if rows is not None:
            self.graph.nodes[node]["masked_rows"] = rows.fully_masked  # at a softmax; None when unknown
        for index, meta in enumerate(inputs):
            if meta is not None and meta.producer is not None:
                self.graph.add_edge(meta.producer, node, arg=index)
        for tensor in flat_out:
            if isinstance(tensor, torch.Tensor):
                self.producers[tensor] = node


def _strip_tensors(value):
    """Arguments without their tensors (replaced by None): enough to read options and to replay a view op."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(_strip_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: _strip_tensors(v) for k, v in value.items()}
    return value


class _Dispatch(TorchDispatchMode):
    def __init__(self, modes: _Modes):
        super().__init__()
        self.modes = modes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.modes.record_op(func, args, kwargs, out)
        return out


class _Function(TorchFunctionMode):
    def __init__(self, modes: _Modes):
        super().__init__()
        self.modes = modes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in _WATCHED_CALLS or not args or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)
        modes = self.modes
        first = modes.graph.number_of_nodes()
        self_meta = modes.meta(args[0])
        inputs = [modes.meta(a) if isinstance(a, torch.Tensor) else None for a in args]
        out = func(*args, **kwargs)
        modes.calls.append(Call(name, first_user_frame(sys._getframe(1)), first, modes.graph.number_of_nodes(),
                                self_meta, inputs, _options(name, args, kwargs)))
        return out


def _options(name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """What each watched call asked for: the target dtype of a cast, the SDPA arguments that pick a kernel."""
    if name in _CAST_METHODS:
        return {"dtype": _CAST_METHODS[name]}
    if name == "type_as":
        return {"dtype": args[1].dtype}
    if name == "to":
        dtype = kwargs.get("dtype")
        for arg in args[1:]:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, torch.Tensor):
                dtype = arg.dtype
        return {"dtype": dtype}
    if name == "contiguous":
        return {"memory_format": args[1] if len(args) > 1 else kwargs.get("memory_format", torch.contiguous_format)}
    if name == "scaled_dot_product_attention":
        names = ("attn_mask", "dropout_p", "is_causal", "scale")
        values = dict(zip(names, args[3:]))
        values.update({k: kwargs[k] for k in names + ("enable_gqa",) if k in kwargs})
        mask = values.get("attn_mask")
        return {"has_mask": mask is not None, "mask_dtype": str(mask.dtype) if mask is not None else None,
                "dropout_p": float(values.get("dropout_p", 0.0) or 0.0), "is_causal": bool(values.get("is_causal")),
                "scale": values.get("scale"), "enable_gqa": bool(values.get("enable_gqa", False))}
    return {}


class OpRecorder:
    """Context manager: `with recorder: model(...)`; then `recorder.result()` is the step's OpGraph."""

    def __init__(self, model: Any = None):
        params: dict[int, str] = {}
        if isinstance(model, torch.nn.Module):
            for prefix, tensors in (("", model.named_parameters()), ("", model.named_buffers())):
                for name, tensor in tensors:
                    params[tensor.untyped_storage().data_ptr()] = prefix + name
        self._modes = _Modes(params)
        self._stack = (_Function(self._modes), _Dispatch(self._modes))

    def __enter__(self):
        for mode in self._stack:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._stack):
            mode.__exit__(*exc)
        return False

    def result(self) -> OpGraph:
        return OpGraph(self._modes.graph, self._modes.calls, self._modes.truncated)
