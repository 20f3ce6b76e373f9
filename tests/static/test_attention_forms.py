"""Attention forms no rule saw: keyword arguments, a matmul through an alias or a one-line
module, a softmax helper of the package with an `if onnx_trace:` branch, an Attend-style dispatching class, and six
transformers families. Each is either rewritten, and then run original vs patched (outputs and gradients, fp32 and
fp64), or reported with its reason.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

from advisor.engine.static import analyze_source
from advisor.patterns.signatures import TORCH, bind
from fixture_models import load_module_from_source

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
MAKE = '''

def make(seed=0):
    torch.manual_seed(seed)
    return Attn(), tuple(torch.randn(2, 3, 5, 8) for _ in range(3))
'''
FOLDED_MAKE = '''

def make(seed=0):
    torch.manual_seed(seed)
    return Attn(), tuple(torch.randn(6, 5, 8) for _ in range(3))
'''


def module(forward: str, init: str = "", top: str = "", make: str = MAKE) -> str:
    init = textwrap.indent(textwrap.dedent(init), " " * 8)
    forward = textwrap.indent(textwrap.dedent(forward), " " * 8)
    return HEAD + textwrap.dedent(top) + f'''

class Attn(nn.Module):
    def __init__(self):
        super().__init__()
{init}
    def forward(self, q, k, v):
{forward}''' + make


def grad_parity(original, patched, fp64_atol: float = 1e-10) -> None:
    """The same model and inputs through both modules, in fp32 and fp64: outputs, input and parameter gradients
    agree (fp32 at 1e-5; fp64 at `fp64_atol`, looser only where the original rounds through fp32 on purpose)."""
    for dtype, atol in ((torch.float32, 1e-5), (torch.float64, fp64_atol)):
        for seed in (0, 1):
            model_o, inputs = original.make(seed)
            model_p, _ = patched.make(seed)
            model_p.load_state_dict(model_o.state_dict(), strict=True)
            results = []
            for model in (model_o, model_p):
                model = model.to(dtype).eval()
                leaves = [t.detach().to(dtype).requires_grad_() for t in inputs]
                out = model(*leaves)
                torch.manual_seed(99)
                out.backward(torch.randn_like(out))
                results.append([out.detach()] + [t.grad for t in leaves] +
                               [p.grad for p in model.parameters()])
            for index, (a, b) in enumerate(zip(*results)):
                torch.testing.assert_close(b, a, atol=atol, rtol=atol,
                                           msg=lambda m: f"{dtype} seed {seed} #{index}: {m}")


def safe_patch(source: str, path: str = "m.py") -> str:
    result = analyze_source(source, path)
    safe = [f for f in result.findings if f.rule == "ADV101" and f.fix_safety == "safe"]
    assert len(safe) == 1, [(f.rule, f.fix_safety, f.reason) for f in result.findings]
    assert "scaled_dot_product_attention" in result.fixed
    return result.fixed


def assert_rewritten_exactly(source: str, name: str, fp64_atol: float = 1e-10) -> None:
    fixed = safe_patch(source)
    grad_parity(load_module_from_source(source, f"{name}_o"), load_module_from_source(fixed, f"{name}_p"),
                fp64_atol)


# 1. keyword and positional arguments bound to torch's parameter names ----------------------------------------

KEYWORD_FORMS = {
    "functional_softmax_input_kw": "s = q @ k.transpose(-2, -1) * 0.125\nw = F.softmax(input=s, dim=-1)\nreturn w @ v",
    "torch_softmax_input_kw": "s = q @ k.transpose(-2, -1) * 0.125\nw = torch.softmax(input=s, dim=-1)\nreturn w @ v",
    "method_softmax_dim_kw": "s = q @ k.transpose(-2, -1) * 0.125\nw = s.softmax(dim=-1)\nreturn w @ v",
    "nn_functional_positional_dim": "s = q @ k.transpose(-2, -1) * 0.125\nw = nn.functional.softmax(s, -1)\n"
                                    "return w @ v",
    "matmul_input_other_kw": "s = torch.matmul(input=q, other=k.transpose(-2, -1)) * 0.125\n"
                             "w = s.softmax(-1)\nreturn torch.matmul(input=w, other=v)",
    "bmm_input_mat2_kw": "q, k, v = (t.reshape(6, 5, 8) for t in (q, k, v))\n"
                         "s = torch.bmm(input=q, mat2=k.transpose(1, 2)) * 0.125\n"
                         "w = s.softmax(dim=-1)\nreturn torch.bmm(input=w, mat2=v).reshape(2, 3, 5, 8)",
    "einsum_operand_list": "s = torch.einsum('bhlk,bhtk->bhlt', [q, k]) * 0.125\nw = F.softmax(s, dim=-1)\n"
                           "return torch.einsum('bhlt,bhtv->bhlv', [w, v])",  # CvT
    "einsum_operand_tuple": "s = torch.einsum('bhlk,bhtk->bhlt', (q, k)) * 0.125\nw = s.softmax(-1)\n"
                            "return torch.einsum('bhlt,bhtv->bhlv', (w, v))",
    "masked_fill_value_kw": "s = q @ k.transpose(-2, -1) * 0.125\n"
                            "s = s.masked_fill(mask=torch.ones(5, 5, dtype=torch.bool).triu(1), value=float('-inf'))\n"
                            "w = s.softmax(dim=-1)\nreturn w @ v",
}


@pytest.mark.parametrize("name", sorted(KEYWORD_FORMS))
def test_keyword_forms_are_rewritten_exactly(name):
    assert_rewritten_exactly(module(KEYWORD_FORMS[name]), name)


@pytest.mark.parametrize("fill", ["torch.full_like(s, float('-inf'))", "torch.full_like(s, fill_value=-1e9)"])
def test_a_where_fill_built_like_the_scores_is_rewritten_exactly(fill):
    """A reach census (breaker round 18): `torch.where(m, s, torch.full_like(s, -inf))` reads the scores a second
    time, for the fill's shape, dtype and device only, in the statement the patch deletes: it was refused."""
    forward = ("s = q @ k.transpose(-2, -1) * 0.125\nm = torch.ones(5, 5, dtype=torch.bool).tril()\n"
               f"s = torch.where(m, s, {fill})\nw = s.softmax(dim=-1)\nreturn w @ v")
    assert_rewritten_exactly(module(forward), "where_full_like")


