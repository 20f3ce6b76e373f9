"""Bindings the flow once missed. One-line suites (`if mask is not None: s = s + mask`, `if flag: out = w`,
`for ...: s = s * c`) bind names like any block: the flow skipped their small statements, so a mask added on one
line was dropped by a safe patch and a weights read on one line after the product read a deleted name (NameError
where the original ran). Assignment expressions (`(q := q * 2)`) bind names too: one that rebinds q between the
scores and the product made the SDPA call read the new q. So does `except E as q:`, which unbinds q as it ends.

Each form is patched with safe fixes only and run original against patched on every path its tests can take:
the same values, or the same exception type.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

HEAD = "import torch\n\n\ndef f(q, k, v, mask=None, flag: bool = False):\n"
FORMS = {
    "mask_added": ["s = q @ k.transpose(-2, -1) * 0.35", "if mask is not None: s = s + mask",
                   "w = s.softmax(-1)", "return w @ v"],
    "mask_filled": ["s = q @ k.transpose(-2, -1) * 0.35",
                    "if mask is not None: s = s.masked_fill(mask < -1, float('-inf'))",
                    "w = s.softmax(-1)", "return w @ v"],
    "else_on_one_line": ["s = q @ k.transpose(-2, -1) * 0.35", "if mask is None: pass", "else: s = s + mask",
                         "w = s.softmax(-1)", "return w @ v"],
    "scale_on_flag": ["s = q @ k.transpose(-2, -1)", "if flag: s = s * 0.5", "w = s.softmax(-1)", "return w @ v"],
    "weights_after_product": ["s = q @ k.transpose(-2, -1) * 0.35", "w = s.softmax(-1)", "out = w @ v",
                              "if flag: out = w", "return out"],
    "weights_zeroed_before_product": ["s = q @ k.transpose(-2, -1) * 0.35", "w = s.softmax(-1)",
                                      "if flag: w = w * 0", "return w @ v"],
    "scaled_in_a_loop": ["s = q @ k.transpose(-2, -1)", "for _ in range(2): s = s * 0.5", "w = s.softmax(-1)",
                         "return w @ v"],
    "scores_in_a_with": ["with torch.no_grad(): s = q @ k.transpose(-2, -1) * 0.35", "w = s.softmax(-1)",
                         "return w @ v"],
    "walrus_rebinds_query": ["s = q @ k.transpose(-2, -1) * 0.35", "w = s.softmax(-1)",
                             "if (q := q * 2).sum() > 1e9: print('big')", "return w @ v"],
    "walrus_binds_mask": ["s = q @ k.transpose(-2, -1) * 0.35", "if (m := mask) is not None: s = s + m",
                          "w = s.softmax(-1)", "return w @ v"],
    "walrus_scales_scores": ["s = q @ k.transpose(-2, -1)", "w = (s := s * 0.35).softmax(-1)", "return w @ v"],
    "walrus_in_a_comprehension": ["s = q @ k.transpose(-2, -1) * 0.35", "w = s.softmax(-1)",
                                  "_ = [(v := v + 1) for _ in range(1) if flag]", "return w @ v"],
    "except_as_query": ["s = q @ k.transpose(-2, -1) * 0.35", "w = s.softmax(-1)",
                        "try: assert not flag", "except AssertionError as q: pass", "return w @ v"],
    "semicolons": ["s = q @ k.transpose(-2, -1); s = s * 0.35", "if flag: s = s + 1.0; s = s * 2",
                   "w = s.softmax(-1); return w @ v"],
}


def _source(lines: list[str]) -> str:
    return HEAD + "".join(f"    {line}\n" for line in lines)


def _outcome(function, *args):
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001 - the exception type is the outcome compared
        return type(exc)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_one_line_suites_keep_their_bindings(name):
    source = _source(FORMS[name])
    fixed = analyze_source(source, "m.py").fixed
    original = load_module_from_source(source, f"suite_{name}").f
    patched = load_module_from_source(fixed, f"suite_{name}_fixed").f
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(5, 5, dtype=torch.float64)
    mask[:, 0] = 0.0  # every row keeps a key
    for given, flag in itertools.product((None, mask), (False, True)):
        expected, got = _outcome(original, q, k, v, given, flag), _outcome(patched, q, k, v, given, flag)
        if isinstance(expected, type):
            assert got is expected, f"{name} mask={given is not None} flag={flag}: {got}"
        else:
            assert not isinstance(got, type), f"{name} mask={given is not None} flag={flag}: raised {got}"
            torch.testing.assert_close(got, expected, msg=lambda m: f"{name} mask={given is not None} "
                                                                    f"flag={flag}: {m}")


def test_a_one_line_mask_still_gets_a_safe_patch():
    """Reach kept: the mask added on one line is read like one in a block (the SDPA path runs where no mask is
    passed, since nothing proves the rows a passed one keeps)."""
    result = analyze_source(_source(FORMS["mask_added"]), "m.py")
    assert [f.fix_safety for f in result.findings] == ["safe"]
    assert "if mask is None" in result.fixed and "scaled_dot_product_attention" in result.fixed


@pytest.mark.parametrize("body", [
    "s = q @ k.transpose(-2, -1) * 0.35; w = s.softmax(-1); return w @ v",
    "s = q @ k.transpose(-2, -1) * 0.35; w = s.softmax(-1); out = w @ v; return out",
])
def test_a_body_on_the_def_line_is_rewritten_whole(body):
    """`def f(q, k, v): s = ...; w = ...; return w @ v` is a suite on the `def` line: the patch removed the
    scores and weights only from statement lines, so this one kept computing them before the SDPA call. (v is k:
    their lengths are one, proved; no guard is needed, which a suite on the `def` line could not hold.)"""
    source = f"import torch\n\n\ndef f(q, k, v): k = v; {body}\n"
    result = analyze_source(source, "m.py")
    assert [f.fix_safety for f in result.findings] == ["safe"]
    patched_line = result.fixed.splitlines()[3]
    assert "softmax" not in patched_line and "transpose" not in patched_line, patched_line
    original = load_module_from_source(source, "def_line").f
    patched = load_module_from_source(result.fixed, "def_line_fixed").f
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(patched(q, k, v), original(q, k, v))
