"""The classes of a file as the rest of the scanned tree sees them (static.class_sites): what each derives from,
what it defines, and which subclasses a class has across files (ProjectFacts.subclasses)."""

from __future__ import annotations

import pytest

from advisor.static.class_sites import ANY_NAME, UNNAMED_BASE, class_sites
from advisor.static.project import ProjectFacts


def _site(source: str):
    [site] = class_sites("m.py", source)
    return site


@pytest.mark.parametrize("source, bases", [
    ("class S(Attn):\n    pass\n", ("Attn",)),
    ("class S(attn.Attn, Mix):\n    pass\n", ("Attn", "Mix")),
    ("class S(Generic[T], Attn):\n    pass\n", ("Generic", "Attn")),
    ("class S(with_metaclass(Meta, Attn)):\n    pass\n", (UNNAMED_BASE,)),  # what a call returns
    ("class S(bases()[0]):\n    pass\n", (UNNAMED_BASE,)),
    ("class S(Sampler[List[int]]):\n    pass\n", ("Sampler",)),
    ("S = type('S', (Attn,), {})\n", ("Attn",)),
    ("S = type('S', make_bases(), {})\n", (UNNAMED_BASE,)),
    # a sixth breaker's: other class factories, a name not a literal
    ("S = types.new_class('S', (Attn,))\n", ("Attn",)),
    ("S = Meta('S', (Attn,), {})\n", ("Attn",)),
    ("S = type.__new__(type, 'S', (Attn,), {})\n", ("Attn",)),
    ("S = type(str('S'), (Attn,), {})\n", ("Attn",)),
])
def test_the_bases_are_named_by_their_last_name(source, bases):
    assert _site(source).bases == bases


@pytest.mark.parametrize("source, defines", [
    ("class S(Attn):\n    scale = 2\n\n    def norm(self, s):\n        return s\n", {"scale", "norm"}),
    ("class S(Attn):\n    def __init__(self):\n        self.scale = 2\n        self.register_buffer('bias', b)\n",
     {"__init__", "scale", "bias"}),
    ("class S(Attn):\n    def __init__(self, n):\n        setattr(self, n, 1)\n", {"__init__", ANY_NAME}),
    ("S = type('S', (Attn,), {'norm': f})\n", {"norm"}),
    ("S = type('S', (Attn,), dict(norm=f, scale=2))\n", {"norm", "scale"}),
    ("S = type('S', (Attn,), namespace)\n", {ANY_NAME}),
])
def test_what_a_class_defines(source, defines):
    assert _site(source).defines == defines


@pytest.mark.parametrize("source", [
    "import torch.nn as nn\n\n\nclass A(nn.Module):\n    pass\n",
    "class A(object):\n    pass\n\n\nclass B(torch.nn.Module):\n    pass\n",
    "x = type(y)\n",
])
def test_classes_deriving_from_no_class_of_a_tree_are_left_out(source):
    assert class_sites("m.py", source) == []


def test_subclasses_are_followed_through_the_tree_by_name():
    sites = [*class_sites("a.py", "class Sub(Attn):\n    pass\n"),
             *class_sites("b.py", "class Deeper(Sub):\n    def norm(self):\n        pass\n"),
             *class_sites("c.py", "class Other(Base):\n    pass\n")]
    facts = ProjectFacts(classes=tuple(sites))
    assert [site.name for site in facts.subclasses("Attn")] == ["Sub", "Deeper"]
    assert facts.subclasses("Deeper") == []


def test_a_subclass_of_a_name_bound_to_the_class_derives_from_it():
    """`Base = attn.Attn; class S(Base)` (a sixth breaker's: S's override of an inlined helper went unseen)."""
    source = "import attn\n\nBase = attn.Attn\n\n\nclass S(Base):\n    def norm(self):\n        pass\n"
    sites = class_sites("b.py", source)
    assert [site.name for site in ProjectFacts(classes=tuple(sites)).subclasses("Attn")] == ["Base", "S"]


ATTN_WITH_CAUSAL_BUFFER = '''import math
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

    def forward(self, q, k, v):
        T = q.size(-2)
        w = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        w = w.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return torch.softmax(w, dim=-1) @ v
'''


@pytest.mark.parametrize("write", [
    "self.bias.fill_(1)", "self.bias.copy_(torch.ones(1, 1, n, n))", "self.bias.data = torch.ones(1, 1, n, n)",
    'self._buffers["bias"] = torch.ones(1, 1, n, n)', 'vars(self)["_buffers"]["bias"] = torch.ones(1, 1, n, n)',
    "self.bias[..., 1] = 1", "torch.fill_(self.bias, 1)",
])
def test_a_subclass_in_another_file_writing_the_buffer_in_place_leaves_no_causal_patch(tmp_path, write):
    """A subclass in another file of the tree writes the causal buffer through `self` (breaker round 12, bug 26:
    3.18 in fp32): what the class built is not what its instances hold."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "attn.py").write_text(ATTN_WITH_CAUSAL_BUFFER)
    (package / "other.py").write_text(f"import torch\nfrom pkg.attn import Attn\n\n\nclass Bi(Attn):\n"
                                      f"    def __init__(self, n=8):\n        super().__init__(n)\n        {write}\n")
    import advisor

    advisor.fix([str(tmp_path)], apply=True)  # applies the safe patches only
    patched = (package / "attn.py").read_text()
    assert "is_causal=True" not in patched
    assert "scaled_dot_product_attention" not in patched or "attn_mask" in patched
