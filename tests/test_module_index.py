"""ParsedModule's own parent map must be exactly libcst's ParentNodeProvider's: every analysis walks it."""

from pathlib import Path

import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from advisor.static.module_index import ParsedModule

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "fixtures" / "attention" / "public").glob("*.py"))[:8] + [ROOT / "advisor" / "cli.py"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_parent_map_equals_libcsts_provider(path):
    parsed = ParsedModule(path.read_text(), str(path))
    expected = MetadataWrapper(parsed.module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    assert dict(parsed.parents) == dict(expected)
