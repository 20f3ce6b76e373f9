"""The families' screens (advisor.contracts.family.Screen): a file that no family can find anything in is never
parsed by libcst, and what the screens let through is judged exactly as before."""

from __future__ import annotations

import pytest

from advisor.engine import static
from advisor.engine.static import analyze_source, scan_paths, static_families

TYPE_HINTS_ONLY = '''import torch


def scale(x: torch.Tensor, factor: float = 2.0, steps: int = 1, flag: bool = False) -> torch.Tensor:
    """Casts nothing: int, float and bool are type hints here, and `.to` is a word in this docstring."""
    return x * factor
'''

CAST = '''import torch


def twice(x):
    return x.float().float()
'''


@pytest.fixture
def parses(monkeypatch):
    """The files libcst parses during a scan."""
    parsed = []
    original = static.ParsedModule

    def recording(source, path, *args, **kwargs):
        parsed.append(path)
        return original(source, path, *args, **kwargs)

    monkeypatch.setattr(static, "ParsedModule", recording)
    return parsed


def test_a_file_without_a_call_any_rule_proves_is_never_parsed_by_libcst(tmp_path, parses):
    hints, cast = tmp_path / "hints.py", tmp_path / "cast.py"
    hints.write_text(TYPE_HINTS_ONLY)
    cast.write_text(CAST)
    result = scan_paths([str(hints), str(cast)], jobs=1, cache=False, fixed=False)  # as `scan` runs it
    assert parses == [str(cast)]
    assert [(f.path, f.rule) for f in result.findings] == [(str(cast), "ADV301")]
    assert analyze_source(TYPE_HINTS_ONLY, "hints.py").findings == []  # the same verdict, libcst parsing it


def test_configuration_rules_are_not_run_on_installed_packages_where_they_report_nothing():
    setting = 'model = AutoModel.from_pretrained("gpt2", attn_implementation="eager")\n'
    assert [f.name for f in static_families(setting, "project/train.py")] == ["attention_config"]
    assert static_families(setting, "/venv/lib/python3.11/site-packages/pkg/train.py") == []


def test_a_profile_of_the_file_runs_the_families_that_read_it_whatever_the_text():
    assert [f.name for f in static_families(TYPE_HINTS_ONLY, "hints.py", evidence=object())] == ["copies_casts"]
