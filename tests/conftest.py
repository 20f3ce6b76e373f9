import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent

# `advisor` importable without an install, the shared helpers (tests/fixture_models.py) importable by name, and
# each layer's folder too: a few tests reuse another test module's source builders (`from test_optimize import
# write_model`), whichever folder runs first.
LAYER_DIRS = sorted(path for path in TESTS_DIR.iterdir() if path.is_dir() and next(path.glob("test_*.py"), None))
for entry in map(str, (REPO_ROOT, TESTS_DIR, *LAYER_DIRS)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

# every attention proof the suite runs (in this process and in the CLI processes it starts) checks each step against
# what it declares it reads and writes (patterns/attention/proof_steps.py)
os.environ["ADVISOR_CHECK_PROOF"] = "1"


@pytest.fixture(autouse=True)
def _scan_cache_in_a_temporary_folder(tmp_path_factory, monkeypatch):
    """Scans keep results in $XDG_CACHE_HOME/advisor: the suite's go to a folder of its own, never ~/.cache, and
    each test starts cold (a result kept by an earlier test would hide what this one's analysis does)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
