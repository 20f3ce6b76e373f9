"""Which calls may run code the analysis does not see (patterns/foreign_calls.py): the attention rewrite refuses
where one runs between the scores and the value product (breaker rounds 22 and 23), and another file's in-place
shape change counts for the length proof only where the block calls one."""

from __future__ import annotations

import re

import pytest
import libcst as cst

from advisor.contracts.fix_safety import FixSafety
from advisor.engine.static import scan_paths
from advisor.patterns.foreign_calls import foreign_call
from advisor.static.module_index import ParsedModule

HEAD = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
import helpers


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.maps = []

    def inverse(self, m, n_iter=2):
        for _ in range(n_iter):
            m = torch.matmul(m, m)
        return m

    def forward(self, x, cb):
{body}
"""

KNOWN = {
    "torch and tensor methods": "        return F.softmax(x.transpose(-1, -2) @ x, dim=-1).float()",
    "builtins and exceptions": "        if len(x) != 2:\n            raise ValueError(f'{x.size()}')\n"
                               "        return [i for i in range(3)]",
    "a torch.nn layer built here": "        return self.proj(x)",
    "a method of this class, followed": "        return self.inverse(x)",
    "a list the class builds": "        self.maps.append(x)\n        return x",
    "displays, ranges and sizes iterated": "        for t in (x, x):\n            x = t\n        n = sum(x.shape)\n"
                                           "        return [t for t in range(n)], list(zip(self.maps, [1]))",
    "a lambda given to map, over a tensor made here": "        y = x * 2\n        return list(map(lambda t: t * 2, y))",
    "a generator expression of torch calls, iterated later": "        g = (torch.relu(t) for t in x.unbind(0))\n"
                                                             "        return list(g)",
}
FOREIGN = {
    "a callback": ("        cb()\n        return x", "cb"),
    "another module's function": ("        return helpers.shrink(x)", "helpers.shrink"),
    "a method of an object": ("        return x.cache.update(x)", "x.cache.update"),
    "a builtin the file rebinds": ("        range = cb\n        return range(3)", "range"),
    "a function given to map": ("        return list(map(cb, x))", "list"),
    "a key given to max": ("        return max(x, key=cb)", "max"),
    "a parameter iterated by a loop (a caller's generator)": ("        for t in cb:\n            x = t\n"
                                                              "        return x", "cb"),
    "a generator of another module made earlier": ("        g = helpers.gen(x)\n        y = x * 2\n"
                                                   "        return [t for t in g]", "helpers.gen"),
}


def _first_foreign(body: str) -> str | None:
    parsed = ParsedModule(HEAD.format(body=body), "m.py")
    forward = next(f for f, owner, _ in parsed.functions if f.name.value == "forward")
    owner = next(owner for f, owner, _ in parsed.functions if f is forward)
    call = foreign_call(parsed, owner, forward.body)
    return None if call is None else parsed.code(call.func if isinstance(call, cst.Call) else call)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_calls_whose_code_is_seen(name):
    assert _first_foreign(KNOWN[name]) is None


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_calls_that_may_run_unseen_code(name):
    body, callee = FOREIGN[name]
    assert _first_foreign(body) == callee


CYCLE = """
import torch
import torch.nn as nn


class Attn(nn.Module):
    def a(self, x, n):
        if n:
            x = self.b(x, n - 1)
        return hook(x)

    def b(self, x, n):
        return self.a(x, n)

    def first(self, x):
        return self.a(x, 2)

    def second(self, x):
        return self.b(x, 2)
"""


def test_a_method_in_a_cycle_keeps_what_its_cycle_calls():
    """Followed first from `a`, `b` meets `a` half searched: its own answer is not remembered, so `b` asked
    afterwards still finds `hook`, which `a` calls."""
    parsed = ParsedModule(CYCLE, "m.py")
    methods = {f.name.value: (f, owner) for f, owner, _ in parsed.functions}
    for name, callee in (("first", "self.a"), ("second", "self.b")):
        function, owner = methods[name]
        call = foreign_call(parsed, owner, function)
        assert call is not None and parsed.code(call.func) == callee, name  # the call through which `hook` runs


PACKAGE_MODEL = """
import torch
import torch.nn as nn
from {importer} import resolve


class Attn(nn.Module):
    def forward(self, q, k, v, mask):
        attn = q @ k.transpose(-2, -1)
        bias = resolve(attn, mask)
        return (attn + bias).softmax(-1) @ v
"""
PACKAGE_HELPER = """
import torch


def register(fn):
    SEEN.add(fn)
    return fn


SEEN = set()


def _patch(fn):
    fn.__code__ = _other.__code__


def keep(fn):
    _patch(fn)
    return fn


def _other(attn, mask):
    return CALLBACK(attn)


{decorators}
def resolve(attn, mask):
    {body}
