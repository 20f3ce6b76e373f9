"""Patches for code that ran: a patch to a block the profile never saw run is listed as not exercised by
this workload and never timed, however many patches its file offers."""

import json
import os
from collections import Counter

from advisor.cli import main
from advisor.contracts.evidence import FileEvidence, RuntimeEvidence
from advisor.contracts.finding import Finding
from advisor.verify.optimize_pipeline import PatchCandidate, set_aside_unexercised
from optimize_models import write_blocks


def test_a_patch_to_code_the_workload_never_ran_is_not_exercised_and_never_timed(tmp_path, capsys):
    path = write_blocks(tmp_path, 2)  # Attention runs in `workload`; its copy Copy1 is only defined
    code = main(["optimize", f"{path}:workload", "--format", "json", "--timing-budget", "0.5",
                 "--report", str(tmp_path / "r")])
    result = json.loads(capsys.readouterr().out)
    ran, idle = sorted(result["patches"], key=lambda p: p["function"])
    assert (ran["function"], idle["function"]) == ("Attention.forward", "Copy1.forward")
    assert ran["exercised"] and ran["parity"] is not None
    assert not idle["exercised"] and idle["verdict"] == "not-run"
    assert idle["parity"] is None and idle["speedup"] is None and not idle["applied"]
    assert idle["reason"].startswith("not exercised by this workload")
    assert not (tmp_path / "r" / f"patched-{idle['id']}.log").exists()
    assert code in (0, 1)


def test_a_line_whose_ops_take_no_time_ran_where_the_profiles_recorder_saw_it():
    """`h = h.contiguous()` of a contiguous tensor owns no op time, so it is in no line of the time table; the
    recorder saw its call run (promise round 33: optimize called it "not exercised by this workload" although
    profile reported it), and the patch is tried. A line nothing saw is still set aside."""
    path = os.path.realpath("model.py")
    candidates = {pid: PatchCandidate(pid, Finding("ADV201", "copy", path, line, line, "Net.forward", "copy"), "", "x")
                  for pid, line in (("P1", 13), ("P2", 20))}
    evidence = RuntimeEvidence("model.py:workload", {path: FileEvidence(observed=Counter({(13, "contiguous"): 1}))})
    set_aside_unexercised(candidates, [[path, 12]], evidence)
    assert candidates["P1"].exercised and candidates["P1"].patched == "x"
    assert not candidates["P2"].exercised and candidates["P2"].reason.startswith("not exercised by this workload")
