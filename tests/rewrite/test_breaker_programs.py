"""Programs breaker round 20 wrote against the `kv-length` proof (fixtures/attention/breaker20: each defines `run()`,
which raises in the original because its keys and values differ in length, or feeds a patch another rank): every
safe patch must raise where the original raises and give its values where it does not. They were safe patches
that returned values after the fix (SDPA's CPU kernels read past v) before the proof learned: a helper's own
sizes differ per call, a guessed number may be a tensor, `torch.cat` skips a legacy empty tensor, dim 0 and axis
-4 are one axis of a 4-D tensor, torch's `axis=` spelling, in-place shape changes and hooks anywhere in the file,
`global`/`nonlocal` names, subclasses redefining a helper or a layer, lists changed in place, starred and nested
targets, nested tensors, a 1-D v the check's slice reads, a permute the patch undoes, a baddbmm input of another
dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advisor.engine.static import analyze_source
from fixture_models import load_module_from_source

PROGRAMS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "attention" / "breaker20").glob("*.py"))


def _outcome(module):
    try:
        return module.run()
    except Exception as error:  # noqa: BLE001 - what a caller sees, whatever it is
        return type(error)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_a_safe_patch_raises_where_the_original_raises_and_keeps_its_values(path):
    source = path.read_text(encoding="utf-8")
    fixed = analyze_source(source, path.name).fixed
    original = _outcome(load_module_from_source(source, f"{path.stem}_original"))
    patched = _outcome(load_module_from_source(fixed, f"{path.stem}_patched"))
    if isinstance(original, type) or isinstance(patched, type):
        assert isinstance(original, type) and isinstance(patched, type), (original, patched)
    else:
        torch.testing.assert_close(patched, original, rtol=1e-4, atol=1e-5)
