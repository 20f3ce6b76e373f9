"""Numerical judge for the round-3 adversarial attention modules (fixtures/attention/public3): each module has
`build(seed=0, dropout=0.1) -> (model, inputs)`; a rewrite of it is run beside the original on the same weights
and inputs in several precisions, and its outputs and gradients are compared."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fixture_models import ParityResult, _compare, iter_tensors, load_module_from_source

# (dtype, atol, rtol): fp32 and fp64 as the brief asks; bf16 at the product's own tolerance (README: 1e-2)
FP32, FP64, BF16 = (torch.float32, 1e-5, 1e-5), (torch.float64, 1e-10, 1e-10), (torch.bfloat16, 1e-2, 1e-2)


@dataclass
class Side:
    """One side of a comparison: a loaded source and what its build() returns for a seed."""

    module: Any

    def build(self, seed: int, dropout: float) -> tuple[torch.nn.Module, tuple]:
        model, inputs = self.module.build(seed, dropout)
        return model, tuple(inputs)


def load_pair(original: str, rewritten: str, name: str) -> tuple[Side, Side]:
    return (Side(load_module_from_source(original, f"{name}_original")),
            Side(load_module_from_source(rewritten, f"{name}_rewritten")))


def _cast_inputs(inputs: tuple, dtype: torch.dtype | None, grad: bool) -> tuple:
    """Floating inputs cast to `dtype` (None: kept) and made leaves that need a gradient; others cloned."""
    cast = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if value.is_floating_point():
                if dtype is not None:
                    value = value.to(dtype)
                value.requires_grad_(grad)
        cast.append(value)
    return tuple(cast)


def _forward(model: torch.nn.Module, inputs: tuple, grad: bool, autocast: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.set_grad_enabled(grad):
            return model(*inputs)


def _gradients(model: torch.nn.Module, inputs: tuple, out: Any, keep: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of a fixed random projection of the outputs at the positions `keep` marks (finite on both sides:
    an accepted NaN -> finite divergence must not reach the gradients through the loss) with respect to the
    floating inputs and the parameters (zeros where one gets no gradient)."""
    generator = torch.Generator().manual_seed(1234)
    loss = None
    for tensor, kept in zip(_differentiable(out), keep):
        weight = torch.randn(tensor.shape, generator=generator, dtype=torch.float64).to(tensor.dtype)
        term = torch.where(kept, tensor, 0.0).mul(weight).sum()
        loss = term if loss is None else loss + term
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad] + list(model.parameters())
    if loss is None:
        return []
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [g if g is not None else torch.zeros_like(leaf) for g, leaf in zip(grads, leaves)]


def _differentiable(out: Any) -> list[torch.Tensor]:
    return [t for t in iter_tensors(out) if t.is_floating_point() and t.requires_grad]


def _scaled_atol(value: Any, atol: float) -> float:
    """atol grown with the largest finite magnitude when above 1, as advisor's own parity does (README)."""
    biggest = max((float(t.detach().double().nan_to_num(0.0, 0.0, 0.0).abs().max())
                   for t in iter_tensors(value) if t.is_floating_point() and t.numel()), default=0.0)
    return atol * max(1.0, biggest)


def compare_run(original: Side, rewritten: Side, *, seed: int = 0, dtype: torch.dtype | None = torch.float32,
                atol: float = 1e-5, rtol: float = 1e-5, grad: bool = True, train: bool = False,
                autocast: bool = False, accept_nan: bool = False, dropout: float = 0.1,
                inputs_hook: Callable[[tuple], tuple] | None = None) -> ParityResult:
    """Build both sides for `seed`, give the rewrite the original's state_dict, cast to `dtype`, run both in eval
    (or train) mode and compare outputs, then (with `grad`) input and parameter gradients. Raises ParityError."""
    model_o, inputs = original.build(seed, dropout)
    model_r, _ = rewritten.build(seed, dropout)
    model_r.load_state_dict(model_o.state_dict(), strict=True)
    if inputs_hook is not None:
        inputs = inputs_hook(inputs)
    for model in (model_o, model_r):
        if dtype is not None:
            model.to(dtype)
        model.train(train)
    result = ParityResult()
    inputs_o, inputs_r = _cast_inputs(inputs, dtype, grad), _cast_inputs(inputs, dtype, grad)
    torch.manual_seed(seed)
    out_o = _forward(model_o, inputs_o, grad, autocast)
    torch.manual_seed(seed)
    out_r = _forward(model_r, inputs_r, grad, autocast)
    _compare(out_o, out_r, "output", _scaled_atol(out_o, atol), rtol, False, result, accept_nan)
    if grad:
        keep = [a.isfinite() & b.isfinite() for a, b in zip(_differentiable(out_o), _differentiable(out_r))]
        grads_o = _gradients(model_o, inputs_o, out_o, keep)
        grads_r = _gradients(model_r, inputs_r, out_r, keep)
        _compare(grads_o, grads_r, "gradient", _scaled_atol(grads_o, atol), rtol, False, result, accept_nan)
    return result
