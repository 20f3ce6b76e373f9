"""Scan time linear in the attention blocks of one file (issue 19: 800 blocks in at most 8x the time of 100).
Wall-clock times are not asserted (the machines are noisy); the calls each function of advisor makes are counted
instead, and must grow by the same number for each block added: work that reads the whole file once per block
(quadratic) adds more calls for each block than for the one before."""

from __future__ import annotations

import cProfile
import gc
import pstats
from pathlib import Path

from advisor.engine.static import analyze_source, scan_paths
from benchmarks.scan_scaling import module_with_blocks

ROOT = Path(__file__).resolve().parents[2]
OURS = (str(ROOT / "advisor"), str(ROOT / "rules"))


def _calls(blocks: int) -> dict[tuple, int]:
    """Calls of each function of advisor and its rule units while one file of `blocks` blocks is analysed and its
    fixes applied together (what `fix` writes)."""
    source = module_with_blocks(blocks)
    profiler = cProfile.Profile()
    result = profiler.runcall(lambda: analyze_source(source, "m.py"))
    fixed = profiler.runcall(lambda: result.fixed)
    assert len(result.findings) == blocks and fixed.count("scaled_dot_product_attention(") == blocks
    return {key: calls for key, (_, calls, *_) in pstats.Stats(profiler).stats.items() if key[0].startswith(OURS)}


def test_each_block_adds_the_same_calls_to_every_function():
    analyze_source(module_with_blocks(1), "m.py")  # imports and process-wide caches out of the count
    two, three, four = (_calls(blocks) for blocks in (2, 3, 4))
    grows = {f"{Path(key[0]).relative_to(ROOT)}:{key[1]} {key[2]}": (two.get(key, 0), three.get(key, 0), calls)
             for key, calls in four.items() if calls - three.get(key, 0) != three.get(key, 0) - two.get(key, 0)}
    assert grows == {}, "calls for 2, 3 and 4 blocks, not growing by the same number for each block"


def test_the_cyclic_collector_runs_once_for_a_files_analysis():
    """Its passes over the live trees found nothing and grew with the file (static.collector): it runs once, as the
    analysis ends (87 passes for this file before), and stays on."""
    source, passes = module_with_blocks(3), []
    gc.callbacks.append(lambda phase, info: passes.append(info["generation"]) if phase == "start" else None)
    try:
        analyze_source(source, "m.py")
    finally:
        gc.callbacks.pop()
    assert len(passes) <= 1 and gc.isenabled()


def test_a_scan_sets_objects_aside_only_for_its_run_and_leaves_a_callers_freeze(tmp_path):
    """`scan_paths` freezes what is alive as it starts and unfreezes it as it ends; a process that froze objects
    itself keeps them frozen (static.collector.long_lived_set_aside)."""
    (tmp_path / "m.py").write_text(module_with_blocks(1))
    assert gc.get_freeze_count() == 0
    scan_paths([str(tmp_path)], jobs=1, cache=False)
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        scan_paths([str(tmp_path)], jobs=1, cache=False)
        assert gc.get_freeze_count() > 0  # not released (objects freed by reference counting leave the count)
    finally:
        gc.unfreeze()
