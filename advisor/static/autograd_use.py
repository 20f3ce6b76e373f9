"""Where a file asks autograd for more than one reverse pass: double backward (`create_graph`), forward-mode AD, and
the torch.func / torch.autograd.functional transforms built on them.

SDPA's fused kernels (the CPU flash kernel; CUDA's flash and efficient kernels) implement neither, while the eager
attention they replace supports both; so an attention rewrite keeps working only where nothing asks for them (the
`first-order-autograd` fact). Names are resolved through the file's imports, so `from torch.autograd import grad as
g` and `import functorch` count. Files that mention none of the words are skipped first (`might_ask`), and a file
not yet parsed is read with CPython's parser before libcst's (`worth_resolving`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

import libcst as cst

from advisor.static.dataflow import target_names
from advisor.static.module_index import ParsedModule
from advisor.static.walk import walk

# A file in which none of these occur asks for nothing here ("autograd" and "backward(" for a create_graph passed by
# position); substring tests, since one regular expression of all of them is several times slower.
TOKENS = ("create_graph", "forward_ad", "forward-mode", "jvp", "jacfwd", "hessian", "hvp", "vhp", "gradgradcheck",
          "functorch", "autograd", "backward(", "forward_grad", "learn2learn", "higher", "torchopt", "torchmeta",
          "_execution_engine", "run_backward")
FUNC_MODULE = re.compile(r"(?:torch\.|import |, *)func\b")  # torch.func, `from torch import func` or `nn, func`

DOUBLE_BACKWARD, FORWARD_MODE = "double backward", "forward-mode AD"

# Qualified name (or a module: every name under it) -> what using it asks of every op it differentiates.
TRANSFORMS = {
    "torch.autograd.forward_ad": FORWARD_MODE,
    "torch.func.jvp": FORWARD_MODE,
    "torch.func.jacfwd": FORWARD_MODE,
    "torch.func.linearize": FORWARD_MODE,
    "torch.func.hessian": FORWARD_MODE,  # jacfwd over jacrev
    "torch.autograd.functional.hessian": DOUBLE_BACKWARD,
    "torch.autograd.functional.hvp": DOUBLE_BACKWARD,
    "torch.autograd.functional.vhp": DOUBLE_BACKWARD,
    "torch.autograd.functional.jvp": DOUBLE_BACKWARD,  # computed as a backward of a backward
    "torch.autograd.gradgradcheck": DOUBLE_BACKWARD,
}
# Where the transforms are also defined: functorch's old name, torch's private modules, gradcheck's own module
ALIASES = {"functorch.": "torch.func.", "torch._functorch.eager_transforms.": "torch.func.",
           "torch._functorch.apis.": "torch.func.", "torch._functorch.functional_call.": "torch.func.",
           "torch.autograd.gradcheck.gradgradcheck": "torch.autograd.gradgradcheck"}
# Libraries outside the tree whose use differentiates through gradients: MAML's second-order step (learn2learn's
# `MAML(..., first_order=False)` by default, torchmeta's `gradient_update_parameters`), differentiable optimizers
# (higher, torchopt), Hessian tools (PyHessian, hessian-eigenthings). Any name under them may ask.
HIGHER_ORDER_LIBRARIES = {name: DOUBLE_BACKWARD for name in ("learn2learn", "higher", "torchopt", "torchmeta",
                                                             "pyhessian", "hessian_eigenthings")}
TRANSFORMS.update(HIGHER_ORDER_LIBRARIES)
# The modules those transforms live in: a name computed on one (`getattr(torch.func, "j" + "vp")`) may be any.
TRANSFORM_MODULES = {prefix.rsplit(".", 1)[0] for prefix in TRANSFORMS} | {"torch.func", "functorch"}
# ... those torch's (a string naming one is an import at run time; "higher" may be any word)
TORCH_TRANSFORM_MODULES = frozenset({name for name in TRANSFORM_MODULES if name.startswith(("torch.", "functorch"))} |
                                    {"torch.autograd.forward_ad"})
# ... their last names, as CPython's tree shows the module a `getattr` reads (breaker round 56: torch.autograd)
TRANSFORM_MODULE_LEAVES = frozenset(module.rsplit(".", 1)[-1] for module in TRANSFORM_MODULES | TORCH_TRANSFORM_MODULES)
# packages any module of which may hold transforms (`torch._functorch.eager_transforms`: breaker round 33)
TRANSFORM_PACKAGES = ("torch.func.", "torch._functorch.", "functorch.", "torch.autograd.forward_ad.")


def names_transform_module(value) -> bool:
    """A string naming a module of torch's transforms: one of TORCH_TRANSFORM_MODULES, or any module of their
    packages (an import of it at run time may be used for any transform)."""
    return isinstance(value, str) and (value in TORCH_TRANSFORM_MODULES or value.startswith(TRANSFORM_PACKAGES))
# Options that make a call (`torch.autograd.gradcheck`, or a wrapper passing them on) run forward-mode AD.
FORWARD_MODE_OPTIONS = ("check_forward_ad", "check_batched_forward_grad")
GRADCHECKS = {"torch.autograd.gradcheck", "torch.autograd.gradcheck.gradcheck"}  # `**options` may hold them
# builtins that run code given as a string: a literal one is read as the file's own code, any other may ask
CODE_RUNNERS = ("exec", "eval", "compile")
# Reverse-mode transforms: first order alone, double backward when one transforms a function that calls another
# (`grad(grad(f))`, `jacrev(lambda x: grad(f)(x))`, `grad(g)` with `def g` or `g = grad(f)` anywhere): a file that
# uses them twice is taken to nest them, since the composition can go through any function of the file. So does one
# use with a plain backward pass anywhere in the tree (`PLAIN_PASS`): a transform's result is differentiable, and
# second-order MAML written with torch.func takes `grad` inside and `.backward()` outside.
REVERSE_TRANSFORMS = {"torch.func.grad", "torch.func.grad_and_value", "torch.func.jacrev", "torch.func.vjp"}
# A reverse pass of plain autograd, read as text (a comment or string that matches only makes the fact assumed): the
# word `backward` in any spelling (`loss.backward()`, `getattr(loss, "backward")()`, `methodcaller("backward")`),
# `autograd.grad` or `autograd.functional` named, imported or aliased (`import torch.autograd as ag; ag.grad(...)`,
# breaker round 15), or torch.autograd reached by its name as a string (`importlib.import_module("torch.autograd")`).
PLAIN_PASS = re.compile(r"\bbackward\b|\bautograd\.(?:grad|functional)\b|"
                        r"\bfrom\s+torch\.autograd\s+import\b[^\n]*\b(?:grad|functional)\b|"
                        r"\bimport\s+torch\.autograd\b[^\n]*\bas\b|\bfrom\s+torch\s+import\b[^\n]*\bautograd\s+as\b|"
                        r"[\"']torch\.autograd\b")
# autograd's engine reached past `torch.autograd` (`Variable._execution_engine.run_backward(..., create_graph, ...)`,
# what `torch.autograd.grad` calls): what it is asked is not read, so it may build the gradient's graph
ENGINE_ENTRIES = frozenset({"_execution_engine", "run_backward", "_engine_run_backward", "_ImperativeEngine",
                            "_EngineBase"})
# Where `create_graph` sits among the positional arguments of the calls that take it.
CREATE_GRAPH_POSITION = {"torch.autograd.grad": 4, "torch.autograd.backward": 3, "torch.Tensor.backward": 3,
                         "torch.autograd.functional.jacobian": 2, "torch.autograd.functional.vjp": 3}
# a screen for `_looks_up_module_attributes`: a getattr whose name is no literal on anything but self/cls, a
# namespace subscripted
COMPUTED_LOOKUP = re.compile(r"\bgetattr\s*\(\s*(?!self\b|cls\b)\w+\s*,\s*[^\"'\s)]|\bvars\s*\(\s*\w+\s*\)\s*\[|"
                             r"\b\w+\.__dict__\s*\[")
TENSOR_BACKWARD_POSITION = 2  # `loss.backward(gradient, retain_graph, create_graph)`
# What `worth_resolving` looks for, by the last part of each name.
TRIGGER_NAMES = {name.rsplit(".", 1)[-1] for name in TRANSFORMS} | {"create_graph", "functorch", "jacobian",
                                                                    *FORWARD_MODE_OPTIONS, *ENGINE_ENTRIES}
CALLS_WITH_CREATE_GRAPH = {name.rsplit(".", 1)[1] for name in CREATE_GRAPH_POSITION}
FEWEST_POSITIONAL = min([*CREATE_GRAPH_POSITION.values(), TENSOR_BACKWARD_POSITION])


@dataclass(frozen=True)
class AutogradSite:
    what: str  # "`torch.func.jvp` asks for forward-mode AD"
    path: str | None = None  # None: seen at run time (advisor.runtime.autograd_probe)
    line: int = 0
    # The site passes on its function's own parameter (off by default, never rebound): it asks only where a call of
    # that function turns it on. The name whose uses hold those calls: the function's, or its class's for a method.
    caller_decides: str | None = None
    # A reverse transform applied to a parameter of the module-level function around it (`def derivative(fn):
    # return torch.func.grad(fn)`), or bound to a name (`d = torch.func.grad`): that name is a transform too, used
    # once per use of it.
    wrapper: str | None = None
    # A reverse transform that may be applied more than once by itself (to its own result in a loop, or passed on
    # as a value): why, and so it may nest with itself.
    repeats: str | None = None


def might_ask(source: str) -> bool:
    return any(token in source for token in TOKENS) or FUNC_MODULE.search(source) is not None


# the words of TOKENS that name a request beyond first-order reverse mode (not `autograd`, `backward(`)
BEYOND_FIRST_ORDER = re.compile("|".join(re.escape(token) for token in TOKENS
                                         if token not in ("autograd", "backward(", "forward-mode")))


def unparsed_request(source: str, path: str) -> AutogradSite | None:
    """A file CPython cannot parse whose words name a request beyond first-order reverse mode (`create_graph`,
    `jvp`, `torch.func`): what it asks is not seen, so it asks (breaker round 18: a gradient penalty in a file
    written in a newer Python's syntax proved nothing asked)."""
    found = BEYOND_FIRST_ORDER.search(source) or FUNC_MODULE.search(source)
    if found is None:
        return None
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return AutogradSite(f"a file that cannot be parsed here names `{found.group(0).strip(' ,')}`, and what it asks "
                            "of autograd is not seen", path, source.count("\n", 0, found.start()) + 1)
    return None


def worth_resolving(source: str) -> bool:
    """Whether a file not yet parsed with libcst needs `autograd_sites`: the word prefilter, then the identifiers
    CPython's parser sees (10x cheaper than libcst's parse: `torch.autograd.Function` or `loss.backward()` alone
    pass the words, not this). A superset of what `autograd_sites` reports; False for unparsable source."""
    if not might_ask(source):
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    names: set[str] = set()
    long_calls: set[str | None] = set()  # callees given enough positional arguments to pass create_graph
    takes_create_graph = set(CALLS_WITH_CREATE_GRAPH)  # and the local names they are imported as
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (len(node.args) > FEWEST_POSITIONAL or _unpacks(node)):
            long_calls.add(_leaf(node.func))  # `grad(y, x, **opts)`: the options may hold create_graph
        elif isinstance(node, (ast.Assign, ast.keyword)) and _leaf(node.value) in CALLS_WITH_CREATE_GRAPH:
            return True  # `g = torch.autograd.grad`: a call through the alias may pass create_graph by position
        elif isinstance(node, ast.Call) and _leaf(node.func) == "getattr" and len(node.args) >= 2 and \
                not isinstance(node.args[1], ast.Constant) and _leaf(node.args[0]) in TRANSFORM_MODULE_LEAVES:
            return True  # `getattr(torch.func, name)`, `getattr(torch.autograd, "gr" + "ad")`: any transform
        elif isinstance(node, ast.alias) and node.asname and node.name.rsplit(".", 1)[-1] in CALLS_WITH_CREATE_GRAPH:
            takes_create_graph.add(node.asname)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                module.split(".")[0] in HIGHER_ORDER_LIBRARIES for module in _imported_modules(node)):
            return True  # `from learn2learn.algorithms import MAML`: its names may ask
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CODE_RUNNERS or \
                isinstance(node, ast.Constant) and names_transform_module(node.value):
            return True  # code run from a string; `import_module("torch.func")`
        elif isinstance(node, ast.Attribute) and node.attr == "__dict__" or \
                isinstance(node, ast.Call) and _leaf(node.func) == "vars":
            names.add("__dict__")  # `vars(torch.func)[name]`: any transform, where the module is named too
        names.update(_identifiers(node))
    reverse = {name.rsplit(".", 1)[1] for name in REVERSE_TRANSFORMS}
    modules = {"func", "functorch", "_functorch"}
    return bool(names & TRIGGER_NAMES or long_calls & (takes_create_graph | {"gradcheck"}) or
                names & reverse and names & modules or "__dict__" in names and names & (modules | {"autograd"}))


