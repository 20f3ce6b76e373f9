"""Guarded facts: where the only unproved facts are about metadata (q, k and v sharing a dtype, a
mask's rank or dtype), the patch checks them before the SDPA call and runs the original block where they fail:
it is safe, exact for every input, and lists those facts as `guarded`."""

from __future__ import annotations

import json
import textwrap
import warnings
from unittest.mock import patch

import einops
import pytest
import torch
import torch.nn.functional as F

from advisor.engine.static import analyze_source
from advisor.patterns.masks import pattern_output_axes
from attention_sources import masked_module
from fixture_models import dispatched_ops, load_module_from_source, uses_sdpa

SCRIPTED = "\n\ndef make():\n    return torch.jit.script(Attention())\n"

KEEP_MASK_OF_ANY_RANK = """
scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
scores = scores.masked_fill(~mask, float("-inf"))
out = scores.softmax(dim=-1) @ v
"""
# q and k are upcast before the scores, the weights cast back to v's dtype: nothing ties v's dtype to q's
UPCAST_QK = """
q, k = q.float(), k.float()
scores = (q @ k.transpose(-2, -1)) * 0.25
weights = scores.softmax(dim=-1).to(v.dtype)
out = weights @ v
"""


def _finding(source: str):
    (finding,) = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    return finding


def _names(finding, status: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(status, [])}


def _models(source: str, dtype=torch.float32):
    fixed = analyze_source(source, "case.py").fixed
    assert fixed != source
    torch.manual_seed(0)
    original = load_module_from_source(source, "case").Attention().to(dtype).eval()
    patched = load_module_from_source(fixed, "case_fixed").Attention().to(dtype).eval()
    patched.load_state_dict(original.state_dict())
    return original, patched


def _constructed(source: str, *args):
    """The original's and the patch's `Attention(*args)`."""
    fixed = analyze_source(source, "case.py").fixed
    return (load_module_from_source(source, "case").Attention(*args),
            load_module_from_source(fixed, "case_fixed").Attention(*args))


def _sdpa_calls(function, *inputs) -> int:
    with patch.object(F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention) as sdpa:
        function(*inputs)
    return sdpa.call_count


def test_a_mask_of_unknown_rank_is_guarded_and_the_patch_is_safe():
    finding = _finding(masked_module(KEEP_MASK_OF_ANY_RANK))
    assert finding.fix_safety == "safe" and finding.rule == "ADV101"
    assert _names(finding, "guarded") == {"mask-rank", "mask-dtype"} and not _names(finding, "assumed")
    assert "mask.dim()" in finding.patch and "mask.dtype == torch.bool" in finding.patch and "else:" in finding.patch


@pytest.mark.parametrize("shape", [(2, 1, 1, 5), (5,)], ids=["4-D mask: SDPA", "1-D mask: the original"])
def test_the_guarded_patch_is_exact_on_masks_that_pass_and_fail_the_check(shape):
    original, patched = _models(masked_module(KEEP_MASK_OF_ANY_RANK))
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(shape, dtype=torch.bool)
    mask[..., 3:] = False
    with torch.no_grad():
        torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, mask))) == (len(shape) == 4)


def test_a_guard_does_not_swallow_the_originals_error():
    """A 4-D mask that does not broadcast passes the check; SDPA then raises, as the original does."""
    original, patched = _models(masked_module(KEEP_MASK_OF_ANY_RANK))
    x, mask = torch.randn(2, 5, 16), torch.ones(2, 1, 1, 4, dtype=torch.bool)
    for model in (original, patched):
        with pytest.raises(RuntimeError):
            model(x, mask)


def test_q_k_and_v_sharing_a_dtype_is_guarded():
    finding = _finding(masked_module(UPCAST_QK))
    assert finding.fix_safety == "safe"
    assert "qkv-dtype" in _names(finding, "guarded") and not _names(finding, "assumed")
    assert "q.dtype == k.dtype == v.dtype" in finding.patch
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    for dtype, sdpa in ((torch.float32, True), (torch.bfloat16, False)):  # bf16: q, k float32 and v bf16
        original, patched = _models(masked_module(UPCAST_QK), dtype)
        with torch.no_grad():
            torch.testing.assert_close(patched(x.to(dtype), None), original(x.to(dtype), None), atol=1e-5, rtol=1e-5)
        assert uses_sdpa(dispatched_ops(patched, (x.to(dtype), None))) == sdpa


def test_a_function_torchscript_compiles_is_guarded_too():
    """The check compiles under TorchScript (tests/rewrite/test_torchscript_patches.py scripts it and compares
    values)."""
    finding = _finding(masked_module(KEEP_MASK_OF_ANY_RANK) + SCRIPTED)
    assert _names(finding, "guarded") == {"mask-rank", "mask-dtype"} and not _names(finding, "assumed")
    assert finding.fix_safety == "safe"


