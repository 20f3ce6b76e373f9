import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Wall-clock limits fail a test on a loaded machine (CI shares 2 cores), never on a behaviour: hypothesis' 200 ms
# deadline and its too-slow health check are off for every property test; each still sets its own examples.
settings.register_profile("advisor", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("advisor")

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent

# `advisor` importable without an install, and the shared helpers at the top of tests/ (fixture_models.py,
# optimize_models.py, ...) importable by name from every layer's folder. No test module imports another
# (tests/static/test_architecture.py checks it): what two tests share lives in a helper here.
for entry in map(str, (REPO_ROOT, TESTS_DIR)):
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


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh folder that is the current directory for the test (commands run in it as a user runs them there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
