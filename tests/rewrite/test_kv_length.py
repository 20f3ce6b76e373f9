"""Keys and values of one length (`kv-length`): where they differ the original's value product raises, and SDPA's CPU
kernels read past v and return values (breaker round 19b, bugs 28 and 29). The fact is proved where the source
ties both key axes to one size, else guarded (`k.shape[-2] == v.shape[-2]`: the original runs, and raises)."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source, scan_paths
from fixture_models import load_module_from_source

HEAD = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
'''

FUNCTION = HEAD + '''

def attend(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return s.softmax(dim=-1) @ v
'''

EINSUM = HEAD + '''

def attend(q, k, v):
    s = torch.einsum("bhid,bhjd->bhij", q, k) * 0.125
    return torch.einsum("bhij,bhjd->bhid", s.softmax(dim=-1), v)
'''

MODULE = HEAD + '''

class Attention(nn.Module):
    def __init__(self, d=16, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.to_kv = nn.Linear(d, 2 * d)
        self.to_q = nn.Linear(d, d)
        self.to_k = nn.Linear(d, d)
        self.to_v = nn.Linear(d, d)

    def heads_first(self, t):
        shape = t.size()[:-1] + (self.h, 8)
        return t.view(shape).permute(0, 2, 1, 3)

    def heads_inferred(self, t):
        return t.view(t.size(0), -1, self.h, 8).transpose(1, 2)

    def forward(self, x, context, past_k, past_v):
        B, T, C = x.size()
{body}
        s = q @ k.transpose(-2, -1) * 0.125
        return s.softmax(dim=-1) @ v
'''

# each body binds q, k and v of shape (B, heads, length, C // heads), k and v of one length by construction
PROVED = {
    "split_views": '''
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)''',
    "unbind_permuted": '''
        qkv = self.qkv(x).reshape(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)''',
    "indexed_permuted": '''
        qkv = self.qkv(x).reshape(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]''',
    "unpacked_permuted": '''
        q, k, v = self.qkv(x).reshape(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)''',
    "chunk_items": '''
        parts = self.qkv(x).chunk(3, dim=-1)
        q = rearrange(parts[0], "b n (h d) -> b h n d", h=self.h)
        k = rearrange(parts[1], "b n (h d) -> b h n d", h=self.h)
        v = rearrange(parts[2], "b n (h d) -> b h n d", h=self.h)''',
    "mapped_tuple": '''
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.h), (q, k, v))''',
    "mapped_starred_chunks": '''
        q, k, v = (self.to_q(x), *self.to_kv(context).chunk(2, dim=-1))
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.h), (q, k, v))''',
    "helper_method": '''
        q = self.heads_first(self.to_q(x))
        k = self.heads_first(self.to_k(context))
        v = self.heads_first(self.to_v(context))''',
    "einops_context": '''
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.h)
        k = rearrange(self.to_k(context), "b n (h d) -> b h n d", h=self.h)
        v = rearrange(self.to_v(context), "b n (h d) -> b h n d", h=self.h)''',
    "cache_concatenated": '''
        q = self.to_q(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        k = self.to_k(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        v = self.to_v(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        k = torch.cat([past_k, k], dim=-2)
        v = torch.cat([past_k, v], dim=-2)''',
}

# k and v need not have one length: the fact must not be proved (a guard may check it)
UNPROVED = {
    "mapped_other_sources": '''
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(x)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.h), (q, k, v))''',
    "helper_inferring_the_length": '''
        q = self.heads_inferred(self.to_q(x))
        k = self.heads_inferred(self.to_k(context))
        v = self.heads_inferred(self.to_v(x))''',
    "inferred_length": '''
        q = self.to_q(x).view(B, -1, self.h, C // self.h).transpose(1, 2)
        k = self.to_k(context).view(B, -1, self.h, C // self.h).transpose(1, 2)
        v = self.to_v(x).view(B, -1, self.h, C // self.h).transpose(1, 2)''',
    "different_inputs": '''
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.h)
        k = rearrange(self.to_k(context), "b n (h d) -> b h n d", h=self.h)
        v = rearrange(self.to_v(x), "b n (h d) -> b h n d", h=self.h)''',
    "tuple_items": '''
        pair = (self.to_k(context), self.to_v(x))
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.h)
        k = rearrange(pair[0], "b n (h d) -> b h n d", h=self.h)
        v = rearrange(pair[1], "b n (h d) -> b h n d", h=self.h)''',
    "tuple_unpacked": '''
        pair = self.to_k(context), self.to_v(x)
        k, v = pair
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.h)
        k = rearrange(k, "b n (h d) -> b h n d", h=self.h)
        v = rearrange(v, "b n (h d) -> b h n d", h=self.h)''',
    "chunked_along_keys": '''
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.h)
        k, v = rearrange(self.to_k(context), "b n (h d) -> b h n d", h=self.h).chunk(2, dim=-2)''',
    "sliced_values": '''
        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.h)
        k = rearrange(self.to_k(context), "b n (h d) -> b h n d", h=self.h)
        v = k[:, :, 1:]''',
    "cache_other_lengths": '''
        q = self.to_q(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        k = self.to_k(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        v = self.to_v(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        k = torch.cat([past_k, k], dim=-2)
        v = torch.cat([past_v, v], dim=-2)''',
    "sizes_rebound": '''
        q = self.to_q(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        k = self.to_k(context).view(B, T, self.h, C // self.h).transpose(1, 2)
        T = context.shape[1]
        v = self.to_v(context).view(B, T, self.h, C // self.h).transpose(1, 2)''',
}


def _finding(source: str):
    findings = [f for f in analyze_source(source, "case.py").findings if f.kind == "attention"]
    assert len(findings) == 1, [f.reason for f in findings]
    return findings[0]


def _kv_fact(finding) -> tuple[str, dict] | None:
    return next(((state, fact) for state, facts in finding.extra["facts"].items() for fact in facts
                 if fact["name"] == "kv-length"), None)


@pytest.mark.parametrize("name", sorted(PROVED))
def test_one_size_proves_the_fact(name):
    finding = _finding(MODULE.format(body=PROVED[name]))
    state, fact = _kv_fact(finding)
    assert state == "proved", fact
    assert finding.fix_safety == "safe", finding.reason
    assert "shape[-2] ==" not in (analyze_source(MODULE.format(body=PROVED[name]), "case.py").fixed or "")


@pytest.mark.parametrize("name", sorted(UNPROVED))
def test_sizes_the_source_does_not_tie_are_not_proved(name):
    finding = _finding(MODULE.format(body=UNPROVED[name]))
    found = _kv_fact(finding)
    assert found is not None and found[0] != "proved", found


def _outcome(function, *args):
    try:
        return function(*args)
    except RuntimeError as error:
        return type(error)


@pytest.mark.parametrize("source", [FUNCTION, EINSUM], ids=["matmul", "einsum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keys_and_values_of_other_lengths_raise_as_the_original(source, dtype):
    finding = _finding(source)
    assert finding.fix_safety == "safe", finding.reason
    assert _kv_fact(finding)[0] == "guarded"
    original = load_module_from_source(source, "kv_original")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, "kv_patched")
    make = torch.Generator().manual_seed(0)
    for lengths in ((6, 6), (6, 5), (6, 1), (1, 6)):
        q = torch.randn(2, 3, 4, 8, dtype=dtype, generator=make)
        k, v = (torch.randn(2, 3, n, 8, dtype=dtype, generator=make) for n in lengths)
        expected, got = _outcome(original.attend, q, k, v), _outcome(patched.attend, q, k, v)
        if isinstance(expected, type) or isinstance(got, type):
            assert got is expected, (lengths, got, expected)
        else:
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", sorted(PROVED))
def test_proved_patches_keep_values_and_gradients(name):
    source = MODULE.format(body=PROVED[name])
    original = load_module_from_source(source, f"kv_{name}")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, f"kv_{name}_fixed")
    torch.manual_seed(0)
    a = original.Attention().double()
    b = patched.Attention().double()
    b.load_state_dict(a.state_dict())
    x, context = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    past = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(b(x, context, past, past), a(x, context, past, past))


LAYOUTS = ('{t}.view(B, {n}, 2, 8).transpose(1, 2)', 'rearrange({t}, "b n (h d) -> b h n d", h=2)',
           '{t}.reshape(B, {n}, 2, 8).permute(0, 2, 1, 3)', 'self.heads_first({t})',
           'self.heads_first({t})[:, :, :{n}]', '{t}.view(*{t}.shape[:-1], 2, 8).transpose(1, 2)')
AFTER = ('{t}', 'torch.cat([past, {t}], dim=-2)', '{t}[:, :, 1:]', '{t} * 0.5', '{t}.contiguous()', '{t}.float()',
         'torch.cat([{t}, {t}], dim=-2)', '{t}.transpose(-2, -1).transpose(-1, -2)')
GENERATED = HEAD + '''

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def heads_first(self, t):
        shape = t.size()[:-1] + (2, 8)
        return t.view(shape).permute(0, 2, 1, 3)

    def kv(self, x, context, past):
        B, T, _ = x.shape
        S = context.shape[1]
{kv}
        return k, v

    def forward(self, x, context, past):
        B, T, _ = x.shape
        S = context.shape[1]
{kv}
        q = self.to_q(x).view(B, T, 2, 8).transpose(1, 2)
        s = q @ k.transpose(-2, -1) * 0.125
        return s.softmax(dim=-1) @ v
'''


def _chain(draw, name: str) -> list[str]:
    from hypothesis import strategies as st
    source = draw(st.sampled_from(("x", "context")))
    projected = draw(st.sampled_from((f"self.to_{name}({source})", f"self.to_v({source})", source)))
    layout = draw(st.sampled_from(LAYOUTS)).format(t=projected, n=draw(st.sampled_from(("T", "S", "-1"))))
    return [f"        {name} = {layout}", f"        {name} = {draw(st.sampled_from(AFTER)).format(t=name)}"]


def test_generated_key_and_value_chains_proved_only_where_lengths_agree():
    """Soundness of the proof over chains nobody wrote by hand: wherever `kv-length` is proved, k and v built from
    inputs of other lengths (x: 3 rows, context: 5, a cache: 2) have one length, or building them raises."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @st.composite
    def programs(draw):
        lines = _chain(draw, "k")
        lines += ["        v = k"] if draw(st.booleans()) and draw(st.booleans()) else _chain(draw, "v")
        return GENERATED.format(kv="\n".join(lines))

    proved = []

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(programs())
    def check(source):
        found = _kv_fact(_finding(source))
        if found is None or found[0] != "proved":
            return
        model = load_module_from_source(source, f"kv_generated_{len(proved)}").Attention()
        try:
            k, v = model.kv(torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 2, 2, 8))
        except RuntimeError:
            return
        proved.append(source)
        assert k.shape[-2] == v.shape[-2], source

    check()
    assert proved, "no generated program proved the fact: the generator no longer reaches the proof"


