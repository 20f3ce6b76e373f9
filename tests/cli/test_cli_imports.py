"""The CLI starts light: building the parser (every verb's options) and running `analyze` import no heavy library.
torch alone costs seconds and ~250 MB of RSS, which `advisor --help` and `advisor analyze` never use."""

from __future__ import annotations

import json
import subprocess
import sys

from trace_files import trace

HEAVY = ("torch", "transformers", "libcst", "networkx")
SCRIPT = """
import json, sys
from advisor.cli import build_parser, main
heavy = {heavy!r}
build_parser()
after_parser = sorted(m for m in heavy if m in sys.modules)
code = main(sys.argv[1:])
print(json.dumps({{"after_parser": after_parser, "after_analyze": sorted(m for m in heavy if m in sys.modules),
                  "code": code}}))
"""


def test_building_the_parser_and_analyzing_a_trace_import_no_heavy_library(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(trace(0)))
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(heavy=HEAVY), "analyze", str(path), "--format", "json"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["code"] == 1, run.stderr  # the trace's hand-written attention is found
    assert report["after_parser"] == [] and report["after_analyze"] == []

