"""What other files of the scanned tree tell about one file's code: torch's process-wide module hooks, hooks on
single modules, attributes written on objects other than `self`, TorchScript compiling code, and calls that run a
module with other parameters and buffers (`torch.func.functional_call`).

`torch.nn.modules.module.register_module_forward_hook` (and its pre-hook, backward and registration variants)
installs a hook on every module of the process, wherever it is called: a hook registered in `train.py` fires on
the dropout call that a rewrite of `model.py` deletes, and a registration hook may replace any submodule or buffer
as it is assigned. So a scan of several files first collects these calls from all of them (resolved through each
file's imports), and each file's analysis reads them as if they were its own. The same holds for what a training
script does to the model another file defines: `model.blocks[0].attn.attn_drop.register_forward_hook(save)`
(attention maps), `blk.attn.bias.data = band` or `m.apply(swap_dropout)`: a hook or a write in any file of the
tree counts as one in the file that defines the class. So does `torch.jit.script(model)` in an export script: it
compiles the model's classes, and every function they or a scripted function call, wherever they are defined; and
`functional_call(model, {"attn.bias": ones}, (x,))` runs any class with a buffer it did not build.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from advisor.contracts.finding import display_path
from advisor.static.call_sites import module_stem
from advisor.static.class_sites import UNNAMED_BASE, ClassSite, class_sites
from advisor.static.escaping_reads import escaping_reads
from advisor.static.module_index import ParsedModule
from advisor.static.op_overrides import op_overrides
from advisor.static.outside_writes import NARROWED, REGISTRATION_HOOKS, file_writes
from advisor.static.python_ast import nodes, python_tree
from advisor.static.sdpa_kernels import math_kernel_excluded
from advisor.static.state_swaps import first_shape_change, may_swap, state_runs, state_swaps
from advisor.static.text_screens import then_on_line

# hooks that fire around every module call: a deleted module call loses them
GLOBAL_CALL_HOOKS = frozenset({"register_module_forward_hook", "register_module_forward_pre_hook",
                               "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
                               "register_module_backward_hook"})
TOKEN = "register_module_"  # every one of them starts so: files without it are not parsed
# a hook registered by a computed method name, or written into torch's process-wide tables (hooks_by_computed_name)
MAY_HOOK_BY_NAME = re.compile(then_on_line(r"getattr\(", "hook") + r"|_global_\w*hooks|register_\w*hook\b(?!\s*\()")
# what makes TorchScript compile code: the functions or modules passed to it, and everything they call
SCRIPT_ENTRIES = frozenset({"torch.jit.script", "torch.jit.script_method", "torch.jit.ScriptModule"})
SCRIPT_PRIVATE = "torch.jit._script."  # the compiler's own module (`torch.jit._script.script`)
# files without a match are not parsed for them (`torch.jit.is_scripting()` and `from torch.jit import Final` are not)
MAY_SCRIPT = re.compile(r"\bjit\.script(?:_method)?\b|ScriptModule|" + then_on_line("jit import", r"\bscript") + "|" +
                        then_on_line(r"\bjit\b", "script"))
# what traces modules symbolically (torch.fx, and the libraries built on it: torchvision's feature extraction,
# FX quantization, timm's FX features)
FX_TRACERS = ("torch.fx", "torch.ao.quantization.quantize_fx", "torch.quantization.quantize_fx",
              "torchvision.models.feature_extraction",
              "timm.models._features_fx", "timm.models.features_fx")
MAY_FX_TRACE = re.compile(r"\bfx\b|symbolic_trace|feature_extraction|features_fx|quantize_fx|make_fx|proxy_tensor|"
                          r"functorch")
# tracers that run the code on tensors (real, fake or functional), not Proxies, and record the ops it ran: a check
# of dtypes or dims is decided once, by the example, and no flag of torch's public API says one is tracing; the
# graph then takes inputs of other dtypes and ranks. (torch.export is not read as one: its program guards shapes
# and ranks, not dtypes; timm's ONNX helper names `torch.export.Dim`, and reading it so took every guard of timm's
# models away; README says what is left.)
REAL_TENSOR_TRACERS = ("torch.fx.experimental.proxy_tensor", "functorch.compile", "torch._functorch")
# tracers that run the code once on example inputs and record the ops it ran: every `if` is decided then, for good
# and their defining module (`torch.jit._trace.trace`); `torch.jit` or `torch.onnx` taken as a value counts too
JIT_TRACERS = ("torch.jit.trace", "torch.jit.trace_module", "torch.jit._trace", "torch.onnx.export")
TRACER_MODULES = ("torch.jit", "torch.onnx")  # `getattr(torch.jit, "tra" + "ce")` may be any of them
# then `_may_jit_trace` (comments say them often)
MAY_JIT_TRACE = re.compile(r"\btrace(?:_module)?\b|\bonnx\b|\bjit\b(?!\s*\.)")
# torch.func's transforms (vmap, grad, jacrev, ...), which need every autograd.Function they run through to
# support them (flash_attn's does not)
FUNC_TRANSFORMS = ("torch.func", "functorch", "torch.vmap")
MAY_FUNC_TRANSFORM = re.compile(r"(?:torch\.|import |, *)func\b|functorch|\bvmap\b")
# methods of torch.Tensor that copy and cast rewrites read on a receiver of unknown type; a class of the tree defining
# one (`def contiguous(self)` on a box of tensors) may be that receiver (breaker round 14)
TENSOR_METHOD_NAMES = ("contiguous", "clone", "float", "half", "double", "bfloat16", "to", "type",
                       "type_as", "int", "long", "bool", "detach", "cpu", "cuda")
TENSOR_METHOD_DEFS = re.compile(rf"^[ \t]+(?:async[ \t]+)?def[ \t]+({'|'.join(TENSOR_METHOD_NAMES)})[ \t]*\(",
                                re.MULTILINE)
# hooks registered on one module (its call, and so a deleted call of it, runs them)
HOOK_METHODS = frozenset({"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                          "register_full_backward_pre_hook", "register_backward_hook"})
# A file none of whose lines may write an attribute of another object is not parsed for them: an assignment or
# augmented assignment to a dotted target not starting at `self.`, a call that binds by name, an attribute table or
# namespace (`vars(m)`), an in-place method, a state-dict loader, an attribute handed to a function.

@dataclass(frozen=True)
class HookSite:
    path: str
    line: int
    name: str  # the registering function's name

    def describe(self, here: str | None = None) -> str:
        where = "this file" if self.path == here else f"`{display_path(self.path)}`"
        return f"{where} registers a hook on every module (`{self.name}`, line {self.line})"


@dataclass(frozen=True)
class UseSite:
    """A use of one of torch's names that changes how code of the whole tree runs: TorchScript's compiler
    (SCRIPT_ENTRIES), or a call running modules with state given by name (STATE_SWAPS)."""

    path: str
    line: int
    code: str

    def describe(self) -> str:
        return f"`{display_path(self.path)}` uses `{self.code}` (line {self.line})"


@dataclass(frozen=True)
class AttributeWrites:
    """The names of the attributes one file writes on objects other than a method's own `self`
    (static.outside_writes: `*` for names it computes)."""

    path: str
    names: frozenset[str]
    reshaped: frozenset[str]  # ... written otherwise than into their elements
    writers: frozenset[tuple[str, int]] = frozenset()  # outside_writes.FileWrites
    handed: frozenset[tuple[str, int, str]] = frozenset()
    escaping: frozenset[str] = frozenset()  # read where their tensors may be handed on (static.escaping_reads)

    def with_handed_written(self, writers: dict[tuple[str, str], set[int]]) -> "AttributeWrites":
        """These writes and the attributes this file hands to a function another file defines writing that
        parameter (`writers`: (module stem, function name) -> positions; a module is known by its stem alone)."""
        written = {name for callee, position, name in self.handed
                   if position in writers.get(tuple(callee.lstrip(".").split(".")[-2:]), ())}
        return AttributeWrites(self.path, self.names | written, self.reshaped, self.writers, self.handed,
                               self.escaping) if written - self.names else self


@dataclass(frozen=True)
class ProjectFacts:
    """Hooks registered anywhere in the scanned tree, and the attributes its files write on other objects."""

    call_hooks: tuple[HookSite, ...] = ()
    registration_hooks: tuple[HookSite, ...] = ()
    module_hooks: tuple[HookSite, ...] = ()  # `m.register_forward_hook(...)` and its variants, on any module
    attribute_writes: tuple[AttributeWrites, ...] = ()
    scripts: tuple[UseSite, ...] = ()  # TorchScript compiling what it is given and all it calls
    state_swaps: tuple[UseSite, ...] = ()  # modules run with parameters and buffers given by name
    classes: tuple[ClassSite, ...] = ()  # every class of the tree that derives from something (static.class_sites)
    fx_traces: tuple[UseSite, ...] = ()  # torch.fx symbolic tracing, which runs the code on Proxies
    jit_traces: tuple[UseSite, ...] = ()  # torch.jit.trace and ONNX export, which record one run's ops
    func_transforms: tuple[UseSite, ...] = ()  # torch.func's transforms of modules and functions
    op_overrides: tuple[UseSite, ...] = ()  # modes, tensor subclasses and kernels changing torch's ops
    tensor_methods: tuple[UseSite, ...] = ()  # methods named as torch.Tensor's (TENSOR_METHOD_NAMES) defined
    sdpa_restrictions: tuple[UseSite, ...] = ()  # SDPA's kernels restricted without its math kernel
    shape_changes: tuple[UseSite, ...] = ()  # in-place shape changes and `.data` assignments (shape_changes)
    real_traces: tuple[UseSite, ...] = ()  # make_fx and torch.export, which trace real (or fake) tensors
    state_runs: tuple[UseSite, ...] = ()  # those of state_swaps that run modules with state given by name
    frame_globals: tuple[UseSite, ...] = ()  # a frame's or a function's globals reached: any module's names bound

    def subclasses(self, name: str) -> list[ClassSite]:
        """The classes of the tree deriving from a class named `name`, directly or not (by the bases' names: a
        class of another file with the same name counts too)."""
        found: list[ClassSite] = []
        names, pending = {name}, [name]
        while pending:
            base = pending.pop()
            for site in self._derived.get(base, []) + self._derived.get(UNNAMED_BASE, []):
                if site not in found:
                    found.append(site)
                    if site.name not in names:
                        names.add(site.name)
                        pending.append(site.name)
        return found

    def named(self, name: str) -> list[ClassSite]:
        """The class sites of the tree with that name."""
        return self._by_name.get(name, [])

    @cached_property
    def _by_name(self) -> dict[str, list[ClassSite]]:
        found: dict[str, list[ClassSite]] = {}
        for site in self.classes:
            found.setdefault(site.name, []).append(site)
        return found

    @cached_property
    def _derived(self) -> dict[str, list[ClassSite]]:
        derived: dict[str, list[ClassSite]] = {}
        for site in self.classes:
            for base in set(site.bases):
                derived.setdefault(base, []).append(site)
        return derived

    def writes_elsewhere(self, here: str) -> tuple[AttributeWrites, ...]:
        return tuple(writes for writes in self.attribute_writes if writes.path != here)

    def names_written_elsewhere(self, here: str) -> tuple[frozenset[str], frozenset[str]]:
        """The names, and the reshaped names, that files other than `here` write (those of `writes_elsewhere`,
        joined), from counts over the tree made once: joining every other file's names for each file grew with
        the files squared."""
        names, reshaped, by_path = self._write_counts
        own = by_path.get(here, ())
        return _written_by_others(names, [w.names for w in own]), _written_by_others(reshaped, [w.reshaped for w in own])

    def escaping_elsewhere(self, name: str, here: str) -> list[tuple[str, str]]:
        """(entry, file) for each file other than `here` that reads the attribute `name` where its tensor may be
        handed on, the entry qualified as outside_writes qualifies writes (`bias@torch.nn.Linear`), from an index
        built once per tree (a join for each file grew with the files squared, as `names_written_elsewhere`)."""
        return [(entry, path) for entry, path in self._escaping.get(name, ()) if path != here]

    @cached_property
    def _escaping(self) -> dict[str, list[tuple[str, str]]]:
        found: dict[str, list[tuple[str, str]]] = {}
        for writes in self.attribute_writes:
            for entry in writes.escaping:
                found.setdefault(entry.partition(NARROWED)[0], []).append((entry, writes.path))
        return found

    @cached_property
    def _write_counts(self) -> tuple[Counter, Counter, dict[str, list[AttributeWrites]]]:
        by_path: dict[str, list[AttributeWrites]] = {}
        for writes in self.attribute_writes:
            by_path.setdefault(writes.path, []).append(writes)
        return (Counter(name for writes in self.attribute_writes for name in writes.names),
                Counter(name for writes in self.attribute_writes for name in writes.reshaped), by_path)


def _written_by_others(counts: Counter, own: list[frozenset[str]]) -> frozenset[str]:
    """The names of `counts` (how many files' entries hold each) that an entry other than `own` holds."""
    mine = Counter(name for names in own for name in names)
    return frozenset(name for name in counts if counts[name] > mine[name])


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


def hooks_by_computed_name(parsed: ParsedModule) -> list[tuple[cst.CSTNode, str]]:
    """Hooks registered where no call names them: `getattr(m, f"register_{kind}_hook")(fn)` (a computed name that
    mentions a hook, read as one on a single module: the patch checks at run time), a registration method passed on
    as a value (`r = m.drop.register_forward_hook; r(h)`, `partial(nn.Module.register_forward_hook, m)`), and a
    write into torch's process-wide hook tables (`module._global_forward_hooks[i] = fn`, read as
    `register_module_forward_hook`)."""
    if MAY_HOOK_BY_NAME.search(parsed.source) is None:
        return []
    found: list[tuple[cst.CSTNode, str]] = []
    for call in parsed.calls_and_classes[0]:
        getter = call.func
        if isinstance(getter, cst.Call) and isinstance(getter.func, cst.Name) and getter.func.value == "getattr" and \
                len(getter.args) >= 2 and "hook" in parsed.code(getter.args[1].value).lower():
            found.append((call, "register_forward_hook"))
    found += [(node, "register_module_forward_hook") for node in parsed.nodes_of(cst.Name)  # `x._global_..` too
              if node.value.startswith("_global_") and node.value.endswith("hooks")]
    registrations = HOOK_METHODS | GLOBAL_CALL_HOOKS
    found += [(node, "register_forward_hook") for node in parsed.nodes_of(cst.Attribute)  # a bound method passed
              if node.attr.value in registrations and  # on (`r = m.register_forward_hook`)
              not (isinstance(parsed.parents.get(node), cst.Call) and parsed.parents[node].func is node)]
    return found


def script_uses(parsed: ParsedModule) -> list[cst.BaseExpression]:
    """Where the file may hand code to TorchScript's compiler: SCRIPT_ENTRIES, the compiler's own module
    (`torch.jit._script.script`), and `torch.jit` itself taken as a value (`getattr(torch.jit, "script")`)."""
    return [node for node in parsed.uses_of(None) if parsed.imported_name(node) in SCRIPT_ENTRIES or
            parsed.imported_name(node) == "torch.jit" or parsed.imported_name(node).startswith(SCRIPT_PRIVATE)]


def first_elsewhere(sites: tuple[UseSite | HookSite, ...], here: str) -> UseSite | HookSite | None:
    """The first of `sites` (a ProjectFacts field: hooks on single modules, TorchScript's compiler, a state swap, a
    tracer, torch.func) in a file other than `here`: what it is given may be any of `here`'s modules or functions."""
    return next((site for site in sites if site.path != here), None)


def fx_trace_uses(parsed: ParsedModule) -> list[cst.BaseExpression]:
    """Where the file reads torch.fx or a library that traces with it (FX_TRACERS)."""
    return _uses_under(parsed, FX_TRACERS)


def real_trace_uses(parsed: ParsedModule) -> list[cst.BaseExpression]:
    """Where the file reads a tracer that runs the code on tensors (REAL_TENSOR_TRACERS)."""
    return _uses_under(parsed, REAL_TENSOR_TRACERS)


def func_transform_uses(parsed: ParsedModule) -> list[cst.BaseExpression]:
    """Where the file reads torch.func, functorch or torch.vmap (FUNC_TRANSFORMS)."""
    return _uses_under(parsed, FUNC_TRANSFORMS)


def jit_trace_uses(parsed: ParsedModule) -> list[cst.BaseExpression]:
    """Where the file reads torch.jit.trace or ONNX export (JIT_TRACERS), or takes their module as a value."""
    return _uses_under(parsed, JIT_TRACERS) + parsed.uses_of(frozenset(TRACER_MODULES))


def _uses_under(parsed: ParsedModule, names: tuple[str, ...]) -> list[cst.BaseExpression]:
    """The file's reads of one of `names` (dotted, through its imports), or of a name under one."""
    found = []
    for node in parsed.uses_of(None):
        dotted = parsed.imported_name(node) or ""
        if any(dotted == name or dotted.startswith(name + ".") for name in names):
            found.append(node)
    return found


def _may_jit_trace(text: str) -> bool:
    """A screen for JIT_TRACERS before libcst's parse: the words, then CPython's tree holding a `.trace` or
    `.trace_module` attribute, or an import from torch.jit or torch.onnx (transformers' files mention
    `torch.jit.trace` in comments, and libcst's parses of those took the tree phase from 27 s to 41 s CPU)."""
    if MAY_JIT_TRACE.search(text) is None:
        return False
    try:
        tree = python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(type(node) is ast.Attribute and node.attr in ("trace", "trace_module", "export") or
               type(node) in (ast.Import, ast.ImportFrom) and any(
                   name in TRACER_MODULES for name in _import_names(node)) or
               type(node) in (ast.Call, ast.Assign) and any(  # `getattr(torch.jit, name)`, `j = torch.jit`
                   type(value) is ast.Attribute and value.attr in ("jit", "onnx")
                   for value in (node.args if type(node) is ast.Call else [node.value])) for node in nodes(tree))


def _import_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import reads, and the dotted names it binds (`from torch import jit`: `torch.jit`)."""
    if type(node) is ast.Import:
        return [alias.name for alias in node.names]
    return [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]


def hook_sites(path: str, text: str) -> list[tuple[HookSite, str] | AttributeWrites | tuple[UseSite, str] | ClassSite]:
    """One file's part of the project facts: its hook registrations (process-wide and on single modules), each with
    its registering function's name, the attributes it writes on other objects, its uses of TorchScript's compiler
    and of calls that swap a module's state, each with its kind, what may change torch's ops (static.op_overrides),
    and its derived classes ([] for a file that cannot be parsed: the scan reports it)."""
    found: list = []
    uses = MAY_SCRIPT.search(text) is not None or may_swap(text) or \
        MAY_FX_TRACE.search(text) is not None or _may_jit_trace(text) or \
        MAY_FUNC_TRANSFORM.search(text) is not None
    computed = MAY_HOOK_BY_NAME.search(text) is not None
    if TOKEN in text or any(name in text for name in HOOK_METHODS) or uses or computed:
        try:
            parsed = ParsedModule(text, path)
            found = [(HookSite(path, parsed.line(call), name), name) for call, name in
                     global_hook_calls(parsed, GLOBAL_CALL_HOOKS | REGISTRATION_HOOKS | HOOK_METHODS) +
                     hooks_by_computed_name(parsed)]
            found += [(UseSite(path, parsed.line(node), parsed.code(node).strip().splitlines()[0][:80]), kind)
                      for kind, nodes in (("script", script_uses(parsed)), ("swap", state_swaps(parsed)),
                                          ("state-run", state_runs(parsed)),
                                          ("fx", fx_trace_uses(parsed)), ("jit", jit_trace_uses(parsed)),
                                          ("func", func_transform_uses(parsed)),
                                          ("real", real_trace_uses(parsed)))
                      for node in nodes]
        except (cst.ParserSyntaxError, RecursionError, MemoryError):
            return []
    writes = file_writes(text, escaping_reads)  # every file: any may hand on an attribute it reads
    if writes.names or writes.writers or writes.handed or writes.escaping:
        found.append(AttributeWrites(path, writes.names, writes.reshaped, writes.writers, writes.handed,
                                     writes.escaping))
    found += [(UseSite(path, line, code), "ops") for line, code in op_overrides(text)]
    found += [(UseSite(path, line, code), "sdpa") for line, code in math_kernel_excluded(text)]
    found += [(site, "methods") for site in tensor_method_definitions(path, text)]
    found += [(site, "shapes") for site in shape_changes(path, text)]
    found += [(site, "frames") for site in frame_globals(path, text)]
    return found + class_sites(path, text)


def shape_changes(path: str, text: str) -> list[UseSite]:
    """The file's first word that may change a tensor's shape where no reader of another file sees it: an in-place
    shape change named anywhere (strings and comments too), `torch.utils.swap_tensors`, a `.data` assignment (by
    `setattr` too). One site is enough: what it is handed may be any tensor of the tree."""
    match = first_shape_change(text)
    return [] if match is None else [UseSite(path, text.count("\n", 0, match.start()) + 1, match.group(0).strip())]


# a frame's or a function's globals written: by an item (`f_globals["F"] = x`), by a method that binds, or as the
# namespace code runs in (`exec(code, frame.f_globals)`); reads (`f.__globals__["__file__"]`) bind nothing
FRAME_GLOBALS = re.compile(r"\b(?:f_globals|__globals__)\s*(?:\[[^\]\n]*\]\s*=(?!=)|\.\s*(?:update|setdefault|"
                           r"__setitem__|__delitem__|pop|popitem|clear)\b)|" +
                           then_on_line(r"\b(?:exec|eval)\(", r"\b(?:f_globals|__globals__)\b"))


def frame_globals(path: str, text: str) -> list[UseSite]:
    """The file's first write into a frame's or a function's globals (`inspect.stack()[-1].frame.f_globals["F"] =
    x`: the caller's module, whichever it is, breaker round 49): any module's names may be bound anew from here."""
    match = FRAME_GLOBALS.search(text)
    return [] if match is None else [UseSite(path, text.count("\n", 0, match.start()) + 1, match.group(0))]


def tensor_method_definitions(path: str, text: str) -> list[UseSite]:
    """The methods of the file named as a torch.Tensor method a copy or cast rewrite reads (TENSOR_METHOD_DEFS),
    each as a site whose code is the name."""
    return [UseSite(path, text.count("\n", 0, match.start()) + 1, match.group(1))
            for match in TENSOR_METHOD_DEFS.finditer(text)]


def project_facts(sites: list[tuple[HookSite, str] | AttributeWrites | ClassSite]) -> ProjectFacts:
    """The hooks registered, the attributes written and the classes derived in the scanned tree, from every file's
    `hook_sites`."""
    hooks = [site for site in sites if isinstance(site, tuple)]
    writes = [site for site in sites if isinstance(site, AttributeWrites)]
    writers: dict[tuple[str, str], set[int]] = {}
    for site in writes:
        for function, position in site.writers:
            writers.setdefault((module_stem(site.path), function), set()).add(position)
    return ProjectFacts(tuple(site for site, name in hooks if name in GLOBAL_CALL_HOOKS),
                        tuple(site for site, name in hooks if name in REGISTRATION_HOOKS),
                        tuple(site for site, name in hooks if name in HOOK_METHODS),
                        tuple(site.with_handed_written(writers) for site in writes),
                        tuple(site for site, kind in hooks if kind == "script"),
                        tuple(site for site, kind in hooks if kind == "swap"),
                        tuple(site for site in sites if isinstance(site, ClassSite)),
                        tuple(site for site, kind in hooks if kind == "fx"),
                        tuple(site for site, kind in hooks if kind == "jit"),
                        tuple(site for site, kind in hooks if kind == "func"),
                        tuple(site for site, kind in hooks if kind == "ops"),
                        tuple(site for site, kind in hooks if kind == "methods"),
                        tuple(site for site, kind in hooks if kind == "sdpa"),
                        tuple(site for site, kind in hooks if kind == "shapes"),
                        tuple(site for site, kind in hooks if kind == "real"),
                        tuple(site for site, kind in hooks if kind == "state-run"),
                        tuple(site for site, kind in hooks if kind == "frames"))
