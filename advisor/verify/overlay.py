"""The patched side's view of the code: modules whose file has a patch are loaded from a patched copy.

Nothing on disk that belongs to the user or to an installed package changes. The patched text is written to a
mirrored tree (`ROOT/<absolute original path>`) and compiled from there, so tracebacks and profiler stacks point
at a file that exists and holds the patched lines; the module keeps its original `__file__`, `__spec__.origin`
and package, so relative imports and data files next to it resolve as before. Installed in a worker process only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_PATCHED: dict[str, str] = {}  # realpath of an original file -> path of its patched copy


def mirrored_path(root: str, original: str) -> str:
    return os.path.join(root, os.path.realpath(original).lstrip(os.sep))


def original_path(root: str, path: str) -> str | None:
    """The original file a path in the mirrored tree stands for (None when it is not in the tree)."""
    prefix = os.path.realpath(root) + os.sep
    real = os.path.realpath(path)
    return os.sep + real[len(prefix):] if real.startswith(prefix) else None


class PatchedLoader(importlib.abc.Loader):
    def __init__(self, copy: str):
        self.copy = copy

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        with open(self.copy, encoding="utf-8") as handle:
            code = compile(handle.read(), self.copy, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - the user's own (patched) module, as import would run it


class PatchedFinder(importlib.abc.MetaPathFinder):
    """Asks the other finders where a module lives; when that file has a patch, loads the patched copy instead."""

    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            loader = file_loader(spec.origin) if spec.origin else None
            if loader is None:
                return spec
            return importlib.util.spec_from_file_location(
                name, spec.origin, loader=loader, submodule_search_locations=spec.submodule_search_locations)
        return None


def file_loader(path: str) -> PatchedLoader | None:
    copy = _PATCHED.get(os.path.realpath(path)) if path else None
    return PatchedLoader(copy) if copy else None


def write_tree(root: str, patched: dict[str, str]) -> dict[str, str]:
    """Write each patched text to its mirrored path; returns original realpath -> copy."""
    copies = {}
    for original, text in patched.items():
        copy = mirrored_path(root, original)
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        with open(copy, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        copies[os.path.realpath(original)] = copy
    return copies


def install(patched: dict[str, str], root: str) -> None:
    """Route imports of the patched files to their copies (modules already imported are not reloaded)."""
    _PATCHED.update(write_tree(root, patched))
    already = [name for name, module in list(sys.modules.items())
               if os.path.realpath(getattr(module, "__file__", None) or "") in _PATCHED]
    if already:
        raise RuntimeError(f"patched modules were imported before the overlay: {', '.join(sorted(already))}")
    sys.meta_path.insert(0, PatchedFinder())