def test_a_guarded_patch_is_idempotent():
    fixed = analyze_source(masked_module(KEEP_MASK_OF_ANY_RANK), "case.py").fixed
    again = analyze_source(fixed, "case.py")
    assert again.fixed == fixed and not [f for f in again.findings if f.kind == "attention"]


# the value product runs in float32 whatever q's dtype: SDPA would get a float32 v next to a bf16 q
FLOAT_VALUE_PRODUCT = """
weights = ((q @ k.transpose(-2, -1)) * 0.25).softmax(dim=-1)
out = (weights.float() @ v.float()).to(x.dtype)
"""


def test_a_leaf_cast_to_a_literal_dtype_is_compared_as_that_dtype():
    finding = _finding(masked_module(FLOAT_VALUE_PRODUCT))
    assert "qkv-dtype" in _names(finding, "guarded") and finding.fix_safety == "safe"
    assert "q.dtype == k.dtype == torch.float32" in finding.patch
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    for dtype, sdpa in ((torch.float32, True), (torch.bfloat16, False)):
        original, patched = _models(masked_module(FLOAT_VALUE_PRODUCT), dtype)
        with torch.no_grad():
            torch.testing.assert_close(patched(x.to(dtype), None), original(x.to(dtype), None), atol=1e-5, rtol=1e-5)
        assert uses_sdpa(dispatched_ops(patched, (x.to(dtype), None))) == sdpa


def test_a_guard_comparing_with_a_literal_dtype_is_idempotent():
    """`if q.dtype == k.dtype == torch.float32:` reads metadata only: the block under its else is the kept
    original, not a block to patch again (it was nested once more on every run)."""
    fixed = analyze_source(masked_module(FLOAT_VALUE_PRODUCT), "case.py").fixed
    assert "== torch.float32:" in fixed
    again = analyze_source(fixed, "case.py")
    assert again.fixed == fixed and not [f for f in again.findings if f.kind == "attention"]


def test_a_guard_compiles_without_a_graph_break():
    """`torch.compile(fullgraph=True)` raises on any graph break: the check reads metadata only, on both paths."""
    source = "import math\nimport torch\n\n\ndef attend(q, k, v, mask):\n" + textwrap.indent(
        textwrap.dedent(KEEP_MASK_OF_ANY_RANK).strip("\n") + "\nreturn out\n", " " * 4)
    fixed = analyze_source(source, "attend.py").fixed
    assert "2 <= mask.dim() <= q.dim()" in fixed
    namespace: dict = {}
    exec(compile(fixed, "attend.py", "exec"), namespace)
    compiled = torch.compile(namespace["attend"], fullgraph=True, backend="eager")
    q, k, v = torch.randn(3, 1, 2, 8, 4).unbind(0)
    for mask in (torch.rand(1, 1, 1, 8) > 0.2, torch.rand(8) > 0.2):  # the SDPA path, then the original block
        torch.testing.assert_close(compiled(q, k, v, mask), namespace["attend"](q, k, v, mask))


def test_a_mask_indexed_under_its_not_none_test_is_guarded():
    """`if mask is not None:` then `mask[0]`: the original indexes it whenever it is not None, so the check may."""
    body = """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask[0], float("-inf"))
    out = scores.softmax(dim=-1) @ v
    """
    finding = _finding(masked_module(body))
    assert "mask-rank" in _names(finding, "guarded") and "mask is None or" in finding.patch
    original, patched = _models(masked_module(body))
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    for mask in (torch.ones(1, 5, dtype=torch.bool), torch.ones(1, 2, 1, 1, 5, dtype=torch.bool), None):
        with torch.no_grad():  # a 1-D mask[0] runs the original; a 4-D one, and None, SDPA
            torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)


UNSQUEEZED_PADDING = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2):
        super().__init__()
        self.num_heads = num_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)

    def forward(self, x, key_padding_mask):
        b, n, c = x.shape
        q, k, v = self.in_proj(x).view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        attn_weights = torch.matmul(q, k.transpose(-1, -2)) * 0.3535533905932738
        attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(dim=2).bool(),
                                                float("-inf"))
        attn_weights = F.softmax(attn_weights, dim=-1)
        return torch.matmul(attn_weights, v).transpose(1, 2).reshape(b, n, c)
"""


@pytest.mark.parametrize("shape", [(2, 5), (1, 1, 5)], ids=["2-D: SDPA", "3-D, broadcast to 5-D: the original"])
def test_a_mask_unsqueezed_in_the_block_is_guarded_by_its_rank_plus_the_dims_added(shape):
    """fairseq's `key_padding_mask.unsqueeze(1).unsqueeze(2)` (a reach round's p129: mask-rank assumed, so the patch
    was unsafe): the check reads the mask's own rank plus one per `unsqueeze`, without running them."""
    finding = _finding(UNSQUEEZED_PADDING)
    assert finding.fix_safety == "safe" and "mask-rank" in _names(finding, "guarded"), finding.extra["facts"]
    assert "key_padding_mask.dim() + 2 <= 4" in finding.patch  # q is unpacked from a 5-D permute: 4-D
    original, patched = _models(UNSQUEEZED_PADDING)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[..., 3:] = True
    with torch.no_grad():
        torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, mask))) == (len(shape) <= 2)
    for model in (original, patched):  # a 0-d mask: both raise at the second unsqueeze (`2 <= 0 + 2`: the patch's)
        with pytest.raises(IndexError):
            model(x, torch.tensor(True))


