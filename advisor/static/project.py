"""What other files of the scanned tree tell about one file's code: torch's process-wide module hooks.

`torch.nn.modules.module.register_module_forward_hook` (and its pre-hook, backward and registration variants)
installs a hook on every module of the process, wherever it is called: a hook registered in `train.py` fires on
the dropout call that a rewrite of `model.py` deletes, and a registration hook may replace any submodule or buffer
as it is assigned. So a scan of several files first collects these calls from all of them (resolved through each
file's imports), and each file's analysis reads them as if they were its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from advisor.contracts.finding import display_path
from advisor.static.module_index import REGISTRATION_HOOKS, ParsedModule

# hooks that fire around every module call: a deleted module call loses them
GLOBAL_CALL_HOOKS = frozenset({"register_module_forward_hook", "register_module_forward_pre_hook",
                               "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
                               "register_module_backward_hook"})
TOKEN = "register_module_"  # every one of them starts so: files without it are not parsed


@dataclass(frozen=True)
class HookSite:
    path: str
    line: int
    name: str  # the registering function's name

    def describe(self, here: str | None = None) -> str:
        where = "this file" if self.path == here else f"`{display_path(self.path)}`"
        return f"{where} registers a hook on every module (`{self.name}`, line {self.line})"


@dataclass(frozen=True)
class ProjectFacts:
    """Process-wide hooks registered anywhere in the scanned tree."""

    call_hooks: tuple[HookSite, ...] = ()
    registration_hooks: tuple[HookSite, ...] = ()


def global_hook_calls(parsed: ParsedModule, names: frozenset[str]) -> list[tuple[cst.Call, str]]:
    """Calls in `parsed` to torch's process-wide hook registrations among `names`, resolved
    through the file's imports (`from torch.nn.modules.module import register_module_forward_hook as on_all`), or
    an attribute of that name on any receiver (`mm.register_module_forward_hook`)."""
    found = []
    for call in parsed.calls_and_classes[0]:
        dotted = parsed.imported_name(call.func) or ""
        name = dotted.rsplit(".", 1)[-1] if dotted.startswith("torch.") else \
            call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if name in names:
            found.append((call, name))
    return found


def hook_sites(path: str, text: str) -> list[tuple[HookSite, str]]:
    """The process-wide hook registrations in one file's text, each with its registering function's name ([] for
    a file that cannot be parsed: the scan reports it)."""
    if TOKEN not in text:
        return []
    try:
        parsed = ParsedModule(text, path)
        return [(HookSite(path, parsed.line(call), name), name)
                for call, name in global_hook_calls(parsed, GLOBAL_CALL_HOOKS | REGISTRATION_HOOKS)]
    except (cst.ParserSyntaxError, RecursionError, MemoryError):
        return []


def project_facts(sites: list[tuple[HookSite, str]]) -> ProjectFacts:
    """The hooks registered in the scanned tree, from every file's `hook_sites`."""
    return ProjectFacts(tuple(site for site, name in sites if name in GLOBAL_CALL_HOOKS),
                        tuple(site for site, name in sites if name in REGISTRATION_HOOKS))
