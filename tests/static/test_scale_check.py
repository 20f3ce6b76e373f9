"""benchmarks/scale_check.py's own promises: a damaged fixed file is reported (bare LFs in a CRLF file, a fix
that is offered again), and a long run resumed from its JSON skips only the passes recorded without failures."""

from __future__ import annotations

import json

import pytest

from benchmarks import scale_check
from benchmarks.scale_check import Record, check

CAPPED = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, cap=50.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        scores = torch.tanh(scores / self.cap) * self.cap
        return torch.matmul(torch.softmax(scores, dim=-1), v)
"""


def _tree(tmp_path):
    (tmp_path / "crlf.py").write_bytes(CAPPED.replace("\n", "\r\n").encode())
    (tmp_path / "clean.py").write_text("import torch\n\n\ndef f(x):\n    return torch.relu(x)\n")
    return [str(tmp_path / "clean.py"), str(tmp_path / "crlf.py")]


def test_flex_fixes_of_a_crlf_file_pass_every_check(tmp_path):
    numbers = check(_tree(tmp_path), unsafe=True, backend="flex")
    assert (numbers["files"], numbers["unsafe_patches"], numbers["fixed_files"]) == (2, 1, 1)
    assert numbers["failures"] == []


def test_bare_lfs_in_a_crlf_file_are_a_failure(tmp_path, monkeypatch):
    from advisor.engine.static import FileResult

    real = FileResult.fixed
    monkeypatch.setattr(FileResult, "fixed", property(lambda self: real.fget(self).replace("\r\n", "\n", 1)))
    failures = check(_tree(tmp_path), unsafe=True, backend="flex")["failures"]
    assert any("1 lines end in a bare LF in a CRLF file" in failure for failure in failures)


def test_a_fix_offered_again_on_the_fixed_text_is_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(scale_check, "_tree", lambda paths: None)
    real = scale_check.idempotent
    monkeypatch.setattr(scale_check, "idempotent",
                        lambda file, unsafe, backend, tree: real(_unfixed(file), unsafe, backend, tree))
    failures = check(_tree(tmp_path), unsafe=True, backend="flex")["failures"]
    assert any("fixing it again offers ADV101" in failure for failure in failures)


def _unfixed(file):
    """The result with its fixed text replaced by its source: a fix that did nothing, so it is offered again."""
    file._applied = type(file.applied)(file.source)
    return file


def _numbers(files: int, failures: list[str]) -> dict:
    fields = ("lines", "findings", "safe_patches", "unsafe_patches", "fixed_files", "errors", "internal",
              "not_compiling", "seconds")
    return {"files": files, **dict.fromkeys(fields, 1), "failures": failures, "commit": "abc"}


def test_a_resumed_run_skips_passes_recorded_without_failures(tmp_path):
    path = tmp_path / "run.json"
    record = Record(path, {"limit": None, "shards": 4})
    record.add("transformers sdpa safe 1/4", _numbers(3, []))
    record.add("transformers sdpa safe 2/4", _numbers(2, ["x.py: broken"]))
    again = Record(path, {"limit": None, "shards": 4})
    assert again.done("transformers sdpa safe 1/4") == _numbers(3, [])
    assert again.done("transformers sdpa safe 2/4") is None  # a failure runs again, after its fix
    assert again.done("transformers sdpa safe 3/4") is None
    assert "transformers sdpa safe (2 of 4 shards): 5 files, 2 lines" in again.totals()
    assert json.loads(path.read_text())["options"] == {"limit": None, "shards": 4}


def test_a_record_of_other_options_is_refused(tmp_path):
    path = tmp_path / "run.json"
    Record(path, {"limit": None, "shards": 4}).add("generated flex unsafe 1/4", _numbers(1, []))
    assert "not {'limit': None, 'shards': 8}" in Record(path, {"limit": None, "shards": 8}).problem


@pytest.mark.parametrize("text", ["0/4", "5/4", "a/b"])
def test_a_shard_outside_its_count_is_refused(text):
    with pytest.raises(Exception, match="is not I/N"):
        scale_check._shard(text)
