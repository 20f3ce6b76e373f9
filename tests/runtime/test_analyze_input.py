"""`advisor analyze` on bad input: one bad trace in a folder is one error entry and the other ranks are still
analysed; only regular files are read; malformed values name the file; the JSON output is always strict JSON."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.cli import main
from trace_files import trace

ROOT = Path(__file__).resolve().parents[2]


def strict_json(text: str) -> dict:
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def analyze(capsys, path) -> tuple[int, dict, str]:
    code = main(["analyze", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    return code, strict_json(out) if out.strip() else {}, err


def test_a_truncated_gz_is_one_error_and_the_other_ranks_are_analysed(capsys, tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps(trace(0)))
    (tmp_path / "rank1.json.gz").write_bytes(gzip.compress(json.dumps(trace(1)).encode())[:-40])
    code, data, _ = analyze(capsys, tmp_path)
    assert code == 2 and data["ranks"] == [0]
    [error] = data["errors"]
    assert error["path"].endswith("rank1.json.gz") and error["message"]


def test_text_output_lists_the_bad_trace_on_stderr(capsys, tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps(trace(0)))
    (tmp_path / "rank1.json").write_text(json.dumps(trace(1))[:-30])
    assert main(["analyze", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "1 trace(s), rank(s) 0" in out
    assert err.count("advisor: error:") == 1 and "rank1.json" in err and "truncated" in err


def test_a_fifo_named_json_is_skipped_and_named_alone_is_refused(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps(trace(0)))
    os.mkfifo(tmp_path / "pipe.json")
    folder = _analyze_in_child(tmp_path)  # a child with a timeout: a blocking open would hang the test otherwise
    assert folder.returncode == 1 and strict_json(folder.stdout)["traces"] == [str(tmp_path / "rank0.json")]
    alone = _analyze_in_child(tmp_path / "pipe.json")
    [error] = strict_json(alone.stdout)["errors"]
    assert alone.returncode == 2 and "not a regular file" in error["message"]


def _analyze_in_child(path) -> subprocess.CompletedProcess:
    script = "import sys; from advisor.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, "analyze", str(path), "--format", "json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


MALFORMED = {
    "ts-not-a-number": dict(ts="abc"),
    "negative-duration": dict(dur=-5.0),
    "absurd-duration": dict(dur=1e300),
    "args-not-an-object": dict(args=["x"]),
    "rank-a-string": dict(distributedInfo={"rank": "one"}),
    "distributedInfo-a-list": dict(distributedInfo=[0]),
    "step-marker-without-a-number": dict(step={"name": "ProfilerStep#last"}),
    "events-not-objects": dict(extra=[None, 1, "x"]),  # were skipped: the trace read as clean
    "correlation-beyond-64-bits": dict(extra=[{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                                               "ts": 101.0, "dur": 2.0, "args": {"correlation": 1 << 64}}]),
    # promise round 60: the values of events analysis does not keep were not read (the trace read as clean)
    "python-function-ts": dict(extra=[{"ph": "X", "cat": "python_function", "name": "f", "ts": "abc", "dur": 5}]),
    "python-function-negative-dur": dict(extra=[{"ph": "X", "cat": "python_function", "name": "f", "ts": -1e30,
                                                 "dur": -7}]),
    "no-category-ts": dict(extra=[{"ph": "X", "name": "aten::mm", "ts": "abc", "dur": 5}]),
    "instant-event-ts": dict(extra=[{"ph": "i", "name": "mark", "ts": float("1e300")}]),
}


@pytest.mark.parametrize("changes", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_values_are_errors_naming_the_file(capsys, tmp_path, changes):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(trace(1, **changes)))
    assert main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0] and "internal error" not in err[0]
    (tmp_path / "good.json").write_text(json.dumps(trace(0)))
    code, data, _ = analyze(capsys, tmp_path)
    assert code == 2 and data["ranks"] == [0] and [e["path"] for e in data["errors"]] == [str(bad)]


@pytest.mark.parametrize("text", ["[" * 40000 + "]" * 40000,
                                  '{"traceEvents": [{"ph": "X", "args": ' + "[" * 5000 + "]" * 5000 + "}]}"])
def test_deep_nesting_is_one_error_not_a_memory_blowup(capsys, tmp_path, text):
    """A third promises round: `[[[[...]]]]` of 80 KB took 5 GB and 11 s, then an internal RecursionError; values
    nested beyond a trace's depth are a malformed trace, found while streaming, before any is built."""
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested deeper than" in err[0] and "internal error" not in err[0], err


@pytest.mark.parametrize("duration", ["NaN", "Infinity", "1e400"])
def test_non_finite_durations_never_reach_the_output(capsys, tmp_path, duration):
    (tmp_path / "good.json").write_text(json.dumps(trace(0)))
    text = json.dumps(trace(1, dur=12345.0)).replace("12345.0", duration)
    (tmp_path / "bad.json").write_text(text)
    code, data, _ = analyze(capsys, tmp_path)  # strict_json fails on NaN/Infinity
    assert code == 2 and data["ranks"] == [0] and data["errors"][0]["path"].endswith("bad.json")


def test_a_trace_with_events_but_no_ops_is_analysed(capsys, tmp_path):
    data = trace(0)
    data["traceEvents"] = data["traceEvents"][:1]
    (tmp_path / "steps_only.json").write_text(json.dumps(data))
    code, result, _ = analyze(capsys, tmp_path / "steps_only.json")
    assert code == 0 and result["findings"] == [] and result["errors"] == []


@pytest.mark.parametrize("make", [
    pytest.param(lambda folder: folder / "missing.json", id="missing-path"),
    pytest.param(lambda folder: folder, id="folder-without-traces"),
    pytest.param(lambda folder: (folder / "rank0.json").write_text("{not json") and folder / "rank0.json",
                 id="only-trace-unreadable"),
])
def test_json_is_one_object_with_errors_when_no_trace_could_be_read(capsys, tmp_path, make):
    code, data, err = analyze(capsys, make(tmp_path))
    assert code == 2 and data["traces"] == [] and data["findings"] == []
    [error] = data["errors"]
    assert error["path"] and error["message"]


def test_text_output_when_no_trace_could_be_read_is_one_error_line(capsys, tmp_path):
    assert main(["analyze", str(tmp_path / "missing.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "missing.json" in err
