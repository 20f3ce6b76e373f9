"""What a run asks of autograd beyond one reverse pass, seen while one step runs: the runtime side of the
`first-order-autograd` fact (static analysis sees only the files of the run; a gradient penalty in a library the
step calls is seen here).

A TorchFunctionMode sees `torch.autograd.grad` and `Tensor.backward` with their `create_graph` (torch.func's
grad/hessian and torch.autograd.functional's hvp call them the same way) and the dual-tensor ops every forward-mode
transform uses (`torch.autograd.forward_ad`, torch.func.jvp/jacfwd/hessian). Checked on torch 2.13, CPU."""

from __future__ import annotations

from collections.abc import Callable

from torch.overrides import TorchFunctionMode

FORWARD_AD_OPS = {"_make_dual", "_unpack_dual"}


class _AutogradWatch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, None] = {}  # in the order first seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if kwargs.get("create_graph"):
            self.seen.setdefault(f"the profiled run called `{name}(..., create_graph=True)`, which asks for double "
                                 "backward")
        elif name in FORWARD_AD_OPS:
            self.seen.setdefault("the profiled run made dual tensors, which asks for forward-mode AD")
        return func(*args, **kwargs)


def higher_order_requests(step: Callable[[], object]) -> list[str]:
    """Run `step` once and say what it asked of autograd beyond first-order reverse mode (empty: nothing)."""
    with _AutogradWatch() as watch:
        step()
    return list(watch.seen)
