"""Modules imported on first use (importlib's LazyLoader recipe). Rule units import their proof helpers this way:
the registry loads every unit to list the codes, and `advisor analyze` or `advisor rules` must not pay for libcst,
networkx or torch, which only a detector that runs needs."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_import(name: str) -> ModuleType:
    """The module `name`, executed when an attribute of it is first read (at once if it is imported already)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
