"""Safe patches raise where the original raises, and only there.

`F.dropout` checks its probability even where it does not train (p outside [0, 1] raises), so a patch that drops it
in eval mode must keep that check: a probability that is not a literal is guarded (`0.0 <= p <= 1.0`, a Python
comparison) and the original runs where the check fails.
"""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

DROPOUT = '''
import math
import torch
import torch.nn.functional as F


def attend(q, k, v, p):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    w = F.dropout(s.softmax(dim=-1), p, training={training})
    return w @ v
'''


def _outcome(function, *args):
    """The output, or the exception's type: what a caller sees."""
    try:
        return function(*args)
    except (RuntimeError, ValueError, TypeError) as error:
        return type(error)


def _pair(source: str, name: str):
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.reason
    fixed = analyze_source(source, "case.py").fixed
    return load_module_from_source(source, name), load_module_from_source(fixed, f"{name}_fixed"), finding


@pytest.mark.parametrize("training", ["False", "p > 0.5"])
def test_dropout_probability_out_of_range_raises_as_the_original(training):
    original, patched, finding = _pair(DROPOUT.format(training=training), "dropout_range")
    assert "dropout-range" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    for p in (0.0, 0.25, 1.5, -0.1, float("nan"), torch.tensor(0.1)):
        expected, got = _outcome(original.attend, q, k, v, p), _outcome(patched.attend, q, k, v, p)
        if isinstance(expected, type) or isinstance(got, type):
            assert got is expected, (p, got, expected)
        elif not (isinstance(p, float) and 0.0 < p and training != "False"):  # training: random masks differ
            torch.testing.assert_close(got, expected, equal_nan=True)


def test_dropout_literal_out_of_range_is_refused():
    source = DROPOUT.format(training="False").replace("dim=-1), p,", "dim=-1), 1.5,")
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "refused" or finding.patch is None, finding.fix_safety
    assert "outside [0, 1]" in (finding.reason or "")


DIVIDED = '''
import torch


def attend(q, k, v, t: float):
    s = q @ k.transpose(-2, -1) / t
    return s.softmax(-1) @ v
'''


@pytest.mark.parametrize("scripted", [False, True])
def test_number_divisor_zero_or_nan_runs_the_original(scripted):
    """`1.0 / t` raised ZeroDivisionError where the original divides by 0 (NaN); a NaN `t` gave other values (also
    under TorchScript, whose float `t == t` is True for NaN)."""
    source = DIVIDED.replace("def attend", "@torch.jit.script\ndef attend") if scripted else DIVIDED
    original, patched, finding = _pair(source, "divisor")
    assert "scale-nonzero" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    for t in (0, 0.0, -0.0, float("nan"), float("inf"), 2.5):
        expected, got = _outcome(original.attend, q, k, v, t), _outcome(patched.attend, q, k, v, t)
        assert not isinstance(got, type), (t, got)
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_tensor_divisor_is_unsafe_unless_a_nonzero_constant():
    """A learned temperature may hold 0: `(q / t)·kᵀ` is not `(q·kᵀ) / t` there, and no metadata check shows it."""
    learned = DIVIDED.replace("t: float", "t: torch.Tensor")
    [finding] = [f for f in analyze_source(learned, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "unsafe" and "holds no 0" in finding.reason
    constant = learned.replace("def attend(q, k, v, t: torch.Tensor):", "def attend(q, k, v):\n    t = torch.tensor(8.0)")
    [finding] = [f for f in analyze_source(constant, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "safe", finding.reason


def test_per_key_factor_is_refused():
    """`(q·kᵀ) * ‖k‖` scales each key's column: folded into q it raised on the shapes (S against E)."""
    source = DIVIDED.replace("/ t", "* k.norm(dim=-1).unsqueeze(-2)").replace(", t: float", "")
    [finding] = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert finding.patch is None and "per-key factor" in finding.reason, finding.reason


ANNOTATED = '''
import torch


def attend(q, k, v, s: int):
    w = q @ k.transpose(-2, -1) * s
    return w.softmax(-1) @ v
'''


def test_an_int_annotation_is_not_trusted_a_tensor_scale_runs_the_original():
    """Breaker round 19b (37): `s: int` proved the scale a number, but Python does not enforce annotations: a tensor
    `s` (a per-head temperature, a size read as a 0-d tensor) gave SDPA a tensor `scale`. It is checked now."""
    original, patched, finding = _pair(ANNOTATED, "annotated_int")
    assert "scale-is-number" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    for s in (2, torch.tensor(2), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).view(3, 1, 1)):
        expected, got = _outcome(original.attend, q, k, v, s), _outcome(patched.attend, q, k, v, s)
        assert not isinstance(expected, type)
        torch.testing.assert_close(got, expected)
