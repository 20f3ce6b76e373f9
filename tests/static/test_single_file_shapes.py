"""A file scanned alone is its own tree: whether code may change a tensor's shape in place (`.data =`, `resize_`)
is read from its own text. It counted as changing shapes, so a learned bias gathered from a parameter by an index
buffer (timm's LeViT, EfficientFormer) kept its rank assumed wherever the file also ran `self.apply(partial(...))`,
which may write buffers (keeping their shapes unless something changes shapes in place)."""

from __future__ import annotations

import pytest

from fuzz.differential import SAFE_OK, analyze, check

MODEL = '''from functools import partial

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, side=3):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        n = side * side
        self.attention_biases = nn.Parameter(torch.empty(heads, n))
        self.register_buffer("attention_bias_idxs", torch.empty((n, n), dtype=torch.long), persistent=False)
        self.attention_bias_cache = {{}}
        self.side = side
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.attention_biases, std=0.5)
        pos = torch.stack(torch.meshgrid(torch.arange(self.side), torch.arange(self.side), indexing="ij")).flatten(1)
        rel = (pos[..., :, None] - pos[..., None, :]).abs()
        self.attention_bias_idxs.copy_(rel[0] * self.side + rel[1])
        self.attention_bias_cache = {{}}

    def get_attention_biases(self, device):
        if self.training:
            return self.attention_biases[:, self.attention_bias_idxs]
        key = str(device)
        if key not in self.attention_bias_cache:
            self.attention_bias_cache[key] = self.attention_biases[:, self.attention_bias_idxs]
        return self.attention_bias_cache[key]

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = q @ k.transpose(-2, -1) * self.scale + self.get_attention_biases(x.device)
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, N, C)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.init_weights()

    def init_weights(self, needs_reset=True):
        self.apply(partial(self._init_weights, needs_reset=needs_reset))

    def _init_weights(self, m, needs_reset=True):
        if needs_reset and hasattr(m, "reset_parameters"):
            m.reset_parameters()

    def forward(self, x):
        return self.attn(x)
{extra}

def make(seed=0):
    torch.manual_seed(seed)
    return Net().eval(), (torch.randn(2, 9, 16),)
'''


def _assumed(source: str) -> set[str]:
    finding = next(f for f in analyze(source, as_file=True).findings if f.kind == "attention")
    return {fact["name"] for fact in finding.extra["facts"].get("assumed", [])}


def test_a_gathered_learned_bias_keeps_its_rank_in_a_file_that_changes_no_shape():
    source = MODEL.format(extra="")
    assert "mask-rank" not in _assumed(source)
    outcome = check(source, as_file=True)
    assert outcome.status == SAFE_OK and outcome.safe_patches == 1, (outcome.status, outcome.detail)


@pytest.mark.parametrize("extra", [
    "\n\ndef squeeze_all(model):\n    for b in model.buffers():\n        b.unsqueeze_(0)\n",
    "\n\ndef swap(model, t):\n    model.attn.attention_bias_idxs.data = t\n",
    "\n\ndef grow(t):\n    t.resize_(1, 81)\n",
], ids=["unsqueeze_", "data-assignment", "resize_"])
def test_a_file_that_may_change_shapes_in_place_keeps_the_rank_assumed(extra):
    assert "mask-rank" in _assumed(MODEL.format(extra=extra))
