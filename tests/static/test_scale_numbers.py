"""Scales that are Python numbers only by what the tree shows: a head size derived in `__init__` from constructor
parameters named as sizes (`self.head_dim = dim // num_heads`, then `* self.head_dim ** -0.5`), module-level
constants unpacked from a tuple (`H, T = 4, 9`), and 0-d tensors built from a literal (`torch.tensor(8.0) ** 0.5`),
which hold float32's value of it. Each is run original vs patched in float32 and float64."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from fixture_models import load_module_from_source

SIZED = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) {scale}
        return (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)
'''
BUILT = "\n\nclass Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n" \
        "        self.attn = Attention({arguments})\n\n    def forward(self, x):\n        return self.attn(x)\n"


def _attention(source: str, path: str = "sized.py"):
    [finding] = [f for f in analyze_source(source, path).findings if f.kind == "attention"]
    return finding


def _scanned(folder, source: str):
    """The file's attention finding as a scan reads it (the tree's call sites), and the file fixed."""
    (folder / "sized.py").write_text(source)
    [result] = scan_paths([str(folder)], jobs=1).files
    [finding] = [f for f in result.findings if f.kind == "attention"]
    return finding, result.fixed


def _names(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra.get("facts", {}).get(status, [])}


def _parity(source: str, fixed: str, build, x: torch.Tensor) -> None:
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        torch.manual_seed(0)
        original = build(load_module_from_source(source, "scale_numbers_original")).to(dtype)
        patched = build(load_module_from_source(fixed, "scale_numbers_patched")).to(dtype)
        patched.load_state_dict(original.state_dict())
        inputs = x.to(dtype)
        torch.testing.assert_close(patched(inputs), original(inputs), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("scale", ["* self.head_dim ** -0.5", "/ self.head_dim ** 0.5", "/ (self.head_dim ** 0.5)"])
@pytest.mark.parametrize("arguments", ["32, 4", "dim=32, num_heads=4"])
def test_a_head_size_from_constructor_sizes_is_proved_by_the_constructions(tmp_path, scale, arguments):
    """Every construction of the file passes numbers for `dim` and `num_heads`: the scale is a number, proved from
    call sites (it was a tensor scale of unknown shape before, assumed, so the patch was unsafe)."""
    source = SIZED.format(scale=scale) + BUILT.format(arguments=arguments)
    finding, fixed = _scanned(tmp_path, source)
    assert finding.fix_safety == "safe", finding.extra["facts"]
    assert "scale-is-number" in _names(finding, "from_call_sites")
    _parity(source, fixed, lambda module: module.Block(), torch.randn(2, 5, 32))


def test_without_constructions_the_head_size_is_checked_when_the_block_runs():
    """A library's class, whose callers live elsewhere: the patch checks the scale is a number and runs the
    original block where a caller passed a tensor."""
    source = SIZED.format(scale="* self.head_dim ** -0.5")
    finding = _attention(source)
    assert finding.fix_safety == "safe" and "scale-is-number" in _names(finding, "guarded"), finding.extra["facts"]
    fixed = analyze_source(source, "sized.py").fixed
    assert "isinstance(self.head_dim ** -0.5, (int, float))" in fixed
    _parity(source, fixed, lambda module: module.Attention(32, 4), torch.randn(2, 5, 32))


def test_a_construction_passing_a_tensor_size_proves_nothing(tmp_path):
    source = SIZED.format(scale="* self.head_dim ** -0.5") + BUILT.format(arguments="torch.tensor(32), 4")
    finding, _ = _scanned(tmp_path, source)
    assert "scale-is-number" not in _names(finding, "from_call_sites") | _names(finding, "proved")


def test_a_parameter_not_named_as_a_size_is_not_taken_for_a_number():
    """`temperature` without a default may be a learned tensor: its scale stays a tensor scale (folded into q)."""
    source = SIZED.replace("dim, num_heads", "dim, num_heads, temperature").replace(
        "self.num_heads = num_heads", "self.num_heads = num_heads\n        self.temperature = temperature").format(
        scale="/ self.temperature")
    assert "scale-is-number" not in _names(_attention(source), "proved") | _names(_attention(source), "guarded")


MODULE_CONSTANTS = '''
import torch
import torch.nn as nn

H, T = 4, 9


class Attention(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, H, -1).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) * (c // H) ** -0.5
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
'''


@pytest.mark.parametrize("binding, proved", [
    ("H, T = 4, 9", True),
    ("(H, T) = [4, 9]", True),
    ("H, T = 4, torch.tensor(9)", True),  # T is not the one read
    ("H, T = torch.tensor(4), 9", False),
    ("H, *T = 4, 9, 10", False),
])
def test_module_constants_unpacked_from_literals_are_numbers(binding, proved):
    source = MODULE_CONSTANTS.replace("H, T = 4, 9", binding)
    finding = _attention(source, "constants.py")
    assert ("scale-is-number" in _names(finding, "proved")) == proved, finding.extra["facts"]
    if proved:
        assert finding.fix_safety == "safe", finding.extra["facts"]
        _parity(source, analyze_source(source, "constants.py").fixed, lambda module: module.Attention(),
                torch.randn(2, 9, 32))


TENSOR_LITERAL = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        s = torch.matmul(q, k.transpose(-1, -2)) {scale}
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
'''


@pytest.mark.parametrize("scale, as_number", [
    ("/ torch.tensor(8.0) ** 0.5", False),  # float32's sqrt(8): a 0-d tensor, folded into q
    ("* torch.tensor(0.1)", False),  # float32's 0.1 is not Python's
    ("/ torch.sqrt(torch.tensor(8.0))", False),
    ("* torch.tensor(0.125)", True),  # float32 holds it exactly
    ("* torch.tensor(0.1, dtype=torch.float64)", True),
])
def test_a_tensor_built_from_a_literal_scales_as_the_original_does_in_float64(scale, as_number):
    """A reach round's p220: `/ torch.tensor(8.0) ** 0.5` was taken for the number sqrt(8) (SDPA's `scale=` got
    1 / float32's sqrt(8), computed in float32): float64 outputs differed by 1.1e-8, gradients by 1.6e-7. The
    tensor is float32's value, which the original's float64 scores are scaled by: folded into q where float32
    cannot hold the literal, a number only where it can (or the tensor is float64)."""
    source = TENSOR_LITERAL.format(scale=scale)
    finding = _attention(source, "literal.py")
    assert finding.fix_safety == "safe", finding.extra["facts"]
    assert ("scale-is-number" in _names(finding, "proved")) == as_number, finding.extra["facts"]
    _parity(source, analyze_source(source, "literal.py").fixed, lambda module: module.Attention(),
            torch.randn(2, 5, 32))


def test_sizes_proved_across_files(tmp_path):
    """The constructions of another file of the tree prove the sizes as the file's own do."""
    (tmp_path / "attn.py").write_text(SIZED.format(scale="* self.head_dim ** -0.5"))
    (tmp_path / "model.py").write_text("import torch.nn as nn\nfrom attn import Attention\n" +
                                       BUILT.format(arguments="64, 8"))
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert "scale-is-number" in _names(finding, "from_call_sites"), finding.extra["facts"]


@pytest.mark.parametrize("scale", ["/ torch.full([], 80 ** 0.5, dtype=q.dtype)",  # another tensor's dtype
                                   "/ torch.full([], 6 ** 0.5, dtype=torch.long)"])  # it holds 2
def test_a_tensor_of_another_dtype_is_no_number(scale):
    """An eighth breaker's bug_01: `dtype=lengths.dtype` (int64) was read as the scores' rounding, and the patch
    scaled by 2.449 where the original divided by 2 (output 0.109 off)."""
    finding = _attention(TENSOR_LITERAL.format(scale=scale), "literal.py")
    assert "scale-is-number" not in _names(finding, "proved") if "facts" in finding.extra else not finding.fixable
