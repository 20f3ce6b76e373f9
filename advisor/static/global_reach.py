"""Whether a file may reach one of its module-level names otherwise than by spelling it (a string, `globals()`,
`exec`, the module object through the import machinery): then no reading of the name's one binding holds for
every read. Below static.call_sites and static.global_writes, which both ask."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from advisor.static.module_index import ParsedModule

MODULE_OBJECT_SOURCES = {"sys.modules", "importlib.import_module", "importlib.reload"}
ESCAPE_HATCHES = {"globals", "vars", "setattr", "exec", "eval", "locals", "__import__"}
# what reaches any object, or any module's names, without naming it, from any file: the collector's lists of live
# objects, frames (a caller's locals and globals: `sys._getframe(1).f_locals`, `inspect.stack()`, a traceback's, a
# trace function's), the script's own module as `__main__` (breaker round 62: `vars(sys.modules["__main__"])`)
OBJECTS_REACHED_UNSEEN = re.compile(
    r"\b(?:get_objects|get_referrers|get_referents|_getframe|currentframe|f_locals|f_globals|f_back|tb_frame|"
    r"settrace|setprofile|getouterframes|getinnerframes)\b|\binspect\s*\.\s*(?:stack|trace)\b|"
    r"modules\s*\[\s*[\"']__main__[\"']|\bimport\s+__main__\b|\bfrom\s+__main__\s+import\b")
# what reaches a module object or any object's namespace without naming the attribute in the source
NAMESPACE_ATTRIBUTES = {"__dict__", "__setattr__", "__getattribute__", "__delattr__", "__globals__", "f_globals"}


def reached_by_name(parsed: ParsedModule, name: str, star: bool = True) -> bool:
    """Whether the file may reach its global `name` otherwise than by spelling it: `globals()["MASK"] = ...`,
    `vars()`, `exec`/`eval`, `__import__`, a namespace (`sys.modules[__name__].__dict__[...]`, a frame's `f_globals`,
    a function's `__globals__`), the module object by
    import machinery (whose attributes a computed string can name), a string naming it (`getattr(module, "MASK")`),
    or, with `star`, a star import (`from consts import *`, whose names replace the file's: a file reading an
    imported tensor rebinds only its own name so). Once per file and name."""
    return parsed.derived(("reached-by-name", name, star), lambda p: _reached_by_name(p, name, star))


def _reached_by_name(parsed: ParsedModule, name: str, star: bool) -> bool:
    if star and any(isinstance(node.names, cst.ImportStar) for node in parsed.nodes_of(cst.ImportFrom)):
        return True
    for node in parsed.nodes_of(cst.Call, cst.Attribute, cst.Name, cst.SimpleString):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ESCAPE_HATCHES:
            return True
        if isinstance(node, cst.Attribute) and node.attr.value in NAMESPACE_ATTRIBUTES or \
                isinstance(node, (cst.Attribute, cst.Name)) and parsed.imported_name(node) in MODULE_OBJECT_SOURCES:
            return True
        if isinstance(node, cst.SimpleString) and node.evaluated_value == name and not _in_all(parsed, node) and \
                not _names_a_buffer(parsed, node):
            return True
    return False


def _names_a_buffer(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """The name `self.register_buffer("mask", mask)` gives the buffer: an attribute of the instance, not the
    module's global of the same name."""
    arg = parsed.parents.get(node)
    call = parsed.parents.get(arg)
    return isinstance(arg, cst.Arg) and arg.keyword is None and isinstance(call, cst.Call) and \
        call.args[0] is arg and isinstance(call.func, cst.Attribute) and call.func.attr.value == "register_buffer" \
        and isinstance(call.func.value, cst.Name) and call.func.value.value == "self"


def _in_all(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """A string of `__all__ = [...]` (or `+=`): it names what a star import takes, and reaches nothing."""
    statement = parsed.innermost(node, (cst.Assign, cst.AugAssign))
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else \
        [statement.target] if isinstance(statement, cst.AugAssign) else []
    return any(isinstance(target, cst.Name) and target.value == "__all__" for target in targets)


def objects_reached_unseen(parsed: ParsedModule) -> bool:
    """Whether some file of the scanned tree (this one too) may reach the file's objects, its globals and its
    functions' locals among them, without naming them (OBJECTS_REACHED_UNSEEN): then no object's one definition is
    what every later read sees (a list spread into a call, a module-level mask). Once per file."""
    return parsed.tree_matches("objects reached unseen", OBJECTS_REACHED_UNSEEN)

