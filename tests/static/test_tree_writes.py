"""Writes another file of the scanned tree makes, unseen by a write-pattern reading (a thirteenth breaker round):
a causal buffer a class registers, handed on by another file before it is written (static/escaping_reads.py), and
the class's registering methods overridden by a subclass there. Each writer runs before the model in the original;
a patch that still passes `is_causal=True` would attend as the class built, where the original attends as written.
The reads that hand nothing on keep the causal patch."""

from __future__ import annotations

import pytest

from advisor.engine.static import scan_paths
from attention_sources import CAUSAL_BUFFER_BLOCK

ATTN = CAUSAL_BUFFER_BLOCK.format(use="return y.transpose(1, 2).contiguous().view(B, L, C)")

HANDED_ON = {
    "set": "reg = set()\n    reg.add(model.bias)\n    for t in reg:\n        t.fill_(1.0)",
    "list +=": "rows = []\n    rows += model.bias\n    rows[0].fill_(1.0)",
    "helper return": "def get(m):\n        return m.bias\n    get(model).fill_(1.0)",
    "buffers()": "next(model.buffers()).fill_(1.0)",
    "attrgetter": "operator.attrgetter('bias')(model).fill_(1.0)",
    "__getattr__": "model.__getattr__('bias').fill_(1.0)",
    "_buffers.get": "model._buffers.get('bias').fill_(1.0)",
    "reduce(getattr)": "functools.reduce(getattr, ['bias'], model).fill_(1.0)",
    "_apply": "model._apply(lambda t: torch.ones_like(t) if t.dim() == 4 else t)",
    "the class's accessor": "model.causal_mask().fill_(1.0)",
    "_buffers.values()": "for buf in model._buffers.values():\n        buf.fill_(1.0)",  # breaker round 18
    "_buffers.items()": "for name, buf in model._buffers.items():\n        buf.fill_(1.0)",
    "state_dict().values()": "for buf in model.state_dict().values():\n        buf.fill_(1.0)",
    "a comprehension's write": "[buf.fill_(1.0) for buf in model.buffers()]",
}
READ_ONLY = {
    "metadata": "print(model.bias.shape, model.bias.dtype)",
    "arithmetic": "print((model.bias * 2).sum())",
    "torch function": "print(torch.count_nonzero(model.bias))",
    # a comprehension's name is its own: the `x` written below is another
    "a comprehension's name": "keys = {x for x in model.state_dict().keys()}\n    x = torch.zeros(2)\n    x += 1",
}
SETUP = '''import functools
import operator

import torch


def prepare(model):
    {body}
'''


def _causal(tmp_path, setup: str) -> bool:
    (tmp_path / "attn.py").write_text(ATTN)
    (tmp_path / "setup.py").write_text(setup)
    (finding,) = scan_paths([str(tmp_path)], jobs=1, cache=False).findings
    assert finding.fix_safety == "safe", finding.reason
    added = [line for line in finding.patch.splitlines() if line.startswith("+")]
    return any("is_causal=True" in line for line in added)


@pytest.mark.parametrize("body", HANDED_ON.values(), ids=HANDED_ON)
def test_a_buffer_handed_on_in_another_file_is_no_longer_read_as_causal(tmp_path, body):
    assert not _causal(tmp_path, SETUP.format(body=body))


@pytest.mark.parametrize("body", READ_ONLY.values(), ids=READ_ONLY)
def test_a_buffer_only_read_in_another_file_keeps_the_causal_patch(tmp_path, body):
    assert _causal(tmp_path, SETUP.format(body=body))


@pytest.mark.parametrize("method", ["register_buffer", "__setattr__", "_apply"])
def test_a_subclass_elsewhere_that_overrides_how_buffers_are_bound_refuses_the_patch(tmp_path, method):
    (tmp_path / "attn.py").write_text(ATTN)
    (tmp_path / "model.py").write_text(
        f"from attn import Attn\n\n\nclass Full(Attn):\n    def {method}(self, *args, **kwargs):\n"
        f"        return super().{method}(*args, **kwargs)\n")
    (finding,) = scan_paths([str(tmp_path)], jobs=1, cache=False).findings
    assert finding.fix_safety != "safe" and method in finding.reason


GATHERED_BIAS = '''import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, d=16, h=2, n=4):
        super().__init__()
        self.h, self.scale = h, (d // h) ** -0.5
        self.qkv = nn.Linear(d, 3 * d)
        self.biases = nn.Parameter(torch.zeros(h, n))
        self.register_buffer("idxs", torch.zeros((n, n), dtype=torch.long), persistent=False)

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        attn = q @ k.transpose(-2, -1) * self.scale + self.biases[:, self.idxs]
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, L, C)
'''
LISTINGS = {"state_dict() kept": "state = model.state_dict()\n    register(state.values())",
            "buffers() handed on": "register(list(model.buffers()))",
            # a record holding a listing: writing its other entries writes no tensor
            "a checkpoint record": "state = {'epoch': 1, 'model': model.state_dict()}\n    state['arch'] = 'attn'\n"
                                   "    register(state)",
            # writes into buffers' elements (timm's `distribute_bn`) keep their ranks
            "buffers averaged in place": "for name, buf in model.named_buffers():\n        buf /= 2.0\n"
                                         "    register(model.state_dict())"}


def _rank_fact(tmp_path, setup: str) -> tuple[str, str]:
    (tmp_path / "attn.py").write_text(GATHERED_BIAS)
    (tmp_path / "setup.py").write_text(setup)
    (finding,) = scan_paths([str(tmp_path)], jobs=1, cache=False).findings
    status = {fact["name"]: status for status, facts in finding.extra["facts"].items() for fact in facts}
    return finding.fix_safety, status["mask-rank"]


@pytest.mark.parametrize("body", LISTINGS.values(), ids=LISTINGS)
def test_a_listing_handed_on_elsewhere_keeps_a_buffers_rank_where_no_file_changes_a_shape(tmp_path, body):
    """Code handed a module's tensors can change their rank or dtype only in place (`unsqueeze_`, `set_`, a `.data`
    assignment): where no file of the tree names one, the index buffer keeps its rank and the gather its 3 dims."""
    assert _rank_fact(tmp_path, SETUP.format(body=body)) == ("safe", "proved")


@pytest.mark.parametrize("body", LISTINGS.values(), ids=LISTINGS)
def test_a_listing_handed_on_where_the_tree_changes_shapes_in_place_leaves_the_rank_unproved(tmp_path, body):
    setup = SETUP.format(body=body) + "\n\ndef register(tensors):\n    for t in tensors:\n        t.unsqueeze_(0)\n"
    assert _rank_fact(tmp_path, setup) == ("unsafe", "assumed")
