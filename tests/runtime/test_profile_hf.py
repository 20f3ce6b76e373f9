"""A real transformers model (tiny config, random weights, eager attention): attention found in its modeling file."""

import pytest

from profile_helpers import by_rule, run_fixture, source_line


@pytest.mark.parametrize("function, module, qk, av", [
    ("llama", "transformers.models.llama.modeling_llama", "attn_weights = torch.matmul(query, key_states",
     "attn_output = torch.matmul(attn_weights, value_states)"),
    ("gpt2", "transformers.models.gpt2.modeling_gpt2", "attn_weights = torch.matmul(query, key.transpose",
     "attn_output = torch.matmul(attn_weights, value)"),
])
def test_eager_attention_found_in_transformers_source(function, module, qk, av):
    import importlib
    import os

    source = importlib.import_module(module).__file__
    report = run_fixture("hf_models.py", function)
    [attention] = by_rule(report, "ADV110")
    assert os.path.realpath(attention.path) == os.path.realpath(source)
    assert (attention.line, attention.end_line) == (source_line(source, qk), source_line(source, av))
    assert attention.function == "eager_attention_forward" and attention.extra["calls"] == 2
    assert attention.extra["rank"] == 1 + sum(f.extra["self_us"] > attention.extra["self_us"] for f in report.findings)
    assert report.timing.attributed_share >= 0.95  # see test_profile_fixtures.ATTRIBUTED_FLOOR
    assert report.timing.statement_share >= 0.85  # time-weighted: see test_profile_fixtures.STATEMENT_FLOOR
