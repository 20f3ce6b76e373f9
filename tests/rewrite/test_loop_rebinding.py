"""Attention in a loop whose body rebinds an operand (breaker round 21, bugs 07 and 08): the back edge brings the
new binding to every read in the body, so two reads seeing the same reaching definitions need not see one value.
A generator places the rebinding (a scaling, a slice that shortens the keys, a flip) of q, k, v or the mask at
every point of the body, under `if i == 1:`, `if i > 0:` or always, in `for` and `while` loops: wherever advisor
offers a safe patch, the patched program gives the original's values, or raises where it raises."""

from __future__ import annotations

import textwrap

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

BODY = ["s = q @ k.transpose(-2, -1) * 0.125",
        "s = s.masked_fill(~mask, float('-inf'))",
        "w = s.softmax(dim=-1)",
        "outs.append(w @ v)"]
CHANGES = {"scaled": "{x} * 2.0", "shortened": "{x}[..., 1:, :]", "flipped": "{x}.flip(-2)"}
MASK_CHANGES = {"scaled": "{x} & {x}", "shortened": "{x}[..., 1:]", "flipped": "{x}.flip(-1)"}


@st.composite
def loop_programs(draw) -> str:
    name = draw(st.sampled_from(["q", "k", "v", "mask"]))
    change = draw(st.sampled_from(sorted(CHANGES)))
    rebinding = f"{name} = " + (MASK_CHANGES if name == "mask" else CHANGES)[change].format(x=name)
    condition = draw(st.sampled_from(["if i == 1:", "if i > 0:", ""]))
    statements = [rebinding] if not condition else [condition, "    " + rebinding]
    body = list(BODY)
    at = draw(st.integers(0, len(body)))
    body[at:at] = statements
    if draw(st.booleans()):
        loop, step = "for i in range(3):", []
    else:
        loop, step = "i = 0\nwhile i < 3:", ["i += 1"]
    inner = textwrap.indent("\n".join(body + step), "    ")
    return ("import torch\n\n\ndef attend(q, k, v, mask):\n    outs = []\n" + textwrap.indent(loop, "    ") + "\n" +
            textwrap.indent(inner, "    ") + "\n    return torch.stack(outs)\n")


def _outcome(function, *args):
    try:
        return function(*args)
    except (RuntimeError, IndexError, ValueError) as error:
        return type(error)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(loop_programs())
def test_a_rebinding_in_the_loop_body_never_changes_what_a_safe_patch_computes(source):
    result = analyze_source(source, "loop.py")
    safe = [f for f in result.findings if f.kind == "attention" and f.fix_safety == "safe"]
    if not safe:
        return
    original = load_module_from_source(source, "loop_original")
    patched = load_module_from_source(result.fixed, "loop_patched")
    make = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=make) for n in (3, 5, 5))
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool).tril(diagonal=2)
    expected, got = _outcome(original.attend, q, k, v, mask), _outcome(patched.attend, q, k, v, mask)
    if isinstance(expected, type) or isinstance(got, type):
        assert got is expected, (source, result.fixed, got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=lambda m: f"{m}\n{source}")
