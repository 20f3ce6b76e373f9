"""Dataflow, scope and dispatch soundness of the attention rewrite (issue 6, classes E-I, K-N).

Each source is a minimal reproduction of a "safe" patch that changed outputs or raised before the fix. A test
either checks that no safe patch is offered (and why), or runs the original and the patched module on the same
weights and inputs and compares them.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from advisor.scan import analyze_source
from fixture_models import load_module_from_source, parity

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
MAKE = '''

def make(seed: int = 0):
    torch.manual_seed(seed)
    model = Attn()
    return model, (torch.randn(2, 6, 16),)
'''


def attention(forward: str, init: str = "", methods: str = "", after: str = "") -> str:
    """A module `Attn` with two heads of width 8 over (2, 6, 16) inputs; `forward` continues after q, k, v."""
    init = textwrap.indent(textwrap.dedent(init), " " * 8)
    forward = textwrap.indent(textwrap.dedent(forward), " " * 8)
    methods = textwrap.indent(textwrap.dedent(methods), " " * 4)
    return HEAD + f'''
class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
{init}
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
{forward}
{methods}
{textwrap.dedent(after)}''' + MAKE


def findings(source: str):
    return analyze_source(source, "m.py").findings


def safe_findings(source: str):
    return [f for f in findings(source) if f.rule == "ADV101" and f.fix_safety == "safe"]


def assert_exact_or_not_safe(source: str, name: str) -> bool:
    """A safe patch, if any, computes what the original computes. Returns whether one was offered."""
    result = analyze_source(source, "m.py")
    if not [f for f in result.findings if f.rule == "ADV101" and f.fix_safety == "safe"]:
        return False
    parity(source, result.fixed, name=name)
    return True


def the_finding(source: str):
    (finding,) = findings(source)
    return finding


# E: a triangle whose contents change later is not causal ----------------------------------------------------

def test_tril_written_locally_is_not_causal():
    source = attention("""
        mask = torch.tril(torch.ones(T, T))
        mask[:, :2] = 1  # prefix-LM: the first two keys are visible to every query
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s = s.masked_fill(mask == 0, float('-inf'))
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """)
    assert "is_causal" not in analyze_source(source, "m.py").fixed
    assert_exact_or_not_safe(source, "tril_local")


@pytest.mark.parametrize("write", ["self.bias[:, :, :, :2] = 1", "self.bias[..., 0].fill_(1)",
                                   "torch.ones(1, 1, 8, 8, out=self.bias)"])
def test_tril_buffer_written_in_init_or_another_method_is_not_causal(write):
    init = 'self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))'
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s = s.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init=init + "\nself.prefix()", methods=f"""
    def prefix(self):
        {write}
    """)
    assert "is_causal" not in analyze_source(source, "m.py").fixed
    assert_exact_or_not_safe(source, "tril_buffer")


# F: a factor in an `else:` applies when the test is false ----------------------------------------------------

@pytest.mark.parametrize("flag", [False, True])
def test_scale_in_else_branch_keeps_its_polarity(flag):
    source = attention("""
        s = q @ k.transpose(-2, -1)
        if self.unscaled:
            pass
        else:
            s = s * 0.5
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init=f"self.unscaled = {flag}")
    assert assert_exact_or_not_safe(source, "else_scale")
    assert "(1.0 if self.unscaled else 0.5)" in analyze_source(source, "m.py").fixed


def test_scale_in_elif_is_not_rewritten_with_one_guard():
    source = attention("""
        s = q @ k.transpose(-2, -1)
        if self.unscaled:
            pass
        elif self.half:
            s = s * 0.5
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="self.unscaled = False\nself.half = True")
    assert not assert_exact_or_not_safe(source, "elif_scale")


# G: a tensor is never proved a Python-number scale -----------------------------------------------------------

def test_parameter_scale_through_a_local_is_refused():
    source = attention("""
        s = q @ k.transpose(-2, -1) * self.scale
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """, init="scale = nn.Parameter(torch.tensor(0.3))\nself.scale = scale")
    finding = the_finding(source)
    assert finding.rule == "ADV103" and "not provably a Python number" in finding.reason


def test_inherited_scale_is_an_assumption():
    source = HEAD + '''
class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.3))


class Attn(Base):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) * self.scale
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
''' + MAKE
    finding = the_finding(source)
    assert finding.fix_safety == "unsafe" and "not assigned in this class" in finding.reason
    assert [f["name"] for f in finding.extra["facts"]["assumed"]] == ["scale-is-number"]


def test_unannotated_scale_parameter_is_an_assumption():
    source = HEAD + '''
def attend(q, k, v, scale):
    s = q @ k.transpose(-2, -1) * scale
    return s.softmax(dim=-1) @ v
'''
    finding = the_finding(source)
    assert finding.fix_safety == "unsafe" and "no int/float annotation" in finding.reason
    annotated = source.replace("scale):", "scale: float):")
    proved = the_finding(annotated)
    assert proved.fix_safety == "safe"
    assert "scale-is-number" in [f["name"] for f in proved.extra["facts"]["proved"]]  # beside the dtype facts


# I: in-place writes and deletions between the scores and the value product -----------------------------------

@pytest.mark.parametrize("statement, how", [
    ("del q, k", "deleted"),
    ("q[..., 0] = 0", "written in place"),
    ("k.add_(1.0)", "written in place"),
    ("torch.mul(k, 2.0, out=k)", "written in place"),
    ("k[0] += 1", "written in place"),
])
def test_inputs_changed_after_the_scores_are_refused(statement, how):
    source = attention(f"""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        p = s.softmax(dim=-1)
        {statement}
        return (p @ v).transpose(1, 2).reshape(B, T, C)
    """)
    finding = the_finding(source)
    assert finding.rule == "ADV103" and how in finding.reason, finding.reason


def test_scores_written_in_place_are_refused():
    source = attention("""
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s[..., 0] = -1e9
        return (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    """)
    assert not assert_exact_or_not_safe(source, "scores_store")
