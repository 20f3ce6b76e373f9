"""Warm scans. Each file's result is kept on disk (advisor.static.scan_cache) and reused only while
nothing that could change it changed: the file, the options, the tree-wide facts, and the other files its analysis
read (the callers that prove facts from call sites)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import advisor
import advisor.engine.static as static
from advisor.cli import main
from advisor.engine.static import scan_paths
from advisor.static.scan_cache import cache_root
from fixture_models import fixture_inputs

REPO = Path(__file__).resolve().parents[2]
POSITIVE = REPO / "fixtures" / "attention" / "positive"

ATTEND = '''
import torch


def attend(q, k, v, mask, scale):
    scores = q @ k.transpose(-2, -1) * scale + mask
    return scores.softmax(dim=-1) @ v
'''

CALLER = '''
import torch

from attn import attend


def run(q, k, v, ids):
    b, n = ids.shape
    keep = ids != 0
    return attend(q, k, v, {mask}, 0.25)
'''


@pytest.fixture
def analysed(monkeypatch) -> list[str]:
    """The files whose analysis ran (not taken from the cache), in this process."""
    seen: list[str] = []
    real = static._analyze_file

    def counting(path, *args, **kwargs):
        seen.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(static, "_analyze_file", counting)
    return seen


def _tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def _fixture_tree(tmp_path: Path, count: int = 4) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    for source in fixture_inputs(POSITIVE)[:count]:
        (root / source.name).write_text(source.read_text())
    return root


def _json(result) -> list[dict]:
    return [f.to_json() for f in result.findings]


def _entries() -> list[Path]:
    return [p for p in cache_root().rglob("*") if p.is_file()]


def test_a_warm_scan_analyses_nothing_and_finds_what_the_cold_one_found(tmp_path, analysed):
    root = _fixture_tree(tmp_path)
    cold = scan_paths([str(root)])
    files = sorted(p.name for p in root.iterdir())
    assert sorted(analysed) == files and cold.findings
    analysed.clear()
    warm = scan_paths([str(root)])
    assert analysed == []
    assert _json(warm) == _json(cold)
    assert [f.fixed for f in warm.files] == [f.fixed for f in cold.files]  # what `fix` writes
    analysed.clear()
    scan_paths([str(root)], unsafe_fixes=True)  # other options: other entries
    assert sorted(analysed) == files


def test_an_edit_of_a_caller_drops_the_fact_it_proved_in_the_callee(tmp_path, analysed):
    root = _tree(tmp_path / "tree", {"attn.py": ATTEND, "model.py": CALLER.format(mask="keep.view(b, 1, 1, n)")})

    def attention():
        found = [f for f in scan_paths([str(root)]).findings if f.kind == "attention"]
        assert len(found) == 1
        return found[0]

    before = attention()
    proved = {fact["name"] for fact in before.extra["facts"].get("from_call_sites", [])}
    assert {"mask-dtype", "fully-masked-rows"} <= proved
    analysed.clear()
    assert attention().to_json() == before.to_json() and analysed == []  # unchanged: taken from the cache
    (root / "model.py").write_text(textwrap.dedent(CALLER.format(mask="torch.load('mask.pt')")))
    after = attention()  # attn.py is unchanged; its call site is not
    assert "attn.py" in analysed
    assert not {"mask-dtype", "fully-masked-rows"} & {f["name"] for f in after.extra["facts"].get("from_call_sites", [])}
    assert after.fix_safety == "unsafe"


PLAIN_STEP = '''
def step(loss):
    loss.backward()
'''

PENALTY_STEP = '''
import torch


def step(loss, x):
    (grad,) = torch.autograd.grad(loss, x, create_graph=True)
    grad.square().sum().backward()
'''


def test_what_another_file_asks_of_autograd_keys_an_unchanged_files_result(tmp_path, analysed):
    """The tree's facts key every entry: a double backward asked for in another file, which this file's analysis
    never reads, still takes its result out of the cache, and its fact turns from proved to assumed."""
    root = _tree(tmp_path / "tree", {"attn.py": ATTEND, "train.py": PLAIN_STEP})

    def autograd_fact() -> str:
        (found,) = [f for f in scan_paths([str(root)]).findings if f.kind == "attention"]
        return next(status for status, facts in found.extra["facts"].items()
                    if any(fact["name"] == "first-order-autograd" for fact in facts))

    assert autograd_fact() == "proved"
    analysed.clear()
    assert autograd_fact() == "proved" and analysed == []  # unchanged: taken from the cache
    (root / "train.py").write_text(textwrap.dedent(PENALTY_STEP))
    assert autograd_fact() == "assumed"
    assert "attn.py" in analysed


def test_a_corrupt_or_foreign_entry_is_ignored_and_rebuilt(tmp_path, analysed):
    root = _fixture_tree(tmp_path)
    cold = _json(scan_paths([str(root)]))
    entries = sorted(_entries())
    assert entries
    for number, entry in enumerate(entries):  # every kind of damage, round robin
        data = entry.read_bytes()
        damaged = [data[: len(data) // 2], b"", os.urandom(64), data.replace(b"advisor-scan-cache 1", b"advisor-"
                   b"scan-cache 0", 1), entries[(number + 1) % len(entries)].read_bytes()][number % 5]
        entry.write_bytes(damaged)
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold
    assert sorted(analysed) == sorted(p.name for p in root.iterdir())
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and analysed == []  # rebuilt


def test_an_entry_that_is_no_regular_file_is_a_miss(tmp_path, analysed):
    """A third promises round: entries replaced by FIFOs blocked the scan forever (a read of a FIFO waits for a
    writer); a FIFO, a link or a folder in an entry's place is a miss, and the scan's result the same."""
    root = _fixture_tree(tmp_path)
    cold = _json(scan_paths([str(root)]))
    for number, entry in enumerate(sorted(_entries())):
        entry.unlink()
        [lambda: os.mkfifo(entry), lambda: entry.symlink_to("/dev/zero"), lambda: entry.mkdir()][number % 3]()
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and analysed


def test_an_entry_with_the_right_key_but_a_foreign_value_is_a_miss(tmp_path, analysed):
    """The header and key right, the pickled value not a file's result (`(None, {}, "garbage")`): the scan used it
    and died on `.findings`; now it is analysed again and the entry rewritten."""
    root = _fixture_tree(tmp_path)
    cold = _json(scan_paths([str(root)]))
    for entry in _entries():
        data = entry.read_bytes()
        header = data[: data.index(b"\n") + 1]
        entry.write_bytes(header + pickle.dumps((None, {}, "garbage")))
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and analysed
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and analysed == []


def test_concurrent_runs_share_the_cache_safely(tmp_path, monkeypatch, capsys, analysed):
    root = _fixture_tree(tmp_path, count=6)
    monkeypatch.chdir(tmp_path)
    command = [sys.executable, "-m", "advisor", "scan", str(root), "--format", "json"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]  # both cold, writing
    outputs = [json.loads(run.communicate(timeout=300)[0])["findings"] for run in runs]
    fresh = _json(scan_paths([str(root)], cache=False))
    assert fresh and outputs == [fresh, fresh]
    analysed.clear()
    main(command[3:])  # the same options in this process: what they wrote is whole
    assert json.loads(capsys.readouterr().out)["findings"] == fresh and analysed == []
    assert not [p for p in cache_root().rglob(".tmp-*")]  # no partial entry left behind


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids: folder ownership is not checked")
def test_a_cache_folder_others_can_write_is_neither_read_nor_written(tmp_path, analysed):
    """Entries are pickles (loading one runs code): only a folder no other user can write is trusted."""
    root = _fixture_tree(tmp_path, count=2)
    cold = _json(scan_paths([str(root)]))
    assert cache_root().stat().st_mode & 0o777 == 0o700 and (cache_root() / "scan").stat().st_mode & 0o777 == 0o700
    entries = sorted(_entries())
    cache_root().chmod(0o777)
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and len(analysed) == 2  # nothing read
    (root / "new.py").write_text("x = 1\n")
    scan_paths([str(root)])
    assert sorted(_entries()) == entries  # nothing written
    cache_root().chmod(0o700)
    analysed.clear()
    scan_paths([str(root)])
    assert "new.py" in analysed


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids: folder ownership is not checked")
@pytest.mark.parametrize("attack", ["shard-writable", "shard-link", "entry-writable"])
def test_a_shard_folder_or_entry_others_can_write_is_neither_read_nor_written(tmp_path, analysed, attack):
    """The entries sit in shard folders under `scan/`: each is checked like the folders above it (promise round 32:
    a 0777 shard was read, a planted pickle ran, and a shard linked to a shared folder was written into)."""
    root = _fixture_tree(tmp_path, count=2)
    cold = _json(scan_paths([str(root)]))
    entries = sorted(_entries())
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    for entry in entries:
        if attack == "shard-writable":
            entry.parent.chmod(0o777)
        elif attack == "entry-writable":
            entry.chmod(0o666)
    if attack == "shard-link":
        for shard in {entry.parent for entry in entries}:
            for entry in shard.iterdir():
                entry.rename(shared / entry.name)
            shard.rmdir()
            shard.symlink_to(shared)
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and len(analysed) == 2  # nothing read
    kept = sorted(p.name for p in shared.iterdir())
    (root / "new.py").write_text("x = 1\n")
    scan_paths([str(root)])
    assert sorted(p.name for p in shared.iterdir()) == kept  # nothing written through a link


def test_no_cache_neither_reads_nor_writes(tmp_path, capsys, monkeypatch, analysed):
    root = _fixture_tree(tmp_path, count=2)
    monkeypatch.chdir(tmp_path)
    main(["scan", str(root), "--no-cache", "--format", "json"])
    advisor.scan(root, cache=False)
    assert _entries() == []
    main(["scan", str(root), "--format", "json"])
    assert _entries()
    analysed.clear()
    main(["scan", str(root), "--no-cache", "--format", "json"])
    assert len(analysed) == 2
    (tmp_path / "pyproject.toml").write_text("[tool.advisor]\ncache = false\n")
    analysed.clear()
    main(["fix", str(root)])
    assert len(analysed) == 2
    capsys.readouterr()


def test_the_cache_lives_under_xdg_cache_home_else_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    scan_paths([str(_fixture_tree(tmp_path, count=2))])
    assert cache_root() == tmp_path / "xdg" / "advisor" and _entries()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "advisor"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: ignored, never a folder in the scanned tree
    assert cache_root() == tmp_path / "home" / ".cache" / "advisor"


def _edit_when_analysed(monkeypatch, path: Path, text: str, before_read: bool) -> None:
    """The next time the analysis reads `path`, the file becomes `text`: just before that read, or just after."""
    real = static.read_source
    pending = [True]

    def reading(where, *args, **kwargs):
        edit = pending and Path(where) == path
        if edit and before_read:
            path.write_text(text)
        source = real(where, *args, **kwargs)
        if edit:
            pending.clear()
            path.write_text(text)
        return source

    monkeypatch.setattr(static, "read_source", reading)


def test_a_file_edited_before_its_analysis_read_it_is_not_kept(tmp_path, monkeypatch, analysed):
    """The tree-wide pass read the old bytes, the analysis the new: the key (old bytes) and the result (new bytes)
    disagree, so nothing is kept."""
    root = _tree(tmp_path / "tree", {"attn.py": ATTEND})
    target = root / "attn.py"
    _edit_when_analysed(monkeypatch, target, "import torch\n", before_read=True)
    assert scan_paths([str(root)]).findings == []  # the new bytes' result
    target.write_text(textwrap.dedent(ATTEND))
    analysed.clear()
    assert scan_paths([str(root)]).findings and analysed == ["attn.py"]  # the old bytes: analysed again


def test_a_file_edited_after_its_analysis_read_it_is_kept_under_the_bytes_analysed_alone(tmp_path, monkeypatch,
                                                                                          analysed):
    """The result is kept under the bytes the analysis read (its own digest, not a second read of the file): the
    edited bytes are analysed afresh, and the bytes analysed, once back, are served from the cache."""
    root = _tree(tmp_path / "tree", {"attn.py": ATTEND})
    target = root / "attn.py"
    _edit_when_analysed(monkeypatch, target, "import torch\n", before_read=False)
    cold = _json(scan_paths([str(root)]))
    assert cold and target.read_text() == "import torch\n"
    analysed.clear()
    assert scan_paths([str(root)]).findings == [] and analysed == ["attn.py"]  # never the old result for new bytes
    target.write_text(textwrap.dedent(ATTEND))
    analysed.clear()
    assert _json(scan_paths([str(root)])) == cold and analysed == []


HELPER = '''
import torch


def softmax(x, dim):
    return torch.softmax({argument}, dim=dim)
'''
USES_HELPER = '''
from torch import nn

from pkg import utils


class Attention(nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) * (q.size(-1) ** -0.5)
        return utils.softmax(scores, dim=-1) @ v
'''


def test_an_edit_of_a_package_helper_the_block_reads_drops_the_kept_result(tmp_path, analysed):
    """A softmax helper read from another file of the package (`utils.softmax(s, dim=-1)`) is part of the proof:
    when it stops being a plain softmax, the kept safe patch of the file that calls it must not come back."""
    root = _tree(tmp_path / "pkg", {"__init__.py": "", "utils.py": HELPER.format(argument="x"),
                                    "model.py": USES_HELPER})

    def attention():
        [found] = [f for f in scan_paths([str(root)]).findings if f.kind == "attention"]
        return found

    assert attention().fix_safety == "safe"
    analysed.clear()
    assert attention().fix_safety == "safe" and analysed == []  # unchanged: taken from the cache
    (root / "utils.py").write_text(textwrap.dedent(HELPER.format(argument="x * 2.0")))
    after = attention()
    assert "model.py" in analysed
    assert after.fix_safety != "safe" and "utils.softmax" in after.reason


EAGER_LOAD = 'from transformers import LlamaForCausalLM\n\nmodel = LlamaForCausalLM.from_pretrained("x", attn_implementation="eager")\n'


def _adv601(tmp_path: Path, env: dict, *options: str) -> list:
    scanned = subprocess.run([sys.executable, "-m", "advisor", "scan", *options, "m.py", "--format", "json"],
                             cwd=tmp_path, capture_output=True, text=True, env=env)
    return [(f["rule"], f["fix_safety"]) for f in json.loads(scanned.stdout)["findings"]]


def test_a_transformers_shadowing_the_installed_one_is_never_run_nor_shares_cached_verdicts(tmp_path):
    """Breaker round 16: ADV601 reads `_supports_sdpa` from the importable transformers. A repository's own
    `transformers/` (the current folder leads sys.path) ran during a static scan, and two environments sharing one
    cache got each other's verdict: the installed package's `safe` reached one whose transformers says nothing."""
    (tmp_path / "m.py").write_text(EAGER_LOAD)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    installed = _adv601(tmp_path, env)
    assert installed == [("ADV601", "safe")]  # the installed LlamaForCausalLM supports SDPA
    (tmp_path / "other" / "transformers").mkdir(parents=True)
    (tmp_path / "other" / "transformers" / "__init__.py").write_text(
        "import pathlib\npathlib.Path('RAN').write_text('x')\n\n\nclass LlamaForCausalLM:\n    _supports_sdpa = True\n")
    shadowed = {**env, "PYTHONPATH": str(tmp_path / "other")}
    assert _adv601(tmp_path, shadowed) == _adv601(tmp_path, shadowed, "--no-cache") == [("ADV601", "unsafe")]
    assert not (tmp_path / "RAN").exists()
