"""Which query rows of an attention block's scores were fully masked, computed while the recorded step runs.

The source cannot show a padding mask's values; the run can. From each product of two activations (a score
product) the tracker follows the scores through views and elementwise ops and, at every op that masks them, ORs in
the elements that no longer carry their score: those `masked_fill` fills, those `where` takes from the other
operand, and for an added or subtracted tensor those it swallows (the sum equals the mask's value: -inf, or a
finite value so large that the score is lost in rounding). A softmax over tracked scores records how many rows had
every element masked. Where the tracker cannot replay an op on its mask state (a multiplication by a tensor, an op
it does not know, baddbmm's added input) it stops following those scores: a softmax over untracked scores has an
unknown count, never 0, and an unknown count discharges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from advisor.runtime.detect.op_kinds import MATMULS, SOFTMAXES, VIEWS

ROW_REDUCTIONS = SOFTMAXES | {"_log_softmax", "log_softmax"}
_MASKING = frozenset({"masked_fill", "where", "add", "sub"})
_SCALING = frozenset({"mul", "div"})
# elementwise on the scores alone (a scale, a cast, a copy, soft-capping): masked elements stay masked
_ELEMENTWISE = _SCALING | {"_to_copy", "clone", "contiguous", "tanh", "clamp", "neg"}


@dataclass(frozen=True)
class _State:
    masked: torch.Tensor | None = None  # bool, broadcastable to the scores; None: no element masked yet


_CLEAN = _State()


@dataclass(frozen=True)
class Rows:
    """At a softmax over tracked scores: how many rows had every element masked."""

    fully_masked: int


class MaskedRows:
    """Per-tensor mask state, keyed weakly by the scores tensors (no activation is kept alive)."""

    def __init__(self) -> None:
        self.states = WeakIdKeyDictionary()

    def on_op(self, name: str, func, args: tuple, kwargs: dict, out, params) -> Rows | None:
        """Update the states for one dispatched op; at a softmax over tracked scores return its rows."""
        with torch._C.DisableTorchFunction():  # the recorder's function mode must not see the tracker's own ops
            return self._on_op(name[:-1] if name.endswith("_") else name, func, args, kwargs, out, params)

    def _on_op(self, name, func, args, kwargs, out, params) -> Rows | None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name in MATMULS:
            beta = kwargs.get("beta", args[3] if len(args) > 3 else 1) if name == "baddbmm" else 0
            if isinstance(out, torch.Tensor) and len(tensors) >= 2 and beta == 0 and \
                    not any(_storage(t) in params for t in tensors):
                self.states[out] = _CLEAN  # a product of two activations: maybe attention scores
            return None
        tracked = [(t, self.states[t]) for t in tensors if t in self.states]
        if not tracked:
            return None
        scores, state = max(tracked, key=lambda pair: pair[0].numel())
        if name in ROW_REDUCTIONS:
            return Rows(_fully_masked_rows(scores, state, args[1] if len(args) > 1 else kwargs.get("dim", -1)))
        if not isinstance(out, torch.Tensor):
            return None  # split, unbind: scores are not followed into pieces
        others = [t for t in tensors if t is not scores]
        following = self._next(name, func, args, kwargs, out, scores, state, others)
        if following is None:
            self.states.pop(out, None)  # an in-place op's output is its input: stop following it too
        else:
            self.states[out] = following
        return None

    def _next(self, name, func, args, kwargs, out, scores, state, others) -> _State | None:
        """The mask state of the op's output, or None where it cannot be known."""
        try:
            if name in VIEWS:
                if state.masked is None:
                    return _CLEAN
                return _State(func(state.masked.expand(scores.shape), *args[1:], **kwargs))
            if name in _MASKING:
                return _or(state, _newly_masked(name, args, kwargs, out, scores, others))
        except RuntimeError:
            return None
        if name not in _ELEMENTWISE or out.shape != scores.shape or \
                name in _SCALING and any(t.numel() > 1 for t in others):
            return None
        return state


def _newly_masked(name, args, kwargs, out, scores, others) -> torch.Tensor | None:
    if name == "masked_fill":
        return args[1].bool()
    if name == "where":
        keep = args[0].bool()
        return ~keep if args[1] is scores else keep
    other = next((t for t in others if t.numel() > 1), None)
    if other is None:
        return None  # a scalar added to every score masks nothing
    if other is not args[1]:
        return out == other  # mask + scores, mask - scores: swallowed where the result is the mask
    value = other * kwargs.get("alpha", 1)
    return out == (-value if name == "sub" else value)


def _or(state: _State, masked: torch.Tensor | None) -> _State:
    if masked is None:
        return state
    return _State(masked if state.masked is None else state.masked | masked)


def _fully_masked_rows(scores: torch.Tensor, state: _State, dim: int) -> int:
    if state.masked is None:
        return 0
    return int(state.masked.expand(scores.shape).all(dim).sum())


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0
