"""What `advisor profile/optimize TARGET` runs: a model and the inputs of one step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Workload:
    """A runnable model step. TARGET functions return one (or a `(model, inputs)` pair)."""

    model: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    device: str | None = None
    dtype: Any = None
    seed: int = 0
    steps: int = 5
    autocast: tuple = ()  # advisor.runtime.autocast_state.Autocast: the regions each call of the model runs in
