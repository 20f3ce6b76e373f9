"""`[tool.advisor]` in pyproject.toml, found as Ruff finds its configuration: the nearest pyproject.toml with a
`[tool.advisor]` table, from the first PATH (or TARGET's file) upward, else from the current directory upward;
`--config FILE` names one instead. Command-line flags override the file. A mistake in the file (unknown key,
wrong type, unknown rule code, invalid TOML) is a usage error: one line, exit 2."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from advisor.contracts.finding import current_folder
from advisor.errors import AdvisorError

SECTION = ("tool", "advisor")


@dataclass(frozen=True)
class Key:
    """One configuration key: the argparse destination it fills and the TOML type it takes."""

    dest: str
    kind: str  # "codes", "globs", "bool", "backend", "per-file"


KEYS = {
    "select": Key("select", "codes"),
    "ignore": Key("ignore", "codes"),
    "exclude": Key("exclude", "globs"),
    "force-exclude": Key("force_exclude", "bool"),
    "per-file-ignores": Key("per_file_ignores", "per-file"),
    "backend": Key("backend", "backend"),
    "unsafe-fixes": Key("unsafe_fixes", "bool"),
    "call-site-facts": Key("call_site_facts", "bool"),
    "cache": Key("cache", "bool"),
}
DEFAULTS = {"select": None, "ignore": None, "exclude": [], "force_exclude": False, "per_file_ignores": {},
            "backend": "sdpa", "unsafe_fixes": False, "call_site_facts": True,
            "cache": True}


@dataclass(frozen=True)
class PathRules:
    """The path-dependent keys (exclude, per-file-ignores), their globs relative to the config file's folder.
    Picklable: the scan's worker processes read it per file."""

    root: str = "."
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    force_exclude: bool = False

    def excludes(self, path: str) -> bool:
        relative = self.relative(path)
        return any(_glob_matches(pattern, relative, self.root) for pattern in self.exclude)

    def excludes_named(self, path: str) -> bool:
        """Whether force-exclude drops a path named on the command line: it or a folder above it (up to the
        config's folder) is excluded, as Ruff checks a named path's ancestors."""
        if not self.force_exclude:
            return False
        relative = self.relative(path)
        if _outside(relative):
            return self.excludes(path)
        parts = relative.split("/")
        return any(self.excludes(os.path.join(self.root, *parts[:end])) for end in range(1, len(parts) + 1))

    def ignored_codes(self, path: str) -> list[str]:
        """The codes per-file-ignores turns off for `path`: a glob matching it or a folder above it (up to the
        config's folder), as `exclude` reads a folder name at any depth (`"tests" = [...]` for `tests/unit/t.py`)."""
        relative = self.relative(path)
        parts = relative.split("/")
        scopes = [relative] if _outside(relative) else ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
        return [code for pattern, codes in self.per_file_ignores
                if any(_glob_matches(pattern, scope, self.root) for scope in scopes) for code in codes]

    def relative(self, path: str) -> str:
        """`path` relative to the config's folder, `/`-separated. A project reached through a symbolic link (a
        linked checkout, macOS's /tmp) is read through the link first and then with links resolved, so a path
        named either way is inside the folder of a config found either way."""
        relative = _relative(os.path.abspath(path), self.root)
        if _outside(relative):
            resolved = _relative(os.path.realpath(path), os.path.realpath(self.root))
            relative = relative if _outside(resolved) else resolved
        return relative

    def __bool__(self) -> bool:
        return bool(self.exclude or self.per_file_ignores)


