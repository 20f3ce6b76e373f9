"""Arguments spread from a fixed display (`inputs = [query, key, value, MASK]`, then `model(*inputs)`: how a
compiler's attention tests call a model; `kw = {"attn_mask": MASK}`, then `model(q, k, v, **kw)`): each element
binds the parameter at its position (or of its key), so the module-level
mask it holds proves its facts from the call as if written there, and the mask is handed only to that call. A name
that may hold anything else where it is spread proves nothing."""

from __future__ import annotations

import shutil

import pytest
import torch

from fixture_models import load_module_from_source
from fuzz.differential import analyze

PROGRAM = '''import math

import torch

torch.manual_seed(0)
MASK = {mask}


class Model(torch.nn.Module):
    def forward(self, query, key, value, attn_mask):
        qk = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        qk = qk + attn_mask
        return torch.softmax(qk, dim=-1) @ value


query = torch.randn(1, 4, 16, 32, requires_grad=True)
key = torch.randn(1, 4, 16, 32)
value = torch.randn(1, 4, 16, 32)
inputs = [query, key, value, MASK]
model = Model()
{use}
'''
SPREAD = "output = model(*inputs)"


def _program(use: str = SPREAD, mask: str = "torch.randn(1, 1, 16, 16)") -> str:
    return PROGRAM.format(use=use, mask=mask)


def _safety(source: str) -> str:
    [finding] = analyze(source, as_file=True).findings
    return finding.fix_safety


@pytest.mark.parametrize("use, mask", [
    (SPREAD, "torch.randn(1, 1, 16, 16)"),
    (SPREAD, "torch.zeros(1, 1, 16, 16)"),
    ("output = model(query, key, value, MASK)", "torch.randn(1, 1, 16, 16)"),  # the list is built and never spread
    ("rest = (query, key)\noutput = model(*rest, value, MASK)", "torch.zeros(16, 16)"),
    ("output = model(*inputs)", "(torch.rand(16, 16) > 0.5) * -2.0"),
    ("kw = {'attn_mask': MASK, 'value': value}\noutput = model(query, key, **kw)", "torch.zeros(1, 1, 16, 16)"),
    ("kw = {'attn_mask': MASK}\noutput = model(query, key, value, **kw)", "torch.randn(16, 16)"),
])
def test_a_mask_spread_from_a_fixed_display_proves_its_rows_and_the_patch_keeps_the_values(tmp_path, use, mask):
    """The program's own run, as written and as `fix --apply` patches it: the same output and query gradient."""
    import advisor

    source = _program(use + "\noutput.sum().backward()", mask)
    assert _safety(source) == "safe"
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "program.py").write_text(source, encoding="utf-8")
    shutil.copytree(tmp_path / "original", tmp_path / "patched")
    advisor.fix(str(tmp_path / "patched"), apply=True, cache=False)
    patched_source = (tmp_path / "patched" / "program.py").read_text(encoding="utf-8")
    assert "scaled_dot_product_attention" in patched_source
    original = load_module_from_source(source, "spread_original")
    patched = load_module_from_source(patched_source, "spread_patched")
    torch.testing.assert_close(patched.output, original.output)
    torch.testing.assert_close(patched.query.grad, original.query.grad)


@pytest.mark.parametrize("use", [
    "inputs.append(torch.zeros(1))\noutput = model(*inputs[:4])",  # the list changes
    "inputs[3] = torch.full((1, 1, 16, 16), -1e9)\noutput = model(*inputs)",
    "inputs = [query, key, value, torch.full((1, 1, 16, 16), -1e9)]\noutput = model(*inputs)",  # bound again
    "print(inputs)\noutput = model(*inputs)",  # read otherwise than spread
    "output = model(*inputs, **{})",
    "output = model(*inputs)\nswallowed = model(query, key, value, torch.full((1, 1, 16, 16), -1e9))",
    "def corrupt(a, b, c, m):\n    m.fill_(-1e9)\n\n\ncorrupt(*inputs)\noutput = model(*inputs)",
    "globals()['inputs'] = [query, key, value, torch.full((1, 1, 16, 16), -1e9)]\noutput = model(*inputs)",
    "kw = {'attn_mask': MASK}\nkw['attn_mask'] = torch.full((1, 1, 16, 16), -1e9)\n"
    "output = model(query, key, value, **kw)",
    "kw = {'attn_mask': MASK}\nkw.update(attn_mask=torch.full((1, 1, 16, 16), -1e9))\n"
    "output = model(query, key, value, **kw)",
    "kw = {'attn_mask': MASK}\noutput = model(*kw)",  # the keys, spread as positions
    "kw = {'attn_mask': MASK, **{'attn_mask': torch.full((1, 1, 16, 16), -1e9)}}\n"
    "output = model(query, key, value, **kw)",
], ids=["append", "element stored", "bound twice", "printed", "keywords spread", "another call swallows rows",
        "written by a function it is spread to", "rebound through globals()", "entry stored", "dict updated",
        "dict spread as positions", "dict with a spread inside"])
