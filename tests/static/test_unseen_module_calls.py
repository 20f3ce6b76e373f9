"""Calls of a module that no use of its class shows (breaker round 58): a submodule reached through an enumeration
handed on, a dotted or computed path, `apply`, or `torch.func.functional_call` may be called with any mask, so the
mask its parent passes proves nothing about the block's rows. Initialisers and type tests that only inspect the
modules keep the proof."""

from __future__ import annotations

import pytest

from advisor.engine.static import scan_paths
from fuzz.differential import analyze

MODEL = '''import operator

import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, d=8, h=2):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x, attention_mask=None):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) / (D // self.h) ** 0.5
        if attention_mask is not None:
            causal_mask = attention_mask[:, :, :, : k.shape[-2]]
            s = s + causal_mask
        return (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, x):
        T = x.shape[1]
        mask = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
        return self.attn(x, attention_mask=mask)


m = M()
outer = nn.ModuleDict({{"blk": m}})
x = torch.randn(2, 5, 8)
bad = torch.full((1, 1, 5, 5), torch.finfo(torch.float32).min)
{use}
'''


def _rows_from_call_sites(use: str) -> bool:
    (finding,) = analyze(MODEL.format(use=use), as_file=True).findings
    return "fully-masked-rows" in {fact["name"] for fact in finding.extra["facts"].get("from_call_sites", [])}


def test_the_parent_s_mask_proves_the_rows_where_every_call_is_seen():
    assert _rows_from_call_sites("y = m(x)")


@pytest.mark.parametrize("use", [
    "y = [mod for _, mod in m.named_children()][0](x, attention_mask=bad)",
    "y = dict(m.named_children())['at' + 'tn'](x, attention_mask=bad)",
    "y = list(m.children())[0](x, attention_mask=bad)",
    "y = outer.get_submodule('blk.attn')(x, attention_mask=bad)",
    "y = m.get_submodule('at' + 'tn')(x, attention_mask=bad)",
    "y = operator.attrgetter('blk.attn')(outer)(x, attention_mask=bad)",
    "outs = []\nm.apply(lambda mod: outs.append(mod(x, attention_mask=bad)) if hasattr(mod, 'qkv') else None)",
    "y = torch.func.functional_call(m.attn, dict(m.attn.named_parameters()), (x,), {'attention_mask': bad})",
    "def run(module):\n    if hasattr(module, 'qkv'):\n        module.forward(x, attention_mask=bad)\n\n\n"
    "m.apply(run)",
    # breaker round 59: the module first among a loop's targets, or the submodules' table read
    "for c, mk in zip(m.children(), [bad]):\n    c(x, attention_mask=mk)",
    "for (c,) in zip(m.children()):\n    c(x, attention_mask=bad)",
    "for (name, c), mk in zip(m.named_children(), [bad]):\n    c(x, attention_mask=mk)",
    "for c, mk in zip([mm for mm in m.children()], [bad]):\n    c(x, attention_mask=mk)",
    "for c, mk in zip(m._modules.values(), [bad]):\n    c(x, attention_mask=mk)",
    # review: a comprehension that hands the modules on (a dict's keys, a function given each)
    "handed = {mod: 0 for mod in m.children()}\nfor mod in handed:\n    mod(x, attention_mask=bad)",
    "def run(mod):\n    return mod(x, attention_mask=bad)\n\n\nys = [run(mod) for mod in m.children()]",
    # a loop's module handed on in its body, called through `forward`, or kept past the loop
    "def run(mod):\n    return mod(x, attention_mask=bad)\n\n\nfor c in m.children():\n    run(c)",
    "fns = []\nfor c in m.children():\n    fns.append(c)\nfns[0](x, attention_mask=bad)",
    "for c in m.children():\n    c.forward(x, attention_mask=bad)",
    "for c in m.children():\n    getattr(c, 'forward')(x, attention_mask=bad)",
    "for c in m.children():\n    getattr(c, '__call__')(x, attention_mask=bad)",
    "for c in m.children():\n    pass\nc(x, attention_mask=bad)",
    "for c in m.children():\n    pass\nkept = c\nkept(x, attention_mask=bad)",
    "def f():\n    return c(x, attention_mask=bad)\n\n\nfor c in m.children():\n    pass\nf()",
    "def g():\n    for c in m.children():\n        pass\n    return c\n\n\ng()(x, attention_mask=bad)",
    "def g():\n    for c in m.children():\n        keep = lambda: c\n    return keep\n\n\n"
    "g()()(x, attention_mask=bad)",
    "for _, c in m.named_children():\n    nn.Sequential(c)(x, attention_mask=bad) if False else None",
    "for c in m.children():\n    type(c).forward(c, x, attention_mask=bad)",
    "if hasattr(m, 'attn'):\n    getattr(m, 'attn')(x, attention_mask=bad)",
    "if hasattr(m, 'attn'):\n    getattr(m, f'attn')(x, attention_mask=bad)",
    "def hasattr(o, n):\n    return getattr(o, n)(x, attention_mask=bad)\n\n\nhasattr(m, 'attn')",
], ids=["comprehension", "dict-computed-key", "list-indexed", "dotted-path", "computed-path", "attrgetter-dotted",
        "apply-calls", "functional-call", "apply-forward", "zip-first", "zip-alone", "zip-named", "zip-comprehension",
        "modules-table", "dict-comprehension-key", "comprehension-hands-on", "loop-hands-on", "loop-collects",
        "loop-forward", "loop-getattr-forward", "loop-getattr-call", "after-loop", "after-loop-bound",
        "global-read-by-function", "returned-after-loop", "closure-returned", "loop-wrapped", "loop-class-forward",
        "hasattr-then-getattr", "hasattr-then-f-string", "hasattr-rebound"])
