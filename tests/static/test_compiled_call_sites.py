"""Call sites through `torch.compile`: a compiled module's calls are the instance's, with the same arguments, so
the mask a program hands `torch.compile(Model())` proves the block's facts as a plain instance's call would (the
way a program written for a compiler's attention matcher runs its model). Handing the compiled module on, or
compiling with positional options, proves nothing."""

from __future__ import annotations

import pytest
import torch

from fixture_models import load_module_from_source
from fuzz.differential import SAFE_OK, analyze, check

PROGRAM = '''import math

import torch


class Model(torch.nn.Module):
    def forward(self, query, key, value, attn_mask):
        qk = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
        qk = qk + attn_mask
        return qk.softmax(dim=-1).matmul(value)


torch.manual_seed(0)  # the original and the patched copy, each imported, draw the same mask
attn_mask = torch.randn(1, 1, 6, 6)


def main():
{body}


class Harness(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Model()

    def forward(self, q, k, v):
        return self.inner(q, k, v, attn_mask)


def make(seed=0):
    torch.manual_seed(seed)
    return Harness(), (torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4))
'''


def program(body: str) -> str:
    return PROGRAM.format(body="\n".join(f"    {line}" for line in body.strip().splitlines()))


def _facts(source: str) -> dict:
    (finding,) = analyze(source, as_file=True).findings
    return finding.extra["facts"]


def _from_call_sites(source: str) -> set[str]:
    return {fact["name"] for fact in _facts(source).get("from_call_sites", [])}


@pytest.mark.parametrize("body", [
    'model = torch.compile(Model(), backend="eager")\nq = torch.randn(2, 2, 6, 4)\nreturn model(q, q, q, attn_mask)',
    'model = torch.compile(Model())\nq = torch.randn(2, 2, 6, 4)\nreturn model(q, q, q, attn_mask=attn_mask)',
    "q = torch.randn(2, 2, 6, 4)\nreturn torch.compile(Model())(q, q, q, attn_mask)",
    "q = torch.randn(2, 2, 6, 4)\nreturn Model()(q, q, q, attn_mask)",  # no compile: called as built
], ids=["bound", "keyword", "called-at-once", "plain-called-at-once"])
def test_a_compiled_instance_s_call_proves_the_mask_facts_with_parity(body):
    source = program(body)
    assert "fully-masked-rows" in _from_call_sites(source)
    outcome = check(source, as_file=True)
    assert outcome.status == SAFE_OK, (outcome.status, outcome.detail, outcome.notes)


def test_the_patch_gives_the_original_s_values_under_dynamo():
    """The patched model, compiled as the program compiles it (eager backend: no C++ toolchain needed)."""
    source = program('model = torch.compile(Model(), backend="eager")\nq = torch.randn(2, 2, 6, 4)\n'
                     'return model(q, q, q, attn_mask)')
    result = analyze(source, as_file=True)
    assert [f.fix_safety.value for f in result.findings] == ["safe"]
    original = load_module_from_source(source, "compiled_original")
    patched = load_module_from_source(result.fixed, "compiled_patched")
    assert "scaled_dot_product_attention" in result.fixed
    model, inputs = original.make(0)
    torch.testing.assert_close(torch.compile(patched.make(0)[0], backend="eager")(*inputs), model(*inputs))


@pytest.mark.parametrize("body", [
    "model = torch.compile(Model())\nq = torch.randn(2, 2, 6, 4)\nreturn model(q, q, q, attn_mask * 1e9)",
    "model = torch.compile(Model())\nrun(model)\nq = torch.randn(2, 2, 6, 4)\nreturn model(q, q, q, attn_mask)",
    "model = torch.compile(Model(), False)\nq = torch.randn(2, 2, 6, 4)\nreturn model(q, q, q, attn_mask)",
    "model = torch.compile(Model())\nmodel.forward = print\nq = torch.randn(2, 2, 6, 4)\n"
    "return model(q, q, q, attn_mask)",
], ids=["large-values", "handed-on", "positional-option", "forward-replaced"])
def test_a_compiled_module_that_passes_large_values_or_escapes_proves_no_row(body):
    source = program(body)
    assert "fully-masked-rows" not in _from_call_sites(source)


FUNCTION_PROGRAM = '''import math

import torch


def attention(query, key, value, attn_mask):
    qk = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
    qk = qk + attn_mask
    return qk.softmax(dim=-1).matmul(value)


torch.manual_seed(0)
attn_mask = torch.randn(1, 1, 6, 6)


def main():
{body}


class Harness(torch.nn.Module):
    def forward(self, q, k, v):
        return attention(q, k, v, attn_mask)


def make(seed=0):
    torch.manual_seed(seed)
    return Harness(), (torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4))
'''


def function_program(body: str) -> str:
    return FUNCTION_PROGRAM.format(body="\n".join(f"    {line}" for line in body.strip().splitlines()))


@pytest.mark.parametrize("body", [
    "compiled = torch.compile(attention)\nq = torch.randn(2, 2, 6, 4)\nreturn compiled(q, q, q, attn_mask)",
    "q = torch.randn(2, 2, 6, 4)\nreturn torch.compile(attention, fullgraph=True)(q, q, q, attn_mask)",
], ids=["bound", "called-at-once"])
def test_a_compiled_function_s_call_proves_the_mask_facts_with_parity(body):
    """A program written for a compiler's attention matcher compiles the function and calls it."""
    source = function_program(body)
    assert "fully-masked-rows" in _from_call_sites(source)
    outcome = check(source, as_file=True)
    assert outcome.status == SAFE_OK, (outcome.status, outcome.detail, outcome.notes)


@pytest.mark.parametrize("body", [
    "compiled = torch.compile(attention)\nq = torch.randn(2, 2, 6, 4)\ncompiled(q, q, q, attn_mask)\n"
    "return torch.compile(attention)(q, q, q, torch.full((1, 1, 6, 6), -1e30))",
    "compiled = torch.compile(attention)\nother = compiled\nq = torch.randn(2, 2, 6, 4)\n"
    "return other(q, q, q, torch.full((1, 1, 6, 6), -1e30))",
    "compiled = torch.compile(attention)\nq = torch.randn(2, 2, 6, 4)\nreturn run(compiled)",
    "compiled = torch.compile(attention, options)\nq = torch.randn(2, 2, 6, 4)\nreturn compiled(q, q, q, attn_mask)",
], ids=["second-compile-large", "aliased", "handed-on", "positional-option"])
def test_a_compiled_function_called_with_large_values_or_handed_on_proves_no_row(body):
    assert "fully-masked-rows" not in _from_call_sites(function_program(body))
