"""What removing a copy can change: values never, but the result then shares memory (and the layout) of its
input. Two static obligations discharge that: no code reads the result's layout or lets it leave the function
(where its layout and memory are no longer seen), and nothing in the function writes a tensor in place."""

from __future__ import annotations

import libcst as cst

from advisor.patterns.copy_cast_roles import calls_in
from advisor.static.inplace_args import inplace_argument
from advisor.patterns.scope import outer_names
from advisor.static.dataflow import loaded_names
from advisor.static.module_index import ParsedModule
from advisor.static.outside_writes import in_place_name, writes_its_receiver
from advisor.static.tensor_views import RANDOM_OPS, SCALAR_BUILTINS, STRIDE_READS
from advisor.static.walk import walk

# numpy functions whose array shares a tensor's memory (numpy writes in place without a trailing underscore)
ARRAY_SHARERS = frozenset({"numpy.asarray", "numpy.asanyarray", "numpy.from_dlpack", "numpy.frombuffer"})
# Reading these observes the layout or the storage itself, so a copy's removal could change what they see.
LAYOUT_READS = frozenset({"view", "view_as"}) | STRIDE_READS
METADATA = frozenset({"shape", "dtype", "device", "ndim", "size", "dim", "numel", "requires_grad", "is_cuda",
                      "item", "tolist", "element_size", "nelement", "is_floating_point", "is_complex"})
# Results that are a new contiguous tensor whatever their inputs' strides: matrix products, and reductions and
# softmax, which allocate their output contiguous (checked on every permutation of a 4-d input). Any other result
# may be a view of its input (transpose, einsum, chunk) or keep its strides (elementwise ops, clone, conv), so its
# uses are followed like the copy's own.
FRESH_RESULTS = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "sum", "mean", "prod",
                           "amax", "amin", "std", "var", "norm", "logsumexp", "argmax", "argmin", "all", "any",
                           "softmax", "log_softmax"})
# reductions only when no second tensor is given: `torch.max(a, b)` is the elementwise maximum, which keeps a's strides
# (breaker round 17: `.view` of it raised once the copy was gone)
REDUCING_UNLESS_PAIRED = frozenset({"max", "min"})
# the torch namespaces whose functions compute tensors from their arguments; another (`torch.utils.checkpoint`,
# `torch.func`) runs a callable of the user on them, whose use of them is not seen
VALUE_NAMESPACES = frozenset({"torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft"})
# nodes whose use of a value reads its values only: a discarded expression, a condition (an `IfExp`'s branches are
# followed above), an f-string, an index
VALUE_ONLY_PARENTS = (cst.Expr, cst.If, cst.While, cst.IfExp, cst.Assert, cst.FormattedStringExpression, cst.Index,
                      cst.SubscriptElement, cst.Del)
# where a read runs later than the statement holding it, once the copy's input may have changed
DEFERRED = (cst.Lambda, cst.GeneratorExp, cst.FunctionDef, cst.ClassDef)
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
            if name in LAYOUT_READS or writes_its_receiver(name):
                return f"`.{name}` at line {parsed.line(parent)} reads its layout or writes it in place"
            if name in RANDOM_OPS:
                return f"`.{name}` at line {parsed.line(parent)} draws random numbers in its memory order"
            if name in METADATA or (called and (name in FRESH_RESULTS or _reduces(caller, name, 0))):
                continue
            if not called and name not in VIEW_ATTRIBUTES:
                return f"its attribute `.{name}` is read at line {parsed.line(parent)}"
            pending.append(caller if called else parent)
        elif isinstance(parent, cst.Arg) and parent.value is node:
            call = parsed.parents.get(parent)
            callee = parsed.imported_name(call.func) if isinstance(call, cst.Call) else None
            namespace, _, last = (callee or "").rpartition(".")
            if namespace not in VALUE_NAMESPACES:
                shown = parsed.code(call.func).strip() if isinstance(call, cst.Call) else "a call"
                return f"it is passed to `{shown}` at line {parsed.line(parent)}, whose use of it is not seen"
            if last in LAYOUT_READS or in_place_name(last) or inplace_argument(parsed, call):
                return f"`{callee}` at line {parsed.line(parent)} reads its layout or writes it in place"
            if last in RANDOM_OPS:  # `F.dropout(h, p, self.training)`: a profile in eval mode drew nothing
                return f"`{callee}` at line {parsed.line(parent)} draws random numbers in its memory order"
            if last not in FRESH_RESULTS and not _reduces(call, last, 1):
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
            later = next((read for read in reads if _deferred(parsed, read, function)), None)
            if later is not None:
                return f"it is read at line {parsed.line(later)} by code that may run later (a lambda, a generator)"
            pending.extend(reads)
        elif isinstance(parent, cst.IfExp) and parent.test is not node:
            pending.append(parent)
        elif isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
            return f"it is iterated at line {parsed.line(parent)}, which yields views of it"
        elif not isinstance(parent, VALUE_ONLY_PARENTS):
            return f"it is used by `{_shown(parsed, parent)}` at line {parsed.line(node)}, which is not followed"
    return None


