"""A mask fill read through a helper of the file (lucidrains' `def max_neg_value(t): return
-torch.finfo(t.dtype).max`, DALLE-pytorch, stable-diffusion): the call is read as the finfo extreme written in place.
Parity on fully masked rows is in tests/rewrite/test_fully_masked_rows.py (`finfo_helper`); here, every helper that
does not return exactly its parameter's dtype's most negative number leaves the fill unread (a refusal)."""

from __future__ import annotations

import pytest

from advisor.engine.static import analyze_source

SOURCE = '''
import torch
import torch.nn.functional as F


{helper}


def attend(q, k, v, keep):
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    scores = scores.masked_fill(~keep, {call})
    return F.softmax(scores, dim=-1) @ v
'''

HELPER = "def max_neg_value(t):\n    return -torch.finfo(t.dtype).max"


def _attention(helper: str, call: str = "max_neg_value(scores)"):
    (finding,) = [f for f in analyze_source(SOURCE.format(helper=helper, call=call), "case.py").findings
                  if f.kind == "attention"]
    return finding


@pytest.mark.parametrize("helper", [HELPER, "def max_neg_value(t):\n    return torch.finfo(t.dtype).min",
                                    'def max_neg_value(t):\n    """Docstring."""\n    return -torch.finfo(t.dtype).max'])
def test_the_helper_reads_as_the_dtype_extreme(helper):
    finding = _attention(helper)
    assert finding.fix_safety == "safe" and finding.patch, finding.reason


@pytest.mark.parametrize("helper, call", [
    ("def max_neg_value(t):\n    return torch.finfo(t.dtype).max", "max_neg_value(scores)"),  # positive
    ("def max_neg_value(t):\n    return -torch.finfo(t.dtype).tiny", "max_neg_value(scores)"),  # not large
    ("def max_neg_value(t, s=1.0):\n    return -torch.finfo(t.dtype).max * s", "max_neg_value(scores)"),
    (HELPER + "\n\n\nmax_neg_value = lambda t: 0.0", "max_neg_value(scores)"),  # rebound
    ("@torch.no_grad()\n" + HELPER, "max_neg_value(scores)"),  # a decorator may replace it
    (HELPER, "max_neg_value(t=scores)"),
])
def test_other_helpers_leave_the_fill_unread(helper, call):
    finding = _attention(helper, call)
    assert finding.fix_safety != "safe"
    assert "is not provably -inf or a large negative number" in (finding.reason or "")


@pytest.mark.parametrize("helper, fill", [
    ("", 'float("-1e20")'),  # aladdinpersson's tutorial
    ("", "float('-1e9')"),
    ("", "float(-1e9)"),
    ("", "int(-1e9)"),
    ("", "-2 ** 32 + 1"),  # DeepCTR's
    ("NEG_INF = -1e9", "NEG_INF"),
    ("NEG_INF = -1e4 * 1e5", "NEG_INF"),
])
def test_fills_the_source_fixes_as_constants_are_read(helper, fill):
    """A reach round's p124-p126, p613: each fill is a large negative number once folded, and was refused as "not
    provably -inf or a large negative number"."""
    finding = _attention(helper, fill)
    assert finding.fix_safety == "safe" and finding.patch, finding.reason
    import torch
    from fixture_models import load_module_from_source

    source = SOURCE.format(helper=helper, call=fill)
    original = load_module_from_source(source, "fill_constant")
    patched = load_module_from_source(analyze_source(source, "case.py").fixed, "fill_constant_fixed")
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    keep = torch.rand(2, 1, 1, 5, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[..., 0] = True
    torch.testing.assert_close(patched.attend(q, k, v, keep), original.attend(q, k, v, keep))


@pytest.mark.parametrize("helper, fill", [
    ("NEG_INF = -1e9\n\n\ndef reset():\n    global NEG_INF\n    NEG_INF = 0.0", "NEG_INF"),  # rebound
    ("NEG_INF = -1e9\nNEG_INF = -1.0", "NEG_INF"),  # two values, one not a mask fill
    ("", 'float("-1")'),  # not large
    ("float = lambda s: 0.0", 'float("-1e9")'),  # not the builtin
    ("", "-2 ** 0.5"),
    # an eighth breaker's: rebound by name through globals(), a class body's `global`, a star import
    ("NEG_INF = -1e9\nglobals()['NEG_INF'] = 0.0", "NEG_INF"),
    ("NEG_INF = -1e9\n\n\nclass Reset:\n    global NEG_INF\n    NEG_INF = 0.0", "NEG_INF"),
    ("NEG_INF = -1e9\nfrom consts import *", "NEG_INF"),
    # a ninth's: module-level `vars()` is `globals()`; `exec` runs any assignment
    ("NEG_INF = -1e9\nvars()['NEG_INF'] = -1.0", "NEG_INF"),
    ("NEG_INF = -1e9\nexec('NEG_INF = -1.0')", "NEG_INF"),
])
def test_other_constants_leave_the_fill_unread(helper, fill):
    finding = _attention(helper, fill)
    assert not finding.fixable or finding.fix_safety != "safe", finding.reason


@pytest.mark.parametrize("patcher", ["from unittest import mock\nimport attn\nmock.patch.object(attn, 'NEG_INF', 0.0).start()",
                                     "from unittest import mock\nmock.patch('attn.NEG_INF', 0.0).start()",
                                     "def test(monkeypatch):\n    monkeypatch.setattr('attn.NEG_INF', 0.0)"])
def test_a_fill_constant_patched_by_name_in_another_file_is_unread(tmp_path, patcher):
    """An eighth breaker's bug_05: `mock.patch.object(attn, "NEG_INF", 0.0)` made the fill 0 (the original masked
    nothing; the patch masked: output 0.749 off)."""
    from advisor.engine.static import scan_paths

    (tmp_path / "attn.py").write_text(SOURCE.format(helper="NEG_INF = -1e9", call="NEG_INF"))
    (tmp_path / "other.py").write_text(patcher + "\n")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert not finding.fixable or finding.fix_safety != "safe", finding.extra.get("facts")
