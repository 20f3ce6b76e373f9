"""[tool.advisor] in pyproject.toml: found as Ruff finds its config, overridden by flags, mistakes are usage errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from advisor.cli import build_parser, main
from advisor.config import settle

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
COPIES_AND_CASTS = ROOT / "fixtures" / "profile" / "copies_and_casts.py"  # ADV101 (unsafe) and ADV204 (safe)


def scan_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["scan", *map(str, argv), "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out)


def rules_found(data: dict) -> list[tuple[str, str]]:
    return sorted((f["path"], f["rule"]) for f in data["findings"])


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a model (ADV101 + ADV204); the test writes its pyproject.toml."""
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    shutil.copy(COPIES_AND_CASTS, root / "src" / "model.py")
    monkeypatch.chdir(root)
    return root


def write_config(folder: Path, body: str, name: str = "pyproject.toml") -> Path:
    path = folder / name
    text = ("[tool.advisor]\n" if name == "pyproject.toml" else "") + body
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # "\udcff" in a body is the byte 0xff
    return path


def test_select_and_ignore_from_the_pyproject_in_the_current_directory(capsys, project):
    write_config(project, 'select = ["ADV2"]\n')
    assert rules_found(scan_json(capsys, "src")[1]) == [("src/model.py", "ADV204")]
    write_config(project, 'ignore = ["ADV204"]\n')
    assert rules_found(scan_json(capsys, "src")[1]) == [("src/model.py", "ADV101")]


