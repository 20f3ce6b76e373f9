"""annotate_findings: measured cost flows onto static findings whose span overlaps, then they sort by it."""

import os

from advisor.contracts.finding import Finding
from advisor.runtime.join import annotate_findings


def _finding(rule, path, line, end_line, **extra):
    return Finding(rule=rule, kind="attention", path=path, line=line, end_line=end_line, function="f",
                   message="m", extra=dict(extra))


def test_overlapping_spans_get_cost_and_sort_by_it(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("x = 1\n")
    link = tmp_path / "link.py"
    os.symlink(model, link)
    static = [_finding("ADV101", str(model), 10, 16), _finding("ADV101", str(model), 40, 46),
              _finding("ADV103", str(tmp_path / "other.py"), 10, 16)]
    runtime = [_finding("ADV110", str(link), 10, 16, self_us=50.0, share=0.05, calls=2),  # same file via symlink
               _finding("ADV110", str(model), 46, 50, self_us=500.0, share=0.5, calls=4),  # touches end_line 46
               _finding("ADV501", str(model), 17, 20, self_us=9.0, share=0.01, calls=1)]  # no overlap
    result = annotate_findings(static, runtime)
    assert [(f.line, f.extra.get("self_us")) for f in result] == [(40, 500.0), (10, 50.0), (10, None)]
    assert result[0].extra["calls"] == 4 and result[0].extra["share"] == 0.5
    assert result[1].extra["measured_by"] == ["ADV110"]
    assert "self_us" not in result[2].extra  # other.py: nothing measured there


def test_several_runtime_findings_in_one_span_add_up(tmp_path):
    path = str(tmp_path / "m.py")
    [annotated] = annotate_findings([_finding("ADV101", path, 1, 9)],
                                    [_finding("ADV110", path, 1, 9, self_us=10.0, share=0.1, calls=2),
                                     _finding("ADV304", path, 5, 5, self_us=2.0, share=0.02, calls=2)])
    assert annotated.extra["self_us"] == 12.0 and annotated.extra["measured_by"] == ["ADV110", "ADV304"]