def test_a_display_that_may_hold_another_mask_where_it_is_spread_proves_nothing(use):
    assert _safety(_program(use)) != "safe"


def test_a_tensor_after_a_spread_is_held_to_the_parameter_at_its_real_position():
    """`corrupt(*rest, MASK)` hands MASK to corrupt's fourth parameter (the three spread ones first), which fills
    it: the mask is no longer the definition's."""
    use = ("rest = [query, key, value]\n\n\ndef corrupt(a, b, c, m):\n    m.fill_(-1e9)\n\n\n"
           "corrupt(*rest, MASK)\noutput = model(query, key, value, MASK)")
    source = _program(use, "torch.zeros(1, 1, 16, 16)")
    [finding] = analyze(source, as_file=True).findings
    assert "fully-masked-rows" not in {fact["name"] for fact in finding.extra["facts"]["proved"]}
    assert finding.fix_safety != "safe"


def test_a_display_another_file_names_proves_nothing(tmp_path):
    """Another module of the tree that imports the program may change its list (`program.inputs[3] = m`)."""
    from advisor.engine.static import scan_paths

    (tmp_path / "program.py").write_text(_program(), encoding="utf-8")
    (tmp_path / "other.py").write_text("import torch\n\nimport program\n\n"
                                       "program.inputs[3] = torch.full((1, 1, 16, 16), -1e9)\n", encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety != "safe"


@pytest.mark.parametrize("helper", [
    "import sys\n\n\ndef tamper(bad):\n    for value in vars(sys.modules['__main__']).values():\n"
    "        if isinstance(value, list) and len(value) == 4:\n            value[3] = bad\n",
    "import gc\n\n\ndef tamper(bad):\n    for value in gc.get_objects():\n"
    "        if isinstance(value, list) and len(value) == 4:\n            value[3] = bad\n",
    "import sys\n\n\ndef tamper(bad):\n    sys._getframe(1).f_globals['MASK'].fill_(-1e9)\n",
], ids=["__main__'s namespace", "the collector's objects", "a caller's frame"])
@pytest.mark.parametrize("use", [SPREAD, "output = model(query, key, value, MASK)"], ids=["spread", "direct"])
def test_objects_another_file_reaches_without_naming_them_prove_nothing(tmp_path, helper, use):
    """Breaker round 62: a helper that finds the program's list or mask through `sys.modules["__main__"]`, the
    garbage collector or a frame names neither, yet writes them; the mask's definition proves nothing then."""
    from advisor.engine.static import scan_paths

    (tmp_path / "program.py").write_text(
        _program("import helper\n\nhelper.tamper(torch.full((1, 1, 16, 16), -1e9))\n" + use), encoding="utf-8")
    (tmp_path / "helper.py").write_text(helper, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety != "safe"


@pytest.mark.parametrize("use", [SPREAD, "output = model(query, key, value, MASK)"], ids=["spread", "direct"])
def test_a_mask_built_by_a_replaced_torch_function_proves_nothing(use):
    """`torch.randn = lambda *s, **k: torch.full(s, -1e9)` before the mask is drawn: its definition reads as a
    bounded draw only where `torch.randn` is torch's."""
    source = _program(use).replace("torch.manual_seed(0)\n", "torch.manual_seed(0)\n"
                                   "torch.randn = lambda *s, **k: torch.full(s, -1e9)\n")
    assert _safety(source) != "safe"