def _reduces(call: cst.Call, name: str, first: int) -> bool:
    """`h.max()`, `h.max(1)`, `torch.max(h, dim=1)`: a reduction (a new contiguous tensor), where `first` positional
    arguments come before the dimension; `torch.max(h, z)` is elementwise."""
    if name not in REDUCING_UNLESS_PAIRED:
        return False
    positional = [arg.value for arg in call.args if arg.keyword is None]
    later = positional[first:first + 1]
    return all(arg.star == "" for arg in call.args) and \
        (not later or isinstance(later[0], cst.Integer) or
         isinstance(later[0], cst.UnaryOperation) and isinstance(later[0].expression, cst.Integer))


def _deferred(parsed: ParsedModule, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
    """Whether `node` sits in a lambda, a generator or a nested function or class of `function`."""
    parent = parsed.parents.get(node)
    while parent is not None and parent is not function:
        if isinstance(parent, DEFERRED):
            return True
        parent = parsed.parents.get(parent)
    return False


def _shown(parsed: ParsedModule, node: cst.CSTNode) -> str:
    code = " ".join(parsed.code(node).split())
    return code if len(code) <= 60 else code[:57] + "..."


def reads_of_assignment(flow, assign: cst.Assign) -> list[cst.Name] | None:
    """Every read of the names `assign` binds; None when it binds anything but plain names."""
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    name = assign.targets[0].target.value
    if name in outer_names(flow.function):
        return None  # a global or nonlocal: read after the function returns
    reads: list[cst.Name] = []
    for definition in flow.definitions.values():
        if definition.statement is assign and definition.name == name:
            reads += flow.reads_of(definition)
    return reads


def writes_in_place(parsed: ParsedModule, function: cst.FunctionDef) -> str | None:
    """Why some tensor in `function` may be written in place (then a removed copy could share that write), or
    None. Conservative: any augmented assignment, subscript store, `out=` or `inplace` argument or `name_()` call
    counts."""
    finder = _InPlace(parsed)
    walk(function.body, finder)
    return f"{finder.found[1]} at line {parsed.line(finder.found[0])}" if finder.found else None


def written_by_a_callee(parsed: ParsedModule, function: cst.FunctionDef, copied: cst.BaseExpression) -> str | None:
    """Why code `function` calls may write the copy's input in place (None: no call can reach it): module state
    (`self.memory`, a global) is reachable from any method or helper it calls (breaker round 17: `self.remember(x)`
    updating the memory the removed copy had snapshotted); a parameter or a local only from calls handed it."""
    root = _root(copied)
    if root is None:
        return "the copy's input is not a name or an attribute"
    flow = parsed.flow(function)
    local = isinstance(root, cst.Name) and root.value != "self" and not flow.sees_undefined(root) and \
        bool(flow.definitions_of(root))
    for call in calls_in(function.body):
        callee = parsed.imported_name(call.func) or ""
        if callee.startswith("torch.") or callee in SCALAR_BUILTINS:
            continue
        receiver = _root(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if local:
            handed = any(isinstance(name, cst.Name) and name.value == root.value
                         for arg in call.args for name in loaded_names(arg.value))
            if not handed:
                continue
        elif isinstance(receiver, cst.Name) and receiver.value != "self" and flow.definitions_of(receiver):
            continue  # a method of a local value (a tensor's): it reaches no module state but through its arguments
        return (f"`{parsed.code(call.func).strip()}` at line {parsed.line(call)} may write the copy's input "
                f"(`{parsed.code(copied).strip()}`) in place")
    return None


def _root(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The name (or `self.attr` chain) a chain of method calls, attributes and subscripts starts from."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Attribute) and not isinstance(node.value, cst.Name):
            node = node.value
        elif isinstance(node, (cst.Name, cst.Attribute)):
            return node
        else:
            return None


class _InPlace(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule) -> None:
        self.parsed = parsed
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
        if inplace_argument(self.parsed, node):
            self._hit(node, f"`{self.parsed.code(node.func).strip()}(..., inplace)` writes in place")
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        if method is not None and writes_its_receiver(method):  # `z.__setitem__(i, v)` too (breaker round 32)
            self._hit(node, f"`.{method}()` writes in place")
        # breaker round 25: `x.numpy().sort(axis=0)` sorted x
        if method in ("numpy", "__array__") or self.parsed.imported_name(node.func) in ARRAY_SHARERS:
            self._hit(node, f"`{self.parsed.code(node.func).strip()}` gives an array sharing a tensor's memory, "
                            "whose methods write in place (`.sort()`, `.fill()`)")
