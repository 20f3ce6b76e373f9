"""Patches of functions TorchScript compiles stay TorchScript: the hoisted mask variable (`None`, then a tensor)
and the run-time guards must compile under `torch.jit.script` where the original did, and the scripted patch must
compute what the scripted original computes (fp32, padded keys included; every query row keeps a key, the one
input where the finite-fill and -inf facts agree)."""

from __future__ import annotations

import textwrap

import pytest
import torch

import advisor
from advisor.engine.static import analyze_source
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

MODULE = '''
import math
from typing import Optional

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.causal = True
        self.drop = nn.Dropout(0.1)  # eval mode in the comparison: dropout_p reads the module's mode
        self.qkv = nn.Linear(dim, dim * 3)
        self.register_buffer("tril", torch.ones(8, 8, dtype=torch.bool).tril())

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
{body}
        return out.transpose(1, 2).reshape(b, n, c)


def make():
    return torch.jit.script(Attention())
'''

# the mask is reshaped under its `is not None` test: hoisted into a variable that starts as None
PADDING_VIEWED = """
s = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5)
if mask is not None:
    s = s.masked_fill(mask.view(b, 1, 1, n), float("-inf"))
out = s.softmax(dim=-1) @ v
"""
# ... with the weights through a dropout module (`dropout_p=self.drop.p if self.drop.training else 0.0`)
PADDING_DROPOUT = PADDING_VIEWED.replace("out = s.softmax(dim=-1) @ v", "out = self.drop(s.softmax(dim=-1)) @ v")
# a 0/1 mask filled with a finite value under its `is not None` test: hoisted, and its rank guarded
FINITE_FILL = """
s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
if mask is not None:
    s = s.masked_fill(mask == 0, -1e9)
out = torch.matmul(torch.softmax(s, dim=-1), v)
"""
# two conditional masks (a causal buffer under a flag, an additive mask): accumulated into one hoisted variable
TWO_CONDITIONAL = """
s = (q @ k.transpose(-2, -1)) * 0.25
if self.causal:
    s = s.masked_fill(~self.tril[:n, :n], float("-inf"))
if mask is not None:
    s = s + mask
out = s.softmax(dim=-1) @ v
"""
# q and k upcast, v not: q, k and v sharing a dtype is guarded
UPCAST_QK = """
q, k = q.float(), k.float()
s = (q @ k.transpose(-2, -1)) * 0.25
out = s.softmax(dim=-1).to(v.dtype) @ v
"""

FUNCTION = '''
import math
from typing import Optional

import torch
import torch.nn.functional as F


@torch.jit.script
def attention(query, key, value, mask: Optional[torch.Tensor] = None):
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    return torch.matmul(F.softmax(scores, dim=-1), value)
'''


def _padding(b: int = 3, n: int = 6) -> torch.Tensor:
    """True on padded keys: some rows padded, none fully."""
    padded = torch.zeros(b, n, dtype=torch.bool)
    padded[0, 4:] = True
    padded[1, 1:] = True
    return padded


CASES = {
    "padding mask viewed": (PADDING_VIEWED, lambda: _padding(), "safe"),
    "padding mask and dropout": (PADDING_DROPOUT, lambda: _padding(), "safe"),
    "finite fill, rank guarded": (FINITE_FILL, lambda: (~_padding())[:, None, None, :].long(), "unsafe"),
    "two conditional masks": (TWO_CONDITIONAL, lambda: torch.randn(3, 1, 6, 6), "unsafe"),
    "q/k/v dtype guarded": (UPCAST_QK, lambda: None, "safe"),
}


def _patched(source: str):
    result = analyze_source(source, "case.py", unsafe_fixes=True)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert result.fixed != source, finding.reason
    return finding, result.fixed


@pytest.mark.parametrize("case", CASES)
def test_a_scripted_module_is_patched_into_code_torchscript_compiles(case):
    body, mask_of, safety = CASES[case]
    source = MODULE.format(body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))
    finding, fixed = _patched(source)
    assert finding.rule == "ADV101" and finding.fix_safety == safety
    torch.manual_seed(0)
    original = load_module_from_source(source, "scripted").make().eval()
    patched = load_module_from_source(fixed, "scripted_fixed").make().eval()  # raises if TorchScript refuses it
    patched.load_state_dict(original.state_dict())
    x, mask = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1)), mask_of()
    with torch.no_grad():
        for inputs in ((x, mask), (x, None)):
            torch.testing.assert_close(patched(*inputs), original(*inputs), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, mask)))


