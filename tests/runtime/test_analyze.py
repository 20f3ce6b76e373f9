"""advisor analyze on traces this project wrote: same kinds as profile where a trace can show them, across ranks."""

import json
import os

import pytest

from advisor.cli import main
from profile_helpers import FIXTURES, run_fixture, same_file


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("traces") / "rank0.json"
    run_fixture("handwritten_attention.py", trace_path=str(path))
    return path


def _analyze(capsys, path):
    code = main(["analyze", str(path), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def _def_line(path, name):
    for number, text in enumerate(open(path).read().splitlines(), 1):
        if text.strip().startswith(f"def {name}("):
            yield number


def test_trace_attention_and_mask_attributed_to_the_function(trace_file, capsys):
    code, data = _analyze(capsys, trace_file)
    source = FIXTURES / "handwritten_attention.py"
    forward_line = list(_def_line(source, "forward"))[0]  # CausalSelfAttention.forward
    assert code == 1
    kinds = {(f["rule"], f["line"]) for f in data["findings"] if same_file(f["path"], source)}
    assert ("ADV110", forward_line) in kinds and ("ADV501", forward_line) in kinds
    top = data["findings"][0]
    assert top["rule"] == "ADV110" and top["calls"] == 2
    assert any("statement" in note for note in data["limitations"])
    assert {row["category"] for row in data["breakdown"]} >= {"gemm", "softmax"}


def test_ranks_are_aggregated(trace_file, tmp_path, capsys):
    data = json.loads(trace_file.read_text())
    for rank in (0, 1):
        data["distributedInfo"] = {"rank": rank}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(data))
    code, result = _analyze(capsys, tmp_path)
    assert result["ranks"] == [0, 1]
    attention = next(f for f in result["findings"] if f["rule"] == "ADV110")
    assert set(attention["evidence"]["per_rank_us"]) == {"0", "1"}


def test_stackless_ranks_merge_and_shares_are_of_the_mean_rank(trace_file, tmp_path, capsys):
    """Promise breaker round 31: without Python stacks each rank's hits were keyed by its file's name (one block,
    two findings at half the share), and a share was of the last rank read's op time, so the files' order set it."""
    data = json.loads(trace_file.read_text())
    for event in data["traceEvents"]:
        (event.get("args") or {}).pop("Call stack", None)
    for rank, name in ((0, "b.json"), (1, "a.json")):
        data["distributedInfo"] = {"rank": rank}
        (tmp_path / name).write_text(json.dumps(data))
    _, merged = _analyze(capsys, tmp_path)
    _, alone = _analyze(capsys, tmp_path / "a.json")
    shares = {(f["rule"], f["path"], f["line"]): f["share"] for f in merged["findings"]}
    assert len(shares) == len(merged["findings"])  # one finding per block, not one per rank's file
    assert shares == {(f["rule"], f["path"], f["line"]): f["share"] for f in alone["findings"]}


def test_sdpa_fallback_reason_from_trace_shapes(tmp_path, capsys):
    trace = tmp_path / "sdpa.json"
    run_fixture("sdpa_fallback.py", trace_path=str(trace))
    _, data = _analyze(capsys, trace)
    [fallback] = [f for f in data["findings"] if f["rule"] == "ADV401"]
    assert any("dropout" in reason for reason in fallback["evidence"]["reasons"])


def test_a_trace_in_the_json_array_format_reads_as_its_object_form(trace_file, tmp_path, capsys):
    """The Trace Event Format's other form, a bare list of events, was "not a Chrome/Kineto trace"."""
    (tmp_path / "array.json").write_text(json.dumps(json.loads(trace_file.read_text())["traceEvents"]))
    code, as_array = _analyze(capsys, tmp_path / "array.json")
    _, as_object = _analyze(capsys, trace_file)
    assert code == 1 and as_array["findings"] and as_array["findings"] == as_object["findings"]

def test_trace_without_stacks_says_so(trace_file, tmp_path, capsys):
    data = json.loads(trace_file.read_text())
    for event in data["traceEvents"]:
        (event.get("args") or {}).pop("Call stack", None)
    (tmp_path / "nostack.json").write_text(json.dumps(data))
    _, result = _analyze(capsys, tmp_path / "nostack.json")
    assert any("no Python stacks" in note for note in result["limitations"])
    assert all(f["line"] == 0 for f in result["findings"])


@pytest.mark.parametrize("content, message", [("", "truncated"), ('{"traceEvents": [{"ph": "X"', "truncated"),
                                              ('{"other": 1}', "not a Chrome/Kineto trace")])
def test_bad_traces_are_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_missing_trace_is_exit_2(tmp_path, capsys):
    assert main(["analyze", os.fspath(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