TREE_MODEL = '''
import torch
from torch import nn
import utils


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.k = nn.Linear(4, 4)
        self.v = nn.Linear(4, 4)

    def forward(self, x, ctx):
        q = self.q(x)
        k = self.k(ctx)
        utils.prepare(ctx)
        v = self.v(ctx)
        w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return w @ v
'''
SHRINKING_HELPER = '''
def prepare(t):
    t.resize_(*t.shape[:-2], t.shape[-2] - 1, t.shape[-1])
'''
HOOKING_SCRIPT = '''
import torch
from model import Attn

def build():
    model = Attn()
    model.v.register_forward_hook(lambda module, args, out: out[:, 1:])
    return model
'''
INNOCENT_HELPER = '''
def prepare(t):
    return t.shape
'''


@pytest.mark.parametrize("others, proved", [({"utils.py": INNOCENT_HELPER}, True),
                                            ({"utils.py": SHRINKING_HELPER}, False),
                                            ({"utils.py": INNOCENT_HELPER, "train.py": HOOKING_SCRIPT}, False)],
                         ids=["innocent", "shape-changed-in-another-file", "hooked-from-another-file"])
def test_what_another_file_may_do_to_k_or_v_leaves_the_length_unproved(tmp_path, others, proved):
    """Breaker round 20's residuals: a helper of another file resizing the context in place between k's and v's
    layers, a training script hooking the value layer. Proved only where no file of the tree may."""
    (tmp_path / "model.py").write_text(TREE_MODEL)
    for name, text in others.items():
        (tmp_path / name).write_text(text)
    [finding] = [f for f in scan_paths([str(tmp_path)], cache=False).findings if f.kind == "attention"]
    state, fact = _kv_fact(finding)
    assert (state == "proved") is proved, fact
    assert finding.fix_safety == "safe", finding.reason


def test_a_context_shrunk_by_another_files_helper_still_raises(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(TREE_MODEL)
    (tmp_path / "utils.py").write_text(SHRINKING_HELPER)
    [patched] = [result.fixed for result in scan_paths([str(tmp_path)], cache=False).files
                 if result.path.endswith("model.py")]
    assert patched is not None and "scaled_dot_product_attention" in patched
    monkeypatch.syspath_prepend(str(tmp_path))
    for source, name in ((TREE_MODEL, "kv_tree_original"), (patched, "kv_tree_patched")):
        model = load_module_from_source(source, name).Attn()
        with pytest.raises(RuntimeError):
            model(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4))  # 4-D: SDPA's CPU kernels check no length
