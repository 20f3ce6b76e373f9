"""Turn a Workload into a callable step on the right device, dtype and mode (eval, or forward+backward)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from advisor.errors import AdvisorError
from advisor.runtime.autocast_state import Autocast, replayed
from advisor.workload import Workload


@dataclass
class PreparedStep:
    model: Any
    forward: Callable[[], Any]  # one forward pass, as the op recorder watches it
    step: Callable[[], Any]  # one full step: forward, or forward + backward with --train
    device: torch.device
    dtype: torch.dtype | None
    sync: Callable[[], None]
    train: bool = False
    autocast: Autocast = ()  # replayed around every forward (the workload's)


def resolve_device(requested: str | None) -> torch.device:
    name = requested or "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise AdvisorError(f"--device {name}: no CUDA GPU is available here (torch.cuda.is_available() is False)")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise AdvisorError(f"--device {name}: {exc}") from exc


def prepare(workload: Workload, device: str | None = None, dtype: str | torch.dtype | None = None,
            train: bool = False) -> PreparedStep:
    """Move model and inputs, set eval/train mode and return the step functions. CLI flags beat the workload's."""
    target_device = resolve_device(device or workload.device)
    target_dtype = _resolve_dtype(dtype if dtype is not None else workload.dtype)
    model = workload.model
    if isinstance(model, torch.nn.Module):
        model.to(device=target_device, dtype=target_dtype) if target_dtype else model.to(target_device)
        model.train(train)
    args = tuple(_move(a, target_device, target_dtype) for a in workload.args)
    kwargs = {k: _move(v, target_device, target_dtype) for k, v in workload.kwargs.items()}
    sync = torch.cuda.synchronize if target_device.type == "cuda" else (lambda: None)

    def forward():
        with replayed(workload.autocast):
            return model(*args, **kwargs)

    if not train:
        def step():
            with torch.inference_mode():
                return forward()

        def recorded_forward():
            # no_grad, not inference_mode: under inference_mode composite ops (matmul, contiguous, SDPA) reach
            # the recorder undecomposed, hiding the kernels they run.
            with torch.no_grad():
                return forward()
    else:
        def step():
            loss = _scalar_loss(forward())
            loss.backward()
            if isinstance(model, torch.nn.Module):
                model.zero_grad(set_to_none=True)
            return loss
        recorded_forward = forward
    return PreparedStep(model, recorded_forward, step, target_device, target_dtype, sync, train,
                        tuple(workload.autocast))


def check_runs(prepared: PreparedStep, target: str) -> None:
    """Run one step outside any instrumentation so a model that fails on its inputs is one clear error."""
    try:
        prepared.step()
        prepared.sync()
    except Exception as exc:  # noqa: BLE001 - user model code
        raise AdvisorError(f"{target}: the model failed on its inputs: {type(exc).__name__}: {exc}") from exc


def _resolve_dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise AdvisorError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    return resolved


def _move(value, device: torch.device, dtype: torch.dtype | None):
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device, dtype) for k, v in value.items()}
    return value


def _scalar_loss(output) -> torch.Tensor:
    """A scalar to backpropagate: the model's own `.loss` when it has one, else the sum of its first tensor."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    for value in values:
        if isinstance(value, torch.Tensor) and value.requires_grad:
            return value.float().sum()
    raise AdvisorError("--train: the model's output has no tensor that requires grad to backpropagate")
