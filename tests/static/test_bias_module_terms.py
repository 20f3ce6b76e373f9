"""A bias module (`attn = self.rel_pos(attn)`, whose forward is `return attn + self.get_bias()`: timm's `RelPosBias`)
is a score term read in the module's class: its values (a learned table of that class) and its rank (a gather viewed
and unsqueezed to 4 dims) are proved there, and the patch passes `self.rel_pos.get_bias()` as SDPA's attn_mask behind
a run-time check that the module is of that class exactly and no hook fires on it; the original runs otherwise. Each
patch is run against the original: outputs and input and table gradients in fp32 and fp64, in train and eval mode,
with hooks on the module, with the module swapped or subclassed at run time, the SDPA call counted where it must
(and must not) run."""

from __future__ import annotations

import functools

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

TEMPLATE = '''
import torch
from torch import nn


class RelPosBias(nn.Module):
    """A relative-position bias module: its forward adds a gathered table to the scores it is given."""

    def __init__(self, heads=2, n=5):
        super().__init__()
        self.n = n
        self.table = nn.Parameter(torch.randn(2 * n - 1, heads))
        positions = torch.arange(n)
        self.register_buffer("index", positions[:, None] - positions[None, :] + n - 1, persistent=False)

    def get_bias(self):
        return self.table[self.index.view(-1)].view(self.n, self.n, -1).permute(2, 0, 1).unsqueeze(0)

    def forward(self, attn, shared_rel_pos=None):
        {forward}


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, n=5):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.rel_pos = RelPosBias(heads, n, **{{}})
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = self.rel_pos(attn)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        return (attn @ v).transpose(1, 2).reshape(B, N, C)
'''
ADD = "return attn + self.get_bias()"


@functools.lru_cache(maxsize=None)
def _analysed(source: str, unsafe: bool = False):
    return analyze_source(source, "case.py", unsafe_fixes=unsafe)


def _finding(source: str):
    (finding,) = [f for f in _analysed(source).findings if f.kind == "attention"]
    return finding