"""
TORCH_ONLY = "return torch.zeros_like(mask, dtype=attn.dtype).masked_fill_(~mask, float('-inf'))"


def _package_call(tmp_path, importer="pkg", decorators="@torch.fx.wrap\n@register", body=TORCH_ONLY,
                  extra: dict[str, str] | None = None) -> str | None:
    """The first foreign call of `Attn.forward` in pkg/model.py, whose `resolve` lives in pkg/masks.py and is
    re-exported by the package's `__init__` (timm's `resolve_self_attn_mask`)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .masks import resolve\n")
    (package / "masks.py").write_text(PACKAGE_HELPER.format(decorators=decorators, body=body))
    model = package / "model.py"
    model.write_text(PACKAGE_MODEL.format(importer=importer))
    for name, text in (extra or {}).items():
        (package / name).write_text(text)
    parsed = ParsedModule(model.read_text(), str(model))
    forward, owner = next((f, owner) for f, owner, _ in parsed.functions if f.name.value == "forward")
    call = foreign_call(parsed, owner, forward.body)
    return parsed.code(call.func) if call is not None else None


@pytest.mark.parametrize("importer", ["pkg", ".masks", "pkg.masks"])
def test_a_function_of_the_package_is_followed_through_imports_and_reexports(tmp_path, importer):
    assert _package_call(tmp_path, importer) is None


@pytest.mark.parametrize("decorators, body", [
    ("@torch.fx.wrap", "return CALLBACK(attn)"),  # the body calls what the file does not see
    ("@torch.no_grad()", TORCH_ONLY),  # a decorator that is a call: its wrapper runs
    ("@WRAP", TORCH_ONLY),  # an unresolved name
    ("@keep", TORCH_ONLY),  # returns its argument, after a helper replaced its code (breaker round 28)
], ids=["callback in the body", "wrapping decorator", "unknown decorator", "decorator changing the code"])
def test_a_function_of_the_package_runs_unseen_code(tmp_path, decorators, body):
    assert _package_call(tmp_path, decorators=decorators, body=body) == "resolve"


TREE_MODEL = """
import torch
import torch.nn as nn
from pkg import note


class Attn(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        note(q)
        out = attn @ v
        return out.transpose(1, 2).reshape(b, n, c)
"""


@pytest.mark.parametrize("patch", [None, "from pkg import helpers\nhelpers.note = print\n",
                                   "import pkg\npkg.note = print\n"], ids=["none", "defining module", "re-export"])
def test_a_function_another_file_assigns_over_is_not_followed(tmp_path, patch):
    """Scanned as a tree: `note(q)` between the scores and the value product runs pkg/helpers.py's `note`, read
    through the package's re-export, unless a file of the tree assigns that name (review of stop 46)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .helpers import note\n")
    (package / "helpers.py").write_text("def note(t):\n    return t\n")
    (package / "model.py").write_text(TREE_MODEL)
    if patch is not None:
        (tmp_path / "patch.py").write_text(patch)
    findings = [f for result in scan_paths([str(tmp_path)], cache=False).files for f in result.findings
                if f.rule.startswith("ADV10")]
    assert [(f.rule, f.patch is not None and f.fix_safety == FixSafety.SAFE) for f in findings] == \
        ([("ADV101", True)] if patch is None else [("ADV103", False)])


WRAPPED = """
import functools
import torch
import torch.nn as nn


def doubling(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        args[-1].mul_(2)
        return fn(*args)
    return wrapper


{helper}


class Attn(nn.Module):
{method}
    def forward(self, q, k, v):
        attn = (q @ k.transpose(-2, -1)).softmax(-1)
        {call}
        return attn @ v
"""


@pytest.mark.parametrize("helper, method, call", [
    ("@doubling\ndef note(t):\n    return t", "", "note(q)"),
    ("", "    @doubling\n    def note(self, t):\n        return t\n", "self.note(q)"),
], ids=["function", "method"])
def test_a_decorated_helper_runs_its_wrapper(helper, method, call):
    """A decorator's wrapper, not the body read, runs (review of stop 46: it wrote q in place)."""
    source = WRAPPED.format(helper=helper, method=method, call=call)
    parsed = ParsedModule(source, "m.py")
    forward, owner = next((f, owner) for f, owner, _ in parsed.functions if f.name.value == "forward")
    found = foreign_call(parsed, owner, forward.body)
    assert found is not None and parsed.code(found.func) == call.split("(")[0]
    undecorated = ParsedModule(re.sub(r"^ *@doubling\n", "", source, flags=re.MULTILINE), "m.py")
    forward, owner = next((f, owner) for f, owner, _ in undecorated.functions if f.name.value == "forward")
    assert foreign_call(undecorated, owner, forward.body) is None


def test_a_function_s_packed_parameters_run_nothing_when_iterated():
    """`*args` is a tuple and `**kwargs` a dict, which Python makes: iterating them runs no caller's code, where
    iterating a plain parameter may run a caller's generator."""
    from advisor.patterns.foreign_calls import iteration_sources

    parsed = ParsedModule("def f(a, *args, **kwargs):\n    for x in args:\n        pass\n"
                          "    for y in kwargs:\n        pass\n    for z in a:\n        pass\n", "m.py")
    loops = [node for node in parsed.nodes_of(cst.For)]
    assert [iteration_sources(parsed, None, loop.iter) for loop in loops] == [[], [], None]