def test_the_scores_read_like_a_fill_outside_the_block_still_refuse():
    forward = ("s = q @ k.transpose(-2, -1) * 0.125\nkeep = torch.full_like(s, 1.0)\n"
               "w = s.softmax(dim=-1)\nreturn w @ v + keep.sum()")
    [finding] = [f for f in analyze_source(module(forward), "m.py").findings if f.kind == "attention"]
    assert not finding.fixable and "is also used" in finding.reason, finding.reason


def test_a_keyword_dim_is_read_as_the_dim():
    source = module("s = q @ k.transpose(-2, -1) * 0.125\nw = F.softmax(input=s, dim=-2)\nreturn w @ v")
    (finding,) = analyze_source(source, "m.py").findings
    assert finding.fix_safety == "unsafe" and "softmax runs over dim -2" in finding.reason


def test_an_extra_keyword_is_not_read_as_the_plain_op():
    """`torch.add(s, m, alpha=2)` is not `s + m`: the binder keeps alpha, so the sum is no additive mask."""
    source = module("s = q @ k.transpose(-2, -1) * 0.125\ns = torch.add(s, torch.zeros(5, 5), alpha=2.0)\n"
                    "w = s.softmax(dim=-1)\nreturn w @ v")
    assert not [f for f in analyze_source(source, "m.py").findings if f.fix_safety == "safe"]


