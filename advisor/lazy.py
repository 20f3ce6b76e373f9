"""Modules imported on first use. Rule units import their proof helpers this way: the registry loads every unit to
list the codes, and `advisor analyze` or `advisor rules` must not pay for libcst, networkx or torch, which only a
detector that runs needs.

The import itself is the ordinary one (`importlib.import_module`), run when an attribute is first read; nothing is
put in `sys.modules` ahead of it. importlib's LazyLoader recipe, used before, placed a module there that executed on
first attribute read wherever that read happened: the Python API loads the rule units before the engine, and the
engine's own `from advisor.static.tree_facts import TreeContext` then ran tree_facts inside the engine's import,
whose chain imports tree_facts again and found it half built (`advisor.scan(...)` in a fresh process raised
ImportError)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


class _OnFirstUse:
    """Stands for the module `name` until an attribute is read, then imports it and reads from it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_import(name: str) -> ModuleType | _OnFirstUse:
    """The module `name` (itself if imported already), imported when an attribute of it is first read; a module
    that does not exist raises ModuleNotFoundError here, at once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    return _OnFirstUse(name)
