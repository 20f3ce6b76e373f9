"""Patches for code that ran: a patch to a block the profile never saw run is listed as not exercised by
this workload and never timed, however many patches its file offers."""

import json

from advisor.cli import main
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