def test_binding_a_method_puts_its_receiver_at_input():
    call = cst.parse_expression("x.where(c, other=y)")
    bound = bind(call, TORCH["where"], receiver=call.func.value)
    assert {name: cst.Module([]).code_for_node(node) for name, node in bound.items()} == \
        {"input": "x", "condition": "c", "other": "y"}
    assert bind(cst.parse_expression("torch.bmm(a, input=b)"), TORCH["bmm"]) is None  # input given twice
    assert bind(cst.parse_expression("torch.bmm(a, b, c)"), TORCH["bmm"]) is None  # one too many


# 2. a matmul through an alias, or through a module of the file whose forward is one matmul --------------------

def test_matmul_through_a_self_attribute_alias():
    source = module("s = self.matmul(q, k.transpose(-2, -1)) * 0.125\nw = s.softmax(dim=-1)\nreturn self.matmul(w, v)",
                    init="self.matmul = torch.matmul")
    assert_rewritten_exactly(source, "self_alias")


def test_matmul_through_a_module_level_alias():
    source = module("s = matmul(q, k.transpose(-2, -1)) * 0.125\nw = s.softmax(dim=-1)\nreturn matmul(w, v)",
                    top="matmul = torch.matmul\n")
    assert_rewritten_exactly(source, "module_alias")


def test_a_module_level_alias_bound_twice_is_not_read():
    source = module("s = matmul(q, k.transpose(-2, -1)) * 0.125\nw = s.softmax(dim=-1)\nreturn matmul(w, v)",
                    top="matmul = torch.matmul\nif torch.__version__ < '0':\n    matmul = torch.mul\n")
    assert not analyze_source(source, "m.py").findings


def test_matmul_through_a_one_line_module_of_the_file():
    """SqueezeBERT's MatMulWrapper: a plain nn.Module whose forward (after its docstring) returns one matmul."""
    top = '''

    class MatMulWrapper(nn.Module):
        def forward(self, mat1, mat2):
            """matmul of two tensors"""
            return torch.matmul(mat1, mat2)
    '''
    source = module("s = self.mm_qk(q, k.transpose(-2, -1)) * 0.125\nw = s.softmax(dim=-1)\nreturn self.mm_pv(w, v)",
                    init="self.mm_qk = MatMulWrapper()\nself.mm_pv = MatMulWrapper()", top=top)
    assert_rewritten_exactly(source, "matmul_wrapper")
    facts = [f for f in analyze_source(source, "m.py").findings][0].extra["facts"]
    assert any(fact["name"] == "no-hooks" for fact in facts["proved"])


def test_a_module_with_its_own_call_is_not_read():
    top = '''

    class MatMulWrapper(nn.Module):
        def forward(self, mat1, mat2):
            return torch.matmul(mat1, mat2)

        def __call__(self, a, b):
            return torch.matmul(a, b) * 2
    '''
    source = module("s = self.mm(q, k.transpose(-2, -1)) * 0.125\nw = s.softmax(dim=-1)\nreturn w @ v",
                    init="self.mm = MatMulWrapper()", top=top)
    assert not analyze_source(source, "m.py").findings


# 3. heads folded into the batch with the softmax from a helper (same file, or another file of the package) ----

UTILS = '''
import torch
import torch.nn.functional as F


def softmax(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    else:
        return F.softmax(x, dim=dim, dtype=torch.float32)


def softmax_bf16(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    return F.softmax(x, dim=dim, dtype=torch.bfloat16)


def other_dims(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    return F.softmax(x, dim=0)
'''