def _imported_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute modules an import statement reads (none for a relative `from . import x`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if node.level == 0 and node.module else []


def _unpacks(call: ast.Call) -> bool:
    """`f(*args)` or `f(**options)`: what it passes is not shown."""
    return any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)


def _identifiers(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.keyword):
        return [node.arg] if node.arg else []
    if isinstance(node, ast.alias):
        return node.name.split(".")
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
        return [node.value]  # `getattr(F, "hvp")`, `{"create_graph": True}`
    if isinstance(node, ast.ImportFrom) and node.module:
        return node.module.split(".")
    return []


def _leaf(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def autograd_sites(parsed: ParsedModule) -> list[AutogradSite]:
    """Every place in the file that asks for double backward or forward-mode AD, in source order."""
    requests, reverse = autograd_uses(parsed)
    return sorted(requests + nested(reverse, lambda name: name_uses(parsed.source, name),
                                    lambda: plain_pass(parsed.source, parsed.path)), key=lambda s: s.line)


def autograd_uses(parsed: ParsedModule) -> tuple[list[AutogradSite], list[AutogradSite]]:
    """(the file's requests but for nesting, its uses of reverse-mode transforms): a reverse transform asks for
    double backward only where another one may nest it, which may be in another file of the tree (`derivative(f)`
    a helper of `utils.py` returning `torch.func.grad(f)`, applied twice in `train.py`): see `nested`."""
    if not might_ask(parsed.source):
        return [], []
    found: list[tuple[cst.CSTNode, str]] = []
    reverse: list[AutogradSite] = []
    for node, parent in parsed.parents.items():
        if isinstance(node, (cst.Name, cst.Attribute)) and not _inside_dotted_name(node, parent) and \
                not isinstance(parent, (cst.ImportAlias, cst.ImportFrom, cst.AsName)):
            what = _transform_use(parsed, node, parent) or _engine_use(parsed, node) or \
                _passed_as_value(parsed, node, parent) or _namespace_read(parsed, node)
            if what is not None:
                found.append((node, what))
            elif qualified(parsed, node) in REVERSE_TRANSFORMS:
                reverse.append(_reverse_use(parsed, node, parent))
        elif isinstance(node, cst.Call):
            asked = _create_graph(parsed, node) or _forward_mode_option(parsed, node) or \
                _getattr_transform(parsed, node) or _namespace_read(parsed, node)
            if asked is not None:
                found.append((node, asked))
            elif _runs_code(parsed, node):
                requests, uses = _uses_in_code_string(parsed, node)
                found.extend(requests)
                reverse.extend(uses)
        elif isinstance(node, cst.DictElement):
            asked = _create_graph_entry(parsed, node)
            if asked is not None:
                found.append((node, asked))
        elif isinstance(node, cst.SimpleString):
            asked = _option_or_module_named(parsed, node, parent)
            if asked is not None:
                found.append((node, asked))
    found.extend(_star_imported_uses(parsed))
    sites = []
    for node, asked in found:
        what, value = asked if isinstance(asked, tuple) else (asked, None)
        decides = _passed_on_parameter(parsed, node, value) if value is not None else None
        sites.append(AutogradSite(what, parsed.path, parsed.line(node), decides))
    return sites, reverse


def _star_imported_uses(parsed: ParsedModule) -> list[tuple[cst.CSTNode, str]]:
    """`from torch.func import *` then `jvp(...)`: a name the file reads that a star import of an autograd module
    may bind to one of its transforms (or to a call taking create_graph by position) is taken to ask; a reverse
    transform too (`grad`), whose uses are not counted for nesting when the name is not resolved."""
    found = []
    read = {node.value for node in parsed.nodes_of(cst.Name)}
    for statement in parsed.nodes_of(cst.ImportFrom):
        if not isinstance(statement.names, cst.ImportStar) or statement.relative or statement.module is None:
            continue
        module = parsed.code(statement.module)
        module = next((public.rstrip(".") for home, public in ALIASES.items() if f"{module}." == home), module)
        leaves = {name.rsplit(".", 1)[1] for name in (*TRANSFORMS, *REVERSE_TRANSFORMS, *CREATE_GRAPH_POSITION)
                  if name.rsplit(".", 1)[0] == module or name == module}
        used = sorted(leaves & read) or [f"{module}.*"] * any(module == prefix or module.startswith(prefix + ".")
                                                              for prefix in TRANSFORMS)
        if used:
            found.append((statement, f"`from {module} import *` may bind `{used[0]}`, which may ask for "
                                     f"{DOUBLE_BACKWARD} or {FORWARD_MODE}"))
    return found


def nested(reverse: list[AutogradSite], uses, plain_pass) -> list[AutogradSite]:
    """Two uses of reverse-mode transforms (`autograd_uses`), in one file or in two, may nest: the composition can
    go through any function. A wrapper's transform counts once per use of the wrapper's name (`uses(name)`, over the
    same files): `derivative(derivative(f))` nests it. One use that repeats itself nests alone, and one use nests
    with a plain reverse pass (`plain_pass()`: the first in the same files, as `AutogradSite`, or None). The
    request, at the second use."""
    repeating = next((site for site in reverse if site.repeats is not None), None)
    if repeating is not None:
        return [AutogradSite(f"`{repeating.what}` {repeating.repeats}, which may nest it and asks for "
                             f"{DOUBLE_BACKWARD}", repeating.path, repeating.line)]
    direct = [site for site in reverse if site.wrapper is None]
    wrapped = [site for site in reverse if site.wrapper is not None for _ in range(uses(site.wrapper))]
    if not direct + wrapped:
        return []
    if len(direct) + len(wrapped) < 2:
        (only,) = direct + wrapped
        backward = plain_pass()
        if backward is None:
            return []
        return [AutogradSite(f"`{only.what}` and {backward.what} in the scanned files may nest (a transform's result "
                             f"is differentiable), which asks for {DOUBLE_BACKWARD}", only.path, only.line)]
    first, second = (direct + wrapped)[:2]
    via = "".join(f" (through `{s.wrapper}`)" for s in (first, second) if s.wrapper)[:200]
    return [AutogradSite(f"`{first.what}` and `{second.what}` in the scanned files may nest{via}, which asks for "
                         f"{DOUBLE_BACKWARD}", second.path, second.line)]


def plain_pass(source: str, path: str | None) -> AutogradSite | None:
    """The file's first reverse pass of plain autograd (`loss.backward()`, `torch.autograd.grad(...)`), if any."""
    match = PLAIN_PASS.search(source)
    if match is None:
        return None
    return AutogradSite(f"a backward pass (`{match.group(0).strip()}`)", path, source.count("\n", 0, match.start()) + 1)


def _reverse_use(parsed: ParsedModule, node: cst.CSTNode, parent: cst.CSTNode | None) -> AutogradSite:
    """A use of a reverse transform: applied once where it is called, once per use of a wrapper or alias name, or
    repeatedly where it is applied to its own result in a loop or passed on as a value."""
    name, line = qualified(parsed, node), parsed.line(node)
    if not (isinstance(parent, cst.Call) and parent.func is node):
        alias = _alias(parsed, node, parent)
        if alias is not None:
            return AutogradSite(name, parsed.path, line, wrapper=alias)
        return AutogradSite(name, parsed.path, line, repeats="is passed on as a value (it may be applied any number "
                                                             "of times)")
    if _reapplied_in_loop(parsed, parent):
        return AutogradSite(name, parsed.path, line, repeats="is applied to its own result in a loop")
    wrapper = _wrapper(parsed, node, parent)
    if wrapper is None and _applied_to_a_parameter(parsed, parent):
        return AutogradSite(name, parsed.path, line, repeats="is applied to a parameter of a lambda or function whose "
                                                             "calls are not counted (it may be applied any number of "
                                                             "times)")
    return AutogradSite(name, parsed.path, line, wrapper=wrapper)


def _applied_to_a_parameter(parsed: ParsedModule, call: cst.Call) -> bool:
    """`D = lambda fn: torch.func.grad(fn)`, a method `d(self, fn)`, `functools.reduce` over a lambda: the transform
    is applied to a parameter of a lambda, a method or a nested function around it, once per call of that (breaker
    round 18: `D(lambda x: D(f)(x).sum())(x)` nested it). A module-level function's parameter is not: its calls
    are counted where it returns the transform (`_wrapper`), and it applies it once per call otherwise."""
    argument = call.args[0].value if call.args and call.args[0].keyword is None else None
    function = parsed.innermost(call, (cst.FunctionDef, cst.Lambda)) if isinstance(argument, cst.Name) else None
    while function is not None:  # a parameter of any function around it (`lambda g: (lambda x: grad(g)(x))`)
        params = function.params
        if argument.value in {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}:
            return not (isinstance(function, cst.FunctionDef) and
                        parsed.module_functions.get(function.name.value) is function)
        function = parsed.innermost(parsed.parents.get(function), (cst.FunctionDef, cst.Lambda))
    return False


def _alias(parsed: ParsedModule, node: cst.CSTNode, parent: cst.CSTNode | None) -> str | None:
    """`d = torch.func.grad`: the one name the transform itself is bound to."""
    if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1 and \
            isinstance(parent.targets[0].target, cst.Name):
        return parent.targets[0].target.value
    return None


def _reapplied_in_loop(parsed: ParsedModule, call: cst.Call) -> bool:
    """`for _ in range(n): f = grad(f)`: the call's function argument is a name rebound inside a loop around the
    call (in the same function), so a later iteration may transform the earlier one's result."""
    argument = call.args[0].value if call.args and call.args[0].keyword is None else None
    if not isinstance(argument, cst.Name):
        return False
    node = parsed.parents.get(call)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda, cst.Module)):
        if isinstance(node, (cst.For, cst.While)) and argument.value in _bound_names(node.body):
            return True
        node = parsed.parents.get(node)
    return False


