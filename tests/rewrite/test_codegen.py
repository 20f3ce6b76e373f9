"""The attention rewrite plan is nodes: the SDPA call quotes the user's own expression nodes (never their text parsed
back), and the new code around them reads exactly as the text templates it replaces wrote it."""

from __future__ import annotations

import libcst as cst
import pytest
import torch

from advisor.engine.static import analyze_source
from advisor.fixes.attention_fix import attention_edits
from advisor.patterns.attention import find_attention
from advisor.rewrite.sdpa_call import WRAP_AT
from advisor.static.codegen import atomic, dotted, joined, keyword, method, number, with_methods
from advisor.static.module_index import ParsedModule

SOURCE = '''import torch


def attend(q, k, v, mask, p: float, training: bool):
    s = (q + 1) @ k.transpose(-2, -1) / 8.0
    s = s.masked_fill(mask == 0, float("-inf"))
    w = torch.nn.functional.dropout(s.softmax(dim=-1), p, training)
    return w @ v
'''


def _node(parsed: ParsedModule, kind: type[cst.CSTNode], text: str, line: int) -> cst.CSTNode:
    """The source's node of that kind and text on that line."""
    [node] = [node for node in parsed.parents
              if isinstance(node, kind) and parsed.code(node) == text and parsed.line(node) == line]
    return node


@pytest.mark.parametrize("built, text", [
    (atomic(cst.parse_expression("a + b")), "(a + b)"),
    (atomic(cst.parse_expression("a.b[0]")), "a.b[0]"),
    (method(cst.parse_expression("a + b"), "to", cst.parse_expression("q.dtype")), "(a + b).to(q.dtype)"),
    (method(cst.Name("m"), "expand", cst.Name("b"), number(-1), keyword("dim", number(2))), "m.expand(b, -1, dim=2)"),
    (with_methods(cst.parse_expression("x or y"), [("permute", (0, 2, 1, 3)), ("unsqueeze", (1,))]),
     "(x or y).permute(0, 2, 1, 3).unsqueeze(1)"),
    (with_methods(cst.Name("v"), []), "v"),
    (joined(cst.BitAnd, [cst.Name("a"), cst.Name("b"), cst.Name("c")]), "a & b & c"),
    (joined(cst.Divide, [joined(cst.Multiply, [cst.Name("s"), cst.Name("t")]), cst.Name("d")]), "s * t / d"),
    (number(0.5), "0.5"),
    (dotted("torch.nn.functional.scaled_dot_product_attention"), "torch.nn.functional.scaled_dot_product_attention"),
])
def test_built_code_reads_as_the_project_writes_it(built, text):
    assert cst.Module([]).code_for_node(built) == text


def test_the_plan_quotes_the_users_nodes_and_the_call_holds_them():
    parsed = ParsedModule(SOURCE, "m.py")
    [match] = find_attention(parsed)
    assert match.query is _node(parsed, cst.BinaryOperation, "(q + 1)", 5)  # the parsed node, not its text reparsed
    assert match.key is _node(parsed, cst.Name, "k", 5)
    assert match.value is _node(parsed, cst.Name, "v", 8)
    assert isinstance(match.attn_mask, cst.Comparison)  # `mask == 0` masked out is `mask != 0` kept
    assert match.attn_mask.left is _node(parsed, cst.Name, "mask", 6)
    assert isinstance(match.dropout_p, cst.IfExp) and match.dropout_p.test is _node(parsed, cst.Name, "training", 7)
    assert match.scale.right is _node(parsed, cst.Float, "8.0", 5)  # `1.0 / 8.0`
    call = attention_edits(parsed, match, drop_weights=False).replace[match.output_node]
    while call.func.attr.value != "scaled_dot_product_attention":  # `.contiguous()`: returned out of the file
        call = call.func.value
    assert [arg.value for arg in call.args] == [match.query, match.key, match.value, match.attn_mask,
                                                match.dropout_p, match.scale]  # CST nodes compare by identity


def test_a_long_call_is_written_one_argument_per_line():
    parsed = ParsedModule(SOURCE, "m.py")
    [match] = find_attention(parsed)
    call = attention_edits(parsed, match, drop_weights=False).replace[match.output_node]
    text = cst.Module([]).code_for_node(call)
    assert text == ("torch.nn.functional.scaled_dot_product_attention(\n    (q + 1),\n    k,\n    v,\n"
                    "    attn_mask=mask != 0,\n    dropout_p=p if training else 0.0,\n    scale=1.0 / 8.0,\n"
                    ").contiguous()")
    assert len(text.replace("\n", "")) > WRAP_AT
    assert call.deep_equals(cst.parse_expression(text))


def test_a_read_of_the_scores_dtype_reads_a_compound_query_in_parentheses():
    """`s.dtype` after the block becomes the query's dtype; a query `q + pos` must be read as `(q + pos).dtype`."""
    source = '''import torch


def attend(q, pos, k, v):
    s = torch.matmul(q + pos, k.transpose(-2, -1)) * 0.125
    out = s.softmax(dim=-1) @ v
    return out, torch.zeros(3, dtype=s.dtype)
'''
    result = analyze_source(source, "m.py")
    assert "torch.zeros(3, dtype=(q + pos).dtype)" in result.fixed
    original, fixed = {}, {}
    exec(compile(source, "m.py", "exec"), original)
    exec(compile(result.fixed, "m.py", "exec"), fixed)
    q, pos, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(4))
    (out, zeros), (fixed_out, fixed_zeros) = original["attend"](q, pos, k, v), fixed["attend"](q, pos, k, v)
    torch.testing.assert_close(fixed_out, out)
    assert fixed_zeros.dtype == zeros.dtype == torch.float64
