"""Adding a rule to a family is adding one file: a unit written the way a newcomer would (docs, examples, a static
proof, an op-graph detector, a trace detector) is put in a folder outside the source tree and appended to the
copy/cast family's package path, and every part of the product picks it up: the registry, `rules --explain`,
`scan`, `fix`, the profile's runtime engine, `analyze` on a Chrome trace, and the tests generated from examples.
Nothing else is edited."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

UNIT = '''
"""ADV206: a clone of a fresh clone."""

from advisor.contracts.call_rule import CallRule
from advisor.lazy import lazy_import
from advisor.rules.copies_casts._examples import not_returned, returned
from advisor.contracts.detection import Detection, TraceHit

roles = lazy_import("advisor.patterns.copy_cast_roles")


def prove(parsed, call):
    found = roles.method(call)
    if roles.is_plain_clone(call) and found is not None and roles.is_plain_clone(found[0]):
        return roles.Rewrite(call, roles.removed_call(parsed, call), "a clone of a fresh clone has its values")
    return None


def detect(op_graph, device):
    graph = op_graph.graph
    return [Detection(RULE.code, data["loc"], data["loc"].line, frozenset({node}), "clone of a clone", {})
            for node, data in graph.nodes(data=True) if data["op"] == "clone" and data["loc"] is not None
            and any(graph.nodes[p]["op"] == "clone" for p in graph.predecessors(node))]


def trace(view):
    for i, event in view.python_calls("aten::clone"):
        if view.inside(i, {"aten::clone"}) or any(view.name(k) == "aten::clone" for k in view.children.of(i)):
            continue
        yield TraceHit(RULE.code, [i], "clone seen in a trace")


RULE = CallRule(
    code="ADV206", kind="contiguous", title="Clone of a fresh clone", summary="clone cloned again",
    fix="remove-call", fix_safety="safe", fix_summary="safe: drop the second clone",
    what="`x.clone().clone()`.", why="The second copy reads and writes every element again.",
    fix_doc="Removes the outer clone: the inner one is fresh already.",
    detectors=("static", "runtime"),
    examples=(returned("x.clone().clone()", "x.clone()"), not_returned("x.clone()")),
    tokens=("clone",), prove=prove, graph=detect, trace=trace,
)
'''

WORKLOAD = '''
import torch


def double_clone(x):
    return x.clone().clone() * 2


def workload():
    return double_clone, (torch.randn(64, 64),)
'''

SCRIPT = '''
import importlib.util, io, json, sys, contextlib
spec = importlib.util.find_spec("advisor.rules.copies_casts")
spec.submodule_search_locations.append(sys.argv[1])  # the new file's folder joins the family's package
sys.modules[spec.name] = family = importlib.util.module_from_spec(spec)
spec.loader.exec_module(family)
from advisor.cli import main
from advisor.registry import load_rules
from advisor.runtime.trace_analysis import analyze_path
from advisor.engine.profiling import profile_workload
from advisor.workload_loader import load_workload

out = {"registered": "ADV206" in load_rules()}
for name, argv in (("explain", ["rules", "--explain", "ADV206"]),
                   ("scan", ["scan", sys.argv[2], "--format", "json", "--select", "ADV206"]),
                   ("fix", ["fix", sys.argv[2], "--select", "ADV206"])):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        out[name + "_code"] = main(argv)
    out[name] = buffer.getvalue()
target = sys.argv[2] + ":workload"
report = profile_workload(load_workload(target), target, trace_path=sys.argv[3])
out["profiled"] = sorted({(f.rule, f.line) for f in report.findings if f.rule == "ADV206"})
out["traced"] = sorted({f.rule for f in analyze_path(sys.argv[3]).findings})
print(json.dumps(out))
'''


def test_a_rule_added_as_one_file_is_registered_explained_scanned_fixed_profiled_and_traced(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    (units / "clone_of_clone.py").write_text(UNIT)
    model = tmp_path / "model.py"
    model.write_text(WORKLOAD)
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(units), str(model),
                          str(tmp_path / "trace.json")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["registered"]
    assert out["explain_code"] == 0 and "Clone of a fresh clone" in out["explain"]
    findings = json.loads(out["scan"])["findings"]
    assert [(f["rule"], f["line"], f["fixable"], f["fix_safety"]) for f in findings] == [("ADV206", 6, True, "safe")]
    assert "-    return x.clone().clone() * 2" in out["fix"] and "+    return x.clone() * 2" in out["fix"]
    assert out["profiled"] == [["ADV206", 6]]
    assert "ADV206" in out["traced"]


@pytest.mark.parametrize("family, codes", [
    ("copies_casts", {"ADV201", "ADV202", "ADV203", "ADV204", "ADV205", "ADV301", "ADV302", "ADV303", "ADV304",
                      "ADV305"}),
    ("attention_config", {"ADV601", "ADV602", "ADV603", "ADV604", "ADV701"}),
])
def test_a_family_folder_is_exactly_its_unit_files(family, codes):
    """One rule per module, and no rule of the family declared anywhere else."""
    package = importlib.import_module(f"advisor.rules.{family}")
    folder = Path(package.__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    assert len(modules) == len(package.FAMILY.rules)
    assert {rule.code for rule in package.FAMILY.rules} == codes
