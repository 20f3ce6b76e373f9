"""Warm scans: each file's scan result kept on disk, under `$XDG_CACHE_HOME/advisor` (default `~/.cache/advisor`).

A result is reused only when nothing that could change it changed. Its key holds the file's bytes (digest), its
path (findings and patches name it), the advisor code and rule set, the scan's options, and the tree-wide facts
every file's analysis reads (process-wide hooks, autograd requests, the number of files). Facts proved from call
sites read other files of the tree (static.call_sites.Tree), and helpers read as one op come from other files of the
package (`ParsedModule.package_module`): the entry keeps the digest of each file that analysis read, and the tree's
file list, and is reused only while those are unchanged (a file outside the scan has no digest: never reused), so an
edit of a caller invalidates the callee's result, and an edit of a helper the result of the file that calls it. Each file's part of the tree-wide facts is kept by its content too (`contribution`).

Entries are pickles behind a header (format, key): a result carries a notebook's JSON, the fixed text and findings
whose `extra` nests values, which the JSON output writes one way only (display paths, flattened fields). They are
written atomically (a temporary file, then os.replace), so a concurrent run reads a whole entry or none; an entry
that is truncated, foreign or of another format is ignored and rebuilt. Loading a pickle runs code, so the cache
is used only from folders that no other user can write: advisor creates them private (0700), and a folder owned by
another user or writable by group or others is neither read nor written. A result is stored only when the bytes its analysis read
(their digest travels with the result, `digest`) are the bytes its key holds (read by the tree-wide pass): a file
edited in between is not stored, and one edited after the analysis read it is stored under the bytes analysed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
import stat
import sys
import tempfile
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from pathlib import Path

from advisor.contracts.finding import ScanError, current_folder, display_path
from advisor.static.discover import regular_file_bytes

FORMAT = b"advisor-scan-cache 1\n"  # bump when the entries' layout changes


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/advisor`, else `~/.cache/advisor` (the XDG base directory default). A relative
    `XDG_CACHE_HOME` is ignored, as the XDG spec says: it would put a cache folder in every tree scanned from."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "advisor"


def _digest(*parts) -> str:
    return hashlib.blake2b(repr(_canonical(parts)).encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()


def _canonical(value):
    """`value` with its sets sorted, so that its repr is the same in every process: a set's order follows the
    strings' hashes, which differ from one process to the next (the tree's facts hold sets of names)."""
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(item) for item in value), key=repr)
    if isinstance(value, (tuple, list)):
        return type(value)(_canonical(item) for item in value)
    if isinstance(value, dict):
        return sorted(((repr(_canonical(key)), _canonical(item)) for key, item in value.items()), key=repr)
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(_canonical(getattr(value, f.name)) for f in fields(value)))
    return value


@lru_cache(maxsize=1)
def code_digest() -> str:
    """advisor's version and the text of its modules and rule units (the rules package may live beside it, as in
    an editable install), the interpreter (its parser decides syntax errors), libcst, and the installed torch and
    transformers (ADV601 reads a model class's `_supports_sdpa` from the installed transformers: two environments
    sharing one cache gave one's verdict to the other, breaker round 16): a result is never reused by other code."""
    import libcst

    import advisor
    from advisor.registry import rules_package_paths

    hasher = hashlib.blake2b(digest_size=20)
    hasher.update(repr((advisor.__version__, sys.version, getattr(libcst, "__version__", ""),
                        *map(_installed_version, ("torch", "transformers")))).encode())
    roots = [Path(advisor.__file__).parent, *map(Path, rules_package_paths())]
    modules = sorted({module.resolve() for root in roots for module in root.rglob("*.py")})
    for module in modules:
        hasher.update(str(module).encode())
        hasher.update(module.read_bytes())
    return hasher.hexdigest()


def _installed_version(distribution: str) -> tuple[str | None, str | None]:
    """The distribution's version, read from its metadata, and where its package would be imported from (found,
    never imported: another folder on `sys.path` may shadow the installed one)."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        spec = importlib.util.find_spec(distribution)
    except (ImportError, ValueError):
        spec = None
    return version, spec.origin if spec is not None else None


def rule_set() -> tuple:
    """The families the registry loads now (a unit added from outside the package changes it)."""
    from advisor.registry import families

    return tuple((family.name, tuple(rule.code for rule in family.rules), family.prefilter,
                  getattr(family.static, "__module__", None), getattr(family.static, "__qualname__", None))
                 for family in families())


@dataclass(frozen=True)
class Recorded:
    """What a worker hands back for one file: its outcome, the digest of the bytes the analysis read (None: no
    result to keep), and the files of the tree that analysis read (real paths; empty when it read none)."""

    outcome: object
    digest: str | None
    read: frozenset[str]


def record(scan_one, tree, path: str) -> Recorded:
    """`scan_one(path)`, noting the files of `tree` (static.call_sites.Tree, or None) it reads. A result carries
    the digest of the bytes it was found in (engine.static.FileResult.digest); the file is not read again."""
    from advisor.static.module_index import noting_package_reads  # libcst: loaded only when a scan runs

    read = tree.recording() if tree is not None else set()
    with noting_package_reads() as package:  # helpers read from other files of the package
        outcome = scan_one(path)
    return Recorded(outcome, getattr(outcome, "digest", None) or None, frozenset(read | package))


def _private(folder: Path, link_ok: bool = True) -> bool:
    """Whether only this user can write `folder` (a folder not there yet is created private); always true where
    the system has no user ids. `link_ok=False`: a link is refused too (the shard folders advisor makes itself,
    which a link would send into a folder others share)."""
    if not hasattr(os, "getuid"):
        return True
    try:
        status = folder.stat() if link_ok else folder.lstat()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o022


class ScanCache:
    """One scan's view of the cache: the options that key every entry, and the digest of each file as the
    tree-wide pass read it."""

    def __init__(self, options: dict, root: Path | None = None):
        self.folder = (root or cache_root()) / "scan"
        self.salt = _digest(FORMAT, code_digest(), rule_set(), sorted(options.items()), current_folder())
        self.digests: dict[str, str] = {}  # real path -> digest of the bytes read
        self._written_ok = self._trusted = _private(self.folder.parent) and _private(self.folder)
        self._shards: dict[Path, bool] = {}  # shard folder -> only this user can write it

    # -- each file's part of the tree-wide facts ---------------------------------------------------------------
    def kept_contribution(self, source):
        """The file's part of the tree-wide facts as kept for its content and path (the parts name the file), or
        None; the file's digest is learnt either way."""
        self.digests[os.path.realpath(source.path)] = source.digest
        found = self._load(self._contribution_key(source.path, source.digest))
        return found if isinstance(found, tuple) and len(found) == 2 else None

    def keep_contribution(self, path: str, digest: str, value) -> None:
        self.digests[os.path.realpath(path)] = digest
        self._store(self._contribution_key(path, digest), value)

    @staticmethod
    def _contribution_key(path: str, digest: str) -> str:
        return _digest("tree", FORMAT, code_digest(), path, digest)  # whatever the options

    # -- each file's result ---------------------------------------------------------------------------------------
    def scan(self, files: list[str], scan_one, run, done, tree) -> list:
        """Outcomes in the order of `files`: kept results where still valid, the others from `run(todo, one)`
        (which runs `one` on each path of `todo` and returns the outcomes in order), stored as they come.
        `tree` (static.tree_facts.TreeContext): what every file's analysis reads of the tree; its facts key every
        entry, and its call sites (`tree.calls`) record the other files each analysis reads."""
        scope = _digest(self.salt, tree.cache_key())
        real = {path: os.path.realpath(path) for path in files}
        members = _digest(sorted(real.values()))
        keys = {path: self._key(scope, path, real[path]) for path in files}
        outcomes: dict[str, object] = {}
        for path in files:
            entry = self._load(keys[path]) if keys[path] is not None else None
            if isinstance(entry, tuple) and len(entry) == 3 and hasattr(entry[2], "findings") and \
                    self._still_valid(entry, members):  # a foreign or damaged entry is a miss
                outcomes[path] = entry[2]
                done(path)
        todo = [path for path in files if path not in outcomes]
        if todo:
            for path, recorded in zip(todo, run(todo, _Recording(scan_one, tree.calls))):
                if not isinstance(recorded, Recorded):  # the error entry of a file that killed its process
                    outcomes[path] = recorded
                    continue
                outcomes[path] = recorded.outcome
                if keys[path] is not None and recorded.digest == self.digests.get(real[path]) and \
                        not isinstance(recorded.outcome, ScanError):  # an error is cheap to find again
                    read = {other: self.digests.get(other) for other in recorded.read}
                    self._store(keys[path], (members if read else None, read, recorded.outcome))
        return [outcomes[path] for path in files]

    def _key(self, scope: str, path: str, real: str) -> str | None:
        digest = self.digests.get(real)
        return _digest(scope, path, real, display_path(path), digest) if digest else None

    def _still_valid(self, entry: tuple, members: str) -> bool:
        """The files the analysis read are as they were, and so is the tree's file list (it looked for names
        in every file)."""
        kept_members, read, _ = entry
        return (not read or kept_members == members) and all(self.digests.get(real) == digest and digest
                                                              for real, digest in read.items())

    # -- the entries on disk ------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / key

    def _shard_private(self, shard: Path) -> bool:
        """Whether only this user can write the shard folder (no link either), checked once per scan."""
        private = self._shards.get(shard)
        if private is None:
            private = self._shards[shard] = _private(shard, link_ok=False)
        return private

    def _load(self, key: str):
        """The value stored under `key`, or None: missing, truncated, foreign, of another format or version, in a
        folder others can write, or written by another user."""
        path = self._path(key)
        if not self._trusted or not self._shard_private(path.parent):
            return None
        try:
            data = regular_file_bytes(path, follow_links=False, own=True)
        except OSError:  # missing, unreadable, another user's, or no regular file (a FIFO, a link, a folder)
            return None
        header = FORMAT + key.encode() + b"\n"
        if not data.startswith(header):
            return None
        try:
            return pickle.loads(data[len(header):])
        except Exception:  # noqa: BLE001 - any damage to an entry is a miss, never an error
            return None

    def _store(self, key: str, value) -> None:
        """Write atomically; a cache that cannot be written (read-only, full) only makes the next scan cold."""
        if not self._written_ok:
            return
        try:
            data = FORMAT + key.encode() + b"\n" + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a value that does not pickle is analysed again next time
            return
        target = self._path(key)
        try:
            for folder in (self.folder.parent, self.folder, target.parent):
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._shards.pop(target.parent, None)  # made now, or there before: read what it is
            if not self._shard_private(target.parent):
                return
            handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                os.replace(temporary, target)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError:
            self._written_ok = False


@dataclass(frozen=True)
class _Recording:
    """`record` bound to the scan's function and tree: picklable, for the worker processes."""

    scan_one: object
    tree: object

    def __call__(self, path: str) -> Recorded:
        return record(self.scan_one, self.tree, path)