def test_a_scripted_function_is_patched_into_code_torchscript_compiles():
    finding, fixed = _patched(FUNCTION)
    assert "mask-rank" in {fact["name"] for fact in finding.extra["facts"]["guarded"]}
    original, patched = (load_module_from_source(code, name).attention
                         for code, name in ((FUNCTION, "function"), (fixed, "function_fixed")))
    assert isinstance(patched, torch.jit.ScriptFunction)
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=generator) for _ in range(3))
    for mask in ((~_padding())[:, None, None, :].long(), (~_padding()[0]).long(), None):  # SDPA, original, SDPA
        torch.testing.assert_close(patched(q, k, v, mask), original(q, k, v, mask), atol=1e-5, rtol=1e-5)


# Found by attacking safe patches (s17): TorchScript also compiles what it is not given by name, and the hoisted mask
# variable (`attn_mask = None`, then a tensor) did not compile there, where the original block did.

CALLED_BY_A_SCRIPTED_FUNCTION = FUNCTION.replace("@torch.jit.script\n", "") + '''

def run(q, k, v, mask: Optional[torch.Tensor] = None):
    return attention(q, k, v, mask)


def make():
    return torch.jit.script(run)
'''


def test_a_function_a_scripted_function_calls_is_patched_into_code_torchscript_compiles():
    finding, fixed = _patched(CALLED_BY_A_SCRIPTED_FUNCTION)
    original, patched = (load_module_from_source(code, name).make()
                         for code, name in ((CALLED_BY_A_SCRIPTED_FUNCTION, "called"), (fixed, "called_fixed")))
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=generator) for _ in range(3))
    for mask in ((~_padding())[:, None, None, :].long(), None):
        torch.testing.assert_close(patched(q, k, v, mask), original(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_a_module_another_file_of_the_tree_scripts_is_patched_into_code_torchscript_compiles(tmp_path):
    model = MODULE.format(body=textwrap.indent(textwrap.dedent(PADDING_VIEWED).strip("\n"), " " * 8))
    model = model.replace("def make():\n    return torch.jit.script(Attention())\n", "")
    (tmp_path / "tree_model.py").write_text(model, encoding="utf-8")
    (tmp_path / "export.py").write_text("import torch\nfrom tree_model import Attention\n\n\ndef make():\n"
                                        "    return torch.jit.script(Attention())\n", encoding="utf-8")
    report = advisor.fix(str(tmp_path), apply=True, cache=False)
    assert [f.path for f in report.files if f.written] == [str(tmp_path / "tree_model.py")]
    fixed = (tmp_path / "tree_model.py").read_text(encoding="utf-8")
    torch.manual_seed(0)
    original = torch.jit.script(load_module_from_source(model, "tree_original").Attention()).eval()
    patched = torch.jit.script(load_module_from_source(fixed, "tree_fixed").Attention()).eval()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for mask in (_padding(), None):
            torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)


# A fifth breaker's: TorchScript compiling a patch the scan never saw scripted (a user's script outside the tree), an
# int scale where the file scripts itself by a spelling not read before.

@pytest.mark.parametrize("body", [PADDING_VIEWED, FINITE_FILL], ids=["hoisted mask", "conditional finite fill"])
def test_a_patch_compiles_where_a_user_outside_the_tree_scripts_the_original(body):
    """No `torch.jit` in the file: the hoisted mask variable is annotated `torch.Tensor | None` all the same, and
    each conditional expression tests the variable its branch reads, so TorchScript refines its Optional type."""
    source = MODULE.format(body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))
    source = source.replace("def make():\n    return torch.jit.script(Attention())\n", "")
    _, fixed = _patched(source)
    assert "jit" not in fixed
    mask = _padding() if body is PADDING_VIEWED else (~_padding())[:, None, None, :].long()
    _assert_scripted_alike(source, fixed, "outside", [mask, None])


@pytest.mark.parametrize("scripting", ['getattr(torch.jit, "script")(Attention())',
                                       "torch.jit._script.script(Attention())"])