FAIRSEQ = '''
import torch
import torch.nn as nn

from {imports}


class Attn(nn.Module):
    def __init__(self, heads=2, onnx_trace=False):
        super().__init__()
        self.heads, self.onnx_trace, self.scaling = heads, onnx_trace, 8 ** -0.5
        self.in_proj = nn.Linear(16, 48)

    def forward(self, x):
        bsz, tgt_len, dim = x.shape
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        q = q * self.scaling
        q = q.contiguous().view(bsz, tgt_len, self.heads, 8).transpose(1, 2).reshape(bsz * self.heads, tgt_len, 8)
        k = k.contiguous().view(bsz, tgt_len, self.heads, 8).transpose(1, 2).reshape(bsz * self.heads, tgt_len, 8)
        v = v.contiguous().view(bsz, tgt_len, self.heads, 8).transpose(1, 2).reshape(bsz * self.heads, tgt_len, 8)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        attn_weights_float = {call}(attn_weights, dim=-1, onnx_trace=self.onnx_trace)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn = torch.bmm(attn_weights, v)
        return attn.view(bsz, self.heads, tgt_len, 8).transpose(1, 2).reshape(bsz, tgt_len, dim)


def make(seed=0):
    torch.manual_seed(seed)
    return Attn(), (torch.randn(2, 5, 16),)
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `pkg` with `utils.py` and `modules/`; importable for the run."""
    root = tmp_path / "pkg"
    (root / "modules").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "modules" / "__init__.py").write_text("")
    (root / "utils.py").write_text(UTILS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
        del sys.modules[name]


def scan_in(package: Path, name: str, source: str):
    path = package / "modules" / f"{name}.py"
    path.write_text(source)
    return analyze_source(source, str(path))


@pytest.mark.parametrize("imports, call", [("pkg import utils", "utils.softmax"),
                                           ("..utils import softmax", "softmax")])
def test_a_package_softmax_helper_is_read_and_rewritten(package, imports, call):
    source = FAIRSEQ.format(imports=imports, call=call)
    result = scan_in(package, "mha", source)
    (finding,) = result.findings
    assert finding.fix_safety == "safe", finding.reason
    assert [fact["name"] for fact in finding.extra["facts"]["accepted"]] == ["precision", "output-writes"]
    (package / "modules" / "mha_fixed.py").write_text(result.fixed)
    original = importlib.import_module("pkg.modules.mha")
    patched = importlib.import_module("pkg.modules.mha_fixed")
    grad_parity(original, patched, fp64_atol=1e-6)  # the original rounds fp64 through fp32 (accepted)


def test_a_helper_branch_that_narrows_is_unsafe_with_the_precision_fact(package):
    result = scan_in(package, "mha", FAIRSEQ.format(imports="pkg import utils", call="utils.softmax_bf16"))
    (finding,) = result.findings
    assert finding.fix_safety == "unsafe" and "rounds to bfloat16" in finding.reason


def test_a_helper_whose_branches_differ_is_not_read(package):
    result = scan_in(package, "mha", FAIRSEQ.format(imports="pkg import utils", call="utils.other_dims"))
    assert not result.findings


def test_an_edited_helper_is_read_again(package):
    source = FAIRSEQ.format(imports="pkg import utils", call="utils.softmax")
    assert scan_in(package, "mha", source).findings[0].fix_safety == "safe"
    utils = package / "utils.py"
    utils.write_text(UTILS.replace("dim=dim, dtype=torch.float32", "dim=0, dtype=torch.float32"))
    os.utime(utils, ns=(utils.stat().st_atime_ns, utils.stat().st_mtime_ns + 10**9))
    (finding,) = scan_in(package, "mha", source).findings  # anchored by its name only, and refused
    assert not finding.fixable and "`utils.softmax`, which is not read as a softmax" in finding.reason


def test_a_package_of_the_helper_module_s_name_is_what_python_imports(package):
    """Breaker round 19: with both `pkg/utils.py` and `pkg/utils/__init__.py`, Python imports the package; the
    helper was read from utils.py (a plain softmax) while the package's is another function."""
    (package / "utils").mkdir()
    (package / "utils" / "__init__.py").write_text(UTILS.replace("dim=dim, dtype=torch.float32",
                                                                 "dim=0, dtype=torch.float32"))
    (finding,) = scan_in(package, "mha", FAIRSEQ.format(imports="pkg import utils", call="utils.softmax")).findings
    assert not finding.fixable and "`utils.softmax`, which is not read as a softmax" in finding.reason


def test_a_module_outside_the_package_is_not_read(tmp_path):
    (tmp_path / "utils.py").write_text(UTILS)
    source = FAIRSEQ.format(imports="utils import softmax", call="softmax")
    path = tmp_path / "mha.py"
    path.write_text(source)
    (finding,) = analyze_source(source, str(path)).findings
    assert not finding.fixable and "`softmax`, which is not read as a softmax" in finding.reason


def test_a_same_file_helper_with_an_onnx_branch_is_read():
    """ESM's `utils_softmax`, defined in the attention file itself."""
    top = '''

    def utils_softmax(x, dim: int, onnx_trace: bool = False):
        if onnx_trace:
            return F.softmax(x.float(), dim=dim)
        else:
            return F.softmax(x, dim=dim, dtype=torch.float32)
    '''
    source = module("s = torch.bmm(q * 0.125, k.transpose(1, 2))\nw = utils_softmax(s, dim=-1).type_as(s)\n"
                    "return torch.bmm(w, v)", top=top, make=FOLDED_MAKE)
    assert_rewritten_exactly(source, "esm_helper", fp64_atol=1e-6)


# 4. an Attend-style class that dispatches to SDPA under a flag --------------------------------------------------

ATTEND = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import einsum


class Attend(nn.Module):
    def __init__(self, dropout=0., flash=False):
        super().__init__()
        self.dropout, self.flash = dropout, flash
        self.attn_dropout = nn.Dropout(dropout)

    def flash_attn(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.)

    def forward(self, q, k, v):
        scale = q.shape[-1] ** -0.5
        if self.flash:
            return self.flash_attn(q, k, v)
        sim = einsum("b h i d, b h j d -> b h i j", q, k) * scale
        attn = sim.softmax(dim=-1)
        attn = self.attn_dropout(attn)
        return einsum("b h i j, b h j d -> b h i d", attn, v)


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attend = Attend()

    def forward(self, q, k, v):
        return self.attend(q, k, v)
''' + MAKE


