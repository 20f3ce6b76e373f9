"""Weights transformed or returned only on request, in the shapes real code writes them.

- `if head_mask is not None: w = w * head_mask` (every BERT-era HF model): the patch takes SDPA where no head mask is
  passed and runs the original block verbatim where one is.
- T5: `scores += position_bias`, where the bias is built from `scores.device`/`scores.dtype` (metadata, not the
  scores' storage), with a head mask and `if output_attentions:` returning the weights: both flags off take SDPA.
- Old HF CLIP: the folded (b*h, L, S) scores viewed as (b, h, L, S) and back once per added mask (two pairs).
- HF BERT: `outputs = (context, probs) if output_attentions else (context,)`, a head mask, and `if self.is_decoder:`
  beside them, which the SDPA path need not turn off.
- HF Llama 4.36: `if not output_attentions: attn_weights = None` after the value product (taken with the flag off),
  on one line or as a block, and `None if not output_attentions else w`.

Each case compares the patched module with the original on every flag combination: outputs (weights included)
and gradients, fp32 and fp64.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from attention_sources import attention_finding_and_fix, fact_names
from fixture_models import FIXTURE_ROOT, build, dispatched_ops, load_module_from_source, uses_sdpa

T5_STYLE = '''
import torch
from torch import nn


class T5Attention(nn.Module):
    def __init__(self, d_model=16, n_heads=2):
        super().__init__()
        self.n_heads, self.d_kv = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, layer_head_mask=None, output_attentions: bool = False):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.n_heads, self.d_kv).transpose(1, 2)
        k = self.k(x).view(b, n, self.n_heads, self.d_kv).transpose(1, 2)
        v = self.v(x).view(b, n, self.n_heads, self.d_kv).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(3, 2))
        position_bias = torch.zeros((1, self.n_heads, n, n), device=scores.device, dtype=scores.dtype)
        scores += position_bias
        attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        if layer_head_mask is not None:
            attn_weights = attn_weights * layer_head_mask
        out = torch.matmul(attn_weights, v).transpose(1, 2).reshape(b, n, -1)
        outputs = (out,)
        if output_attentions:
            outputs = outputs + (attn_weights,)
        return outputs


def make(seed: int = 0, head_mask: bool = False, output_attentions: bool = False):
    torch.manual_seed(seed)
    mask = torch.tensor([1.0, 0.0]).view(1, 2, 1, 1) if head_mask else None
    return T5Attention(), (torch.randn(2, 5, 16), mask, output_attentions)
'''

CLIP_STYLE = '''
import torch
from torch import nn


class CLIPAttention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)

    def _shape(self, tensor, seq_len: int, bsz: int):
        return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, hidden_states, attention_mask=None, causal_attention_mask=None, output_attentions=False):
        bsz, tgt_len, embed_dim = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scale
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(query_states, tgt_len, bsz).view(*proj_shape)
        key_states = key_states.view(*proj_shape)
        value_states = value_states.view(*proj_shape)
        src_len = key_states.size(1)
        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2))
        if causal_attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + causal_attention_mask
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        if attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        if output_attentions:
            attn_weights_reshaped = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights_reshaped.view(bsz * self.num_heads, tgt_len, src_len)
        else:
            attn_weights_reshaped = None
        attn_output = torch.bmm(attn_weights, value_states)
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return attn_output.reshape(bsz, tgt_len, embed_dim), attn_weights_reshaped


def make(seed: int = 0, causal: bool = False, padding: bool = False, output_attentions: bool = False):
    torch.manual_seed(seed)
    n = 5
    causal_mask = torch.full((n, n), -1e4).triu(1)[None, None].expand(2, 1, n, n) if causal else None
    padding_mask = torch.zeros(2, 1, n, n)
    padding_mask[1, ..., 3:] = -1e4
    return CLIPAttention(), (torch.randn(2, n, 16), padding_mask if padding else None, causal_mask, output_attentions)
'''


BERT_STYLE = '''
import math
import torch
from torch import nn


class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size=16, num_attention_heads=2, is_decoder=False):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = hidden_size // num_attention_heads
        self.all_head_size = hidden_size
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(0.1)
        self.is_decoder = is_decoder

    def transpose_for_scores(self, x):
        x = x.view(x.size()[:-1] + (self.num_attention_heads, self.attention_head_size))
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        if head_mask is not None:
            attention_probs = attention_probs * head_mask
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        context_layer = context_layer.view(context_layer.size()[:-2] + (self.all_head_size,))
        outputs = (context_layer, attention_probs) if output_attentions else (context_layer,)
        if self.is_decoder:
            outputs = outputs + (None,)
        return outputs


def make(seed: int = 0, head_mask: bool = False, output_attentions: bool = False, decoder: bool = False):
    torch.manual_seed(seed)
    mask = torch.tensor([1.0, 0.0]).view(1, 2, 1, 1) if head_mask else None
    return BertSelfAttention(is_decoder=decoder).eval(), (torch.randn(2, 5, 16), mask, output_attentions)
'''


LLAMA_STYLE = '''
import math
import torch
from torch import nn


class LlamaAttention(nn.Module):
    def __init__(self, hidden_size=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None, output_attentions: bool = False):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        DROP
        return attn_output, attn_weights


def make(seed: int = 0, mask: bool = False, output_attentions: bool = False):
    torch.manual_seed(seed)
    causal = torch.full((5, 5), -1e4).triu(1)[None, None] if mask else None
    return LlamaAttention(), (torch.randn(2, 5, 16), causal, output_attentions)
'''
DROPS = {"block": "if not output_attentions:\n            attn_weights = None",
         "one_line": "if not output_attentions: attn_weights = None",
         "conditional": "attn_weights = None if not output_attentions else attn_weights"}


def _outputs_and_grads(module, options, dtype):
    model, inputs = build(module, 0, **options)
    model = model.to(dtype)
    inputs = tuple(t.to(dtype).requires_grad_() if torch.is_tensor(t) and t.is_floating_point() and t.dim() == 3
                   else t.to(dtype) if torch.is_tensor(t) else t for t in inputs)
    outputs = [t for t in model(*inputs) if t is not None]
    sum(t.sum() for t in outputs).backward()
    grads = [inputs[0].grad] + [p.grad for p in model.parameters()]
    return [t.detach() for t in outputs], grads


def _check_every_combination(source, fixed, name, flags):
    original = load_module_from_source(source, name)
    patched = load_module_from_source(fixed, name + "_fixed")
    sdpa_runs = 0
    for values in itertools.product((False, True), repeat=len(flags)):
        options = dict(zip(flags, values))
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-6)):
            (out0, grads0), (out1, grads1) = (_outputs_and_grads(m, options, dtype) for m in (original, patched))
            assert len(out0) == len(out1), options
            for a, b in zip(out0 + grads0, out1 + grads1):
                assert (a is None) == (b is None), options
                if a is not None:
                    torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=lambda m: f"{options} {dtype}: {m}")
        model, inputs = build(patched, 0, **options)
        sdpa_runs += uses_sdpa(dispatched_ops(model, inputs))
    return sdpa_runs


def test_t5_in_place_bias_head_mask_and_returned_weights():
    finding, fixed = attention_finding_and_fix(T5_STYLE, unsafe_fixes=True)
    assert finding.rule == "ADV101" and fact_names(finding, "assumed") <= {"fully-masked-rows"}, finding.reason
    assert "layer_head_mask is None" in fixed and "scaled_dot_product_attention" in fixed
    runs = _check_every_combination(T5_STYLE, fixed, "t5_style", ("head_mask", "output_attentions"))
    assert runs == 1  # SDPA where neither the head mask nor the weights are asked for; the original elsewhere


def test_clip_two_view_pairs_under_the_weights_flag():
    finding, fixed = attention_finding_and_fix(CLIP_STYLE, unsafe_fixes=True)
    assert finding.rule == "ADV101", finding.reason
    assert "fully-masked-rows" not in fact_names(finding, "proved")
    runs = _check_every_combination(CLIP_STYLE, fixed, "clip_style", ("causal", "padding", "output_attentions"))
    assert runs >= 1


@pytest.mark.parametrize("head_mask", [False, True])
def test_head_mask_fixture_runs_the_original_where_a_head_mask_is_passed(head_mask):
    path = FIXTURE_ROOT / "positive" / "32_hf_head_mask_optional.py"
    source = path.read_text()
    finding, fixed = attention_finding_and_fix(source)
    assert finding.fix_safety == "safe"
    original, patched = (load_module_from_source(s, f"head_mask_{i}") for i, s in enumerate((source, fixed)))
    (model0, inputs), (model1, _) = build(original, 0, head_mask=head_mask), build(patched, 0, head_mask=head_mask)
    model1.load_state_dict(model0.state_dict())
    model0.eval(), model1.eval()
    torch.testing.assert_close(model1(*inputs), model0(*inputs), atol=1e-6, rtol=1e-6)
    assert uses_sdpa(dispatched_ops(model1, inputs)) != head_mask


def test_bert_weights_under_a_conditional_expression():
    finding, fixed = attention_finding_and_fix(BERT_STYLE)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe", finding.reason
    branch = next(line for line in fixed.splitlines() if "head_mask is None" in line)
    assert "output_attentions" in branch and "is_decoder" not in branch, branch
    assert "outputs = (context_layer,)" in fixed
    runs = _check_every_combination(BERT_STYLE, fixed, "bert_style", ("head_mask", "output_attentions", "decoder"))
    assert runs == 2  # neither a head mask nor the weights asked for, encoder or decoder


@pytest.mark.parametrize("form", sorted(DROPS))
def test_llama_weights_dropped_unless_asked(form):
    source = LLAMA_STYLE.replace("DROP", DROPS[form])
    finding, fixed = attention_finding_and_fix(source)
    assert finding.rule == "ADV101" and finding.fix_safety == "safe", finding.reason
    assert "if not output_attentions" in fixed
    runs = _check_every_combination(source, fixed, f"llama_{form}", ("mask", "output_attentions"))
    assert runs == 1  # SDPA without a mask (its rows are guarded by its absence) and without the weights asked for
