"""Promises a hostile user broke in round 35 (README): diffs that `git apply` takes for a link in the tree and for a
current directory reached through a link, no spinner in a redirected stderr under FORCE_COLOR, a TARGET whose `seed`
has no default, a module TARGET's config, and the apply command after `--interactive` declines."""

from __future__ import annotations

import argparse
import io
import os

from rich.console import Console

from advisor.commands.common import status
from advisor.commands.optimize import apply_command
from advisor.config import start_of
from advisor.contracts.finding import relative_path
from advisor.workload_loader import call_with_seed
from in_process_cli import run_cli

ATTENTION = '''import torch


def attend(q, k, v):
    s = q @ k.transpose(-2, -1) * 0.125
    return s.softmax(dim=-1) @ v
'''


def test_a_link_to_a_file_of_the_tree_is_named_by_its_target_where_the_fix_is_written(capsys, tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(ATTENTION)
    os.symlink("model.py", tmp_path / "link.py")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "fix", ".")
    assert code == 1 and "--- a/model.py" in out and "link.py" not in out


def test_a_file_under_a_current_directory_reached_through_a_link_is_named_relative_to_it(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    (tmp_path / "real" / "model.py").write_text(ATTENTION)
    monkeypatch.chdir(tmp_path / "link")  # the process sees the physical folder; the shell's $PWD names the link
    assert relative_path(str(tmp_path / "link" / "model.py")) == "model.py"
    assert relative_path(str(tmp_path / "elsewhere.py")) == str(tmp_path / "elsewhere.py")


def test_no_spinner_is_drawn_into_a_file_even_where_colour_is_forced():
    console = Console(file=io.StringIO(), force_terminal=True)
    with status(console, "starting") as shown:
        shown.update("loading the workload")
    assert console.file.getvalue() == ""


def test_a_seed_without_a_default_gets_seed_0_first_then_the_seeds_asked():
    def required(seed):
        return seed

    def keyword_only(*, seed):
        return seed

    def positional_only(seed, /):
        return seed

    def defaulted(seed=7):
        return seed

    for function in (required, keyword_only, positional_only):
        assert call_with_seed(function, 0) == 0 and call_with_seed(function, 2) == 2
    assert call_with_seed(defaulted, 0) == 7 and call_with_seed(defaulted, 1) == 1
    assert call_with_seed(lambda: "none", 1) == "none"


def test_a_module_target_s_config_is_searched_from_its_file(tmp_path, monkeypatch):
    package = tmp_path / "proj" / "pkgx"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(ATTENTION)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    args = argparse.Namespace(target="pkgx.model:workload", root=str(tmp_path / "proj"))
    assert start_of(args) == str(package / "model.py")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "proj"))
    assert start_of(argparse.Namespace(target="pkgx.model:workload", root=None)) == str(package / "model.py")
    assert start_of(argparse.Namespace(target="nowhere.model:workload", root=None)) is None


def test_the_apply_command_after_interactive_review_applies_instead_of_asking_again():
    args = argparse.Namespace(argv=["optimize", "model.py:workload", "--interactive", "--report", "r"])
    assert apply_command(args) == "advisor optimize model.py:workload --report r --apply"
    script = argparse.Namespace(argv=["optimize", "--interactive", "--", "train.py", "--interactive"])
    assert apply_command(script) == "advisor optimize --apply -- train.py --interactive"