def test_a_query_scaled_before_its_view_is_checked_by_the_rank_the_view_gives():
    """fairseq's `q = q * self.scaling` then `q = q.view(...).transpose(1, 2)`: where the guarded statements begin, q
    is not yet the query SDPA gets, so `q.dim()` could not be read there (mask-rank stayed assumed); the view fixes
    its rank at 4, which the check reads instead."""
    source = UNSQUEEZED_PADDING.replace(
        "        q, k, v = self.in_proj(x).view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)\n",
        "        q, k, v = self.in_proj(x).chunk(3, dim=-1)\n        q = q * 0.3535533905932738\n"
        "        q = q.contiguous().view(b, n, self.num_heads, -1).transpose(1, 2)\n"
        "        k = k.contiguous().view(b, n, self.num_heads, -1).transpose(1, 2)\n"
        "        v = v.contiguous().view(b, n, self.num_heads, -1).transpose(1, 2)\n").replace(
        "torch.matmul(q, k.transpose(-1, -2)) * 0.3535533905932738", "torch.matmul(q, k.transpose(2, 3))")
    finding = _finding(source)
    assert finding.fix_safety == "safe" and "mask-rank" in _names(finding, "guarded"), finding.extra["facts"]
    assert "key_padding_mask.dim() + 2 <= 4" in finding.patch and "q.dim()" not in finding.patch
    original, patched = _models(source)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    for mask in (torch.zeros(2, 5, dtype=torch.bool), torch.zeros(1, 1, 5, dtype=torch.bool)):
        mask[..., 3:] = True
        with torch.no_grad():
            torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)


PRE_SCALED_QUERY = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, temperature=8 ** 0.5):
        super().__init__()
        self.temperature = temperature

    def forward(self, q, k, v, mask):
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))
        attn = attn.masked_fill(mask == 0, -1e9)
        attn = F.softmax(attn, dim=-1)
        return torch.matmul(attn, v)