def _facts(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


def _pair(source: str, dtype: torch.dtype, unsafe: bool = False):
    fixed = _analysed(source, unsafe).fixed
    assert fixed != source
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().to(dtype)
    patched_module = load_module_from_source(fixed, "case_fixed")
    patched = patched_module.Attention().to(dtype)
    patched.load_state_dict(original.state_dict())
    return original, patched, patched_module


def _assert_same(original, patched, dtype: torch.dtype, monkeypatch, sdpa_expected: bool) -> None:
    """Outputs, input gradients and the bias table's gradients match; SDPA ran exactly where expected."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    x = torch.randn(2, 5, 16, dtype=dtype, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (original, patched):
        calls.clear()
        leaf = x.clone().requires_grad_()
        out = model(leaf)
        (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
        results.append((out, leaf.grad, model.rel_pos.table.grad))
    assert calls == ([1] if sdpa_expected else [])
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}
    torch.testing.assert_close(results[1], results[0], **tolerance)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("forward", [ADD, "return self.get_bias() + attn"], ids=["scores-first", "term-first"])
def test_a_bias_module_term_is_proved_in_its_class_and_passed_as_the_mask(forward, dtype, mode, monkeypatch):
    source = TEMPLATE.format(forward=forward)
    finding = _finding(source)
    assert finding.fix_safety == "safe" and "attn_mask=self.rel_pos.get_bias()" in finding.patch, finding.reason
    assert {"mask-rank"} <= _facts(finding, "proved") and not _facts(finding, "assumed")
    assert {"module-identity", "no-hooks"} <= _facts(finding, "guarded")
    assert "_advisor_module_runs_plain(self.rel_pos, (RelPosBias,))" in finding.patch
    original, patched, _ = _pair(source, dtype)
    getattr(original, mode)(), getattr(patched, mode)()
    _assert_same(original, patched, dtype, monkeypatch, sdpa_expected=True)


def test_a_bias_module_patch_is_idempotent():
    """The original kept under `else:` and the emitted check are no new finding."""
    fixed = _analysed(TEMPLATE.format(forward=ADD)).fixed
    assert analyze_source(fixed, "case.py").fixed == fixed


@pytest.mark.parametrize("hook", ["forward", "forward_pre", "global"])
def test_a_hook_on_the_bias_module_runs_the_original(hook, monkeypatch):
    """A hook changes what the module's call gives (here it doubles the scores or the bias): only the original,
    which calls the module, runs it."""
    original, patched, _ = _pair(TEMPLATE.format(forward=ADD), torch.float64)
    handles = []
    for model in (original, patched):
        if hook == "forward":
            handles.append(model.rel_pos.register_forward_hook(lambda module, args, out: out * 2))
        elif hook == "forward_pre":
            handles.append(model.rel_pos.register_forward_pre_hook(lambda module, args: (args[0] * 2,)))
    if hook == "global":
        handles.append(torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, out: out * 2 if type(module).__name__ == "RelPosBias" else None))
    try:
        _assert_same(original, patched, torch.float64, monkeypatch, sdpa_expected=False)
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("swap", ["subclass", "another class", "None"])
def test_a_bias_module_swapped_at_run_time_runs_the_original(swap, monkeypatch):
    """The term was read in `RelPosBias`: a subclass overriding `get_bias`, another module or None in its place
    runs the original (which raises for None, as the patch must)."""
    original, patched, module = _pair(TEMPLATE.format(forward=ADD), torch.float64)

    class Doubled(module.RelPosBias):
        def get_bias(self):
            return 2 * super().get_bias()

    class Halved(torch.nn.Module):
        def __init__(self, table):
            super().__init__()
            self.table = table

        def get_bias(self):
            raise AssertionError("the patch read a term the check did not prove")

        def forward(self, attn, shared_rel_pos=None):
            return attn / 2 + self.table.sum()

    for model in (original, patched):
        state = model.rel_pos.state_dict()
        if swap == "subclass":
            model.rel_pos = Doubled().double()
            model.rel_pos.load_state_dict(state)
        elif swap == "another class":
            model.rel_pos = Halved(model.rel_pos.table)
        else:
            model.rel_pos = None
    if swap == "None":
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        for model in (original, patched):
            with pytest.raises(TypeError):
                model(x)
        return
    _assert_same(original, patched, torch.float64, monkeypatch, sdpa_expected=False)


def test_a_bias_module_whose_term_is_not_a_learned_table_stays_unsafe():
    """`self.mlp(self.coords)`: the term's values are not read from a table of the class (a table filled with a
    mask value would swallow rows): the module is guarded, the rows fact stays assumed."""
    source = TEMPLATE.format(forward="return attn + self.mlp(self.coords)").replace(
        "    def get_bias(self):", "        self.mlp = nn.Linear(2, 2)\n        self.coords = torch.randn(5, 5, 2)\n\n"
        "    def get_bias(self):", 1)
    finding = _finding(source)
    assert finding.fix_safety == "unsafe" and "fully-masked-rows" in _facts(finding, "assumed"), finding.reason


@pytest.mark.parametrize("forward", ["return attn + attn.mean(-1, keepdim=True)",
                                     "return attn + self.get_bias() * shared_rel_pos",
                                     "attn = attn + self.get_bias()\n        return attn",
                                     "return attn * self.get_bias()"],
                         ids=["a term of the scores", "a term of another argument", "not one return", "a product"])
def test_a_module_forward_that_is_not_a_bias_of_the_module_alone_is_not_followed(forward):
    finding = _finding(TEMPLATE.format(forward=forward))
    assert not finding.fixable and "forward is not followed" in finding.reason, finding.reason


def test_a_bias_module_called_with_an_argument_that_runs_code_is_not_followed():
    """Deleting the call would skip evaluating `shared_rel_pos=self.shared()`, which may run anything."""
    source = TEMPLATE.format(forward=ADD).replace(
        "attn = self.rel_pos(attn)", "attn = self.rel_pos(attn, shared_rel_pos=self.shared())") + \
        "\n    def shared(self):\n        return None\n"
    finding = _finding(source)
    assert not finding.fixable and "forward is not followed" in finding.reason, finding.reason


def test_a_bias_module_table_of_another_dtype_than_q_runs_the_original(monkeypatch):
    """q, k and v passed in (as GCViT's global query): nothing ties the term's dtype to q's, so the patch checks the
    table's dtype (a gather keeps it): equal, SDPA; a wider table, the original (which promotes the scores, then
    raises at the value product, as the patch must)."""
    source = TEMPLATE.format(forward=ADD).replace("def forward(self, x):", "def forward(self, q, k, v):").replace(
        "        B, N, C = x.shape\n        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads)"
        ".permute(2, 0, 3, 1, 4).unbind(0)\n", "").replace(
        "return (attn @ v).transpose(1, 2).reshape(B, N, C)", "return attn @ v")
    finding = _finding(source)
    assert finding.fix_safety == "safe" and "mask-dtype" in _facts(finding, "guarded"), finding.reason
    assert "self.rel_pos.table.dtype == q.dtype" in finding.patch
    original, patched, _ = _pair(source, torch.float32)
    q, k, v = torch.randn(3, 2, 2, 5, 8).unbind(0)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v), atol=1e-5, rtol=1e-5)
    assert calls == [1]
    for model in (original, patched):
        model.rel_pos.double()
        with pytest.raises(RuntimeError):
            model(q, k, v)
    assert calls == [1]
