"""What removing a copy can change: values never, but the result then shares memory (and the layout) of its
input. Two static obligations discharge that: no code reads the result's layout or lets it leave the function
(where its layout and memory are no longer seen), and nothing in the function writes a tensor in place."""

from __future__ import annotations

import libcst as cst

from advisor.static.module_index import ParsedModule
from advisor.static.walk import walk

# Reading these observes the layout or the storage itself, so a copy's removal could change what they see.
LAYOUT_READS = frozenset({"view", "view_as", "stride", "is_contiguous", "data_ptr", "storage", "untyped_storage",
                          "storage_offset", "numpy", "as_strided", "as_strided_", "set_", "data", "grad", "resize_",
                          "from_dlpack", "to_dlpack", "__dlpack__"})
METADATA = frozenset({"shape", "dtype", "device", "ndim", "size", "dim", "numel", "requires_grad", "is_cuda",
                      "item", "tolist", "element_size", "nelement", "is_floating_point", "is_complex"})
# Results that are a new contiguous tensor whatever their inputs' strides: matrix products, and reductions and
# softmax, which allocate their output contiguous (checked on every permutation of a 4-d input). Any other result
# may be a view of its input (transpose, einsum, chunk) or keep its strides (elementwise ops, clone, conv), so its
# uses are followed like the copy's own.
FRESH_RESULTS = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "sum", "mean", "prod",
                           "amax", "amin", "max", "min", "std", "var", "norm", "logsumexp", "argmax", "argmin", "all",
                           "any", "softmax", "log_softmax"})
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag"})


def layout_or_escape(parsed: ParsedModule, function: cst.FunctionDef, expression: cst.CSTNode) -> str | None:
    """Why the value of `expression`, or any value derived from it, may be read for its layout or memory, or leaves
    the function; None when the values derived from it are only computed with and end in a fresh tensor (a matrix
    product), metadata, or nothing. A derived value is any result of an operator, method or torch function of it:
    such a result can be a view of it or share its strides, so a later `.view` or a return would see the layout
    the copy made. An argument of any callable outside torch (a module, a helper) is not seen: that callee could
    `.view` it or keep it."""
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
            if name in METADATA or (called and name in FRESH_RESULTS):
                continue
            if not called and name not in VIEW_ATTRIBUTES:
                return f"its attribute `.{name}` is read at line {parsed.line(parent)}"
            pending.append(caller if called else parent)
        elif isinstance(parent, cst.Arg) and parent.value is node:
            call = parsed.parents.get(parent)
            callee = parsed.imported_name(call.func) if isinstance(call, cst.Call) else None
            if callee is None or not callee.startswith("torch.") or callee.startswith(("torch.ops.", "torch.Tensor.")):
                shown = parsed.code(call.func).strip() if isinstance(call, cst.Call) else "a call"
                return f"it is passed to `{shown}` at line {parsed.line(parent)}, whose use of it is not seen"
            last = callee.rpartition(".")[2]
            if last in LAYOUT_READS or last.endswith("_"):
                return f"`{callee}` at line {parsed.line(parent)} reads its layout or writes it in place"
            if last not in FRESH_RESULTS:
                pending.append(call)
        elif isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.MatrixMultiply):
            continue  # `@` is matmul: a new contiguous tensor
        elif isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget,
                                 cst.BooleanOperation, cst.Subscript)) and node is not getattr(parent, "slice", None):
            pending.append(parent)  # an operator's result keeps its operand's strides; indexing gives a view
        elif isinstance(parent, (cst.Return, cst.Yield)):
            return f"it is returned at line {parsed.line(parent)}, where its layout is no longer seen"
        elif isinstance(parent, (cst.Element, cst.DictElement, cst.StarredElement, cst.AugAssign,
                                 cst.AnnAssign, cst.NamedExpr)):
            return f"it is stored at line {parsed.line(parent)}"
        elif isinstance(parent, cst.Assign):
            reads = reads_of_assignment(flow, parent)
            if reads is None:
                return f"it is stored in `{parsed.code(parent.targets[0].target).strip()}` at line " \
                       f"{parsed.line(parent)}"
            pending.extend(reads)
        elif isinstance(parent, cst.IfExp) and parent.test is not node:
            pending.append(parent)
        elif isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
            return f"it is iterated at line {parsed.line(parent)}, which yields views of it"
    return None


def reads_of_assignment(flow, assign: cst.Assign) -> list[cst.Name] | None:
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
    walk(function.body, finder)
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