def test_the_manual_branch_of_an_attend_class_is_rewritten_and_names_the_flag():
    (finding,) = analyze_source(ATTEND, "m.py").findings
    assert finding.function == "Attend.forward" and finding.fix_safety == "safe"
    assert "`if self.flash` before this block returns what scaled_dot_product_attention computes" in finding.reason
    assert_rewritten_exactly(ATTEND, "attend")


# 5. transformers families that got no finding ---------------------------------------------------------------

FAMILIES = {  # family -> what the reason must say (None: not softmax(QK^T)V attention, no finding is right)
    "ibert": "IntSoftmax",
    "longformer": "torch.cat",
    "sew_d": "XSoftmax.apply",
    "superpoint": None,  # a softmax over a conv's channels (keypoint heatmap), no product with values
    "swiftformer": None,  # additive attention: softmax of q·w_g, then a weighted sum, no key axis
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_family_is_reported_with_its_reason(family):
    transformers = pytest.importorskip("transformers")
    path = Path(transformers.__file__).parent / "models" / family / f"modeling_{family}.py"
    findings = analyze_source(path.read_text(encoding="utf-8"), str(path)).findings
    attention = [f for f in findings if f.kind == "attention"]
    if FAMILIES[family] is None:
        assert not attention
        return
    assert attention and all(f.fix_safety != "safe" or not f.fixable for f in attention)
    assert any(FAMILIES[family] in (f.reason or "") for f in attention), [f.reason for f in attention]


def test_squeezebert_is_patched_behind_the_flag_and_the_absent_mask():
    """The scores leave only under `if output_attentions:` and the mask is added only under `if attention_mask is
    not None:`: SDPA runs where the flag is off and the mask absent, the original block verbatim otherwise, so the
    patch is exact for every input and the mask's facts are guarded, not assumed."""
    transformers = pytest.importorskip("transformers")
    path = Path(transformers.__file__).parent / "models" / "squeezebert" / "modeling_squeezebert.py"
    [finding] = [f for f in analyze_source(path.read_text(encoding="utf-8"), str(path)).findings
                 if f.kind == "attention"]
    guarded = {fact["name"]: fact["why"] for fact in finding.extra["facts"].get("guarded", [])}
    assert finding.fix_safety == "safe" and finding.patch
    assert "`attention_mask is None`" in guarded["fully-masked-rows"] and "output_attentions" in guarded["flag-is-bool"]


SPLIT = HEAD + '''
import math


class MultiHeadedAttention(nn.Module):
    def __init__(self, store=False):
        super().__init__()
        self.store = store
        self.dropout = nn.Dropout(0.0)

    def forward_attention(self, value, scores, mask):
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
            attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        return torch.matmul(self.dropout(attn), value)

    def forward(self, q, k, v, mask=None):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return self.forward_attention(v, scores, mask)
'''


def test_attention_split_across_methods_is_reported_once_with_its_caller():
    """ESPnet and wenet compute the scores in `forward` and pass them to `forward_attention`, which applies the
    softmax and the value product: one finding (not one per softmax of its `if`/`else`), naming the parameter and
    the call; a softmax of a parameter no caller computes from a product is no attention and no finding."""
    [finding] = analyze_source(SPLIT, "m.py").findings
    assert finding.rule == "ADV103" and not finding.fixable
    assert "the scores are the parameter `scores`, which `MultiHeadedAttention.forward` computes" in finding.reason
    assert "(line 24)" in finding.reason and "split across functions" in finding.reason
    uncalled = SPLIT.replace("return self.forward_attention(v, scores, mask)", "return scores")
    assert analyze_source(uncalled, "m.py").findings == []


def test_attention_split_with_the_scores_computed_in_a_subclass_is_reported():
    """NeMo's relative-position attention: a subclass computes the scores and calls its base's `forward_attention`
    (before: no finding, so no reason either). A subclass that redefines the helper calls its own."""
    base, call = SPLIT.split("    def forward(self, q, k, v, mask=None):")
    source = base + "\n\nclass RelPosition(MultiHeadedAttention):\n    def forward(self, q, k, v, mask=None):" + call
    [finding] = analyze_source(source, "m.py").findings
    assert finding.rule == "ADV103" and "`RelPosition.forward` computes" in finding.reason
    own = source.replace("class RelPosition(MultiHeadedAttention):\n",
                         "class RelPosition(MultiHeadedAttention):\n"
                         "    def forward_attention(self, value, scores, mask):\n        return value\n\n")
    assert all("RelPosition.forward" not in (f.reason or "") for f in analyze_source(own, "m.py").findings)


def test_an_expectation_over_bins_the_function_builds_is_not_split_attention():
    """ESMFold's `softmax(logits) @ bin_centers`, the logits an einsum of its caller: the value operand is built in
    the function, not passed in beside the scores, so it is no attention and no finding."""
    source = HEAD + """

def categorical_mean(logits, start: float, end: float):
    edges = torch.linspace(start, end, logits.shape[-1] + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    return (logits.softmax(-1) @ centers.unsqueeze(1)).squeeze(-1)


def head(x, w):
    return categorical_mean(torch.einsum("...c,...cb->...b", x, w), 0.0, 1.0)
"""
    assert [f for f in analyze_source(source, "m.py").findings if f.kind == "attention"] == []


def test_weights_stored_on_the_module_are_reported_as_stored():
    """ESPnet's `self.attn = torch.softmax(scores, dim=-1)` then `matmul(self.dropout(self.attn), value)`: code
    outside the block may read `self.attn`, so it is not rewritten, and the reason says where they are stored."""
    source = module("""
        s = q @ k.transpose(-2, -1) * 0.125
        self.attn = torch.softmax(s, dim=-1)
        return torch.matmul(self.attn, v)
    """)
    [finding] = analyze_source(source, "m.py").findings
    assert not finding.fixable and "the attention weights are stored in `self.attn`" in finding.reason