"""


@pytest.mark.parametrize("temperature", [8 ** 0.5, torch.tensor(8 ** 0.5), torch.full((1, 1, 1, 1, 1), 8 ** 0.5)],
                         ids=["number: SDPA", "0-d tensor: the original", "5-D tensor: the original"])
def test_a_query_divided_by_an_attribute_is_checked_through_the_attribute(temperature):
    """jadore801120's `matmul(q / self.temperature, k.transpose(2, 3))` (a reach round's p219: mask-rank and the
    rows assumed, since `q / self.temperature` cannot be read again without dividing): where the temperature is a
    number, q's rank and dtype are the query's, so the check reads q after checking the temperature is one."""
    finding = _finding(PRE_SCALED_QUERY)
    assert finding.fix_safety == "safe" and {"mask-rank", "fully-masked-rows"} <= _names(finding, "guarded"), \
        finding.extra["facts"]
    assert "isinstance(self.temperature, (int, float))" in finding.patch
    original, patched = _constructed(PRE_SCALED_QUERY, temperature)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    mask = torch.ones(2, 1, 5, 5)
    mask[1] = 0  # a padded sample: every row fully masked
    mask[0, ..., 3:] = 0
    torch.testing.assert_close(patched(q, k, v, mask), original(q, k, v, mask), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (q, k, v, mask))) == isinstance(temperature, float)


# A scale that reaches the scores through arithmetic on a parameter (`x / (1.0 / temperature)`): the check
# evaluates that arithmetic again, which runs no user code (the fuzzer's scale_argument family found it unguarded:
# an unsafe patch that raised on a tensor scale)
ARITHMETIC_SCALE = """
scores = (q @ k.transpose(-2, -1)) / (1.0 / scale)
out = scores.softmax(dim=-1) @ v
"""


@pytest.mark.parametrize("scale", [0.25, torch.tensor(0.25)], ids=["number: SDPA", "tensor: the original"])
def test_a_scale_computed_from_a_parameter_is_guarded(scale):
    source = masked_module(ARITHMETIC_SCALE).replace("def forward(self, x, mask):", "def forward(self, x, scale):")
    finding = _finding(source)
    assert finding.fix_safety == "safe" and "scale-is-number" in _names(finding, "guarded")
    assert "isinstance((1.0 / scale), (int, float))" in finding.patch
    original, patched = _models(source)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(patched(x, scale), original(x, scale), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, scale))) == isinstance(scale, float)


# lucidrains' causal mask with a KV prefix: row r masks keys r + S - L + 1 onwards, so every row keeps key 0 exactly
# where S >= L; that is metadata, checked before the SDPA call (public4 p05)
BOTTOM_RIGHT = '''
import torch
import torch.nn.functional as F


def attend(q, k, v):
    sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * 0.5
    i, j = sim.shape[-2:]
    causal_mask = torch.ones((i, j), dtype=torch.bool).triu(j - i + 1)
    sim = sim.masked_fill(causal_mask, -torch.finfo(sim.dtype).max)
    return torch.einsum("b h i j, b h j d -> b h i d", sim.softmax(dim=-1), v)
'''


@pytest.mark.parametrize("keys", [5, 7, 3], ids=["S == L", "S > L", "S < L: rows fully masked, the original"])
def test_a_bottom_right_triangle_is_guarded_by_the_sequence_lengths(keys):
    (finding,) = [f for f in analyze_source(BOTTOM_RIGHT, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "fully-masked-rows" in _names(finding, "guarded")
    assert "q.shape[-2] <= k.shape[-2]" in finding.patch
    original = load_module_from_source(BOTTOM_RIGHT, "bottom_right").attend
    patched = load_module_from_source(analyze_source(BOTTOM_RIGHT, "case.py").fixed, "bottom_right_fixed").attend
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, n, 4, generator=generator) for n in (5, keys, keys))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v))
    assert uses_sdpa(dispatched_ops(_Call(patched), (q, k, v))) == (keys >= 5)


def test_the_triangle_needs_exactly_the_bottom_right_diagonal():
    """A shifted triangle is no bottom-right one (no shape guard); its one finite fill makes the rows it masks
    everywhere uniform, which the patch reproduces (`attention.uniform_rows`) on every shape."""
    shifted = BOTTOM_RIGHT.replace("triu(j - i + 1)", "triu(j - i + 2)")
    (finding,) = [f for f in analyze_source(shifted, "case.py").findings if f.kind == "attention"]
    assert "q.shape[-2] <= k.shape[-2]" not in finding.patch and "fully-masked-rows" in _names(finding, "proved")
    original = load_module_from_source(shifted, "shifted").attend
    patched = load_module_from_source(analyze_source(shifted, "case.py").fixed, "shifted_fixed").attend
    q, k, v = (torch.randn(2, 2, n, 4, generator=torch.Generator().manual_seed(4)) for n in (5, 3, 3))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v))


# GPT-2's buffer slice has 4 dims wherever it is built; the scores' rank is q's (a parameter): `q.dim() >= 4`
SLICED_BUFFER = '''
import math
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(v.size(-1))
        nd, ns = w.size(-2), w.size(-1)
        b = self.bias[:, :, ns - nd:ns, :ns]
        w = w.masked_fill(b == 0, float("-inf"))
        return torch.matmul(w.softmax(dim=-1), v)
'''


@pytest.mark.parametrize("rank", [4, 3], ids=["4-D q: SDPA", "3-D q: the original (a 4-D output)"])
def test_a_mask_built_in_the_block_is_guarded_by_the_querys_rank(rank):
    (finding,) = [f for f in analyze_source(SLICED_BUFFER, "case.py").findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "q.dim() >= 4" in finding.patch
    original = load_module_from_source(SLICED_BUFFER, "sliced").Attention()
    patched = load_module_from_source(analyze_source(SLICED_BUFFER, "case.py").fixed, "sliced_fixed").Attention()
    generator = torch.Generator().manual_seed(4)
    shape = (2, 2, 5, 4)[4 - rank:]
    q, k, v = (torch.randn(*shape, generator=generator) for _ in range(3))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v))
    assert uses_sdpa(dispatched_ops(patched, (q, k, v))) == (rank == 4)


class _Call(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *inputs):
        return self.function(*inputs)


# an `__init__` parameter that defaults to a number may still be given a tensor (a per-head temperature)
CONSTRUCTOR_SCALE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, scale=0.25):
        super().__init__()
        self.heads = heads
        self.scale = scale
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1) @ v
        return out.permute(0, 2, 1, 3).reshape(b, n, c)
'''


@pytest.mark.parametrize("scale", [0.5, torch.full((2, 1, 1), 0.3)], ids=["number: SDPA", "tensor: the original"])
def test_a_constructor_parameter_defaulting_to_a_number_is_guarded(scale):
    """It was proved a number from its default alone: `Attention(scale=torch.full((2, 1, 1), 0.3))` then made the
    safe patch raise (SDPA's `scale=` takes no tensor) where the original ran."""
    finding = _finding(CONSTRUCTOR_SCALE)
    assert finding.fix_safety == "safe" and "scale-is-number" in _names(finding, "guarded")
    fixed = analyze_source(CONSTRUCTOR_SCALE, "case.py").fixed
    torch.manual_seed(0)
    original = load_module_from_source(CONSTRUCTOR_SCALE, "case").Attention(scale=scale)
    patched = load_module_from_source(fixed, "case_fixed").Attention(scale=scale)
    patched.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(patched(x), original(x), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x,))) == isinstance(scale, float)


