"""Which model a piece of code runs, and on what: its outermost nn.Module calls, recorded while it runs.

A script or a notebook cell names no model; its outermost module call does. While recording, nn.Module.__call__ is
wrapped (in this process only): a call made while no other module call is running is outermost, and its module and
a copy of its inputs are kept. A global forward pre-hook sees the module but not keyword arguments (which models
such as `GPT(idx, targets=None)` take), and nesting needs a matching exit even when forward raises; the wrapper has
both.

    with advisor.capture() as captured:
        model(x)
    captured.workload()  # the model and the inputs of its first call, as a TARGET function would return them
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from advisor.errors import AdvisorError
from advisor.runtime.autocast_state import Autocast, recorded
from advisor.workload import Workload


class EnoughCalls(BaseException):
    """Raised from the wrapper once the model's calls are recorded: a BaseException, so the user code's own
    `except Exception` does not swallow it and nothing after that call runs. A bare `except:` may: then every later
    outermost module call raises it again without running (`capture.stopped`, `capture.stop_reached_the_end`)."""


@dataclass
class Call:
    args: tuple
    kwargs: dict
    autocast: Autocast = ()  # the autocast regions the call ran in


@dataclass
class Captured:
    """The outermost modules called, in order of their first call, with the inputs of each call."""

    modules: list[torch.nn.Module] = field(default_factory=list)
    calls: dict[int, list[Call]] = field(default_factory=dict)  # id(module) -> its recorded calls

    def model(self) -> tuple[torch.nn.Module, list[Call]]:
        """The one model called: the outermost module that owns parameters (losses and activations called at the
        top level own none). None called, or several unrelated ones, is an AdvisorError naming them."""
        if not self.modules:
            raise AdvisorError("no nn.Module was called")
        owners = [m for m in self.modules if _owns_parameters(m)] or self.modules
        if len(owners) > 1:
            named = ", ".join(f"{type(m).__name__} ({len(self.calls[id(m)])} call(s))" for m in owners)
            raise AdvisorError(f"several unrelated models were called at the top level: {named}; advisor measures "
                               "one model per run: call only that one, or write a TARGET function that returns it")
        return owners[0], self.calls[id(owners[0])]

    def workload(self, steps: int = 5) -> Workload:
        """The model with the inputs of its first recorded call, on the device of its parameters, under the
        autocast regions that call ran in."""
        model, calls = self.model()
        parameter = next(iter(model.parameters()), None)
        device = str(parameter.device) if parameter is not None else None
        return Workload(model=model, args=calls[0].args, kwargs=calls[0].kwargs, device=device, steps=steps,
                        autocast=calls[0].autocast)


class capture:  # noqa: N801 - used as `with advisor.capture():`, like torch.no_grad
    """Record the outermost nn.Module calls made inside the block; with `limit`, stop the block (EnoughCalls) at
    the model's `limit`-th call, before it runs: a script or loop needs to run no further."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.captured = Captured()
        self.stopped = False  # the limit was reached and EnoughCalls raised
        self.stop_reached_the_end = False  # it left the block (no code of the block caught it)
        self._local = threading.local()
        self._original = None

    def __enter__(self) -> Captured:
        self._original = original = torch.nn.Module.__call__
        recorder = self

        def recorded_call(module, *args, **kwargs):
            depth = getattr(recorder._local, "depth", 0)
            if depth == 0:
                recorder._record(module, args, kwargs)
            recorder._local.depth = depth + 1
            try:
                return original(module, *args, **kwargs)
            finally:
                recorder._local.depth = depth

        torch.nn.Module.__call__ = recorded_call
        return self.captured

    def __exit__(self, kind, value, traceback) -> bool:
        torch.nn.Module.__call__ = self._original
        self.stop_reached_the_end = kind is EnoughCalls
        return kind is EnoughCalls  # the block stopped because it had run far enough

    def _record(self, module, args, kwargs) -> None:
        if self.stopped:  # the block caught the stop and calls a module again: it runs no further model code
            raise EnoughCalls
        captured = self.captured
        calls = captured.calls.get(id(module))
        if calls is None:
            captured.modules.append(module)
            calls = captured.calls[id(module)] = []
        calls.append(Call(_copy(args), _copy(kwargs), recorded()))
        if self.limit is not None and len(calls) >= self.limit and _owns_parameters(module):
            self.stopped = True
            raise EnoughCalls


def _owns_parameters(module) -> bool:
    return next(iter(module.parameters()), None) is not None


def _copy(value):
    """Tensors detached and cloned (the caller may overwrite them in place after the call), containers rebuilt.
    Cloned outside inference mode: a call made under torch.inference_mode() must still give inputs that --train
    and the recorded forward can use."""
    if isinstance(value, torch.Tensor):
        with torch.inference_mode(False):
            return value.detach().clone()
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value
