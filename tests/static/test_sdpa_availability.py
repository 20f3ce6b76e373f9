"""Manual attention kept for a torch without SDPA: the branch of a test of whether torch has it (nanoGPT's
`self.flash = hasattr(torch.nn.functional, 'scaled_dot_product_attention')`) runs exactly where a patch calling
SDPA would raise (breaker round 57), and where torch has SDPA it does not run at all. So it is refused with that
reason; a plain flag (`self.fused`, which a user sets) keeps its patch and the note to enable the flag."""

from __future__ import annotations

import textwrap

import pytest

from advisor.engine.static import analyze_source

MANUAL = """s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
o = torch.matmul(F.softmax(s, dim=-1), v)"""


def _module(prelude: str, init: str, forward: str) -> str:
    forward = textwrap.dedent(forward).strip("\n").format(manual=textwrap.indent(MANUAL, "    "), flat=MANUAL)
    body = textwrap.indent(forward, " " * 8)
    return (f"import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n{prelude}\n\n"
            f"class A(nn.Module):\n    def __init__(self):\n        super().__init__()\n        {init}\n\n"
            f"    def forward(self, q, k, v):\n{body}\n        return o\n")


BRANCH = """
if {test}:
    o = F.scaled_dot_product_attention(q, k, v)
else:
{manual}
"""
FORMS = {
    "hasattr in the test": ("", "pass", BRANCH.replace("{test}", 'hasattr(F, "scaled_dot_product_attention")')),
    "negated getattr": ("", "pass", """
if getattr(F, "scaled_dot_product_attention", None) is None:
{manual}
else:
    o = F.scaled_dot_product_attention(q, k, v)
"""),
    "flag of a try import": ("try:\n    from torch.nn.functional import scaled_dot_product_attention\n"
                             "    HAS_SDPA = True\nexcept ImportError:\n    HAS_SDPA = False", "pass",
                             BRANCH.replace("{test}", "HAS_SDPA")),
    "module-level hasattr flag": ('FLASH = hasattr(torch.nn.functional, "scaled_dot_product_attention")', "pass",
                                  BRANCH.replace("{test}", "FLASH")),
    "nanoGPT's attribute": ("", 'self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")',
                            BRANCH.replace("{test}", "self.flash")),
    "early return": ("", 'self.flash = hasattr(F, "scaled_dot_product_attention")', """
if self.flash:
    return F.scaled_dot_product_attention(q, k, v)
{flat}
"""),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_branch_for_a_torch_without_sdpa_is_refused(form):
    source = _module(*FORMS[form])
    compile(source, "m.py", "exec")
    result = analyze_source(source, "m.py", unsafe_fixes=True)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.rule == "ADV103" and not finding.fixable
    assert "has no scaled_dot_product_attention" in finding.reason
    assert result.fixed == source


def test_a_flag_the_user_sets_keeps_its_patch_and_the_note():
    source = _module("", "self.fused = True", BRANCH.replace("{test}", "self.fused"))
    result = analyze_source(source, "m.py")
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    assert finding.fix_safety == "safe" and finding.fixable
    assert "already calls scaled_dot_product_attention: enable it" in finding.reason
