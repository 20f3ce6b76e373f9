"""The `optimize --report DIR` folder: files are created only inside it and never through a symbolic link.

DIR itself must not be a link. Every file is created fresh through a descriptor of DIR (`O_EXCL | O_NOFOLLOW`): a
link at its name, or at the `patches` folder, is refused with one line; a regular file already there is unlinked
first, so a hard link to a file outside DIR is replaced, never written into."""

from __future__ import annotations

import os
import shutil
import stat

from advisor.contracts.finding import as_text
from advisor.errors import AdvisorError

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ReportFolder:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        if os.path.islink(self.path):
            self._refuse("is a symbolic link; advisor never writes through a link (give the real folder)")
        try:
            os.makedirs(self.path, exist_ok=True)
        except FileExistsError:
            self._refuse("exists and is not a folder")
        except OSError as exc:
            self._refuse(f"cannot create it ({exc.strerror})")
        self._descriptor = self._open_folder(self.path, None)

    def check(self, names: tuple[str, ...]) -> None:
        """Refuse now, before anything runs, when one of the names the report will take is a link."""
        for name in names:
            if self._kind(self._descriptor, name) == "link":
                self._refuse_link(name)

    def path_of(self, name: str) -> str:
        return os.path.join(self.path, name)

    def create(self, name: str) -> str:
        """A new empty file at `name` (`sub/name` for one level of subfolder); returns its path."""
        os.close(self._new(name))
        return self.path_of(name)

    def write_text(self, name: str, text: str) -> str:
        """`text` as UTF-8, a file name's bytes that are not UTF-8 written `\\xNN` (as_text: a report naming
        `m\\xff.py` could not be written at all: promise round 33)."""
        with os.fdopen(self._new(name), "w", encoding="utf-8") as handle:
            handle.write(as_text(text))
        return self.path_of(name)

    def copy_in(self, source: str, name: str) -> str:
        """`source` (a file advisor wrote in a private folder) copied to `name`."""
        with open(source, "rb") as reader, os.fdopen(self._new(name), "wb") as writer:
            shutil.copyfileobj(reader, writer)
        return self.path_of(name)

    def _new(self, name: str) -> int:
        subfolder, _, base = name.rpartition("/")
        parent = self._descriptor
        try:
            if subfolder:
                if self._kind(parent, subfolder) is None:
                    os.mkdir(subfolder, dir_fd=parent)
                parent = self._open_folder(subfolder, parent)
            kind = self._kind(parent, base)
            if kind == "link":
                self._refuse_link(name)
            if kind == "file":
                os.unlink(base, dir_fd=parent)
            elif kind is not None:
                self._refuse(f"{name} exists and is not a regular file")
            return os.open(base, _NEW_FILE, 0o644, dir_fd=parent)
        except FileExistsError:  # O_EXCL: a file or link put there since the check
            self._refuse(f"{name} was created by someone else while advisor wrote it; not written")
        except OSError as exc:
            self._refuse(f"cannot write {name} ({exc.strerror})")
        finally:
            if parent != self._descriptor:
                os.close(parent)

    def _open_folder(self, name: str, parent: int | None) -> int:
        try:
            return os.open(name, _FOLDER, dir_fd=parent)
        except OSError as exc:
            if self._kind(parent, name) == "link":
                self._refuse_link(name)
            self._refuse(f"cannot open {name} as a folder ({exc.strerror})")

    @staticmethod
    def _kind(parent: int | None, name: str) -> str | None:
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        return "link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "other"

    def _refuse_link(self, name: str):
        self._refuse(f"{name} is a symbolic link; advisor never writes through a link")

    def _refuse(self, why: str):
        raise AdvisorError(f"--report {self.path}: {why}")

    def close(self) -> None:
        os.close(self._descriptor)

    def __enter__(self) -> ReportFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