def _bound_names(body: cst.CSTNode) -> set[str]:
    """Names assigned anywhere in `body` (plain, augmented, annotated, walrus and loop targets)."""
    found: set[str] = set()

    class Binds(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            found.update(n.value for n in target_names(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            found.update(n.value for n in target_names(node.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            found.update(n.value for n in target_names(node.target))

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            found.update(n.value for n in target_names(node.target))

        def visit_For(self, node: cst.For) -> None:
            found.update(n.value for n in target_names(node.target))

    walk(body, Binds())
    return found


def _wrapper(parsed: ParsedModule, node: cst.CSTNode, parent: cst.CSTNode | None) -> str | None:
    """The module-level function that returns the transform `node` of one of its own parameters, if any."""
    function = parsed.innermost(node, cst.FunctionDef)
    if not (isinstance(parent, cst.Call) and parent.func is node and parent.args and function is not None and
            isinstance(parsed.parents.get(parent), cst.Return) and
            parsed.module_functions.get(function.name.value) is function):
        return None
    first = parent.args[0].value
    params = function.params
    names = {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}
    return function.name.value if isinstance(first, cst.Name) and first.value in names else None


def name_uses(source: str, name: str) -> int:
    """How many times the file reads `name` (a name or an attribute of that name; not its definition or import)."""
    if name not in source:
        return 0
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1
    return sum(isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) or
               isinstance(node, ast.Attribute) and node.attr == name for node in ast.walk(tree))


def _getattr_transform(parsed: ParsedModule, call: cst.Call) -> str | None:
    """`getattr(torch.autograd.functional, "hvp")`: an attribute named by a string is that attribute."""
    args = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if not (isinstance(call.func, cst.Name) and call.func.value == "getattr" and len(args) >= 2):
        return None
    owner = qualified(parsed, args[0].value)
    if owner is None:
        return None
    if not isinstance(args[1].value, cst.SimpleString):  # a computed name on an autograd module: any transform
        return f"`{parsed.code(call)}` may look up a transform by name" \
            if owner in TRANSFORM_MODULES | TORCH_TRANSFORM_MODULES else None
    name = f"{owner}.{args[1].value.evaluated_value}"
    for prefix, asks in TRANSFORMS.items():
        if name == prefix or name.startswith(prefix + "."):
            return f"`{parsed.code(call)}` asks for {asks}"
    if name in REVERSE_TRANSFORMS or name == "torch.autograd.functional.jacobian":
        return f"`{parsed.code(call)}` may ask for {DOUBLE_BACKWARD} (a transform looked up by name)"
    return None


def _namespace_read(parsed: ParsedModule, node: cst.BaseExpression) -> str | None:
    """`torch.func.__dict__`, `vars(torch.func)`: a module's namespace holds every transform of it."""
    if isinstance(node, cst.Attribute) and node.attr.value == "__dict__":
        module = node.value
    elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "vars" and \
            len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
        module = node.args[0].value
    else:
        return None
    if qualified(parsed, module) not in TRANSFORM_MODULES:
        return None
    return f"`{parsed.code(node)}` holds every transform of the module, which may ask for {DOUBLE_BACKWARD} or " \
           f"{FORWARD_MODE}"


def _option_or_module_named(parsed: ParsedModule, node: cst.SimpleString, parent: cst.CSTNode | None) -> str | None:
    """A string naming a forward-mode option (`{"check_forward_ad": True}`, `opts["check_forward_ad"] = True`: the
    options a call receives through `**`) or a module of transforms (`importlib.import_module("torch.func")`,
    `sys.modules["torch.func"]`: the module obtained at run time may be used for any of them)."""
    try:
        value = node.evaluated_value
    except (SyntaxError, ValueError):
        return None
    if value in FORWARD_MODE_OPTIONS and not (isinstance(parent, cst.DictElement) and _is_off(parent.value)):
        return f"`{parsed.code(node)}` names an option that asks for {FORWARD_MODE}"
    if names_transform_module(value):
        return f"`{parsed.code(node)}` names a module whose transforms may ask for {DOUBLE_BACKWARD} or {FORWARD_MODE}"
    return None


def _runs_code(parsed: ParsedModule, call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value in CODE_RUNNERS and bool(call.args) and \
        call.func.value not in parsed.bound_names and call.func.value not in parsed.imports


def _uses_in_code_string(parsed: ParsedModule, call: cst.Call) -> tuple[list, list[AutogradSite]]:
    """What `exec(...)`, `eval(...)` or `compile(...)` asks: a literal string read as code of this file (its
    requests and reverse transforms, at the call's line); anything else may hold any request."""
    code = call.args[0].value
    text = code.evaluated_value if isinstance(code, (cst.SimpleString, cst.ConcatenatedString)) else None
    if isinstance(text, str) and might_ask(text):
        try:
            inner = ParsedModule(text, parsed.path)
        except Exception:  # noqa: BLE001 - a string that does not parse raises when run; it asks nothing
            return [], []
        requests, uses = autograd_uses(inner)
        line = parsed.line(call)
        return [(call, site.what) for site in requests], [replace(site, line=line) for site in uses]
    if isinstance(text, str):
        return [], []
    return [(call, f"`{parsed.code(call.func)}` runs code this scan does not see, which may ask for "
                   f"{DOUBLE_BACKWARD} or {FORWARD_MODE}")], []


def _forward_mode_option(parsed: ParsedModule, call: cst.Call) -> str | None:
    """`torch.autograd.gradcheck(f, x, check_forward_ad=True)`: an option, passed by keyword to any callee, that
    runs forward-mode AD; `gradcheck(f, x, **options)`, whose options may hold one."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in FORWARD_MODE_OPTIONS and not _is_off(arg.value):
            return (f"`{parsed.code(call.func)}(..., {arg.keyword.value}={parsed.code(arg.value)})` asks for "
                    f"{FORWARD_MODE}")
    if qualified(parsed, call.func) in GRADCHECKS and any(arg.star == "**" for arg in call.args):
        return f"`{parsed.code(call.func)}(..., **...)` may be given an option that asks for {FORWARD_MODE}"
    return None


def _create_graph_entry(parsed: ParsedModule, entry: cst.DictElement) -> tuple[str, cst.BaseExpression] | None:
    """`{"create_graph": True}`: options a call receives through `**`, which ask as the keyword does."""
    key = entry.key
    if isinstance(key, cst.SimpleString) and key.evaluated_value == "create_graph" and not _is_off(entry.value):
        return (f"`{{{parsed.code(key)}: {parsed.code(entry.value)}}}` passes create_graph to a call and asks for "
                f"{DOUBLE_BACKWARD}", entry.value)
    return None


def _passed_on_parameter(parsed: ParsedModule, call: cst.Call, value: cst.BaseExpression) -> str | None:
    """The function (or, for a method, class) name whose callers decide `create_graph` at `call`: `value` is a
    parameter of the undecorated module-level function or method around the call, False or None by default and
    never rebound there. None for anything else (a nested function is called by the one around it)."""
    function = parsed.innermost(call, cst.FunctionDef)
    if not isinstance(value, cst.Name) or function is None or function.decorators:
        return None
    params = function.params
    param = next((p for p in [*params.posonly_params, *params.params, *params.kwonly_params]
                  if p.name.value == value.value), None)
    if param is None or param.default is None or not _is_off(param.default):
        return None
    if any(d.name == value.value and d.kind != "param" for d in parsed.flow(function).definitions.values()):
        return None
    owner = parsed.owner_of(function)
    if owner is not None:
        return None if owner.node.decorators else owner.node.name.value
    return function.name.value if parsed.module_functions.get(function.name.value) is function else None


def uses_name(source: str, name: str) -> bool:
    """Whether the file may use `name` other than by defining it or importing it under that name: a read of it, an
    attribute of that name, an import under another name, or the name as a string (a `getattr`) outside `__all__`;
    or any name, where the file looks up an imported module's attribute by a name it computes
    (`getattr(steps, cfg["backward"])(loss, True)`, the name held in a config file: breaker round 15). An
    unparsable file that mentions the word counts as a use."""
    mentioned = re.search(rf"\b{re.escape(name)}\b", source) is not None
    if not mentioned and COMPUTED_LOOKUP.search(source) is None:
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return mentioned
    if _looks_up_module_attributes(tree):
        return True
    if not mentioned:
        return False
    exported = {id(node) for statement in ast.walk(tree) if isinstance(statement, ast.Assign) and
                any(isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets)
                for node in ast.walk(statement.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name or isinstance(node, ast.Attribute) and node.attr == name:
            return True
        if isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] == name and node.asname not in (None, name):
            return True
        if isinstance(node, ast.Constant) and node.value == name and id(node) not in exported:
            return True
    return False


def _looks_up_module_attributes(tree: ast.Module) -> bool:
    """`getattr(module, name)`, `vars(module)[name]` or `module.__dict__[name]` with a computed name, on a name the
    file binds by an import (a module, or anything imported: what it holds may be any function of the tree)."""
    imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _leaf(node.func) == "getattr" and len(node.args) >= 2 and \
                not isinstance(node.args[1], ast.Constant):
            owner = node.args[0]
        elif isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant):
            owner = _namespace_owner(node.value)
        else:
            continue
        if isinstance(owner, ast.Name) and owner.id in imported:
            return True
    return False


def _namespace_owner(namespace: ast.AST) -> ast.AST | None:
    """`m` of `vars(m)` or `m.__dict__`."""
    if isinstance(namespace, ast.Call) and _leaf(namespace.func) == "vars" and namespace.args:
        return namespace.args[0]
    if isinstance(namespace, ast.Attribute) and namespace.attr == "__dict__":
        return namespace.value
    return None


def _inside_dotted_name(node: cst.CSTNode, parent: cst.CSTNode | None) -> bool:
    """`torch.func` inside `torch.func.jvp`: only the whole dotted name is resolved (and where it is used, not
    where it is imported)."""
    return isinstance(parent, cst.Attribute) and parent.value is node


def qualified(parsed: ParsedModule, node: cst.CSTNode) -> str | None:
    """The imported name, with the transforms' other homes under their public names (`functorch.jvp`,
    `torch._functorch.eager_transforms.jvp`: `torch.func.jvp`; `torch.autograd.gradcheck.gradgradcheck`)."""
    name = parsed.imported_name(node)
    for home, public in ALIASES.items():
        if name is not None and name.startswith(home):
            return public + name.removeprefix(home)
    return name


def _transform_use(parsed: ParsedModule, node: cst.BaseExpression, parent: cst.CSTNode | None) -> str | None:
    name = qualified(parsed, node)
    if name is None:
        return None
    if name in TRANSFORM_MODULES and not isinstance(parent, cst.Call):  # `fn = torch.func`: what it reads is unseen
        return f"`{name}` is used as a value; a transform read through it may ask for {DOUBLE_BACKWARD} or " \
               f"{FORWARD_MODE}"  # (breaker round 27: `fn = torch.func; fn.jvp(...)` in a function)
    for prefix, asks in TRANSFORMS.items():
        if name == prefix or name.startswith(prefix + "."):
            return f"`{name}` asks for {asks}"
    if name == "torch.autograd.functional.jacobian" and isinstance(parent, cst.Call) and parent.func is node:
        strategy = next((a.value for a in parent.args if a.keyword is not None and a.keyword.value == "strategy"),
                        None)
        if strategy is not None and not (isinstance(strategy, cst.SimpleString) and "reverse-mode" in strategy.value):
            return f"`{name}(..., strategy={parsed.code(strategy)})` may ask for {FORWARD_MODE}"
    return None


def _engine_use(parsed: ParsedModule, node: cst.BaseExpression) -> str | None:
    leaf = node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else None
    if leaf in ENGINE_ENTRIES:
        return f"`{parsed.code(node)}` reaches autograd's engine directly, which may be asked for {DOUBLE_BACKWARD}"
    return None


def _create_graph(parsed: ParsedModule, call: cst.Call) -> tuple[str, cst.BaseExpression] | None:
    """A call that passes `create_graph` as anything but False/None: by keyword to any callee (a wrapper passing it
    on counts), by position to the autograd calls that take it there. With what it asks, the value passed."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "create_graph" and not _is_off(arg.value):
            return (f"`{parsed.code(call.func)}(..., create_graph={parsed.code(arg.value)})` asks for "
                    f"{DOUBLE_BACKWARD}", arg.value)
    name = qualified(parsed, call.func)
    positions = (CREATE_GRAPH_POSITION[name],) if name in CREATE_GRAPH_POSITION else ()
    if not positions and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" and \
            name is None:  # `loss.backward(g, retain, create)`, or unbound through `type(loss).backward(loss, ...)`
        receiver = call.func.value
        unbound = isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and \
            receiver.func.value == "type" or isinstance(receiver, cst.Attribute) and receiver.attr.value == "__class__"
        # a receiver no name shows may be the class too (`T = type(loss)`): create_graph at either position
        positions = (TENSOR_BACKWARD_POSITION + 1,) if unbound else (TENSOR_BACKWARD_POSITION,
                                                                        TENSOR_BACKWARD_POSITION + 1)
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    for position in positions:
        if len(positional) > position and not _is_off(positional[position].value):
            return (f"`{parsed.code(call.func)}(...)` passes create_graph by position and asks for "
                    f"{DOUBLE_BACKWARD}", positional[position].value)
    position = positions[0] if positions else None
    if position is not None and any(arg.star for arg in call.args):  # `grad(y, x, **opts)`, `*[None, None, True]`
        return f"`{parsed.code(call.func)}(...)` passes unpacked arguments, which may hold create_graph"
    if name == "torch.autograd.functional.jacobian" and _forward_strategy(call):
        return f"`{parsed.code(call.func)}(...)` may pick the forward-mode strategy and ask for {FORWARD_MODE}"
    return None


def _passed_as_value(parsed: ParsedModule, node: cst.BaseExpression, parent: cst.CSTNode) -> str | None:
    """`g = torch.autograd.grad`, `partial(torch.autograd.grad, ...)`: a call through the value may pass
    create_graph by position, out of sight."""
    name = qualified(parsed, node)
    if name not in CREATE_GRAPH_POSITION or isinstance(parent, cst.Call) and parent.func is node:
        return None
    return f"`{parsed.code(node)}` is passed on as a value; a call through it may ask for {DOUBLE_BACKWARD}"


def _forward_strategy(call: cst.Call) -> bool:
    """`jacobian`'s `strategy` (keyword or sixth positional argument) is not the literal 'reverse-mode'."""
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    given = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "strategy"),
                 positional[5].value if len(positional) > 5 else None)
    return given is not None and not (isinstance(given, cst.SimpleString) and given.evaluated_value == "reverse-mode")


def _is_off(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value in ("False", "None")