def test_constructions_that_pass_numbers_prove_the_constructor_scale(tmp_path, capsys):
    from in_process_cli import run_cli

    (tmp_path / "model.py").write_text(CONSTRUCTOR_SCALE + "\n\ndef build():\n    return Attention(), "
                                       "Attention(scale=0.1)\n")
    code, out, _ = run_cli(capsys, "scan", tmp_path / "model.py", "--format", "json", "--no-cache")
    (finding,) = json.loads(out)["findings"]
    assert finding["fix_safety"] == "safe" and "isinstance" not in finding["patch"]
    assert [f["name"] for f in finding["facts"]["from_call_sites"]] == ["scale-is-number"]


# softmax in float32 feeding the value product uncast: the original raises unless v is float32
FLOAT32_WEIGHTS = """
scores = (q @ k.transpose(-2, -1)) * 0.25
out = torch.softmax(scores, dim=-1, dtype=torch.float32) @ v
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_weights_of_a_named_dtype_reach_the_value_product_only_in_that_dtype(dtype):
    """SDPA ran on float64 and bfloat16 inputs, where the original's float32 weights @ v raises."""
    finding = _finding(masked_module(FLOAT32_WEIGHTS))
    assert finding.fix_safety == "safe" and "qkv-dtype" in _names(finding, "guarded")
    assert "q.dtype == k.dtype == v.dtype == torch.float32" in finding.patch
    original, patched = _models(masked_module(FLOAT32_WEIGHTS), dtype)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    if dtype != torch.float32:
        for model in (original, patched):
            with pytest.raises(RuntimeError):
                model(x, None)
        return
    with torch.no_grad():
        torch.testing.assert_close(patched(x, None), original(x, None), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, None)))


@pytest.mark.parametrize("tracer", ["import torch.fx\n\n\ndef features(model):\n    return torch.fx.symbolic_trace(model)\n",
                                    "from torchvision.models.feature_extraction import create_feature_extractor\n\n\n"
                                    "def features(model):\n    return create_feature_extractor(model, ['attn'])\n",
                                    "from torch.fx import Tracer\n\n\ngraph = Tracer().trace(model)\n"])
def test_where_the_tree_traces_modules_with_fx_the_guard_first_asks_for_a_tensor(tmp_path, tracer):
    """A seventh breaker's bug_10: under `torch.fx.symbolic_trace` (torchvision's feature extraction, FX
    quantization, timm's FX features) dtypes and dims are Proxies, and the guard's `q.dtype == k.dtype` raised
    TraceError where the original traced. With a tracer in the tree the guard first checks that q is a tensor: a
    Proxy is not, so tracing records the original block."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(masked_module(KEEP_MASK_OF_ANY_RANK))
    (tmp_path / "features.py").write_text(tracer)
    [result] = [r for r in scan_paths([str(tmp_path)], jobs=1).files if r.path.endswith("model.py")]
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "mask-rank" in _names(finding, "guarded"), finding.extra["facts"]
    assert "if isinstance(q, torch.Tensor) and" in finding.patch
    torch.manual_seed(0)
    original = load_module_from_source(masked_module(KEEP_MASK_OF_ANY_RANK), "case").Attention()
    patched = load_module_from_source(result.fixed, "case_fixed").Attention()
    patched.load_state_dict(original.state_dict())
    x, mask = torch.randn(2, 5, 16), torch.ones(2, 1, 1, 5, dtype=torch.bool)
    traced = torch.fx.symbolic_trace(patched)
    torch.testing.assert_close(traced(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(patched(x, mask), original(x, mask), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, mask)))



@pytest.mark.parametrize("tracer", ["import torch\n\n\ndef export(m, x, mask):\n    return torch.jit.trace(m, (x, mask))\n",
                                    "from torch.onnx import export\n\n\ndef save(m, x, mask):\n"
                                    "    export(m, (x, mask), 'm.onnx')\n",
                                    "import torch\n\n\ndef export(m, x, mask):\n"
                                    "    return torch.jit._trace.trace(m, (x, mask))\n",
                                    "import torch\n\n\ndef export(m, x, mask, how='trace'):\n"
                                    "    return getattr(torch.jit, how)(m, (x, mask))\n"],
                         ids=["torch.jit.trace", "ONNX export", "its defining module", "a computed name"])
def test_where_the_tree_traces_modules_with_jit_trace_the_original_is_recorded(tmp_path, tracer):
    """A ninth breaker's bug_01: torch.jit.trace decides the guard once, by its example inputs, and the recorded
    SDPA branch then raised on a 1-D mask the original's traced graph broadcasts. With a tracer in the tree the
    guard first asks `not torch.jit.is_tracing()`: tracing records the original block, eager runs SDPA."""
    from advisor.engine.static import scan_paths

    (tmp_path / "model.py").write_text(masked_module(KEEP_MASK_OF_ANY_RANK))
    (tmp_path / "export.py").write_text(tracer)
    [result] = [r for r in scan_paths([str(tmp_path)], jobs=1).files if r.path.endswith("model.py")]
    [finding] = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and "if not torch.jit.is_tracing() and" in finding.patch
    torch.manual_seed(0)
    original = load_module_from_source(masked_module(KEEP_MASK_OF_ANY_RANK), "case").Attention()
    patched = load_module_from_source(result.fixed, "case_fixed").Attention()
    patched.load_state_dict(original.state_dict())
    x, mask = torch.randn(2, 5, 16), torch.ones(2, 1, 1, 5, dtype=torch.bool)
    flat = torch.ones(5, dtype=torch.bool)
    flat[3:] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's own warnings about the original's Python values
        traced = torch.jit.trace(patched, (x, mask))
    torch.testing.assert_close(traced(x, flat), original(x, flat), atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, mask)))
    # the kept original under `else:` is the patch's own fallback: a second run changes nothing (a hostile user,
    # round 22: `fix --apply` nested the patch 16 deep, and again on every run)
    (tmp_path / "model.py").write_text(result.fixed)
    [again] = [r for r in scan_paths([str(tmp_path)], jobs=1).files if r.path.endswith("model.py")]
    assert (again.fixed or again.source) == result.fixed


VIEWED_BY_A_SHAPE_NAME = """
import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.head_size = dim // heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None):
        shape = (*x.shape[:-1], -1, self.head_size)
        q = self.query(x).view(shape).transpose(1, 2)
        k = self.key(x).view(shape).transpose(1, 2)
        v = self.value(x).view(shape).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        if attention_mask is not None:
            scores = scores + attention_mask.to(scores.device)
        out = torch.matmul(nn.Softmax(dim=-1)(scores), v)
        return out.permute(0, 2, 1, 3).flatten(2)
