"""A small attention module's source, written around the lines a test gives (`attention`), and the findings of
one source: the builders of the dataflow tests and of the library-form tests."""

from __future__ import annotations

import textwrap

from advisor.engine.static import analyze_source

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


MASKED_MODULE = '''
import math
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
{body}
        return out.permute(0, 2, 1, 3).reshape(b, n, c)
'''


def masked_module(body: str) -> str:
    """A module `Attention` whose `forward(x, mask)` runs `body` after q, k, v (b, heads, n, 8) and returns `out`
    (b, heads, n, 8) as (b, n, 16): the block under test and the mask its caller passes."""
    return MASKED_MODULE.format(body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))


def findings(source: str):
    return analyze_source(source, "m.py").findings


def the_finding(source: str):
    (finding,) = findings(source)
    return finding


def attention_finding_and_fix(source: str, **options):
    """The one attention finding of a source (there must be one) and the source as `fix` patches it."""
    result = analyze_source(source, "case.py", **options)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    return finding, result.fixed


def fact_names(finding, status: str) -> set[str]:
    """The names of a finding's facts of one status (proved, guarded, accepted, assumed): none where it has none."""
    return {fact["name"] for fact in finding.extra.get("facts", {}).get(status, [])}


# nanoGPT's block with its causal buffer, ending in `{use}` (what the caller does with the output `y`), with a
# module function and a method that view their argument, and an accessor of the buffer
CAUSAL_BUFFER_BLOCK = '''import math
import torch
import torch.nn as nn
import torch.nn.functional as F

T = 8


def merge(t):
    return t.view(t.size(0) * t.size(1), t.size(2), t.size(3))


class Attn(nn.Module):
    def __init__(self, d=16, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

    def _merge(self, t):
        return t.view(t.size(0) * t.size(1), t.size(2), t.size(3))

    def causal_mask(self):
        return self.bias

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, L, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, L, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, L, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :L, :L] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        {use}
'''
