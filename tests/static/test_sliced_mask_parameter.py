"""A mask parameter read through a local the block binds to a slice of it (Whisper's and Llama's `causal_mask =
attention_mask[:, :, :, : key_states.shape[-2]]`), and causal masks whose fill and dtype are a tensor's
(`torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)`): facts proved from the call sites through
the slice, the dtype checked on the parameter before the block, the triangle read once for every float dtype.

Each program is analysed as a file of a scanned tree and every safe patch is held to the original's outputs and
gradients by `fuzz.differential.check`, in float32 and float64.
"""

from __future__ import annotations

import libcst as cst
import pytest

from advisor.patterns.attention.triangles import keeps_first_key_in_every_dtype, square_parts
from advisor.patterns.values import ValueProver
from advisor.static.module_index import ParsedModule
from fuzz.differential import SAFE_OK, analyze, check

PROGRAM = '''import torch
import torch.nn as nn
import torch.nn.functional as F


def make_causal_mask(n, dtype):
    mask = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype)
    return mask.triu(1)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, attention_mask=None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        s = torch.matmul(q * self.scaling, k.transpose(2, 3))
        if attention_mask is not None:
            causal_mask = {read}{between}
            s = s + causal_mask
        p = F.softmax(s, dim=-1)
        return torch.matmul(p, v).transpose(1, 2).reshape(b, n, -1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = Attention(8, 2)  # called without a mask
        self.dec = Attention(8, 2)

    def forward(self, x):
        T = x.shape[1]
        mask = {build}
        return self.dec(self.enc(x), attention_mask=mask)


def make(seed=0):
    torch.manual_seed(seed)
    return Model(){cast}, (torch.randn(2, 5, 8{dtype}),)
'''

SLICE = "attention_mask[:, :, :, : k.shape[-2]]"
WHISPER = "torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]"


def program(read=SLICE, build=WHISPER, between="", double=False) -> str:
    return PROGRAM.format(read=read, build=build, between=between, cast=".double()" if double else "",
                          dtype=", dtype=torch.float64" if double else "")


def _finding(source: str):
    findings = analyze(source, as_file=True).findings
    assert len(findings) == 1, [f.reason for f in findings]
    return findings[0]


def _names(finding, group: str) -> set[str]:
    return {fact["name"] for fact in finding.extra["facts"].get(group, [])}


@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("read", [SLICE, "attention_mask", "attention_mask[..., : k.shape[-2]]",
                                  "attention_mask[:, :, -n:, :]"], ids=["keys-from-0", "alias", "ellipsis", "rows"])
@pytest.mark.parametrize("build", [
    WHISPER,
    "make_causal_mask(T, x.dtype)[None, None]",
    "torch.zeros(T, T, dtype=x.dtype).masked_fill(torch.tril(torch.ones(T, T)) == 0, torch.finfo(x.dtype).min)"
    "[None, None]",
    "torch.full((T, T), -torch.finfo(x.dtype).max, dtype=x.dtype).triu(1)[None, None]",
], ids=["whisper", "helper", "masked-fill", "negated-max"])
def test_a_causal_mask_passed_to_a_sliced_parameter_proves_its_facts_and_keeps_parity(read, build, double):
    source = program(read=read, build=build, double=double)
    finding = _finding(source)
    assert "fully-masked-rows" in _names(finding, "from_call_sites"), finding.extra["facts"]
    assert "mask-rank" in _names(finding, "from_call_sites") | _names(finding, "guarded") | _names(finding, "proved")
    outcome = check(source, as_file=True)
    assert outcome.status == SAFE_OK, (outcome.status, outcome.detail, outcome.notes)


FUNCTION = """import torch


def attend(q, k, v, attention_mask=None):
    s = torch.matmul(q, k.transpose(-2, -1)) * 0.5
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : k.shape[-2]]
        s = s + causal_mask
    return torch.matmul(s.softmax(dim=-1), v)
"""


def test_the_dtype_check_reads_the_parameter_before_the_block():
    """The local is bound inside the guarded statements: the check reads the tensor it indexes (was: assumed)."""
    finding = analyze(FUNCTION).findings[0]
    assert "mask-dtype" in _names(finding, "guarded")
    assert "attention_mask is None or isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == q.dtype" \
        in finding.patch


