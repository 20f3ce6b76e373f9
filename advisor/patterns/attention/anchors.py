"""Where candidates start: the softmax calls of a function, screened cheaply before any proof.

Every softmax is an anchor; only one fed (through any chain) by a matrix product and whose output reaches another
product is worth proving. The screen's def-use walks (`reaches`, `feeds_product`) are also what the score and
weight walks use to tell the scores' operand from a mask's, and a real value product from a dead end.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import libcst as cst

from advisor.patterns import scope
from advisor.patterns.dtypes import DTYPE_NAMES
from advisor.patterns.attention.candidate import (CORE_OPS, MAX_CHAIN, Candidate, FunctionScope, consumers,
                                                  definition_of_value, flow_for, function_of, listed_operand_of,
                                                  statement_of)
from advisor.patterns.attention.helpers import (bind_arguments, callee, calls_in_subclasses, calls_through_objects,
                                                calls_to, helper_named, single_return)
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.ops import Op, OpReader
from advisor.contracts.emitted_names import FLASH_HELPER_NAME, FLEX_HELPER_NAME as FLEX_HELPER, MODULE_CHECK_LOCAL
from advisor.static.dataflow import UNDEFINED, Definition, FunctionFlow, bound_names
from advisor.static.module_index import ClassInfo, ParsedModule
from advisor.static.walk import children, walk


def mentions_softmax(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """Prefilter: a function (or, for a method, its class, where `nn.Softmax` modules are built) that never
    says softmax has no anchor for the matcher."""
    return parsed.mentions(node, "softmax")


def softmaxes(reader: OpReader, function: cst.FunctionDef) -> list[Op]:
    """The softmax ops of one function body, in source order."""
    collector = _SoftmaxCollector(reader, function)
    walk(function, collector)
    return collector.found


class _SoftmaxCollector(cst.CSTVisitor):
    """Softmax ops of one function body; nested functions are matched on their own."""

    def __init__(self, reader: OpReader, root: cst.FunctionDef) -> None:
        self.reader, self.root, self.found = reader, root, []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.root

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> None:
        op = self.reader.read(node)
        if op is not None and (op.name == "softmax" or (op.name == "sequential" and op.params["stages"]
                                                         and op.params["stages"][0].name == "softmax")):
            self.found.append(op)
        elif op is None and _named_softmax(self.reader.parsed, node):
            self.found.append(Op("softmax", node, [node.args[0].value], {"unread": True}))


def _named_softmax(parsed: ParsedModule, call: cst.Call) -> bool:
    """A call whose callee says softmax but that no reading makes one (I-BERT's `self.softmax = IntSoftmax(...)`,
    DeBERTa's `XSoftmax.apply`): an anchor only so that its attention is reported with the reason, never proved."""
    func = call.func.value if isinstance(call.func, cst.Attribute) and call.func.attr.value == "apply" else call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    return bool(call.args) and call.args[0].keyword is None and not call.args[0].star and \
        name.lower().endswith("softmax")


def unread_softmax(c: Candidate, softmax: Op) -> str:
    """Why a call anchored by its name only is not proved: what it is built as, where the source says."""
    func = softmax.node.func
    attribute = func.attr.value if c.owner is not None and isinstance(func, cst.Attribute) and \
        isinstance(func.value, cst.Name) and func.value.value == "self" else None
    built = c.owner.class_value(attribute) if attribute is not None else None
    what = f"`{short(c.parsed, func)}` (built as `{short(c.parsed, built)}`)" if built is not None else \
        f"`{short(c.parsed, func)}`"
    return (f"the weights come from {what}, which is not read as a softmax (a custom or approximate one, or one "
            f"that takes more than the scores), so SDPA's softmax is not proved to compute the same")


def weights_leave(c: Candidate, softmax: Op) -> str | None:
    """Where the softmax's output (or the same weights after dropout, a cast or a plain copy of the name) is returned
    or stored on an object, or None. Said next to an earlier refusal, so its reason does not hide that the weights
    are used outside the block too."""
    pending, seen = [softmax.node], set()
    while pending:
        node = pending.pop()
        definition = definition_of_value(c, node)
        if definition is None or definition.id in seen:
            continue
        seen.add(definition.id)
        function = function_of(c.parsed, definition.statement)
        if function is not None and definition.name in scope.outer_names(function):
            return (f"the attention weights are bound to the global or nonlocal `{definition.name}` at line "
                    f"{c.parsed.line(definition.statement)}")
        for read in flow_for(c, node).reads_of(definition):
            _, op = consumers(c, read)[0]
            value = read if op is None or op.name not in ("cast", "identity", "dropout") else op.node
            holder = c.parsed.parents.get(value)
            if isinstance(holder, cst.Element) and isinstance(c.parsed.parents.get(holder), cst.Tuple):
                holder = c.parsed.parents.get(c.parsed.parents.get(holder))  # `return out, attn`
            if isinstance(holder, cst.Return):
                return f"the attention weights are returned at line {c.parsed.line(holder)}"
            if isinstance(holder, cst.Assign) and holder.value is value:
                if any(isinstance(t.target, (cst.Attribute, cst.Subscript)) for t in holder.targets):
                    return f"the attention weights are stored at line {c.parsed.line(holder)}"
                pending.append(value)  # `attn = self.drop(attn)`, `a = attn`: still the weights
    return None


def looks_like_attention(c: Candidate, softmax: Op) -> bool:
    """Cheap screen: a matrix product feeds the softmax and its output reaches another one."""
    return reaches(c, softmax.operands[0], CORE_OPS, depth=0) and feeds_product(c, softmax.node)


def reaches(c: Candidate, node: cst.CSTNode, names: set[str], depth: int) -> bool:
    """Some op named in `names` computes (part of) `node`, through names, helpers and subexpressions."""
    return _reaches(c, node, names, depth, {})


def _reaches(c: Candidate, node: cst.CSTNode, names: set[str], depth: int, known: dict[int, list]) -> bool:
    """`reaches`, remembering each node's answer for the rest of one walk: a name read twice, or defined by
    `x = x + x` chains, is walked once, not once per path to it (exponential in the chain's length otherwise).
    The answer is monotone in the depth left (MAX_CHAIN cuts deeper walks), so `known[id(node)]` keeps the
    deepest depth that answered True and the shallowest that answered False; only a depth between them is walked."""
    bounds = known.get(id(node))
    if bounds is not None and depth <= bounds[0]:
        return True
    if bounds is not None and depth >= bounds[1]:
        return False
    found = _walk_reaches(c, node, names, depth, known)
    bounds = known.setdefault(id(node), [-1, MAX_CHAIN + 1])
    if found:
        bounds[0] = max(bounds[0], depth)
    else:
        bounds[1] = min(bounds[1], depth)
    return found


def _walk_reaches(c: Candidate, node: cst.CSTNode, names: set[str], depth: int, known: dict[int, list]) -> bool:
    if depth > MAX_CHAIN:
        return False
    op = c.reader.read(node)
    if op is not None and op.name in names:
        return True
    function = callee(c, node) if op is None else None
    if function is not None:  # a helper that returns the scores, or its argument (after masking it in place)
        returned = single_return(function).value
        return _reaches(c, returned, names, depth + 1, known) or \
            any(_reaches(c, argument, names, depth + 1, known)
                for argument in _returned_arguments(c, function, node, returned))
    if isinstance(node, cst.Name):
        flow = flow_for(c, node)
        return any(_written_value(d) is not None and _reaches(c, _written_value(d), names, depth + 1, known)
                   or any(_reaches_definition(c, flow, p, names, depth + 1, known) for p in d.previous)
                   for d in flow.definitions_of(node) if d.kind in ("assign", "aug", "inplace", "store"))
    return any(_reaches(c, child, names, depth + 1, known) for child in children(node)
               if isinstance(child, (cst.BaseExpression, cst.Arg, cst.BaseElement)))


def scores_from_caller(c: Candidate, softmax: Op) -> str | None:
    """Attention split across functions (ESPnet's `forward_attention(value, scores, mask)`, called by a `forward` that
    computes `scores = q @ k^T / sqrt(d)`): the softmax's input is a parameter that a caller in this file computes
    from a matrix product. SDPA needs q and k where the softmax is, so such a block is reported with that reason
    rather than passed over as no attention; None for anything else."""
    if not feeds_product(c, softmax.node, through_returns=False):
        return None  # a softmax helper (`def stable_softmax(t): return F.softmax(t, -1)`) is part of its caller's block
    parameters = _parameters_reached(c, softmax.operands[0], 0, set())
    if not parameters or not _value_passed_in(c, parameters):
        return None  # `softmax(logits) @ bin_centers`: an expectation over bins the function builds, not attention
    for call in calls_to(c.parsed, c.function, c.owner) + \
            calls_in_subclasses(c.parsed, c.scope.classes(), c.function, c.owner):
        try:
            bound = bind_arguments(c, c.function, call)
        except Refusal:
            continue
        caller = function_of(c.parsed, call)
        entry = c.parsed.function_entry(caller)
        if entry is None:
            continue
        at_caller = Candidate.start(FunctionScope(c.parsed, caller, entry[0], entry[1], OpReader(c.parsed, entry[0])))
        for parameter in sorted(parameters):
            argument = bound.get(parameter)
            if argument is not None and reaches(at_caller, argument, CORE_OPS, depth=0):
                return (f"the scores are the parameter `{parameter}`, which `{entry[1]}` computes from a matrix "
                        f"product and passes here (line {c.parsed.line(call)}): attention split across functions is "
                        f"not rewritten (SDPA needs q and k where the softmax is)")
    return None


VALUE_VIEWS = frozenset({"transpose", "permute", "view", "reshape", "contiguous", "unsqueeze", "flatten", "expand",
                         "to", "type_as", "float", "half", "bfloat16"})


def _value_passed_in(c: Candidate, scores: set[str]) -> bool:
    """A matrix product of the function takes, as one operand, another parameter (or a view of one): the values
    the caller passes beside its scores, as `forward_attention(value, scores, mask)` takes them."""
    products: list[Op] = []

    class _Products(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            self.keep(node)

        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            self.keep(node)

        def keep(self, node: cst.CSTNode) -> None:
            op = c.reader.read(node)
            if op is not None and op.name in ("matmul", "bmm", "einsum"):
                products.append(op)

    walk(c.function, _Products())
    return any(_viewed_parameter(c, operand) - scores for op in products for operand in op.operands)


def _viewed_parameter(c: Candidate, node: cst.BaseExpression) -> set[str]:
    """{the parameter} when `node` is one read as is or through views and casts; empty otherwise."""
    while isinstance(node, cst.Subscript) or isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
            and node.func.attr.value in VALUE_VIEWS:
        node = node.value if isinstance(node, cst.Subscript) else node.func.value
    if not isinstance(node, cst.Name):
        return set()
    definitions = flow_for(c, node).definitions_of(node)
    return {node.value} if definitions and all(d.kind == "param" for d in definitions) and node.value != "self" \
        else set()


def _parameters_reached(c: Candidate, node: cst.CSTNode, depth: int, seen: set[int]) -> set[str]:
    """The parameters of the function whose values `node` is computed from, through names and updates."""
    if depth > MAX_CHAIN:
        return set()
    if not isinstance(node, cst.Name):
        return {name for child in children(node) if isinstance(child, (cst.BaseExpression, cst.Arg, cst.BaseElement))
                for name in _parameters_reached(c, child, depth + 1, seen)}
    flow, found = flow_for(c, node), set()
    pending = [d.id for d in flow.definitions_of(node)]
    while pending:
        definition = flow.definitions.get(pending.pop())
        if definition is None or definition.id in seen:
            continue
        seen.add(definition.id)
        if definition.kind == "param":
            found.add(definition.name)
        elif definition.kind in ("assign", "aug", "inplace", "store"):
            value = _written_value(definition)
            found |= _parameters_reached(c, value, depth + 1, seen) if value is not None else set()
            pending.extend(definition.previous)
    return found


def _written_value(definition: Definition) -> cst.CSTNode | None:
    """What a definition puts in its name: its value, or for `x[i] = v` (a store) the v written into x."""
    if definition.kind == "store" and isinstance(definition.statement, (cst.Assign, cst.AugAssign)):
        return definition.statement.value
    return definition.value


def _returned_arguments(c: Candidate, function: cst.FunctionDef, call: cst.Call,
                        returned: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The call's argument for the parameter a helper returns (`def mask_func(s, m): s.masked_fill_(m, x);
    return s`, megatron), as it may be that parameter updated in place."""
    definitions = c.parsed.flow(function).definitions_of(returned) if isinstance(returned, cst.Name) else []
    if not definitions or any(d.kind not in ("param", "inplace") for d in definitions):
        return []
    try:
        argument = bind_arguments(c, function, call).get(returned.value)
    except Refusal:
        return []
    return [argument] if argument is not None else []


def _reaches_definition(c: Candidate, flow: FunctionFlow, def_id: int, names: set[str], depth: int,
                        known: dict[int, list]) -> bool:
    if def_id == UNDEFINED:
        return False
    definition = flow.definitions[def_id]
    return definition.value is not None and _reaches(c, definition.value, names, depth, known)


def feeds_product(c: Candidate, node: cst.CSTNode, through_returns: bool = True) -> bool:
    """The value of `node` reaches a matmul, bmm or einsum (through reads, slices, unpacking and, unless told
    not to, returns to this function's callers)."""
    frontier, seen, visited = [node], 0, {id(node)}  # visited: a loop makes the def-use graph cyclic
    while frontier and seen < MAX_CHAIN:
        seen += 1
        current = frontier.pop(0)
        parent = c.parsed.parents.get(current)
        if isinstance(parent, cst.Return):
            if not through_returns:
                continue
            frontier.extend(calls_to(c.parsed, c.function, c.owner) +
                            calls_through_objects(c.parsed, c.function, c.owner))
            continue
        if isinstance(parent, cst.Subscript) and parent.value is current:  # a slice of the weights
            frontier.append(parent)
            continue
        if isinstance(parent, cst.Assign) and parent.value is current and \
                isinstance(parent.targets[0].target, (cst.Tuple, cst.List)):  # `probs, scale = self.softmax(s, f)`
            flow = flow_for(c, parent)
            frontier.extend(read for d in flow.definitions.values() if d.statement is parent
                            for read in flow.reads_of(d))
            continue
        if isinstance(parent, cst.Assign) and parent.value is current and _self_attribute(parent.targets[0].target):
            frontier.extend(_attribute_reads(c, parent.targets[0].target))  # ESPnet's `self.attn = softmax(s)`
            continue
        if isinstance(parent, cst.Element) and listed_operand_of(c, current) is None:  # `a, b = w[..., :n], ...`
            frontier.extend(_unpacked_reads(c, parent))
            continue
        if isinstance(parent, cst.Arg) and _parameter_reads(c, parent):  # into a helper: `self._pv(w, v)`
            frontier.extend(_parameter_reads(c, parent))
            continue
        for consumer, op in consumers(c, current):
            if op is not None and op.name in ("matmul", "bmm", "einsum"):
                return True
            if consumer is not None and id(consumer) not in visited:
                visited.add(id(consumer))
                frontier.append(consumer)
    return False


def _self_attribute(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def _attribute_reads(c: Candidate, target: cst.Attribute) -> list[cst.Attribute]:
    """The reads of `self.<attr>` in this function: where weights stored on the module go next (the screen's
    walk only; the proof refuses weights that are stored)."""
    found: list[cst.Attribute] = []

    class _Reads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if node is not target and _self_attribute(node) and node.attr.value == target.attr.value and \
                    not isinstance(c.parsed.parents.get(node), cst.AssignTarget):
                found.append(node)

    walk(c.function, _Reads())
    return found


def _parameter_reads(c: Candidate, arg: cst.Arg) -> list[cst.Name]:
    """Where the helper of this file or class that a call passes `arg` to reads the parameter it binds."""
    call = c.parsed.parents.get(arg)
    function = helper_named(c, call.func) if isinstance(call, cst.Call) and arg in call.args else None
    if function is None or any(a.star for a in call.args):
        return []
    params = [p.name.value for p in function.params.params]
    if isinstance(call.func, cst.Attribute) and not any(
            isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in function.decorators):
        params = params[1:]
    position = [a for a in call.args if a.keyword is None].index(arg) if arg.keyword is None else None
    name = arg.keyword.value if arg.keyword is not None else params[position] if position < len(params) else None
    flow = c.parsed.flow(function)
    return [read for d in flow.definitions.values() if d.kind == "param" and d.name == name
            for read in flow.reads_of(d)]


def _unpacked_reads(c: Candidate, element: cst.Element) -> list[cst.Name]:
    """Where the name an element of `a, b = x, y` binds is read."""
    values = c.parsed.parents.get(element)
    statement = c.parsed.parents.get(values)
    if not isinstance(statement, cst.Assign) or statement.value is not values:
        return []
    index = list(values.elements).index(element)
    flow = flow_for(c, statement)
    return [read for d in flow.definitions.values() if d.statement is statement and d.index == index
            for read in flow.reads_of(d)]


def twin_softmax(c: Candidate, softmax: Op) -> tuple[Definition, cst.Name] | None:
    """`if mask is not None: ...; s = self.softmax(s)` / `else: s = self.softmax(s)` (Swin): the same
    softmax closing both branches is one softmax after the `if`. Returns the else branch's definition and the
    name its softmax reads."""
    parsed = c.parsed
    statement = statement_of(parsed, softmax.node)
    parent_block = parsed.parents.get(parsed.parents.get(statement))
    guard = parsed.parents.get(parent_block) if parent_block is not None else None
    if not isinstance(guard, cst.If) or not isinstance(guard.orelse, cst.Else) or guard.body is not parent_block:
        return None
    if not isinstance(statement, cst.Assign) or not isinstance(softmax.operands[0], cst.Name):
        return None
    last_if = guard.body.body[-1]
    last_else = guard.orelse.body.body[-1]
    if not (isinstance(last_if, cst.SimpleStatementLine) and last_if.body[-1] is statement and
            isinstance(last_else, cst.SimpleStatementLine) and isinstance(last_else.body[-1], cst.Assign)):
        return None
    other = last_else.body[-1]
    if " ".join(parsed.code(other).split()) != " ".join(parsed.code(_unzeroed(parsed, statement, softmax)).split()):
        return None
    twin = [d for d in c.flow.definitions.values() if d.statement is other and d.index is None]
    other_op = c.reader.read(other.value)
    if len(twin) != 1 or other_op is None or not isinstance(other_op.operands[0], cst.Name):
        return None
    return twin[0], other_op.operands[0]


def _unzeroed(parsed: ParsedModule, statement: cst.Assign, softmax: Op) -> cst.Assign:
    """`w = softmax(s)` for `w = softmax(s).masked_fill(m, 0.0)`: the weights zeroed where the branch's mask masks
    (attention.zeroed_rows proves the mask), the twin of an `else:` that neither masks nor zeroes."""
    value = statement.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.value is softmax.node and \
            value.func.attr.value == "masked_fill" and len(value.args) == 2:
        return statement.with_changes(value=softmax.node)
    return statement


def sdpa_on_other_branch(parsed: ParsedModule, statement: cst.CSTNode, owner: ClassInfo | None = None) -> str | None:
    """timm's `if self.fused_attn: F.scaled_dot_product_attention(...) else: <manual>`, or x-transformers'
    `if self.flash: return self.flash_attn(q, k, v)` before the manual code (SDPA called there or in a method of the
    class that branch calls): the fix is the flag."""
    for deciding, other, returns_before in _deciding_ifs(parsed, statement):
        if other is not None and _calls_sdpa(parsed, other, owner):
            return (f"`if {short(parsed, deciding.test)}` before this block returns what "
                    f"scaled_dot_product_attention computes: enable it" if returns_before else
                    f"the other branch of `if {short(parsed, deciding.test)}` already calls "
                    f"scaled_dot_product_attention: enable it")
    return None


def _deciding_ifs(parsed: ParsedModule, statement: cst.CSTNode):
    """The `if` statements of the block's function that decide whether it runs, innermost first, each with the code
    that runs instead: every `if` holding the block, with its other branch (None without an `else:`), and every
    earlier `if` of a block holding it whose body ends in a `return`, with that body (`returns_before`)."""
    child, node = statement, parsed.parents.get(statement)
    while node is not None and not isinstance(node, cst.FunctionDef):
        if isinstance(node, cst.If):
            yield node, None if node.orelse is None else node.orelse if child is node.body else node.body, False
        if isinstance(node, cst.IndentedBlock) and child in node.body:
            for earlier in node.body[:list(node.body).index(child)]:
                if isinstance(earlier, cst.If) and earlier.orelse is None and _returns_last(earlier.body):
                    yield earlier, earlier.body, True
        child, node = node, parsed.parents.get(node)


SDPA_NAME = "scaled_dot_product_attention"


def fallback_without_sdpa(parsed: ParsedModule, statement: cst.CSTNode, owner: ClassInfo | None) -> str | None:
    """Why a block under an `if` that tests whether torch has SDPA at all may not be rewritten to it: the manual
    branch of nanoGPT's `self.flash = hasattr(torch.nn.functional, 'scaled_dot_product_attention')`, of `if
    hasattr(F, "scaled_dot_product_attention"):`, or of a flag a module-level `try:` import of it sets, runs
    where torch has no SDPA (breaker round 57: the patch raised AttributeError there). None elsewhere."""
    for deciding, _, _ in _deciding_ifs(parsed, statement):
        if _tests_sdpa_exists(parsed, deciding.test, owner):
            return (f"the block runs where `{short(parsed, deciding.test)}` may say torch has no "
                    f"scaled_dot_product_attention, and a patch calling it would raise there (where torch has "
                    f"it, the branch that calls it is the fix)")
    return None


def _tests_sdpa_exists(parsed: ParsedModule, test: cst.BaseExpression, owner: ClassInfo | None) -> bool:
    """The test names SDPA in a string (`hasattr(F, "scaled_dot_product_attention")`), or reads a flag whose only
    bindings name it: `self.flash = hasattr(...)` in the class, a module-level assignment or `try:` block."""
    if SDPA_NAME in parsed.code(test):  # a string, or the function itself (`if F.scaled_dot_product_attention:`)
        return True
    attribute_names = {id(node.attr) for node in scope.walk(test) if isinstance(node, cst.Attribute)}
    for node in scope.walk(test):
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self" and \
                owner is not None:
            values = owner.attributes.get(node.attr.value) or []
            if values and all(SDPA_NAME in parsed.code(value) for value in values):
                return True
        elif isinstance(node, cst.Name) and id(node) not in attribute_names and \
                _bound_where_sdpa_is_named(parsed, node.value):
            return True
    return False


def _bound_where_sdpa_is_named(parsed: ParsedModule, name: str) -> bool:
    """A module-level statement that binds `name` and names SDPA (`HAS_SDPA = hasattr(...)`, or a `try:` whose
    body imports it and whose handler binds the flag too)."""
    if SDPA_NAME not in parsed.source:
        return False
    if parsed not in _NAMES_BESIDE_SDPA:  # once per file: read for every name of every test above every block
        _NAMES_BESIDE_SDPA[parsed] = _names_bound_beside_sdpa(parsed)
    return name in _NAMES_BESIDE_SDPA[parsed]


_NAMES_BESIDE_SDPA: WeakKeyDictionary[ParsedModule, frozenset[str]] = WeakKeyDictionary()


def _names_bound_beside_sdpa(parsed: ParsedModule) -> frozenset[str]:
    names = set()
    for statement in parsed.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or SDPA_NAME not in parsed.code(statement):
            continue  # a class body's `fused_attn: Final[bool]` binds no module-level name
        lines = [statement] if isinstance(statement, cst.SimpleStatementLine) else \
            [node for node in scope.walk(statement) if isinstance(node, cst.SimpleStatementLine)]
        names.update(target.value for line in lines for small in line.body for target in bound_names(small))
    return frozenset(names)


def is_guarded_fallback(parsed: ParsedModule, statement: cst.CSTNode) -> bool:
    """The block is the original kept under the `else:` of a guarded patch (`if <metadata check>: <SDPA or the
    module's flex helper> else: <block>`): it runs only where SDPA would not be exact, so it is no finding (and a second pass changes
    nothing). A flag test (timm's `if self.fused_attn:`) is not a metadata check: that block stays a finding."""
    child, node = statement, parsed.parents.get(statement)
    while node is not None and not isinstance(node, cst.FunctionDef):
        if isinstance(node, cst.If) and isinstance(node.orelse, cst.Else) and child is node.orelse:
            finder = _CallFinder(parsed, "torch.nn.functional.scaled_dot_product_attention")
            walk(node.body, finder)
            # the module's own flex helper: only a flex patch writes its call in an `if` with the original after
            flex = FLEX_HELPER in parsed.module_functions and FLEX_HELPER in finder.plain_calls
            flash = any(name.startswith(FLASH_HELPER_NAME) and name in parsed.module_functions
                        for name in finder.plain_calls)  # `--backend flash-attn`'s helper, which calls SDPA
            return flex or (finder.found or flash) and _reads_metadata_only(parsed, node.test, node.orelse.body)
        child, node = node, parsed.parents.get(node)
    return False


RUN_MODE_CHECKS = frozenset({"torch.jit.is_tracing", "torch.jit.is_scripting", "torch.compiler.is_compiling"})
# a tensor's methods that answer from its dtype or layout alone
METADATA_PREDICATES = frozenset({"is_floating_point", "is_complex", "is_contiguous"})


def _reads_metadata_only(parsed: ParsedModule, test: cst.BaseExpression, fallback: cst.BaseSuite) -> bool:
    """A test made of comparisons, `is None`, `isinstance`, `.dtype`, `.dim()`, `.shape[i]` and torch's run-mode
    checks (`torch.jit.is_tracing()`), joined by `and`,
    `or` and `not`: no value of a tensor read; or of a flag the fallback asks `if <flag>:` (`not flag`,
    `flag is None or flag is False`: see attention.flags)."""
    if isinstance(test, cst.BooleanOperation):
        return _reads_metadata_only(parsed, test.left, fallback) and \
            _reads_metadata_only(parsed, test.right, fallback)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _asked_in(parsed, test.expression, fallback) or \
            _reads_metadata_only(parsed, test.expression, fallback)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
            isinstance(test.comparisons[0].operator, cst.Is) and _asked_in(parsed, test.left, fallback):
        return True
    if _none_identity_asked_otherwise(parsed, test, fallback):
        return True
    if isinstance(test, cst.Comparison):
        return all(_metadata_operand(parsed, part) for part in [test.left] + [t.comparator for t in test.comparisons])
    if isinstance(test, cst.Name) and test.value == MODULE_CHECK_LOCAL:  # the deleted modules' check
        return True
    if isinstance(test, cst.Attribute) and test.attr.value == "training" and _attribute_chain(test):
        return True  # `not self.attn_drop.training or ...`, which a guard adds for a dropout in place
    if isinstance(test, cst.Call) and not test.args and parsed.imported_name(test.func) in RUN_MODE_CHECKS:
        return True  # `not torch.jit.is_tracing()`, which a guard adds where the tree traces (promises round 22)
    if isinstance(test, cst.Call) and not test.args and isinstance(test.func, cst.Attribute) and \
            test.func.attr.value in METADATA_PREDICATES and parsed.imported_name(test.func) is None:
        return True  # `q.is_floating_point()`, which a guard adds for cast operands (breaker round 25)
    return isinstance(test, cst.Call) and parsed.imported_name(test.func) is None and \
        isinstance(test.func, cst.Name) and test.func.value == "isinstance"


def _asked_in(parsed: ParsedModule, flag: cst.BaseExpression, fallback: cst.BaseSuite) -> bool:
    """`fallback` holds a statement `if <flag>:` or an expression `... if <flag> else ...`, or either testing `not
    <flag>` (the weights asked for on request: BERT's and Swin's `outputs = (context, probs) if output_attentions
    else (context,)`, DETR's `if not output_attentions: attn_weights = None`)."""
    text = parsed.code(flag)
    return any(isinstance(node, (cst.If, cst.IfExp)) and text in (parsed.code(node.test), _negated_flag(parsed, node))
               for node in scope.walk(fallback))


def _negated_flag(parsed: ParsedModule, node: cst.If | cst.IfExp) -> str | None:
    test = node.test
    return parsed.code(test.expression) if isinstance(test, cst.UnaryOperation) and \
        isinstance(test.operator, cst.Not) else None


def _none_identity_asked_otherwise(parsed: ParsedModule, test: cst.BaseExpression, fallback: cst.BaseSuite) -> bool:
    """`x is None` where the fallback holds `if x is not None:` (or the reverse): the branch on a path of the scores
    that SDPA does not express (see attention.flags)."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and
            isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))):
        return False
    target = test.comparisons[0]
    flipped = cst.IsNot() if isinstance(target.operator, cst.Is) else cst.Is()
    return _asked_in(parsed, test.with_changes(comparisons=[target.with_changes(operator=flipped)]), fallback)


def _metadata_operand(parsed: ParsedModule, node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Float, cst.Name)):
        return True
    if isinstance(node, cst.Attribute):  # `x.dtype`, a dtype constant (`torch.float32`, as a guard compares), or
        # a number read off a module (`0.0 <= self.dropout <= 1.0`, `self.temperature != 0`: see attention.guards)
        return node.attr.value == "dtype" or parsed.imported_name(node) in DTYPE_NAMES | {"torch.bool"} or \
            _attribute_chain(node)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return _metadata_operand(parsed, node.expression)
    if isinstance(node, cst.BinaryOperation):  # `t * 0.0 == 0.0`: a number's finiteness (attention.guards)
        return _metadata_operand(parsed, node.left) and _metadata_operand(parsed, node.right)
    if isinstance(node, cst.Subscript):  # `x.shape[-2]`, `x.shape[-2:-1]`
        return isinstance(node.value, cst.Attribute) and node.value.attr.value == "shape" and \
            all(_metadata_operand(parsed, e.slice.value) if isinstance(e.slice, cst.Index) else
                all(bound is None or _metadata_operand(parsed, bound)
                    for bound in (e.slice.lower, e.slice.upper, e.slice.step)) for e in node.slice)
    return isinstance(node, cst.Call) and not node.args and isinstance(node.func, cst.Attribute) and \
        node.func.attr.value == "dim"


def _attribute_chain(node: cst.BaseExpression) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _returns_last(block: cst.BaseSuite) -> bool:
    last = block.body[-1] if isinstance(block, cst.IndentedBlock) and block.body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return)


def _calls_sdpa(parsed: ParsedModule, node: cst.CSTNode, owner: ClassInfo | None) -> bool:
    """`node` calls SDPA, directly or through a `self.<method>` of the class that calls it directly."""
    finder = _CallFinder(parsed, "torch.nn.functional.scaled_dot_product_attention")
    walk(node, finder)
    for method in finder.self_methods if owner is not None and not finder.found else ():
        if method in owner.methods:
            walk(owner.methods[method], finder)
    return finder.found


class _CallFinder(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule, dotted: str) -> None:
        self.parsed, self.dotted, self.found, self.self_methods = parsed, dotted, False, []
        self.plain_calls: set[str] = set()  # names called as `name(...)`

    def visit_Call(self, node: cst.Call) -> None:
        self.found = self.found or self.parsed.imported_name(node.func) == self.dotted
        func = node.func
        if isinstance(func, cst.Name):
            self.plain_calls.add(func.value)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            self.self_methods.append(func.attr.value)