"""


def test_a_view_given_one_name_holding_the_shape_has_no_known_rank():
    """BLIP's `view(hidden_shape)`: one argument naming a whole shape was counted as one dim, so q's rank read 1 and
    the mask check became `2 <= m.dim() <= 1` (never true: SDPA never ran)."""
    finding = _finding(VIEWED_BY_A_SHAPE_NAME)
    assert "<= attention_mask.dim() <= q.dim()" in finding.patch and "dim() <= 1" not in finding.patch, finding.patch


INDEXED_CALLER_MASK = '''
import math
import torch
import torch.nn.functional as F


def attend(q, k, v, causal_mask):
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(causal_mask[INDEX] == 0, float("-inf"))
    return F.softmax(att, dim=-1) @ v
'''


@pytest.mark.parametrize("index, check, shapes", [
    (":, :, :T, :T", "2 <= causal_mask.dim() <= q.dim()", [(1, 1, 8, 8), (8, 8, 1, 1, 1)]),
    ("0, :, :T, :T", "2 <= causal_mask.dim() - 1 <= q.dim()", [(2, 1, 8, 8), (1, 8, 8)]),
    ("None, :T, :T", "2 <= causal_mask.dim() + 1 <= q.dim()", [(8, 8), (1, 1, 1, 8, 8)]),
    ("..., :T, :T", "2 <= causal_mask.dim() <= q.dim()", [(1, 8, 8), (8,)]),
])
def test_a_caller_mask_indexed_in_the_block_is_guarded_by_the_rank_indexing_gives(index, check, shapes):
    """nanoGPT's buffer passed in and sliced by the block (`causal_mask[:, :, :T, :T]`, a reach round's p115:
    mask-rank assumed): slices keep a dim whatever their bounds, an int drops one, None adds one; the check reads
    the passed tensor's rank, without the slice (whose bounds the block binds). A mask failing it runs the original,
    one too small to index raises in both."""
    source = INDEXED_CALLER_MASK.replace("INDEX", index)
    finding = _finding(source)
    assert finding.fix_safety == "safe" and _names(finding, "guarded") == {"mask-rank", "kv-length"}, \
        finding.extra["facts"]
    assert check in finding.patch
    original = load_module_from_source(source, "case").attend
    patched = load_module_from_source(finding_fixed := analyze_source(source, "case.py").fixed, "fixed").attend
    assert finding_fixed != source
    q, k, v = (torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    fits, too_many = torch.ones(8, 8).tril().expand(shapes[0]), torch.ones(shapes[1])
    torch.testing.assert_close(patched(q, k, v, fits), original(q, k, v, fits))
    assert _sdpa_calls(patched, q, k, v, fits) == 1
    outcomes = []
    for attend in (original, patched):
        try:
            outcomes.append(attend(q, k, v, too_many))
        except (IndexError, RuntimeError) as error:
            outcomes.append(type(error))
    if isinstance(outcomes[0], torch.Tensor):
        torch.testing.assert_close(outcomes[1], outcomes[0])
    else:
        assert outcomes[0] is outcomes[1]


def test_a_mask_indexed_by_a_name_is_not_guarded_by_its_rank():
    """`m[idx]` with a name may be advanced indexing by a tensor, whose rank the mask's rank does not give."""
    finding = _finding(INDEXED_CALLER_MASK.replace("INDEX", "idx").replace("causal_mask):", "causal_mask, idx):"))
    assert "mask-rank" not in _names(finding, "guarded")


