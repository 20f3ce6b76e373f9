"""`fix --apply` writes: links, identity (owner, mode, hard links, read-only), lost updates, one failure per file,
signals, and bytes outside the block (BOM, CR-only newlines, PEP 263 coding lines)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.rewrite.patch import FileChanged, WriteRefused, write_atomically
from advisor.static.discover import discover
from fixture_models import fixture_paths, golden_path
from processes import HAS_PROC, children, running

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
GOLDEN = golden_path(NANOGPT)


def fix_apply(capsys, *paths, extra=()) -> tuple[int, str, str]:
    code = main(["fix", *map(str, paths), "--apply", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob(".advisor-*")]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    return tmp_path / "src"


def test_link_and_target_in_the_tree_fix_the_real_file_once_and_keep_the_link(capsys, tree):
    real = tree / "b_real.py"
    shutil.copy(NANOGPT, real)
    (tree / "a_link.py").symlink_to("b_real.py")
    code, out, _ = fix_apply(capsys, tree)
    assert code == 0 and "0 finding(s) remain" in out and "fixed src/b_real.py" in out
    assert (tree / "a_link.py").is_symlink() and os.readlink(tree / "a_link.py") == "b_real.py"
    assert real.read_bytes() == GOLDEN.read_bytes()


def test_a_file_outside_the_tree_is_never_written_through_a_link(capsys, tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(NANOGPT, outside / "model.py")
    (tree / "linked_dir").symlink_to(outside)
    (tree / "linked_file.py").symlink_to(outside / "model.py")
    code, _, err = fix_apply(capsys, tree)
    assert code == 2 and "outside the scanned tree" in err
    assert (outside / "model.py").read_bytes() == NANOGPT.read_bytes()
    assert (tree / "linked_file.py").is_symlink()


def test_hard_linked_file_is_refused_and_both_names_keep_one_text(capsys, tree):
    shutil.copy(NANOGPT, tree / "model.py")
    os.link(tree / "model.py", tree / "other_name.txt")
    code, _, err = fix_apply(capsys, tree / "model.py")
    assert code == 2 and "hard links" in err
    assert os.stat(tree / "model.py").st_ino == os.stat(tree / "other_name.txt").st_ino
    assert (tree / "model.py").read_bytes() == NANOGPT.read_bytes()


def test_mode_is_kept(capsys, tree):
    shutil.copy(NANOGPT, tree / "model.py")
    os.chmod(tree / "model.py", 0o640)
    assert fix_apply(capsys, tree / "model.py")[0] == 0
    assert os.stat(tree / "model.py").st_mode & 0o7777 == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to nobody:nogroup takes root")
def test_owner_and_group_are_kept(capsys, tree):
    shutil.copy(NANOGPT, tree / "model.py")
    os.chown(tree / "model.py", 65534, 65534)
    os.chmod(tree / "model.py", 0o640)
    assert fix_apply(capsys, tree / "model.py")[0] == 0
    status = os.stat(tree / "model.py")
    assert (status.st_uid, status.st_gid, status.st_mode & 0o7777) == (65534, 65534, 0o640)
    assert (tree / "model.py").read_bytes() == GOLDEN.read_bytes()


def test_read_only_file_is_written_only_when_asked(capsys, tree):
    shutil.copy(NANOGPT, tree / "model.py")
    os.chmod(tree / "model.py", 0o444)
    code, _, err = fix_apply(capsys, tree / "model.py")
    assert code == 2 and "read-only" in err and "--force-readonly" in err
    assert (tree / "model.py").read_bytes() == NANOGPT.read_bytes()
    assert fix_apply(capsys, tree / "model.py", extra=["--force-readonly"])[0] == 0
    assert (tree / "model.py").read_bytes() == GOLDEN.read_bytes()
    assert os.stat(tree / "model.py").st_mode & 0o7777 == 0o444


def _edit_during(monkeypatch, module, name, path: Path, edit: str, in_place: bool) -> None:
    """Make `module.name` (a step of the write) edit `path` first, as another program would."""
    real = getattr(module, name)

    def edited(*args, **kwargs):
        if in_place:
            with open(path, "r+") as handle:
                handle.write(edit)
        else:
            path.with_name("editor.swp").write_text(edit)
            os.replace(path.with_name("editor.swp"), path)
        monkeypatch.setattr(module, name, real)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, edited)


@pytest.mark.parametrize("in_place", [True, False])
def test_an_edit_while_the_temporary_file_is_written_is_not_lost(monkeypatch, tmp_path, in_place):
    target = tmp_path / "m.py"
    target.write_text("a = 1\n")
    _edit_during(monkeypatch, tempfile, "mkstemp", target, "a = 9\n", in_place)
    with pytest.raises(FileChanged):
        write_atomically(str(target), "a = 1\n", "a = 2\n")
    assert target.read_text() == "a = 9\n" and leftovers(tmp_path) == []



def test_a_folder_put_at_the_files_name_after_the_scan_is_refused_with_its_reason(tmp_path):
    """It was an internal error ("IsADirectoryError: ... 3", exit 2, no file named), before the regular-file check."""
    target = tmp_path / "m.py"
    target.mkdir()
    with pytest.raises(WriteRefused, match="not a regular file"):
        write_atomically(str(target), "a = 1\n", "a = 2\n")
    assert target.is_dir() and leftovers(tmp_path) == []

def test_an_edit_into_the_file_just_before_the_rename_is_put_back(monkeypatch, tmp_path):
    target = tmp_path / "m.py"
    target.write_text("a = 1\n")
    _edit_during(monkeypatch, os, "replace", target, "a = 9\n", in_place=True)
    with pytest.raises(FileChanged, match="edit is kept"):
        write_atomically(str(target), "a = 1\n", "a = 2\n")
    assert target.read_text() == "a = 9\n" and leftovers(tmp_path) == []


def test_a_longer_edit_into_the_file_just_before_the_rename_comes_back_whole(monkeypatch, tmp_path):
    target = tmp_path / "m.py"
    target.write_text("a = 1\n")
    edit = "a = 9\n" + "b = 2\n" * 5000  # far longer than the text the fix was computed from
    _edit_during(monkeypatch, os, "replace", target, edit, in_place=True)
    with pytest.raises(FileChanged, match="edit is kept"):
        write_atomically(str(target), "a = 1\n", "a = 2\n")
    assert target.read_text() == edit and leftovers(tmp_path) == []


def test_one_failed_write_is_one_error_and_the_other_files_are_fixed(capsys, tree, monkeypatch):
    for name in ("a.py", "b.py"):
        shutil.copy(NANOGPT, tree / name)
    real_replace = os.replace

    def refuse_in_a(source, destination):
        if os.path.basename(destination) == "a.py":
            raise PermissionError(13, "Permission denied", source, destination)
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", refuse_in_a)
    code, out, err = fix_apply(capsys, tree)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "a.py" in lines[0] and ".advisor-" not in lines[0]
    assert (tree / "a.py").read_bytes() == NANOGPT.read_bytes()
    assert (tree / "b.py").read_bytes() == GOLDEN.read_bytes()
    assert "1 file(s) rewritten" in out and leftovers(tree) == []


def test_a_temporary_file_is_never_scanned_as_source(tmp_path, monkeypatch):
    target = tmp_path / "m.py"
    target.write_text("a = 1\n")
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.extend(discover([str(tmp_path)])[0]), real_replace(a, b)))
    write_atomically(str(target), "a = 1\n", "a = 2\n")
    assert seen == [str(target)]


SLOW_APPLY = """
import os, sys, time
real_replace = os.replace
def slow_replace(a, b):
    print("replacing", file=sys.stderr, flush=True)
    time.sleep(1.0)
    real_replace(a, b)
