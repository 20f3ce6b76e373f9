"""A small attention module's source, written around the lines a test gives (`attention`), and the findings of
one source: the builders of the dataflow tests and of the library-form tests."""

from __future__ import annotations

import textwrap

from advisor.engine.static import analyze_source

HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
MAKE = '''

def make(seed: int = 0):
    torch.manual_seed(seed)
    model = Attn()
    return model, (torch.randn(2, 6, 16),)
'''


def attention(forward: str, init: str = "", methods: str = "", after: str = "") -> str:
    """A module `Attn` with two heads of width 8 over (2, 6, 16) inputs; `forward` continues after q, k, v."""
    init = textwrap.indent(textwrap.dedent(init), " " * 8)
    forward = textwrap.indent(textwrap.dedent(forward), " " * 8)
    methods = textwrap.indent(textwrap.dedent(methods), " " * 4)
    return HEAD + f'''
class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
{init}
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
{forward}
{methods}
{textwrap.dedent(after)}''' + MAKE


def findings(source: str):
    return analyze_source(source, "m.py").findings


def the_finding(source: str):
    (finding,) = findings(source)
    return finding


def attention_finding_and_fix(source: str, **options):
    """The one attention finding of a source (there must be one) and the source as `fix` patches it."""
    result = analyze_source(source, "case.py", **options)
    (finding,) = [f for f in result.findings if f.kind == "attention"]
    return finding, result.fixed


def fact_names(finding, status: str) -> set[str]:
    """The names of a finding's facts of one status (proved, guarded, accepted, assumed): none where it has none."""
    return {fact["name"] for fact in finding.extra.get("facts", {}).get(status, [])}