def test_an_int_scale_is_passed_as_a_float_where_the_file_scripts_itself(scripting):
    """TorchScript's SDPA takes a `float?` scale: `* self.heads` (an int) compiled in the original's product, and
    the patch's `scale=self.heads` did not."""
    body = "s = (q @ k.transpose(-2, -1)) * self.heads\nout = s.softmax(dim=-1) @ v\n"
    source = MODULE.format(body=textwrap.indent(body, " " * 8)).replace("torch.jit.script(Attention())", scripting)
    _, fixed = _patched(source)
    assert "scale=float(self.heads)" in fixed
    torch.manual_seed(0)
    original = load_module_from_source(source, "int_scale").make().eval()
    patched = load_module_from_source(fixed, "int_scale_fixed").make().eval()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(patched(x), original(x), atol=1e-5, rtol=1e-5)


def test_a_file_that_announces_torchscript_is_patched_as_scripted():
    """`torch.jit.Final` and its like say the module is meant to be scripted, wherever the compiler is called."""
    source = _unscripted("self.heads").replace(
        "class Attention(nn.Module):\n", "class Attention(nn.Module):\n    heads: torch.jit.Final[int]\n\n")
    _, fixed = _patched(source)
    assert "scale=float(self.heads)" in fixed
    torch.jit.script(load_module_from_source(fixed, "announced_fixed").Attention())  # compiles


def test_a_product_of_ints_is_passed_as_a_float_wherever_the_module_is_scripted():
    """`* self.mult` with `self.mult = 2`: eager SDPA takes the int, TorchScript's does not, and a user may script
    the module from outside the tree (a fifth breaker's generated programs)."""
    source = _unscripted("self.mult").replace("self.causal = True", "self.causal = True\n        self.mult = 2")
    _, fixed = _patched(source)
    assert "scale=float(self.mult)" in fixed
    _assert_scripted_alike(source, fixed, "int_product", [None])


def _unscripted(factor: str) -> str:
    """MODULE with scores scaled by `factor`, no `make()`: nothing in the file calls TorchScript's compiler."""
    body = f"s = (q @ k.transpose(-2, -1)) * {factor}\nout = s.softmax(dim=-1) @ v\n"
    return MODULE.format(body=textwrap.indent(body, " " * 8)).replace(
        "def make():\n    return torch.jit.script(Attention())\n", "")


def _assert_scripted_alike(source: str, fixed: str, name: str, masks: list) -> None:
    """Both modules scripted as a user would script them, outside the file; the same outputs for each mask."""
    torch.manual_seed(0)
    original = torch.jit.script(load_module_from_source(source, f"{name}_original").Attention()).eval()
    patched = torch.jit.script(load_module_from_source(fixed, f"{name}_fixed").Attention()).eval()
    patched.load_state_dict(original.state_dict())
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for mask in masks:
            torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)


DROPOUT_SWAPPED_THEN_SCRIPTED = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attn(nn.Module):
    def __init__(self, n_embd=16, n_head=2, block_size=8):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.attn_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        return (att @ v).transpose(1, 2).reshape(B, T, C)


def for_inference(model):
    model.attn_dropout = nn.Identity()
    return torch.jit.script(model.eval())
'''


def test_a_dropout_module_swapped_for_identity_in_a_scripted_file_compiles_in_the_sdpa_branch():
    """A ninth breaker's bug_13: the module check sends a swapped Identity to the original, but TorchScript compiles
    the SDPA branch too, whose `self.attn_dropout.p` an Identity lacks ("Module 'Identity' has no attribute 'p'").
    Where TorchScript may compile the function the probability is read `getattr(..., "p", 0.0)`."""
    result = analyze_source(DROPOUT_SWAPPED_THEN_SCRIPTED, "model.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and 'getattr(self.attn_dropout, "p", 0.0)' in finding.patch
    torch.manual_seed(0)
    original = load_module_from_source(DROPOUT_SWAPPED_THEN_SCRIPTED, "swapped")
    patched = load_module_from_source(result.fixed, "swapped_fixed")
    model = original.Attn()
    twin = patched.Attn()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(patched.for_inference(twin)(x), original.for_inference(model)(x))
    torch.testing.assert_close(twin.eval()(x), model.eval()(x))
