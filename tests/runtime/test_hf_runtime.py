"""A profiled transformers model running eager attention: the finding points at the user's line, not the library."""

from __future__ import annotations

import textwrap

from advisor.engine.profiling import profile_workload
from advisor.workload_loader import load_workload
from profile_helpers import FIXTURES, by_rule, run_fixture, same_file, source_line

WORKLOAD = textwrap.dedent('''\
    import advisor
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    IMPLEMENTATION = "{implementation}"


    def workload():
        config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             attn_implementation=IMPLEMENTATION)
        model = LlamaForCausalLM(config)
        ids = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(0))
        return advisor.Workload(model=model, kwargs={{"input_ids": ids, "use_cache": False}}, steps=2)
''')


def _profile(tmp_path, implementation: str):
    path = tmp_path / f"{implementation}_workload.py"
    path.write_text(WORKLOAD.format(implementation=implementation), encoding="utf-8")
    target = f"{path}:workload"
    return path, profile_workload(load_workload(target), target)


def test_eager_attention_points_at_the_line_that_chose_it():
    report = run_fixture("hf_models.py", "llama")
    [finding] = by_rule(report, "ADV604")
    fixture = FIXTURES / "hf_models.py"
    assert same_file(finding.path, fixture) and finding.function == "llama"
    assert finding.line == source_line(fixture, "config = LlamaConfig(")
    assert finding.kind == "hf-attn-implementation" and finding.fixable
    added = [line for line in finding.patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(added) == 1 and 'attn_implementation="sdpa"' in added[0]
    library = by_rule(report, "ADV110")
    assert finding.extra["rank"] == library[-1].extra["rank"] + 1  # its time is theirs: never ranked above them
    assert library and finding.extra["self_us"] == round(sum(f.extra["self_us"] for f in library), 3) > 0
    assert finding.extra["evidence"]["model_class"] == "LlamaForCausalLM"


def test_eager_chosen_at_run_time_points_at_the_line_that_built_the_model(tmp_path):
    path, report = _profile(tmp_path, "eager")
    [finding] = by_rule(report, "ADV604")
    assert same_file(finding.path, path) and finding.function == "workload"
    assert finding.line == source_line(path, "config = LlamaConfig(") and not finding.fixable
    assert 'attn_implementation="sdpa"' in finding.reason


def test_sdpa_models_get_no_eager_finding(tmp_path):
    _, report = _profile(tmp_path, "sdpa")
    assert by_rule(report, "ADV604") == [] and by_rule(report, "ADV110") == []