NUMPY_ROOT_SCALE = '''
import numpy as np
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_k):
        super().__init__()
        self.d_k = d_k

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)) / np.sqrt(self.d_k)
        return torch.matmul(nn.Softmax(dim=-1)(scores), v)
'''


@pytest.mark.parametrize("d_k", [4, 4.0, torch.tensor(4.0)], ids=["int: SDPA", "float: SDPA", "tensor: original"])
def test_a_numpy_root_of_a_size_parameter_is_guarded(d_k):
    """The nlp-tutorial's `/ np.sqrt(self.d_k)` (a reach round's p213): `d_k` is named as a size, so a number
    only as a guess; `np.sqrt` of a number is a float, of a tensor a tensor, so the check reads the root itself
    (numpy's code, no user code, no device sync), and the patch is safe and exact for both."""
    finding = _finding(NUMPY_ROOT_SCALE)
    assert finding.fix_safety == "safe" and "scale-is-number" in _names(finding, "guarded"), finding.extra["facts"]
    assert "isinstance(np.sqrt(self.d_k), (int, float))" in finding.patch
    original, patched = _constructed(NUMPY_ROOT_SCALE, d_k)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v))
    assert _sdpa_calls(patched, q, k, v) == (0 if isinstance(d_k, torch.Tensor) else 1)


TENSOR_ROOT_SCALE = NUMPY_ROOT_SCALE.replace("np.sqrt(self.d_k)",
                                             "torch.sqrt(torch.tensor(self.d_k, dtype=torch.float32))")


@pytest.mark.parametrize("d_k", [4, 0, 4.0], ids=["int: SDPA", "0: the original", "float: the original"])
def test_a_root_of_a_tensor_of_a_size_is_guarded_nonzero(d_k):
    """A tutorial's `/ torch.sqrt(torch.tensor(self.d_k, dtype=torch.float32))` (a reach round's p212): the tensor
    divisor holds a 0 exactly where the int it is built from is 0, so that is checked; a 0 keeps the original (NaN
    scores), as does any other value the check cannot read."""
    finding = _finding(TENSOR_ROOT_SCALE)
    assert finding.fix_safety == "safe" and "scale-divisor-nonzero" in _names(finding, "guarded"), \
        finding.extra["facts"]
    assert "isinstance(self.d_k, int) and self.d_k != 0" in finding.patch
    original, patched = _constructed(TENSOR_ROOT_SCALE, d_k)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v), equal_nan=True)
    assert _sdpa_calls(patched, q, k, v) == (1 if d_k == 4 and isinstance(d_k, int) else 0)


INTEGER_SCORES = '''
import torch


def attend(q, k, v):
    attn = torch.matmul(q, k.transpose(-2, -1)) * 0.125
    return torch.matmul(attn.softmax(dim=-1), v)
'''


def test_a_number_scale_that_makes_integer_scores_float_is_an_accepted_fact():
    """A breaker round's bug_07: `* 0.125` makes int64 scores float32, so the original runs on integer q and k with
    float v, where SDPA raises; the proof that q, k and v share a dtype holds for a float query only, which the
    finding now says (`floating-query`, accepted); a query from a float layer proves it."""
    finding = _finding(INTEGER_SCORES)
    assert "floating-query" in _names(finding, "accepted") and finding.fix_safety == "safe"
    from_layer = INTEGER_SCORES.replace("def attend(q, k, v):\n", "class Attention(torch.nn.Module):\n"
                                        "    def __init__(self):\n        super().__init__()\n"
                                        "        self.q = torch.nn.Linear(8, 8)\n\n"
                                        "    def forward(self, x, k, v):\n        q = self.q(x)\n").replace(
        "    attn =", "        attn =").replace("    return", "        return")
    assert "floating-query" not in _names(_finding(from_layer), "accepted")


# EVA's mask: made bool where it is not None (a name the block rebinds), then indexed up to the scores' rank; the
# output's rank is left open (`reshape(b, n, -1)`), so a mask of more dims would broadcast it up in the original
REBOUND_BY_A_CAST = masked_module("""
scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
if mask is not None:
    mask = mask.bool()
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
out = scores.softmax(dim=-1) @ v
""").replace("return out.permute(0, 2, 1, 3).reshape(b, n, c)", "return out.transpose(1, 2).reshape(b, n, -1)")
# muse-maskgit's mask: einops gives it the pattern's four axes, or raises
REARRANGED = """
mask = rearrange(mask.bool(), 'b j -> b 1 1 j')
scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
scores = scores.masked_fill(~mask, float("-inf"))
out = scores.softmax(dim=-1) @ v
"""


