"""What removing a copy can change: values never, but the result then shares memory (and the layout) of its
input. Two static obligations discharge that: no code reads the result's layout or lets it leave the function
(where its layout and memory are no longer seen), and nothing in the function writes a tensor in place."""

from __future__ import annotations

import libcst as cst

from advisor.static.module_index import ParsedModule

# Methods and attributes that can return their receiver or a view of it (a cast to the dtype it has returns it):
# what reads their result reads the copy's memory.
VIEW_METHODS = frozenset({"transpose", "permute", "t", "unsqueeze", "squeeze", "expand", "expand_as", "narrow",
                          "select", "reshape", "flatten", "unflatten", "detach", "split", "chunk", "unbind",
                          "contiguous", "to", "float", "half", "bfloat16", "double", "type", "type_as"})
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH"})
# Reading these observes the layout or the storage itself, so a copy's removal could change what they see.
LAYOUT_READS = frozenset({"view", "view_as", "stride", "is_contiguous", "data_ptr", "storage", "untyped_storage",
                          "storage_offset", "numpy", "as_strided", "set_", "data", "grad", "resize_"})
METADATA = frozenset({"shape", "dtype", "device", "ndim", "size", "dim", "numel", "requires_grad", "is_cuda"})


def layout_or_escape(parsed: ParsedModule, function: cst.FunctionDef, expression: cst.CSTNode) -> str | None:
    """Why the value of `expression` (and every view of it) may be read for its layout or memory, or leaves the
    function; None when every use is a computation that reads values only: an operator, a method that makes a new
    tensor (a reduction), or an argument of a torch function. An argument of any other callable (a module, a
    helper) is not seen: that callee could `.view` it or keep it."""
    flow = parsed.flow(function)
    pending, seen = [expression], set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        parent = parsed.parents.get(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            name = parent.attr.value
            caller = parsed.parents.get(parent)
            called = isinstance(caller, cst.Call) and caller.func is parent
            if name in LAYOUT_READS or (name.endswith("_") and not name.startswith("_")):
                return f"`.{name}` at line {parsed.line(parent)} reads its layout or writes it in place"
            if (called and name in VIEW_METHODS) or (not called and name in VIEW_ATTRIBUTES):
                pending.append(caller if called else parent)
            elif not called and name not in METADATA:
                return f"its attribute `.{name}` is read at line {parsed.line(parent)}"
        elif isinstance(parent, cst.Arg) and parent.value is node:
            call = parsed.parents.get(parent)
            callee = parsed.imported_name(call.func) if isinstance(call, cst.Call) else None
            if callee is None or not callee.startswith("torch."):
                shown = parsed.code(call.func).strip() if isinstance(call, cst.Call) else "a call"
                return f"it is passed to `{shown}` at line {parsed.line(parent)}, whose use of it is not seen"
        elif isinstance(parent, cst.Subscript) and parent.value is node:
            pending.append(parent)  # indexing gives a view
        elif isinstance(parent, (cst.Return, cst.Yield)):
            return f"it is returned at line {parsed.line(parent)}, where its layout is no longer seen"
        elif isinstance(parent, (cst.Element, cst.DictElement, cst.StarredElement, cst.AugAssign,
                                 cst.AnnAssign, cst.NamedExpr)):
            return f"it is stored at line {parsed.line(parent)}"
        elif isinstance(parent, cst.Assign):
            reads = _reads_of_assignment(flow, parent)
            if reads is None:
                return f"it is stored in `{parsed.code(parent.targets[0].target).strip()}` at line " \
                       f"{parsed.line(parent)}"
            pending.extend(reads)
        elif isinstance(parent, cst.IfExp) and parent.test is not node:
            pending.append(parent)
    return None


def _reads_of_assignment(flow, assign: cst.Assign) -> list[cst.Name] | None:
    """Every read of the names `assign` binds; None when it binds anything but plain names."""
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    name = assign.targets[0].target.value
    reads: list[cst.Name] = []
    for definition in flow.definitions.values():
        if definition.statement is assign and definition.name == name:
            reads += flow.reads_of(definition)
    return reads


def writes_in_place(parsed: ParsedModule, function: cst.FunctionDef) -> str | None:
    """Why some tensor in `function` may be written in place (then a removed copy could share that write), or
    None. Conservative: any augmented assignment, subscript store, `out=` argument or `name_()` call counts."""
    finder = _InPlace()
    function.body.visit(finder)
    return f"{finder.found[1]} at line {parsed.line(finder.found[0])}" if finder.found else None


class _InPlace(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: tuple[cst.CSTNode, str] | None = None

    def _hit(self, node: cst.CSTNode, what: str) -> None:
        if self.found is None:
            self.found = (node, what)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._hit(node, "an augmented assignment may write in place")

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if isinstance(node.target, cst.Subscript):
            self._hit(node, "a subscript assignment writes in place")

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "out":
            self._hit(node, "an `out=` argument writes in place")

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute):
            name = node.func.attr.value
            if name.endswith("_") and not name.startswith("_"):
                self._hit(node, f"`.{name}()` writes in place")
