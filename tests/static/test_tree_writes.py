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
}
READ_ONLY = {
    "metadata": "print(model.bias.shape, model.bias.dtype)",
    "arithmetic": "print((model.bias * 2).sum())",
    "torch function": "print(torch.count_nonzero(model.bias))",
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
