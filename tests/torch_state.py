"""Programs that monkeypatch torch (`nn.Identity = Writer`, `F.dropout = f`, `nn.Dropout.forward = f`) or register
process-wide hooks change every later test of the process: `torch_restored()` puts torch's modules, nn's classes,
`torch.Tensor` and the global hook tables back as they were."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch


def _namespaces() -> list[object]:
    modules = [module for name, module in list(sys.modules.items())
               if module is not None and (name == "torch" or name.startswith(("torch.nn", "torch.functional")))]
    classes = {value for module in modules for value in vars(module).values()
               if isinstance(value, type) and issubclass(value, torch.nn.Module)}
    return modules + sorted(classes, key=id) + [torch.Tensor]


@contextmanager
def torch_restored():
    from torch.nn.modules import module

    spaces = _namespaces()
    saved = [dict(vars(space)) for space in spaces]
    tables = [value for name, value in vars(module).items() if name.startswith("_global_") and isinstance(value, dict)]
    entries = [dict(table) for table in tables]
    default_dtype = torch.get_default_dtype()
    try:
        yield
    finally:
        torch.set_default_dtype(default_dtype)  # a program's `torch.set_default_dtype(torch.float64)` (round 41)
        for space, before in zip(spaces, saved):
            now = vars(space)
            for name in [name for name in now if name not in before]:
                delattr(space, name)
            for name, value in before.items():
                if now.get(name) is not value:
                    setattr(space, name, value)
        for table, before in zip(tables, entries):
            table.clear()
            table.update(before)