@pytest.mark.parametrize("build", [
    "torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(0)[None, None]",  # row 0 masked everywhere
    "torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype)[None, None]",
    "torch.full((T, T), 100.0, dtype=x.dtype).triu(1)[None, None]",  # not a fill: weights piled above
    "torch.full((T, T), torch.finfo(x.dtype).max, dtype=x.dtype).triu(1)[None, None]",  # the largest, not a fill
    "torch.full((T, T), -1e4, dtype=x.dtype)[None, None]",  # every key swallowed
], ids=["diagonal-masked", "all-masked", "positive", "finfo-max", "full"])
def test_a_mask_that_may_swallow_a_row_proves_nothing_through_the_slice(build):
    finding = _finding(program(build=build))
    assert "fully-masked-rows" not in _names(finding, "from_call_sites")
    assert finding.fix_safety != "safe" or "fully-masked-rows" in _names(finding, "guarded")


@pytest.mark.parametrize("read, between", [
    ("attention_mask[:, :, :, 1:]", ""),  # the kept key 0 sliced away (the shapes still broadcast at n = 1)
    (SLICE, "\n            attention_mask.mul_(1e9)"),  # the parameter written after the slice: the view sees it
    (SLICE, "\n            causal_mask = causal_mask * 1e9"),  # rebound: not the slice the call passed
    ("attention_mask[:, :, :, : k.shape[-2]] * 1e9", ""),
], ids=["column-0-dropped", "parameter-written", "rebound", "scaled"])
def test_a_slice_that_may_drop_key_0_or_a_local_that_changes_proves_no_row(read, between):
    finding = _finding(program(read=read, between=between))
    assert "fully-masked-rows" not in _names(finding, "from_call_sites")


def test_a_slice_of_rows_keeps_the_rank_claim_a_none_index_does_not():
    finding = _finding(program(read="attention_mask[:, None, :, :]",
                               build="torch.full((T, T), -1e9, dtype=x.dtype).triu(1)[None]"))
    assert "mask-rank" not in _names(finding, "from_call_sites")


def _mask_of(source: str) -> tuple[ParsedModule, cst.BaseExpression]:
    parsed = ParsedModule(source, "m.py")
    return parsed, parsed.module.body[-1].body[0].value


class _Reader:
    def __init__(self, parsed: ParsedModule) -> None:
        self.parsed = parsed
        self.values = ValueProver(parsed, None, None)


@pytest.mark.parametrize("fill, above, keeps", [
    ("torch.finfo(torch.float32).min", -3.4028234663852886e38, True),
    ("torch.finfo(torch.float32).max", 3.4028234663852886e38, False),  # read as -max before
    ("-torch.finfo(torch.float16).max", -65504.0, True),
])
def test_a_named_dtype_s_extreme_keeps_its_sign(fill, above, keeps):
    parsed, mask = _mask_of(f"import torch\nm = torch.zeros(4, 4).masked_fill(torch.tril(torch.ones(4, 4)) == 0, "
                            f"{fill})\n")
    parts = square_parts(_Reader(parsed), mask, lambda name: None)
    assert parts.above == above and parts.keeps_first_key is keeps


@pytest.mark.parametrize("dtype, keeps", [("x.dtype", True), ("y.dtype", False)])
def test_an_unnamed_dtype_is_read_as_each_dtype_it_may_be(dtype, keeps):
    """`dtype=x.dtype` beside `torch.finfo(x.dtype)` is a float; `dtype=y.dtype` alone may be bool, where the fill
    is True (1.0) above the diagonal."""
    parsed, mask = _mask_of(f"import torch\nm = torch.full((4, 4), torch.finfo(x.dtype).min, dtype={dtype}).triu(1)\n")
    assert square_parts(_Reader(parsed), mask, lambda name: None) is None  # no one reading fixes the values
    assert keeps_first_key_in_every_dtype(_Reader(parsed), mask, lambda name: None) is keeps