def _relative(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _outside(relative: str) -> bool:
    """A `/`-separated relative path that leaves its folder."""
    return relative == ".." or relative.startswith("../")


def _glob_matches(pattern: str, relative: str, root: str) -> bool:
    """Ruff's reading of a path glob: one without `/` matches the file or folder's own name; one with `/` matches
    its path `relative` to the config's folder `root` (`*` also matches `/`). The walk tests each folder before
    entering it, so a pattern that names a folder excludes everything under it."""
    if "/" not in pattern.rstrip("/"):
        return fnmatchcase(relative.rstrip("/").rpartition("/")[2], pattern.rstrip("/"))
    if os.path.isabs(pattern):
        pattern = _relative(pattern, root)
    return fnmatchcase(relative, pattern.removeprefix("./").rstrip("/"))


def find_config(start: str) -> Path | None:
    """The nearest pyproject.toml holding [tool.advisor] at or above `start` (a file's folder); a pyproject.toml
    without the table is passed over, as Ruff passes over one without [tool.ruff]."""
    folder = Path(os.path.abspath(start))
    if not folder.is_dir():
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file() and _section(_read_toml(path), path) is not None:
            return path
    return None


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise AdvisorError(f"{path}: invalid TOML ({exc})") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; tomllib lets the decoder's error through
        raise AdvisorError(f"{path}: invalid TOML (not UTF-8: byte {exc.start})") from None
    except OSError as exc:
        raise AdvisorError(f"{path}: {exc.strerror or exc}") from None


def _section(document: dict, path: Path) -> dict | None:
    """[tool.advisor] of a pyproject.toml; every other file (advisor.toml, given with --config) is the table."""
    if path.name != "pyproject.toml":
        return document
    table = document
    for name in SECTION:
        table = table.get(name) if isinstance(table, dict) else None
    if table is not None and not isinstance(table, dict):
        raise AdvisorError(f"{path}: [tool.advisor] must be a table")
    return table


def load_config(path: Path) -> dict:
    """The file's keys checked and converted to argparse destinations; raises AdvisorError on any mistake."""
    table = _section(_read_toml(path), path)
    if table is None:
        raise AdvisorError(f"{path}: no [tool.advisor] table")
    where = f"{path}: [tool.advisor]" if path.name == "pyproject.toml" else str(path)
    values = {}
    for name, value in table.items():
        key = KEYS.get(name)
        if key is None:
            raise AdvisorError(f"{where}: unknown key {name!r} (known: {', '.join(KEYS)})")
        if key.dest == "select" and value == []:
            # Ruff reads an empty select as "no rule"; a scan that checks nothing is never what was meant.
            raise AdvisorError(f"{where} select = [] selects no rule (leave the key out to select every rule)")
        values[key.dest] = _checked(key.kind, value, f"{where} {name}")
    return values


def _checked(kind: str, value, where: str):
    from advisor.backends import REQUESTABLE
    from advisor.registry import parse_selectors

    if kind == "bool":
        if not isinstance(value, bool):
            raise AdvisorError(f"{where} must be true or false, not {value!r}")
        return value
    if kind == "backend":
        if value not in REQUESTABLE:
            raise AdvisorError(f"{where} must be one of {', '.join(REQUESTABLE)}, not {value!r}")
        return value
    if kind == "per-file":
        if not isinstance(value, dict):
            raise AdvisorError(f"{where} must be a table of glob = [codes]")
        return {pattern: _checked("codes", codes, f"{where} {pattern!r}") for pattern, codes in value.items()}
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise AdvisorError(f"{where} must be a list of strings, not {value!r}")
    if kind == "codes" and value:
        try:
            return parse_selectors(",".join(value))
        except ValueError as exc:
            raise AdvisorError(f"{where}: {exc}") from None
    return list(value)


def configure(args) -> None:
    """For a verb that reads [tool.advisor] (it has --config): settle its options; `args.config_path` is the file."""
    if hasattr(args, "config"):
        args.config_path = settle(args, start_of(args))


def start_of(args) -> str | None:
    """Where the search for pyproject.toml starts: the first PATH, or TARGET's file (`file.py:function`)."""
    paths = getattr(args, "paths", None)
    if paths:
        return paths[0]
    target = getattr(args, "target", None)
    file = target.rpartition(":")[0] if target else ""
    if file and os.path.exists(file):
        return file
    return _module_file(file, getattr(args, "root", None)) if file else None


def _module_file(module: str, root: str | None) -> str | None:
    """The file of a module TARGET (`pkg.model`), found as the worker imports it (the current directory, `--root`,
    PYTHONPATH) without importing anything (promise round 35: its folder's config was not read)."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    folders = [current_folder() or "", root or "", *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    for folder in (f for f in folders if f):
        for candidate in (os.path.join(folder, *parts) + ".py", os.path.join(folder, *parts, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def settle(args, start: str | None) -> Path | None:
    """Fill every configurable option the command line left unset (None) from the config file, then from the
    defaults, and set `args.path_rules`; returns the file read (None: none found). `--select` replaces the file's
    selection (its `ignore` too, as a later `select` does in Ruff); `--ignore` adds to the file's `ignore`."""
    here = current_folder()
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise AdvisorError(f"--config {args.config}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    else:
        path = find_config(start) if start else None
        path = path or (find_config(here) if here else None)
    values = load_config(path) if path else {}
    if getattr(args, "select", None) is not None:
        values.pop("select", None)
        values.pop("ignore", None)
    elif getattr(args, "ignore", None) is not None and values.get("ignore"):
        args.ignore = values.pop("ignore") + args.ignore
    for dest, default in DEFAULTS.items():
        if hasattr(args, dest) and getattr(args, dest) is None:
            setattr(args, dest, values.get(dest, default))
    root = os.path.abspath(path.parent) if path else (here or os.sep)
    per_file = tuple((glob, tuple(codes)) for glob, codes in values.get("per_file_ignores", {}).items())
    args.path_rules = PathRules(root, tuple(values.get("exclude", ())), per_file,
                                bool(getattr(args, "force_exclude", False)))
    return path