def test_the_nearest_pyproject_with_the_table_is_found_from_the_first_path_upward(capsys, project, tmp_path,
                                                                                   monkeypatch):
    write_config(project, 'select = ["ADV2"]\n')
    (project / "src" / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no [tool.advisor]: passed over
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _, data = scan_json(capsys, project / "src" / "model.py")
    assert [f["rule"] for f in data["findings"]] == ["ADV204"]


def test_without_a_config_above_the_path_the_current_directory_decides(capsys, project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(COPIES_AND_CASTS, outside / "model.py")
    write_config(project, 'select = ["ADV2"]\n')
    _, data = scan_json(capsys, outside / "model.py")
    assert [f["rule"] for f in data["findings"]] == ["ADV204"]


def test_flags_override_the_file(capsys, project):
    write_config(project, 'select = ["ADV2"]\nignore = ["ADV101"]\n')
    # --select replaces the file's selection, its ignore included (a later `select` resets it in Ruff)
    assert rules_found(scan_json(capsys, "src", "--select", "ADV101")[1]) == [("src/model.py", "ADV101")]
    write_config(project, 'ignore = ["ADV101"]\n')
    assert rules_found(scan_json(capsys, "src", "--ignore", "ADV2,ADV3")[1]) == []  # --ignore adds to the file's


def test_config_flag_names_the_file_and_a_plain_toml_is_the_table(capsys, project, tmp_path):
    write_config(project, 'select = ["ADV2"]\n')
    other = write_config(tmp_path, 'select = ["ADV1"]\n', name="advisor.toml")
    assert rules_found(scan_json(capsys, "src", "--config", other)[1]) == [("src/model.py", "ADV101")]


def test_exclude_prunes_the_walk_and_force_exclude_also_explicit_paths(capsys, project):
    (project / "src" / "generated").mkdir()
    shutil.copy(NANOGPT, project / "src" / "generated" / "attn.py")
    shutil.copy(NANOGPT, project / "src" / "vendored_attn.py")
    write_config(project, 'exclude = ["generated", "src/vendored_*.py"]\n')
    assert rules_found(scan_json(capsys, ".")[1]) == [("src/model.py", "ADV101"), ("src/model.py", "ADV204")]
    explicit = "src/generated/attn.py"
    assert rules_found(scan_json(capsys, explicit)[1]) == [(explicit, "ADV101")]  # named: scanned, as in Ruff
    code, data = scan_json(capsys, explicit, "src/model.py", "--force-exclude")
    assert [f["path"] for f in data["findings"]] == ["src/model.py", "src/model.py"] and code == 1
    write_config(project, 'exclude = ["generated"]\nforce-exclude = true\n')
    assert scan_json(capsys, explicit)[1]["files_scanned"] == 0


@pytest.mark.parametrize("verb", [["scan"], ["fix", "--apply", "--quiet"]])
def test_naming_only_excluded_files_passes_as_the_pre_commit_hooks_need(capsys, project, verb):
    """pre-commit names the staged files; a commit touching only excluded ones exited 2 ('nothing could be
    scanned') and failed, where Ruff's hook passes. A named path that does not exist still fails."""
    (project / "generated").mkdir()
    shutil.copy(NANOGPT, project / "generated" / "attn.py")
    before = (project / "generated" / "attn.py").read_bytes()
    write_config(project, 'exclude = ["generated"]\n')
    assert main([*verb, "--force-exclude", "generated/attn.py"]) == 0
    assert "every path named is excluded" in capsys.readouterr().err or "--quiet" in verb
    assert (project / "generated" / "attn.py").read_bytes() == before
    assert main([*verb, "--force-exclude", "generated/attn.py", "missing.py"]) == 2


def test_per_file_ignores(capsys, project):
    (project / "legacy").mkdir()
    shutil.copy(COPIES_AND_CASTS, project / "legacy" / "old.py")
    write_config(project, '[tool.advisor.per-file-ignores]\n"legacy/*" = ["ADV1", "ADV3"]\n"model.py" = ["ADV204"]\n')
    assert rules_found(scan_json(capsys, ".")[1]) == [("legacy/old.py", "ADV204"), ("src/model.py", "ADV101")]


def test_per_file_ignores_name_a_folder_at_any_depth(capsys, project):
    """Breaker round 16: `"tests" = [...]` (a glob without `/`, a name at any depth as `exclude` reads it) left
    `tests/unit/t.py` reported."""
    (project / "tests" / "unit").mkdir(parents=True)
    shutil.copy(COPIES_AND_CASTS, project / "tests" / "unit" / "t.py")
    write_config(project, '[tool.advisor.per-file-ignores]\n"tests" = ["ADV1", "ADV2", "ADV3"]\n')
    assert {path for path, _ in rules_found(scan_json(capsys, ".")[1])} == {"src/model.py"}


def test_unsafe_fixes_and_backend_from_the_file_and_the_no_flag(capsys, project):
    write_config(project, 'unsafe-fixes = true\nbackend = "flash"\n')
    model = project / "src" / "model.py"
    before = model.read_text()
    assert main(["fix", "src", "--no-unsafe-fixes", "--apply"]) == 1
    after_safe = model.read_text()
    assert after_safe == before  # its fixes (ADV101, ADV204) are all unsafe: none is applied
    capsys.readouterr()
    assert main(["fix", "src", "--apply"]) == 0  # the file's unsafe-fixes = true
    capsys.readouterr()
    fixed = model.read_text()
    assert "scaled_dot_product_attention" in fixed
    _, data = scan_json(capsys, NANOGPT)
    assert "sdpa_kernel" in data["findings"][0]["patch"]  # backend = "flash"


@pytest.mark.parametrize("body, says", [
    ('selct = ["ADV1"]\n', "unknown key 'selct'"),
    ('select = "ADV1"\n', "select must be a list of strings"),
    ('select = ["ADV9999"]\n', "unknown rule code or prefix: ADV9999"),
    ('select = []\n', "select = [] selects no rule"),  # it selected every rule, unlike Ruff and --select ''
    ('unsafe-fixes = "yes"\n', "unsafe-fixes must be true or false"),
    ('backend = "cudnn"\n', "backend must be one of sdpa, flash, flash-attn"),
    ('per-file-ignores = ["x"]\n', "per-file-ignores must be a table"),
    ('select = [\n', "invalid TOML"),
    ('select = ["ADV1"]  # caf\udcff\n', "invalid TOML (not UTF-8"),  # a latin-1 byte: was a UnicodeDecodeError
])
def test_a_mistake_in_the_file_is_one_line_and_exit_2(capsys, project, body, says):
    write_config(project, body)
    assert main(["scan", "src", "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("advisor: error: ") and says in err
    assert "pyproject.toml" in err


def test_a_missing_config_file_is_a_usage_error(capsys, project):
    assert main(["scan", "src", "--config", "nope.toml"]) == 2
    assert "--config nope.toml: no such file" in capsys.readouterr().err
    assert main(["scan", "src", "--config", "src"]) == 2
    assert "--config src: a folder, not a file" in capsys.readouterr().err


def test_optimize_reads_backend_and_unsafe_fixes_starting_at_the_target_file(project, tmp_path, monkeypatch):
    write_config(project, 'backend = "flash"\nunsafe-fixes = true\n')
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["optimize", f"{project / 'src' / 'model.py'}:workload"])
    assert settle(args, str(project / "src" / "model.py")) == project / "pyproject.toml"
    assert (args.backend, args.unsafe_fixes) == ("flash", True)
    assert args.call_site_facts is True  # the default
    args = build_parser().parse_args(["optimize", "--backend", "sdpa", "--no-unsafe-fixes"])
    settle(args, None)
    assert (args.backend, args.unsafe_fixes) == ("sdpa", False)  # tmp_path has no config: flags and defaults


def test_call_site_facts_from_the_file_and_the_flag_over_it(project):
    write_config(project, 'call-site-facts = false\n')
    args = build_parser().parse_args(["scan", "src"])
    settle(args, "src")
    assert args.call_site_facts is False
    args = build_parser().parse_args(["scan", "src", "--call-site-facts"])
    settle(args, "src")
    assert args.call_site_facts is True


def test_the_readme_example_is_a_valid_config(tmp_path):
    from advisor.config import load_config

    readme = (ROOT / "README.md").read_text()
    block = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "pyproject.toml"
    path.write_text("\n".join(line.strip() for line in block.splitlines()))
    assert set(load_config(path)) == {"select", "ignore", "exclude", "force_exclude", "backend", "unsafe_fixes",
                                      "call_site_facts", "cache", "per_file_ignores"}


@pytest.mark.parametrize("fmt", ["json", "sarif", "github"])
def test_a_folder_with_no_python_file_says_why_in_every_machine_format(capsys, tmp_path, fmt):
    """`--format json` prints one object 'also when nothing could be scanned (its errors say why)': its errors
    were empty (SARIF had no notification, the github format printed nothing)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("no code here\n")
    assert main(["scan", str(tmp_path / "docs"), "--format", fmt]) == 2
    out = capsys.readouterr().out
    assert "no Python files found" in out


@pytest.mark.parametrize("value", ["inf", "1e10", "nan", "0"])
def test_a_timeout_the_clock_cannot_hold_is_a_usage_error(capsys, value):
    """`--timeout inf` passed the parser and failed as an internal OverflowError once the worker ran."""
    assert main(["profile", "x.py:workload", "--timeout", value]) == 2
    assert "argument --timeout" in capsys.readouterr().err


def test_globs_with_a_slash_hold_through_a_symbolic_link(capsys, project, tmp_path, monkeypatch):
    """A project reached through a link (a linked checkout; macOS's /tmp) was read against its config's resolved
    folder: every glob with a `/` stopped matching, so excluded files were scanned and ignored codes reported."""
    (project / "third_party").mkdir()
    shutil.copy(NANOGPT, project / "third_party" / "vendored.py")
    (project / "tests").mkdir()
    shutil.copy(NANOGPT, project / "tests" / "t.py")
    write_config(project, 'exclude = ["third_party/*"]\n[tool.advisor.per-file-ignores]\n"tests/*" = ["ADV1"]\n')
    link = tmp_path / "link"
    link.symlink_to(project)
    monkeypatch.chdir(tmp_path)
    for root in ("project", "link"):
        assert rules_found(scan_json(capsys, root)[1]) == [(f"{root}/src/model.py", "ADV101"),
                                                            (f"{root}/src/model.py", "ADV204")]
        named = f"{root}/third_party/vendored.py"
        assert scan_json(capsys, named, "--force-exclude")[1]["files_scanned"] == 0


def test_a_deleted_working_directory_still_scans_absolute_paths(capsys, project, tmp_path, monkeypatch):
    """A shell left in a removed build folder: the fallback config lookup read the working directory and every
    scan died with an internal FileNotFoundError, printing no result."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    code, data = scan_json(capsys, project / "src" / "model.py", "--no-cache")
    assert code == 1 and sorted(f["rule"] for f in data["findings"]) == ["ADV101", "ADV204"]
    main(["fix", str(project / "src" / "model.py"), "--no-cache", "--unsafe-fixes"])
    assert "+++ b/" in capsys.readouterr().out  # the patches' diff
