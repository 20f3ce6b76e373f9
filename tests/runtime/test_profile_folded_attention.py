"""advisor profile finds attention with heads folded into the batch: einsum (channel-major) and 3-D bmm forms."""

import importlib.util

import pytest
import torch

from advisor.runtime.block_facts import block_call
from advisor.runtime.detect.attention_graph import blocks
from advisor.runtime.recorder import OpRecorder
from profile_helpers import FIXTURES, by_rule, marker_line, run_fixture, same_file

PATH = FIXTURES / "folded_heads_attention.py"


@pytest.fixture(scope="module")
def report():
    return run_fixture("folded_heads_attention.py")


def _spans(report):
    return sorted((f.line, f.end_line) for f in by_rule(report, "ADV110") if same_file(f.path, PATH))


@pytest.mark.parametrize("form, function", [
    ("LEGACY", "QKVAttentionLegacy.forward"), ("BMM", "FoldedBmmAttention.forward")])
def test_each_folded_form_spans_qk_to_av(report, form, function):
    span = (marker_line(PATH, f"LINE_{form}_QK"), marker_line(PATH, f"LINE_{form}_AV"))
    assert span in _spans(report)
    [finding] = [f for f in by_rule(report, "ADV110") if (f.line, f.end_line) == span]
    assert finding.function == function
    assert finding.extra["evidence"]["score_shape"] == [8, 128, 128]  # batch 2 x 4 heads folded, 128 tokens


def test_classifier_softmax_without_value_matmul_is_not_attention(report):
    classifier = marker_line(PATH, "LINE_CLASSIFIER")
    assert len(_spans(report)) == 2
    assert all(f.line != classifier for f in by_rule(report, "ADV110"))


def _attention_blocks(function, *tensors):
    with OpRecorder() as recorder:
        function(*tensors)
    return blocks(recorder.result())


QUERIES, KEYS = torch.randn(3, 5, 8), torch.randn(3, 7, 8)


def test_weights_contracted_over_their_softmax_axis_from_either_side_are_attention():
    def transposed_product(q, k):  # (Wᵀ contracted as the right operand): what einsum("bts,bcs->bct") records
        weights = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
        return torch.bmm(k.transpose(1, 2), weights.transpose(1, 2))

    assert len(_attention_blocks(transposed_product, QUERIES, KEYS)) == 1


def test_weights_contracted_over_their_query_axis_are_not_attention():
    def query_mixing(q, k):  # sums over queries, not keys: softmax(QKᵀ) as the right operand, untransposed
        weights = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
        return torch.bmm(torch.randn(3, 4, 5), weights)

    assert _attention_blocks(query_mixing, QUERIES, KEYS) == []


def test_legacy_block_in_half_precision_walks_through_its_casts():
    spec = importlib.util.spec_from_file_location("folded_heads_attention", PATH)
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    with OpRecorder() as recorder:
        fixture.QKVAttentionLegacy(4)(torch.randn(2, 192, 32, dtype=torch.bfloat16))
    graph = recorder.result().graph
    [block] = blocks(recorder.result())
    for path in (block.score_path, block.value_path):  # `.float()` before the softmax, `.type(...)` after it
        assert "_to_copy" in [graph.nodes[node]["op"] for node in path]
    observed = block_call(graph, block)  # v is the left operand of the value product (Vᵀ·Wᵀ), not the weights
    assert (observed.query, observed.key, observed.value) == ("bfloat16",) * 3
