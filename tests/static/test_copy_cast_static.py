"""Copy/cast fixes proved from the source alone (no profile): each example's patch, a negative control for each,
and parity of every rewrite measured on tensors of several layouts and dtypes (values, dtype, layout, and whether
the result shares its input's memory, all as the original had them)."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from advisor.engine.static import analyze_source, scan_paths

HEADER = "import torch\nimport torch.nn.functional as F\n\n\ndef f(x):\n    return {}\n"

POSITIVE = [  # (rule, original expression, fixed expression)
    ("ADV201", "x.contiguous().contiguous()", "x.contiguous()"),
    ("ADV201", "x.clone(memory_format=torch.contiguous_format).contiguous()",
     "x.clone(memory_format=torch.contiguous_format)"),
    ("ADV301", "x.float().float()", "x.float()"),
    ("ADV301", "x.to(torch.bfloat16).bfloat16()", "x.to(torch.bfloat16)"),
    ("ADV304", "F.softmax(x.float(), dim=-1)", "F.softmax(x, dim=-1, dtype=torch.float32)"),
    ("ADV304", "torch.softmax(x.to(torch.float32), -1)", "torch.softmax(x, -1, dtype=torch.float32)"),
    ("ADV304", "x.float().softmax(-1)", "x.softmax(-1, dtype=torch.float32)"),
    ("ADV304", "F.softmax(x.double(), dim=1)", "F.softmax(x, dim=1, dtype=torch.float64)"),
]

NEGATIVE = [  # nothing provable from the source alone
    "x.contiguous()",  # is x contiguous? only a profile can say
    "x.clone(memory_format=torch.preserve_format).contiguous()",  # not a plain clone
    "x.float().half()",  # a real conversion
    "x.to(x.device).float()",  # not a pure dtype cast
    "F.softmax(x.float(), dim=-1, dtype=torch.float64)",  # already passes dtype=
    # no upcast: CUDA autocast runs softmax without dtype= in float32 (breaker round 30), with dtype= in the dtype
    "F.softmax(x.half(), dim=-1)",
    "torch.softmax(x.to(torch.bfloat16), -1)",
    "F.softmax(x.float(  # a comment the removed cast holds\n    ), dim=-1)",
    "F.softmax(x.float(), *(-1, 3, torch.float64))",  # `*args` may pass dtype (breaker round 19: a TypeError)
    "F.softmax(x, dim=-1).float()",  # the cast follows the softmax
    "x.contiguous().view(-1)",
    # `.to(D, memory_format=torch.contiguous_format)` returns a strided x unchanged when x already has dtype D,
    # so this pair has no one-copy twin (the parity check below found it)
    "x.contiguous().double()",
]


def _analyze(expression: str, **options):
    source = HEADER.format(expression)
    return source, analyze_source(source, "example.py", **options)


def test_a_comment_after_the_last_softmax_argument_stays_where_it_was():
    """Breaker round 19: ADV304's fix dropped the comment after the call's last argument."""
    _, result = _analyze("F.softmax(\n        x.float(),\n        dim=-1,  # keys last\n    )")
    fixed = "F.softmax(\n        x,\n        dim=-1, dtype=torch.float32,  # keys last\n    )"
    assert result.fixed == HEADER.format(fixed)


@pytest.mark.parametrize("before", ["x.contiguous().clone()", "x.clone().contiguous()"])
def test_the_copy_fold_is_unsafe_for_the_strides_of_size_one_dims(before):
    """Breaker round 17: a channels-last pooled (N, C, 1, 1) map is contiguous, so `.contiguous()` keeps its strides
    and so does the clone; the folded `clone(memory_format=torch.contiguous_format)` does not, and a later op's
    output then has another memory format (a `.view` of it raised)."""
    _, result = _analyze(before)
    [finding] = result.findings
    assert (finding.rule, finding.fix_safety) == ("ADV204", "unsafe")
    assert [fact["name"] for fact in finding.extra["facts"]["assumed"]] == ["size-one-strides"]
    assert result.fixed == result.source  # not applied without --unsafe-fixes
    pooled = torch.nn.AdaptiveAvgPool2d(1)(torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last))
    original = eval(before, {"x": pooled})
    folded = pooled.clone(memory_format=torch.contiguous_format)
    assert torch.equal(original, folded) and original.stride() != folded.stride()
    upsampled = [F.interpolate(t, scale_factor=2) for t in (original, folded)]
    assert [t.is_contiguous(memory_format=torch.channels_last) for t in upsampled] == [True, False]


@pytest.mark.parametrize("rule, before, after", POSITIVE)
def test_static_fix_patch(rule, before, after):
    source, result = _analyze(before)
    [finding] = result.findings
    assert (finding.rule, finding.fix_safety, finding.fixable) == (rule, "safe", True)
    assert finding.extra["facts"]["assumed"] == []
    assert result.fixed == HEADER.format(after)
    assert f"-    return {before}\n+    return {after}\n" in finding.patch
    assert analyze_source(result.fixed, "example.py").findings == []  # idempotent: nothing left to fix


@pytest.mark.parametrize("expression", NEGATIVE)
def test_no_static_fix_without_proof(expression):
    source, result = _analyze(expression)
    assert result.findings == [] and result.fixed == source


def _inputs():
    base = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        tensor = base.to(dtype)
        yield tensor  # contiguous
        yield tensor.transpose(1, 2)  # strided
        yield tensor[:, :, ::2]  # not dense


def _compiled(expression: str):
    scope = {"torch": torch, "F": F}
    exec(textwrap.dedent(f"def f(x):\n    return {expression}\n"), scope)
    return scope["f"]


@pytest.mark.parametrize("rule, before, after", POSITIVE)
def test_static_fix_parity(rule, before, after):
    original, fixed = _compiled(before), _compiled(after)
    for x in _inputs():
        expected, actual = original(x), fixed(x)
        assert expected.dtype == actual.dtype and torch.equal(expected, actual)
        assert expected.stride() == actual.stride()
        assert (expected.data_ptr() == x.data_ptr()) == (actual.data_ptr() == x.data_ptr())  # fresh vs alias kept


def test_upcast_inside_an_attention_block_is_left_to_the_attention_rule():
    source = textwrap.dedent("""\
        import torch.nn.functional as F


        def attend(q, k, v):
            scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
            weights = F.softmax(scores.float(), dim=-1).type_as(q)
            return weights @ v
        """)
    result = analyze_source(source, "block.py")
    assert [f.rule for f in result.findings] == ["ADV101"]


@pytest.mark.parametrize("unsafe", [False, True])
def test_upcast_in_the_original_a_guarded_patch_keeps_is_left_alone(unsafe):
    """The attention fix keeps the block under `else:` of its guard; fixing the fixed file again offers nothing
    (the upcast was the attention rule's before, and the kept original is no finding after)."""
    source = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        from torch import nn


        class Attention(nn.Module):
            def __init__(self, scale):
                super().__init__()
                self.scale = scale

            def forward(self, q, k, v):
                scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
                weights = F.softmax(scores.float(), dim=-1).to(v.dtype)
                return torch.matmul(weights, v)
        """)
    fixed = analyze_source(source, "block.py", unsafe_fixes=unsafe).fixed
    assert "else:" in fixed and "F.softmax(scores.float(), dim=-1)" in fixed
    assert analyze_source(fixed, "block.py", unsafe_fixes=unsafe).findings == []


def test_select_and_suppression_apply_to_copy_cast_rules():
    source, result = _analyze("x.contiguous().clone()  # advisor: ignore[ADV204]")
    assert result.findings == []
    source, result = _analyze("x.contiguous().clone()", ignore=["ADV2"])
    assert result.findings == [] and result.fixed == source


BOXES = '''import torch


class Boxes:
    def __init__(self, t):
        self.t = t

    def contiguous(self):
        return Boxes(self.t.contiguous())

    def clone(self):
        return Boxes(self.t.clone())
'''
RUN = "\n\ndef run(b):\n    return b.contiguous().contiguous()\n"


def test_a_class_of_the_file_defining_a_tensor_method_the_rewrite_reads_leaves_the_receiver_assumed():
    """Breaker round 14: `b.contiguous().clone()` on a box of tensors became `b.clone(memory_format=...)`, which its
    own `clone` does not take (TypeError); any rewrite reading a method the class defines is held back."""
    [finding] = [f for f in analyze_source(BOXES + RUN, "boxes.py").findings if f.rule == "ADV201"]
    assumed = {fact["name"]: fact["why"] for fact in finding.extra["facts"]["assumed"]}
    assert finding.fix_safety == "unsafe" and "`contiguous`" in assumed["tensor-receiver"]


def test_a_class_of_another_file_of_the_tree_counts_too(tmp_path):
    (tmp_path / "boxes.py").write_text(BOXES, encoding="utf-8")
    (tmp_path / "run.py").write_text("import torch" + RUN, encoding="utf-8")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1, cache=False).findings if f.rule == "ADV201"]
    assert finding.fix_safety == "unsafe" and "boxes.py" in finding.extra["facts"]["assumed"][0]["why"]
    [alone] = [f for f in scan_paths([str(tmp_path / "run.py")], jobs=1, cache=False).findings if f.rule == "ADV201"]
    assert alone.fix_safety == "safe"