os.replace = slow_replace
from advisor.cli import main
sys.exit(main(["fix", "--apply", sys.argv[1]]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_apply_leaves_no_temporary_file(tmp_path, signum):
    for name in ("a.py", "b.py"):
        shutil.copy(NANOGPT, tmp_path / name)
    child = subprocess.Popen([sys.executable, "-c", SLOW_APPLY, str(tmp_path)], stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    while "replacing" not in child.stderr.readline():
        assert child.poll() is None, "fix --apply ended before writing"
    child.send_signal(signum)
    child.wait(timeout=60)
    assert leftovers(tmp_path) == []
    assert {(tmp_path / n).read_bytes() for n in ("a.py", "b.py")} <= {NANOGPT.read_bytes(), GOLDEN.read_bytes()}


@pytest.mark.skipif(not HAS_PROC, reason="lists processes through Linux /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_scanning_ends_the_scan_workers_too(tmp_path, signum):
    for copy in range(40):  # enough files for the process pool, and for the scan to still be running
        for fixture in fixture_paths("positive")[:6]:
            shutil.copy(fixture, tmp_path / f"{copy}_{fixture.name}")
    child = subprocess.Popen([sys.executable, "-m", "advisor", "fix", "--apply", str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers: set[int] = set()
    deadline = time.monotonic() + 120
    while not workers and child.poll() is None and time.monotonic() < deadline:
        workers = children(child.pid)
        time.sleep(0.05)
    assert workers, "the scan ended before its workers could be seen"
    time.sleep(0.5)  # the workers are now scanning
    workers |= children(child.pid)
    child.send_signal(signum)
    child.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if running(pid)]
    for pid in left:  # never leave them behind the test
        os.kill(pid, signal.SIGKILL)
    assert left == []


WATCHED_CHILD = """
import os, subprocess, sys, time
import advisor.child_lifetime as lifetime
if sys.argv[1:] == ["child"]:
    lifetime._set_parent_death_signal = lambda: False  # as where prctl is missing: the watch must end it
    lifetime.end_with_parent(os.getppid())
    print(os.getpid(), flush=True)
    time.sleep(120)
else:
    subprocess.Popen([sys.executable, "-c", __doc__, "child"])
    time.sleep(120)
"""


@pytest.mark.skipif(not HAS_PROC, reason="lists processes through Linux /proc")
def test_without_a_parent_death_signal_the_watch_ends_the_child_when_its_parent_is_killed():
    script = f"__doc__ = {WATCHED_CHILD!r}\n{WATCHED_CHILD}"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its parent")


@pytest.mark.parametrize("encode", [
    pytest.param(lambda text: b"\xef\xbb\xbf" + text.encode(), id="utf8-bom"),
    pytest.param(lambda text: text.replace("\n", "\r").encode(), id="cr-only"),
    pytest.param(lambda text: "# -*- coding: latin-1 -*-\n# café\n".encode("latin-1") + text.encode("latin-1"),
                 id="latin-1-coding-line"),
])
def test_bytes_outside_the_block_are_identical(capsys, tree, encode):
    (tree / "model.py").write_bytes(encode(NANOGPT.read_text()))
    code, out, err = fix_apply(capsys, tree / "model.py")
    assert (code, err) == (0, "") and "1 file(s) rewritten" in out
    assert (tree / "model.py").read_bytes() == encode(GOLDEN.read_text())
