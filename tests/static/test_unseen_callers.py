"""Calls the call-site reader did not see, each found by a seventh breaker in real projects' spellings: a re-export
through a plain module, a submodule reached as an attribute of its package, `from . import f` of a package's
`__init__.py`, a lookup by a computed name, a call written in a string (a notebook exported as a script), a module
called through `.children()`, and a subclass rebinding the caller's buffer. Each left a fact proved from call sites
that the unseen call breaks (NaN rows made finite, weights returned as None to a caller that reads them): now the
fact is not proved from those sites. The same trees without the unseen call keep the proof."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor.engine.static import scan_paths

ATTEND = '''
import math
import torch


def attend(q, k, v):
    w = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(dim=-1)
    return w @ v, w
'''
DROPS = "from .attention import attend\n\n\ndef run(q, k, v):\n    out, _ = attend(q, k, v)\n    return out\n"

WEIGHTS_READ = {
    "reexported_by_a_module": {
        "functional.py": "from .attention import attend\n",
        "viz.py": "from .functional import attend\n\n\ndef maps(q):\n    return attend(q, q, q)[1]\n",
    },
    "reexported_under_another_name": {
        "functional.py": "from .attention import attend as sdpa_like\n",
        "viz.py": "from .functional import sdpa_like\n\n\ndef maps(q):\n    return sdpa_like(q, q, q)[1]\n",
    },
    "submodule_of_an_imported_package": {
        "layers/__init__.py": "from . import attention\n",
        "layers/attention.py": None,  # the module under test moves into the package
        "viz.py": "from . import layers\n\n\ndef maps(q):\n    return layers.attention.attend(q, q, q)[1]\n",
    },
    "computed_name": {
        "viz.py": "from . import attention\n\n\ndef maps(q, impl='att'):\n"
                  "    return getattr(attention, f'{impl}end')(q, q, q)[1]\n",
    },
    "call_in_a_magic_string": {
        "explore.py": "from .attention import attend\nq = None\n"
                      "get_ipython().run_line_magic('time', 'w = attend(q, q, q)[1]')\n",
    },
}


def _tree(root: Path, files: dict[str, str | None], module: str = "attention.py") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text("")
    target = next((name for name, text in files.items() if text is None), module)
    for name, text in {module: None, "model.py": DROPS, **files}.items():
        if name == module and target != module:
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(ATTEND if text is None else text.replace(".attention", ".layers.attention")
                                 if target != module and name == "model.py" else text)
    return root


def _attention(root: Path):
    [finding] = [f for f in scan_paths([str(root)], jobs=1).findings if f.kind == "attention"]
    return finding


def test_the_one_visible_caller_dropping_the_weights_proves_the_patch(tmp_path):
    finding = _attention(_tree(tmp_path / "pkg", {}))
    assert finding.fix_safety == "safe", finding.reason


@pytest.mark.parametrize("name", sorted(WEIGHTS_READ))
def test_a_caller_the_reader_did_not_see_reading_the_weights_keeps_the_patch_unsafe(tmp_path, name):
    finding = _attention(_tree(tmp_path / "pkg", WEIGHTS_READ[name]))
    assert finding.fix_safety != "safe", (name, finding.extra.get("facts"))


def test_from_dot_import_of_a_packages_own_function_is_a_use(tmp_path):
    """`ops/__init__.py` defines the function; `ops/viz.py` imports it with `from . import attend`, a file that never
    spells `ops`."""
    root = tmp_path / "pkg"
    (root / "ops").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "ops" / "__init__.py").write_text(ATTEND)
    (root / "model.py").write_text(DROPS.replace(".attention", ".ops"))
    assert _attention(root).fix_safety == "safe"
    (root / "ops" / "viz.py").write_text("from . import attend\n\n\ndef maps(q):\n    return attend(q, q, q)[1]\n")
    assert _attention(root).fix_safety != "safe"


BLOCK = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, bias=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = q @ k.transpose(-2, -1) * 0.35
        if bias is not None:
            s = s + bias
        return s.softmax(dim=-1) @ v


class Causal(nn.Module):
    def __init__(self, dim=8, n=16):
        super().__init__()
        self.attn = Attention(dim)
        self.register_buffer("causal", torch.full((n, n), float("-inf")).triu(1), persistent=False)

    def forward(self, x):
        n = x.shape[1]
        return self.attn(x, bias=self.causal[:n, :n])
'''


@pytest.mark.parametrize("extra, proved", [
    ("", True),
    # a module called through an enumeration of its parent's children, with a mask no visible call passes
    ("\n\nclass Stack(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.a = Attention()\n"
     "\n    def forward(self, x, mask=None):\n        for layer in self.children():\n"
     "            x = x + layer(x, bias=mask)\n        return x\n", False),
    # ... that passes only the input: the bias is its default, None, which swallows no row
    ("\n\nclass Stack(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.a = Attention()\n"
     "\n    def forward(self, x):\n        for name, layer in self.named_children():\n            x = layer(x)\n"
     "        return x\n", True),
    ("\n\ndef trunk(model):\n    return nn.Sequential(*list(model.children()))\n", False),
    # an eighth breaker's: a submodule called by a computed name, and an enumeration consumed by next() or unpacking
    ("\n\nclass Stack(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.attn0 = Attention()\n"
     "\n    def forward(self, x, mask, i=0):\n        return getattr(self, f'attn{i}')(x, mask)\n", False),
    ("\n\nclass Stack(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.attn0 = Attention()\n"
     "\n    def forward(self, x, mask, name):\n        layer = getattr(self, name)\n        return layer(x)\n",
     True),  # called with the input only: the bias is its default, None
    ("\n\nclass Stack(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.a = Attention()\n"
     "\n    def forward(self, x, mask):\n        return next(self.children())(x, mask)\n", False),
    ("\n\nclass Stack(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.a = Attention()\n"
     "\n    def forward(self, x, mask):\n        attn, = self.children()\n        return attn(x, mask)\n", False),
    # a subclass of the caller rebinding the buffer it passes: its row 0 masks every key
    ("\n\nclass Strict(Causal):\n    def __init__(self, dim=8, n=16):\n        super().__init__(dim, n)\n"
     "        self.causal = torch.full((n, n), float('-inf')).triu(0)\n", False),
])
def test_module_calls_the_reader_did_not_see(tmp_path, extra, proved):
    (tmp_path / "model.py").write_text(BLOCK + extra)
    finding = _attention(tmp_path)
    from_sites = {fact["name"] for fact in finding.extra["facts"].get("from_call_sites", [])}
    assert ("fully-masked-rows" in from_sites) == proved, finding.extra["facts"]


SCALED = '''
import torch
from torch import nn


{decorator}class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return (q @ k.transpose(-2, -1) * self.head_dim ** -0.5).softmax(dim=-1) @ v


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention(8, 2)

    def forward(self, x):
        return self.attn(x)
'''
REGISTER = "REG = {}\n\n\ndef register(c):\n    REG['attn'] = c\n    return c\n\n\n@register\n"


@pytest.mark.parametrize("decorator, proved", [("", True), (REGISTER, False)])
def test_a_class_its_decorator_may_store_proves_nothing_from_its_constructions(tmp_path, decorator, proved):
    """An eighth breaker's bug_06: `@register` stored the class in a registry that built it with a tensor where the
    visible construction passed numbers; the scale was proved a number and the patch raised TypeError."""
    (tmp_path / "model.py").write_text(SCALED.format(decorator=decorator))
    finding = _attention(tmp_path)
    from_sites = {f["name"] for f in finding.extra["facts"].get("from_call_sites", [])}
    assert ("scale-is-number" in from_sites) == proved, finding.extra["facts"]
