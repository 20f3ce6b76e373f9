"""What other files of the scanned tree tell about one file's code: torch's process-wide module hooks, hooks on
single modules, and attributes written on objects other than `self`.

`torch.nn.modules.module.register_module_forward_hook` (and its pre-hook, backward and registration variants)
installs a hook on every module of the process, wherever it is called: a hook registered in `train.py` fires on
the dropout call that a rewrite of `model.py` deletes, and a registration hook may replace any submodule or buffer
as it is assigned. So a scan of several files first collects these calls from all of them (resolved through each
file's imports), and each file's analysis reads them as if they were its own. The same holds for what a training
script does to the model another file defines: `model.blocks[0].attn.attn_drop.register_forward_hook(save)`
(attention maps), `blk.attn.bias.data = band` or `m.apply(swap_dropout)`: a hook or a write in any file of the
tree counts as one in the file that defines the class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from advisor.contracts.finding import display_path
from advisor.static.module_index import ParsedModule
from advisor.static.outside_writes import REGISTRATION_HOOKS, outside_writes_of_source

# hooks that fire around every module call: a deleted module call loses them
GLOBAL_CALL_HOOKS = frozenset({"register_module_forward_hook", "register_module_forward_pre_hook",
                               "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
                               "register_module_backward_hook"})
TOKEN = "register_module_"  # every one of them starts so: files without it are not parsed
# hooks registered on one module (its call, and so a deleted call of it, runs them)
HOOK_METHODS = frozenset({"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                          "register_full_backward_pre_hook", "register_backward_hook"})
# A file none of whose lines may write an attribute of another object is not parsed for them: an assignment or
# augmented assignment to a dotted target not starting at `self.`, a call that binds by name, an attribute table, an
# in-place method, a state-dict loader.
MAY_WRITE_ATTRIBUTES = re.compile(
    r"(?m)^[ \t]*(?!self\.)[\w.]+(?:\[[^\n]*\])?\.\w+[^\n=]*?[-+*/@%&|^]?=(?!=)|setattr\(|__setattr__|register_buffer|"
    r"register_parameter|add_module|register_module\(|_modules\[|_buffers\[|_parameters\[|__dict__\[|\.\w+_\(|"
    r"load_state_dict|_load_from_state_dict|"
    r"^[ \t]*\w+\[[^\n]*\][ \t]*[-+*/@%&|^]?=(?!=)")  # `MASK[0] = v` on a name another module's import bound


@dataclass(frozen=True)
class HookSite:
    path: str
    line: int
    name: str  # the registering function's name

    def describe(self, here: str | None = None) -> str:
        where = "this file" if self.path == here else f"`{display_path(self.path)}`"
        return f"{where} registers a hook on every module (`{self.name}`, line {self.line})"


@dataclass(frozen=True)
class AttributeWrites:
    """The names of the attributes one file writes on objects other than a method's own `self`
    (static.outside_writes: `*` for names it computes)."""

    path: str
    names: frozenset[str]
    reshaped: frozenset[str]  # ... written otherwise than into their elements


@dataclass(frozen=True)
class ProjectFacts:
    """Hooks registered anywhere in the scanned tree, and the attributes its files write on other objects."""

    call_hooks: tuple[HookSite, ...] = ()
    registration_hooks: tuple[HookSite, ...] = ()
    module_hooks: tuple[HookSite, ...] = ()  # `m.register_forward_hook(...)` and its variants, on any module
    attribute_writes: tuple[AttributeWrites, ...] = ()

    def module_hook_elsewhere(self, here: str) -> HookSite | None:
        """The first hook on a single module that a file other than `here` registers."""
        return next((site for site in self.module_hooks if site.path != here), None)

    def writes_elsewhere(self, here: str) -> tuple[AttributeWrites, ...]:
        return tuple(writes for writes in self.attribute_writes if writes.path != here)


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


def hook_sites(path: str, text: str) -> list[tuple[HookSite, str] | AttributeWrites]:
    """One file's part of the project facts: its hook registrations (process-wide and on single modules), each with
    its registering function's name, and the attributes it writes on other objects ([] for a file that cannot be
    parsed: the scan reports it)."""
    found: list = []
    if TOKEN in text or any(name in text for name in HOOK_METHODS):
        try:
            parsed = ParsedModule(text, path)
            found = [(HookSite(path, parsed.line(call), name), name) for call, name in
                     global_hook_calls(parsed, GLOBAL_CALL_HOOKS | REGISTRATION_HOOKS | HOOK_METHODS)]
        except (cst.ParserSyntaxError, RecursionError, MemoryError):
            return []
    if MAY_WRITE_ATTRIBUTES.search(text) is not None:
        names, reshaped = outside_writes_of_source(text)
        if names:
            found.append(AttributeWrites(path, frozenset(names), frozenset(reshaped)))
    return found


def project_facts(sites: list[tuple[HookSite, str] | AttributeWrites]) -> ProjectFacts:
    """The hooks registered and the attributes written in the scanned tree, from every file's `hook_sites`."""
    hooks = [site for site in sites if isinstance(site, tuple)]
    return ProjectFacts(tuple(site for site, name in hooks if name in GLOBAL_CALL_HOOKS),
                        tuple(site for site, name in hooks if name in REGISTRATION_HOOKS),
                        tuple(site for site, name in hooks if name in HOOK_METHODS),
                        tuple(site for site in sites if isinstance(site, AttributeWrites)))
