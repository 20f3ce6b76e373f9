"""The autocast regions a model call runs in, recorded where a script called it and replayed wherever advisor calls
it again (parity, timing, profiling): a script's `with torch.autocast("cpu", dtype=torch.bfloat16): model(x)`
computes its attention in bfloat16, and a patch verified in float32 says nothing of that (breaker round 17c)."""

from __future__ import annotations

import contextlib

import torch

DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")

Autocast = tuple[tuple[str, str], ...]  # (device type, dtype name) of each enabled region, e.g. (("cpu", "bfloat16"),)


def recorded() -> Autocast:
    """The autocast regions enabled here and now."""
    return tuple((device, str(torch.get_autocast_dtype(device)).replace("torch.", ""))
                 for device in DEVICE_TYPES if torch.is_autocast_enabled(device))


def replayed(regions: Autocast) -> contextlib.ExitStack:
    """A context that enables those regions again (nothing for none)."""
    stack = contextlib.ExitStack()
    for device, dtype in regions:
        stack.enter_context(torch.autocast(device_type=device, dtype=getattr(torch, dtype)))
    return stack


def least_precise(regions: Autocast) -> torch.dtype | None:
    """The narrowest dtype the regions compute in (parity's tolerance is that dtype's), None for none."""
    dtypes = [getattr(torch, dtype) for _, dtype in regions]
    return max(dtypes, key=lambda dtype: torch.finfo(dtype).eps) if dtypes else None


def described(regions: Autocast) -> str:
    return ", ".join(f"torch.autocast({device!r}, dtype=torch.{dtype})" for device, dtype in regions)
