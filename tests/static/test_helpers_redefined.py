"""A helper the block calls is read from its one definition only where nothing else binds its name when the module
or class has run: a second `def` in a module-level `if True:`, `for` or `with` block (or in the class body's), a
write of its `__code__`, `globals()[name] = ...` or `setattr(sys.modules[__name__], name, ...)` replace it (breaker
round 12, bugs 20 to 23: a softmax of `x * 3` or an unscaled score helper that runs, read as the first definition:
1.0 in fp32). Where it is the one definition, the helper is still read and the patch is exact."""

from __future__ import annotations

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

MODULE_HELPER = '''import math
import sys
import torch
from torch import nn


def softmax(x):
    return torch.softmax(x, dim=-1)

{again}

class Attn(nn.Module):
    def forward(self, q, k, v):
        w = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        return softmax(w) @ v
'''
METHOD_HELPER = '''import math
import torch
from torch import nn


class Attn(nn.Module):
    def scores(self, q, k):
        return q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
{again}
    def forward(self, q, k, v):
        return torch.softmax(self.scores(q, k), dim=-1) @ v
'''
REPLACED = {
    "if block": (MODULE_HELPER, "if True:\n    def softmax(x):\n        return torch.softmax(x * 3.0, dim=-1)\n"),
    "for block": (MODULE_HELPER, "for _ in range(1):\n    def softmax(x):\n        return torch.softmax(x * 3.0, -1)\n"),
    "globals": (MODULE_HELPER, 'globals()["softmax"] = lambda x: torch.softmax(x * 3.0, dim=-1)\n'),
    "setattr on the module": (MODULE_HELPER,
                              'setattr(sys.modules[__name__], "softmax", lambda x: torch.softmax(x * 3.0, -1))\n'),
    "__code__": (MODULE_HELPER, "def _tripled(x):\n    return torch.softmax(x * 3.0, dim=-1)\n\n\n"
                                "softmax.__code__ = _tripled.__code__\n"),
    "star import after it": (MODULE_HELPER, "from tripled_softmax import *\n"),
    "class body if block": (METHOD_HELPER, "\n    if True:\n        def scores(self, q, k):\n"
                                           "            return q @ k.transpose(-1, -2)\n"),
}


def _run(source: str, name: str) -> torch.Tensor:
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    return load_module_from_source(source, name).Attn()(q, k, v)


@pytest.mark.parametrize("template, again", REPLACED.values(), ids=REPLACED)
def test_a_helper_bound_again_gets_no_patch_that_changes_values(template, again, tmp_path, monkeypatch):
    (tmp_path / "tripled_softmax.py").write_text("import torch\n\n\ndef softmax(x):\n"
                                                 "    return torch.softmax(x * 3.0, dim=-1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = template.format(again=again)
    result = analyze_source(source, "helper.py")
    torch.testing.assert_close(_run(result.fixed, "helper_fixed"), _run(source, "helper"))


@pytest.mark.parametrize("template", [MODULE_HELPER, METHOD_HELPER], ids=["function", "method"])
def test_a_helper_defined_once_is_read(template):
    source = template.format(again="")
    result = analyze_source(source, "helper.py")
    assert "scaled_dot_product_attention" in result.fixed
    torch.testing.assert_close(_run(result.fixed, "helper_fixed"), _run(source, "helper"))