def test_a_call_no_use_of_the_class_shows_leaves_the_rows_assumed(use):
    assert not _rows_from_call_sites(use + "\ny = m(x)")


@pytest.mark.parametrize("use", [
    "def init(module):\n    if isinstance(module, nn.Linear):\n        nn.init.zeros_(module.bias)\n\n\nm.apply(init)",
    "m.apply(lambda module: print(type(module)))",
    "dropping = any(isinstance(mod, nn.Dropout) for mod in m.modules())",
    "for name, mod in m.named_modules():\n    print(name, mod.training)",
    "for i, mod in enumerate(m.modules()):\n    print(i, type(mod))",
    "for mod in m.modules():\n    if isinstance(mod, nn.Linear):\n        nn.init.zeros_(mod.bias)\n"
    "print(getattr(mod, 'training'))",
    "def init(model):\n    for mod in model.modules():\n        mod.eval()\n    return model\n\n\ninit(m)",
    "for name, mod in m.named_children():\n    print(name, hasattr(mod, 'qkv'), len(list(mod.parameters())))",
    "has_attention = hasattr(m, 'attn') and hasattr(outer, 'blk.attn')",
], ids=["apply-initialiser", "apply-inspects", "any-isinstance", "loop-inspects", "enumerate-inspects",
        "loop-initialises", "function-loop-method", "loop-named-inspects", "hasattr-tests"])
def test_code_that_only_inspects_the_modules_keeps_the_proof(use):
    assert _rows_from_call_sites(use + "\ny = m(x)")


@pytest.mark.parametrize("caller, proved", [
    ("y = model.m(x)", True),
    ("y = eval('model.m.attn(x, attention_mask=model.bad)')", False),
    ("exec('y = model.m.attn(x, attention_mask=model.bad)')", False),
    ("y = eval(''.join(['model.m.at', 'tn(x, attention_mask=model.bad)']))", False),
    ("def eval(text):\n    return len(text)\n\n\nn = eval('model.m.attn(x, attention_mask=model.bad)')", True),
], ids=["plain", "eval", "exec", "eval-computed", "eval-shadowed"])
def test_code_run_from_a_string_in_another_file_may_call_the_module(tmp_path, caller, proved):
    """Breaker round 60: `eval("model.attn(x, bad)")` in a second file of the tree is a call of the block's
    `forward` that no use of its class shows."""
    (tmp_path / "model.py").write_text(MODEL.format(use=""))
    (tmp_path / "main.py").write_text(f"import torch\n\nimport model\n\nx = torch.randn(2, 5, 8)\n{caller}\n")
    (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    rows = "fully-masked-rows" in {fact["name"] for fact in finding.extra["facts"].get("from_call_sites", [])}
    assert rows is proved