def _outcomes(original, patched, x, mask):
    found = []
    for model in (original, patched):
        try:
            with torch.no_grad():
                found.append(model(x, mask))
        except (RuntimeError, einops.EinopsError):
            found.append(None)
    return found


@pytest.mark.parametrize("shape", [(2, 5), (2, 1, 5), None], ids=["2-D: SDPA", "3-D: the original", "None"])
def test_a_mask_rebound_by_a_rank_keeping_cast_is_checked_as_it_was_before(shape):
    """The check reads `mask` where the guarded statements begin, before `mask = mask.bool()`, with the two dims the
    indexing adds (before: mask-rank assumed, the patch unsafe). A 3-D mask broadcasts the original's output to 5-D,
    which its reshape folds: the patch runs the original there."""
    source = REBOUND_BY_A_CAST
    finding = _finding(source)
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-rank" in _names(finding, "guarded") and "2 <= mask.dim() + 2 <= 4" in finding.patch
    original, patched = _models(source)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    mask = None if shape is None else torch.ones(shape, dtype=torch.long)
    if mask is not None:
        mask[..., 3:] = 0
    expected, got = _outcomes(original, patched, x, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert uses_sdpa(dispatched_ops(patched, (x, mask))) == (shape != (2, 1, 5))


@pytest.mark.parametrize("shape", [(2, 5), (2, 1, 5)], ids=["2-D", "3-D: einops raises in both"])
def test_a_mask_rearranged_by_an_einops_pattern_has_the_patterns_rank(shape):
    source = "from einops import rearrange\n" + masked_module(REARRANGED)
    finding = _finding(source)
    assert finding.fix_safety == "safe", finding.reason
    assert "mask-rank" in _names(finding, "proved") and "dim()" not in finding.patch
    original, patched = _models(source)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(shape, dtype=torch.bool)
    mask[..., 3:] = False
    expected, got = _outcomes(original, patched, x, mask)
    assert (expected is None) == (got is None) == (len(shape) == 3)
    if expected is not None:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


# timm's TNT: the attention weights dropped out in place
IN_PLACE_DROPOUT = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.attn_drop = nn.Dropout(p, inplace=True)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * 0.25
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        return (attn @ v).transpose(1, 2).reshape(b, n, c)
'''


@pytest.mark.parametrize("p, train", [(0.0, True), (0.1, False), (0.1, True)],
                         ids=["p=0 training: SDPA", "eval: SDPA", "dropping out: the original, which raises"])
def test_a_dropout_in_place_is_checked_to_drop_nothing(p, train):
    """In place, a dropout that drops anything overwrites the softmax's output, which its backward needs: the
    original's backward raises (breaker round 35), SDPA's would not. Where it drops nothing (eval, p == 0) it writes
    nothing: the patch checks that, and runs the original otherwise (before: refused, timm's TNT lost)."""
    finding = _finding(IN_PLACE_DROPOUT)
    assert finding.fix_safety == "safe" and "dropout-in-place" in _names(finding, "guarded")
    assert "not self.attn_drop.training or self.attn_drop.p == 0" in finding.patch
    fixed = analyze_source(IN_PLACE_DROPOUT, "case.py").fixed
    assert analyze_source(fixed, "case.py").fixed == fixed  # the original kept under `else:` is no finding
    outcomes = []
    for code, name in ((IN_PLACE_DROPOUT, "case"), (fixed, "case_fixed")):
        torch.manual_seed(0)
        model = load_module_from_source(code, name).Attention(p).train(train)
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        try:
            out = model(x)
            (grad,) = torch.autograd.grad(out.sum(), x)
            outcomes.append((out.detach(), grad, uses_sdpa(dispatched_ops(model, (x,)))))
        except RuntimeError:
            outcomes.append(None)
    if p and train:
        assert outcomes == [None, None]
    else:
        (out, grad, _), (patched_out, patched_grad, sdpa) = outcomes
        torch.testing.assert_close(patched_out, out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(patched_grad, grad, atol=1e-5, rtol=1e-5)
        assert sdpa


@pytest.mark.parametrize("pattern, axes", [
    ("b j -> b 1 1 j", 4), ("b n (h d) -> b h n d", 4), ("b h n d -> b n (h d)", 3), ("b j->b () () j", 4),
    ("b(h d) -> b(h d)", 2), ("b ... -> b", None), ("b j -> b ((h) j)", None), ("b j -> b j)", None),
    ("b j", None),
])
def test_an_einops_pattern_gives_its_right_sides_axes(pattern, axes):
    assert pattern_output_axes(pattern) == axes
