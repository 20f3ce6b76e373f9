"""The matcher, for now one class: being split along its roles into this package's modules."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
import networkx as nx

from advisor.patterns import einsum as es
from advisor.patterns import masks as mk
from advisor.patterns import scope
from advisor.patterns.dtypes import DtypeRoots
from advisor.patterns.attention.result import AttentionMatch, MaskTerm, Refusal
from advisor.patterns.ops import Op, OpReader, int_value, number_value
from advisor.patterns.values import ValueProver
from advisor.static.dataflow import UNDEFINED, Definition, FunctionFlow, contains_call, loaded_names
from advisor.static.module_index import ClassInfo, ParsedModule

CORE_OPS = {"matmul", "bmm", "baddbmm", "einsum"}
# methods whose result shares the input's storage with strides derived from the input's
STRIDED_VIEWS = {"transpose", "permute", "mT", "T", "unsqueeze", "squeeze", "expand", "swapaxes", "movedim"}
MAX_CHAIN = 40


def find_attention(parsed: ParsedModule) -> list[AttentionMatch]:
    matches: list[AttentionMatch] = []
    for function, owner, name in parsed.functions:
        if not _mentions_softmax(parsed, owner.node if owner is not None else function):
            continue
        matcher = _FunctionMatcher(parsed, function, owner, name)
        matches.extend(matcher.run())
    return matches


def _mentions_softmax(parsed: ParsedModule, node: cst.CSTNode) -> bool:
    """Prefilter: a function (or, for a method, its class, where `nn.Softmax` modules are built) that never
    says softmax has no anchor for the matcher."""
    return "softmax" in parsed.code(node).lower()


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


@dataclass
class _Chain:
    """What the backward walk collected: ops outermost first, definitions consumed, reads followed."""

    ops: list[tuple[Op, cst.If | None]] = field(default_factory=list)
    definitions: list[Definition] = field(default_factory=list)
    reads: set[cst.Name] = field(default_factory=set)


class _FunctionMatcher:
    def __init__(self, parsed: ParsedModule, function: cst.FunctionDef, owner: ClassInfo | None, name: str):
        self.parsed, self.function, self.owner, self.name = parsed, function, owner, name
        self.flow: FunctionFlow = parsed.flow(function)
        self.reader = OpReader(parsed, owner)
        self.values = ValueProver(parsed, self.flow, owner)
        self.home = function  # where the value product, and so the SDPA call, lives
        self._inlined: dict[cst.FunctionDef, tuple[cst.Call, dict[str, cst.BaseExpression]]] = {}
        self._taken_names: set[str] = set()  # fresh names earlier matches of this function chose

    def run(self) -> list[AttentionMatch]:
        collector = _SoftmaxCollector(self.reader, self.function)
        self.function.visit(collector)
        results, claimed = [], set()
        for softmax in collector.found:
            if self._statement(softmax.node) in claimed:
                continue  # the twin softmax of an if/else already matched with its sibling
            match = self._match(softmax)
            if match is not None:
                results.append(match)
                claimed.update(match.removed)
        return results

    # -- one candidate -----------------------------------------------------------------------------
    def _match(self, softmax: Op) -> AttentionMatch | None:
        if not self._looks_like_attention(softmax):
            return None
        statement = self._statement(softmax.node)
        match = AttentionMatch(self.name, self.parsed.line(statement), self.parsed.end_line(statement))
        try:
            self._prove(softmax, match)
        except Refusal as refusal:
            match.reason = str(refusal)
            match.output_node = None
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours on one block must not lose the file's others
            match.reason = f"internal error while proving this block ({type(exc).__name__}: {exc}); please report it"
            match.output_node, match.removed = None, []
        match.note = self._sdpa_on_other_branch(statement)
        return match

    def _sdpa_on_other_branch(self, statement: cst.CSTNode) -> str | None:
        """timm's `if self.fused_attn: F.scaled_dot_product_attention(...) else: <manual>`: the fix is the flag."""
        child, node = statement, self.parsed.parents.get(statement)
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, cst.If) and node.orelse is not None:
                other = node.orelse if child is node.body else node.body
                finder = _CallFinder(self.parsed, "torch.nn.functional.scaled_dot_product_attention")
                other.visit(finder)
                if finder.found:
                    return (f"the other branch of `if {self._short(node.test)}` already calls "
                            f"scaled_dot_product_attention: enable it")
            child, node = node, self.parsed.parents.get(node)
        return None

    def _looks_like_attention(self, softmax: Op) -> bool:
        """Cheap screen: a matrix product feeds the softmax and its output reaches another one."""
        return self._reaches(softmax.operands[0], CORE_OPS, depth=0) and self._feeds_product(softmax.node)

    def _reaches(self, node: cst.CSTNode, names: set[str], depth: int) -> bool:
        if depth > MAX_CHAIN:
            return False
        op = self.reader.read(node)
        if op is not None and op.name in names:
            return True
        callee = self._callee(node) if op is None else None
        if callee is not None:  # a helper that returns the scores
            return self._reaches(_single_return(callee).value, names, depth + 1)
        if isinstance(node, cst.Name):
            flow = self._flow_for(node)
            return any(d.value is not None and self._reaches(d.value, names, depth + 1)
                       or any(self._reaches_defs(flow, p, names, depth + 1) for p in d.previous)
                       for d in flow.definitions_of(node) if d.kind in ("assign", "aug", "inplace"))
        return any(self._reaches(child, names, depth + 1) for child in node.children
                   if isinstance(child, (cst.BaseExpression, cst.Arg, cst.BaseElement)))

    def _reaches_defs(self, flow: FunctionFlow, def_id: int, names: set[str], depth: int) -> bool:
        if def_id == UNDEFINED:
            return False
        definition = flow.definitions[def_id]
        return definition.value is not None and self._reaches(definition.value, names, depth)

    def _feeds_product(self, node: cst.CSTNode) -> bool:
        frontier, seen, visited = [node], 0, {id(node)}  # visited: a loop makes the def-use graph cyclic
        while frontier and seen < MAX_CHAIN:
            seen += 1
            current = frontier.pop(0)
            parent = self.parsed.parents.get(current)
            if isinstance(parent, cst.Return):
                frontier.extend(_calls_to(self.parsed, self.function, self.owner) +
                                _calls_through_objects(self.parsed, self.function, self.owner))
                continue
            if isinstance(parent, cst.Subscript) and parent.value is current:  # a slice of the weights
                frontier.append(parent)
                continue
            if isinstance(parent, cst.Element):  # `a, b = w[..., :n], w[..., n:]`
                frontier.extend(self._unpacked_reads(parent))
                continue
            for consumer, op in self._consumers(current):
                if op is not None and op.name in ("matmul", "bmm", "einsum"):
                    return True
                if consumer is not None and id(consumer) not in visited:
                    visited.add(id(consumer))
                    frontier.append(consumer)
        return False

    def _unpacked_reads(self, element: cst.Element) -> list[cst.Name]:
        """Where the name an element of `a, b = x, y` binds is read."""
        values = self.parsed.parents.get(element)
        statement = self.parsed.parents.get(values)
        if not isinstance(statement, cst.Assign) or statement.value is not values:
            return []
        index = list(values.elements).index(element)
        flow = self._flow_for(statement)
        return [read for d in flow.definitions.values() if d.statement is statement and d.index == index
                for read in flow.reads_of(d)]

    def _consumers(self, node: cst.CSTNode) -> list[tuple[cst.CSTNode | None, Op | None]]:
        """Where a value goes: (the expression that consumes it, that expression's Op if it is one)."""
        parent = self.parsed.parents.get(node)
        if isinstance(parent, cst.Arg):
            call = self.parsed.parents.get(parent)
            return [(call, self.reader.read(call))]
        if isinstance(parent, cst.Attribute) and parent.value is node:
            call = self.parsed.parents.get(parent)
            if isinstance(call, cst.Call) and call.func is parent:
                return [(call, self.reader.read(call))]
            return [(parent, self.reader.read(parent))]
        if isinstance(parent, cst.BinaryOperation):
            return [(parent, self.reader.read(parent))]
        definition = self._definition_of_value(node)
        if definition is not None:
            return [(read, None) for read in self._flow_for(node).reads_of(definition)]
        return [(None, None)]

    def _flow_for(self, node: cst.CSTNode) -> FunctionFlow:
        """The merged view for the functions of this match; another function's own flow otherwise."""
        function = self._function_of(node)
        if function is self.function or function is self.home or function in self._inlined or function is None:
            return self.flow
        return self.parsed.flow(function)

    def _definition_of_value(self, node: cst.CSTNode) -> Definition | None:
        parent = self.parsed.parents.get(node)
        if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node:
            found = [d for d in self._flow_for(node).definitions.values() if d.statement is parent and d.index is None]
            return found[0] if len(found) == 1 else None
        return None

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        while not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            node = self.parsed.parents[node]
        return node

    # -- the proof -----------------------------------------------------------------------------------
    def _prove(self, softmax: Op, match: AttentionMatch) -> None:
        self._current = match
        self.home, self._inlined = self.function, {}
        self.flow = self.parsed.flow(self.function)
        self.values = ValueProver(self.parsed, self.flow, self.owner)
        chain = _Chain()
        self._chain = chain
        self._absorbed: set[cst.Name] = set()
        self._factor_guards: dict[cst.CSTNode, cst.If] = {}
        self._negated_factors: set[cst.CSTNode] = set()  # factors applied in the `else:` of their guard
        self._guard_negated = False
        self._views: list[tuple[int, Op]] = []  # reads that vanish with the rewrite (cast targets, fill dtypes)
        self._dtype_changes: list[Op] = []  # casts and softmax(dtype=) inside the block
        self._dtype_roots: DtypeRoots | None = None
        self._twin = self._twin_softmax(softmax)
        self._softmax_node = softmax.node
        core = self._peel_scores(softmax.operands[0], chain)
        ndim = self._core_roles(core, chain, match)
        self._check_softmax_dim(softmax, ndim)
        stages = softmax.params.get("stages", [])[1:] if softmax.name == "sequential" else []
        dropouts = [stage for stage in stages if stage.name == "dropout"]
        if len(dropouts) != len(stages):
            raise Refusal("the softmax module is followed by a module that is not dropout")
        if (softmax.params["stages"][0] if softmax.name == "sequential" else softmax).params.get("dtype") is not None:
            self._dtype_changes.append(softmax)
        output, value_node, weight_defs, escapes, more_dropouts = self._follow_weights(softmax.node, ndim)
        self._weight_defs = weight_defs
        buffer = scope.out_argument(output.node)
        if buffer is not None:
            raise Refusal(f"the value product writes into `out={self._short(buffer)}`, which SDPA cannot fill")
        dropouts += more_dropouts
        match.escapes = escapes
        self._value_roles(core, output, value_node, ndim, match)
        self._dropout_role(dropouts, match)
        self._scale_and_mask_roles(chain, core, match)
        consumed = chain.definitions + weight_defs
        self._check_reads(consumed, chain.reads | self._weight_reads | self._absorbed, match)
        self._assemble_mask(match)
        self._mask_and_dtype_facts(match, output, value_node, ndim)
        output_statement = self._statement(output.node)
        match.output_node = output.node
        kept = {output_statement} | set(match.hoisted)
        match.removed = _unique([d.statement for d in consumed
                                 if d.statement not in kept and not self._in_inlined(d.statement)])
        if any(self._in_inlined(node) for node in match.renamed):
            raise Refusal("a helper reads the scores' shape or dtype, and helpers are never edited")
        match.function = self._dotted_name(self.home)
        lines = [self.parsed.line(s) for s in match.removed] + [self.parsed.line(output_statement)]
        match.line, match.end_line = min(lines), self.parsed.end_line(output_statement)
        self._check_bindings(match, output_statement)
        self._check_scope(match, output_statement, consumed)
        self._layout_role(match)
        self._check_escapes(match)

    def _check_scope(self, match: AttentionMatch, output_statement: cst.CSTNode, consumed: list[Definition]) -> None:
        """What the code around the block may change: see patterns.scope."""
        deleted = [s for s in match.removed if self._function_of(s) is self.home]
        reason = scope.same_context(self.parsed, deleted, match.output_node)
        steps = [d.statement for d in consumed] + [self._softmax_node]
        inlined = [s for s in steps if self._in_inlined(s) and scope.enclosing_contexts(self.parsed, s)]
        if reason is None and inlined:  # a helper's step runs once per call only at its top level
            reason = (f"a step of the helper `{self._function_of(inlined[0]).name.value}` runs inside a loop or "
                      f"`with` block (line {self.parsed.line(inlined[0])})")
        if reason is not None:
            raise Refusal(reason)
        match.facts.proved("scope", "the deleted statements run exactly when the value product runs",
                           "same loops, comprehensions and `with` blocks")
        reason = scope.other_targets_read(self.parsed, self.flow, match.removed, {d.id for d in consumed})
        if reason is not None:
            raise Refusal(reason)
        kept = list(self._leaf_nodes) + [node for term in match.masks for node in term.nodes]
        first = min([self.parsed.line(s) for s in deleted] + [self.parsed.line(output_statement)])
        paths = scope.attribute_paths(self.parsed, kept)
        reason = scope.attribute_written_between(self.parsed, self.home, self.owner, paths, first,
                                                 self.parsed.line(output_statement))
        if reason is None:
            reason = scope.storage_written_between(self.parsed, self.flow, kept, first,
                                                   self.parsed.line(output_statement))
        if reason is not None:
            raise Refusal(reason)
        if paths:
            match.facts.proved("no-writes", "no attribute the SDPA call reads is written inside the block")
        self._dispatch_facts(match, deleted + [match.output_node], kept)
        if (match.hoisted or match.hoist_init) and scope.is_scripted(self.parsed, self.home, self.owner):
            raise Refusal("the function is compiled by TorchScript, where the merged mask variable cannot start "
                          "as None and later hold a tensor")

    def _layout_role(self, match: AttentionMatch) -> None:
        """SDPA's output has a fresh matmul's values but not always its strides (CPU and flash kernels return a
        transposed layout). A `.view` that reads the output, directly or through views, needs the original's
        contiguous strides, and so may a caller the output is returned to: emit `.contiguous()` for those
        (a no-op when already contiguous). Every other use reads values only."""
        frontier, steps, reader = [match.output_node], 0, None
        while frontier and steps < MAX_CHAIN and reader is None:
            steps += 1
            node = frontier.pop()
            parent = self.parsed.parents.get(node)
            if isinstance(parent, cst.Return):
                function = self._function_of(parent)
                owner = self.owner if function is self.function or function is self.home else None
                sites = _calls_to(self.parsed, function, owner) if function is not None else []
                if not sites:
                    reader = "is returned to a caller outside this file"
                frontier.extend(sites)  # a helper of this file: follow its callers
                continue
            if isinstance(parent, cst.Subscript) and parent.value is node:
                frontier.append(parent)
                continue
            for consumer, _ in self._consumers(node):
                method = _method_on(consumer, node)
                if method in ("view", "view_as"):
                    reader = f"is read by `.{method}` at line {self.parsed.line(consumer)}"
                elif method in STRIDED_VIEWS or isinstance(consumer, cst.Name):
                    frontier.append(consumer)
        if reader is None:
            match.facts.proved("layout", "no `.view` or caller depends on the output's strides")
            return
        match.output_suffix += ".contiguous()"
        match.facts.proved("layout", f"the output is contiguous, as the original's product is, where it {reader}")

    def _dispatch_facts(self, match: AttentionMatch, block: list[cst.CSTNode], kept: list[cst.CSTNode]) -> None:
        """The `self.` methods and modules the proof resolved are the ones that run, and deleting a module
        call loses nothing but its computation (no hooks)."""
        if self.owner is None:
            return
        names = scope.self_names(block + kept) | {f.name.value for f in self._inlined if f in
                                                   self.owner.methods.values()}
        reason = scope.overridden(self._classes(), self.owner, names)
        if reason is not None:
            raise Refusal(reason)
        if self._classes().subclasses(self.owner):
            match.facts.proved("dispatch", "no subclass overrides a method or attribute the block uses",
                               "checked for the subclasses in this file")
        hooked = scope.registers_hooks(self.parsed)
        for attribute in scope.deleted_module_calls(self.parsed, self.owner, block, kept):
            statement = f"no forward hook is registered on `self.{attribute}`, whose call the rewrite deletes"
            if scope.is_hook_point(self.parsed, self.owner, attribute):
                match.facts.assumed("no-hooks", statement, "it computes nothing, so it exists to carry hooks")
            elif hooked:
                match.facts.assumed("no-hooks", statement, "this file registers module hooks")
            else:
                match.facts.proved("no-hooks", statement, "no hook is registered in this file")

    def _classes(self) -> scope.ClassTable:
        if getattr(self, "_class_table", None) is None:
            self._class_table = scope.ClassTable.of(self.parsed)
        return self._class_table

    def _twin_softmax(self, softmax: Op) -> Definition | None:
        """`if mask is not None: ...; s = self.softmax(s)` / `else: s = self.softmax(s)` (Swin): the same
        softmax closing both branches is one softmax after the `if`. Returns the else branch's definition."""
        statement = self._statement(softmax.node)
        parent_block = self.parsed.parents.get(self.parsed.parents.get(statement))
        guard = self.parsed.parents.get(parent_block) if parent_block is not None else None
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
        if " ".join(self.parsed.code(other).split()) != " ".join(self.parsed.code(statement).split()):
            return None
        twin = [d for d in self.flow.definitions.values() if d.statement is other and d.index is None]
        other_op = self.reader.read(other.value)
        if len(twin) != 1 or other_op is None or not isinstance(other_op.operands[0], cst.Name):
            return None
        self._twin_input = other_op.operands[0]
        return twin[0]

    # backward: softmax input -> Q·K^T ---------------------------------------------------------------
    def _peel_scores(self, node: cst.BaseExpression, chain: _Chain) -> Op:
        """Walk from the softmax input down to the Q·K^T product, recording every op on the way.
        Inside a guarded update (`if mask is not None: s = s.view(...); s = s + mask; ...`) every op carries
        the guard, until the walk leaves the `if` back to the value the `if` started from."""
        guard: cst.If | None = None
        entry: frozenset[int] | None = None  # what the walk must reach when it leaves the guard
        if self._twin is not None:  # `if c: ...; s = softmax(s) else: s = softmax(s)`: start inside the if
            guard, entry = self._twin.guards[-1], frozenset(self.flow.reaching[self._twin_input])
            chain.definitions.append(self._twin)
            chain.reads.add(self._twin_input)
        cursor: cst.BaseExpression | Op | frozenset[int] = node
        for _ in range(MAX_CHAIN):
            if isinstance(cursor, cst.Name):
                chain.reads.add(cursor)
                cursor = frozenset(self.flow.reaching.get(cursor, ()))
            if isinstance(cursor, frozenset):
                if guard is not None and cursor == entry:
                    guard = entry = None
                elif guard is not None and not self._inside(cursor, guard):
                    raise Refusal("a conditional update of the scores does not update the same value")
                cursor, new_guard, new_entry = self._step_definitions(cursor, chain)
                if new_guard is not None:
                    if guard is not None:
                        raise Refusal("the scores are updated under nested conditions")
                    guard, entry = new_guard, new_entry
                    # the update sits in the `else:` of its `if`: a factor there applies when the test is false
                    self._guard_negated = guard in chain.definitions[-1].negated
                continue
            op = cursor if isinstance(cursor, Op) else self.reader.read(cursor)
            if op is None and guard is None and self._callee(cursor) is not None:
                cursor = self._enter_callee(cursor)  # the scores are computed by a helper method
                continue
            if op is None:
                raise Refusal(self._why_unrecognised(cursor))
            if op.name in CORE_OPS:
                if guard is not None:
                    raise Refusal("the Q·K^T product itself is computed conditionally")
                return op
            cursor = self._peel_one(op, chain, guard)
        raise Refusal("the score computation is too long to follow")

    def _why_unrecognised(self, node: cst.CSTNode) -> str:
        """Why the score walk stops at `node`, naming the form when it is a known one."""
        short = self._short(node)
        if isinstance(node, cst.Call):
            if self.parsed.imported_name(node.func) in ("torch.cat", "torch.concat", "torch.concatenate"):
                return (f"the scores are joined from several sources by `{short}`, so one softmax spans several "
                        f"key sets (one SDPA call would need their keys and values concatenated)")
            helper = self._helper_named(node.func)
            if helper is not None and _single_return(helper) is None:
                return f"the scores come from `{short}`, a helper with more than one `return`, which is not inlined"
        return f"the scores come from `{short}`, which is not a recognised operation"

    def _inside(self, ids: frozenset[int], guard: cst.If) -> bool:
        return len(ids) == 1 and UNDEFINED not in ids and guard in self.flow.definitions[next(iter(ids))].guards

    def _step_definitions(self, ids: frozenset[int], chain: _Chain):
        """Follow a read to what it reads: one definition, or the last update inside an `if` that may not run.
        Returns (what the definition computes, the `if` it entered or None, the definitions before that `if`)."""
        definitions = [self.flow.definitions[i] for i in sorted(ids) if i != UNDEFINED]
        if UNDEFINED in ids or not definitions:
            raise Refusal("the scores are not defined on every path")
        if len(definitions) >= 2:
            deepest = max(definitions, key=lambda d: (len(d.guards), d.id))  # the last update
            guard = deepest.guards[-1] if deepest.guards else None
            inside = [d for d in definitions if guard in d.guards]
            outside = [d for d in definitions if guard not in d.guards]
            if (len(inside) == 1 and outside and deepest.kind in ("assign", "aug", "inplace")
                    and deepest.index is None and all(d.guards[:len(deepest.guards) - 1] ==
                                                      deepest.guards[:-1] for d in outside)):
                chain.definitions.append(deepest)
                return self._definition_input(deepest, chain), guard, frozenset(d.id for d in outside)
        if len(definitions) != 1:
            raise Refusal("the scores are assigned on several paths")
        definition = definitions[0]
        if definition.kind == "store":
            raise Refusal(f"the scores are written in place by `{self._short(definition.statement)}`")
        if definition.kind not in ("assign", "aug", "inplace") or definition.index is not None:
            raise Refusal(f"the scores come from `{definition.name}`, which is not computed in this function")
        chain.definitions.append(definition)
        return self._definition_input(definition, chain), None, None

    def _definition_input(self, definition: Definition, chain: _Chain) -> cst.BaseExpression | Op:
        """The expression a definition computes; augmented and in-place updates become ops on the old value."""
        if definition.kind == "assign":
            return definition.value
        statement = definition.statement
        if definition.kind == "aug":
            op_names = {cst.MultiplyAssign: "mul", cst.DivideAssign: "div", cst.AddAssign: "add"}
            name = op_names.get(type(statement.operator))
            if name is None:
                raise Refusal(f"the scores are updated by `{self._short(statement)}`")
            return Op(name, statement, [statement.target, statement.value], inplace=True)
        op = self.reader.read(definition.value)
        if op is None or op.name not in ("masked_fill", "mul", "div", "add"):
            raise Refusal(f"the scores are updated in place by `{self._short(definition.value)}`")
        return op

    def _peel_one(self, op: Op, chain: _Chain, guard: cst.If | None) -> cst.BaseExpression:
        """Record one op of the score chain and return the operand that carries the scores."""
        if op.name in ("cast", "identity"):
            self._absorb(op)
            if op.name == "cast":
                self._dtype_changes.append(op)
            return op.operands[0]
        if op.name in ("mul", "div"):
            tensor, factor = self._tensor_and_factor(op)
            if factor is None:
                unfollowed = self.values.why_not_scalar(op.operands[1])
                if unfollowed is not None:
                    raise Refusal(f"the scale `{self._short(op.operands[1])}` cannot be proved a Python number: "
                                  f"{unfollowed}")
                raise Refusal(f"the scores are scaled by `{self._short(op.operands[1])}`, which is not provably a "
                              f"Python number (SDPA's scale must be one)")
            if guard is not None and contains_call(guard.test):
                raise Refusal(f"the scale is applied under `if {self._short(guard.test)}`, a condition that "
                              f"calls a function and cannot be re-evaluated")
            op.params["factor"] = factor
            if guard is not None:  # becomes `(factor if <test> else 1.0)`, or `(1.0 if <test> else factor)`
                self._factor_guards[factor] = guard
                if self._guard_negated:
                    self._negated_factors.add(factor)
            chain.ops.append((op, guard))
            return tensor
        if op.name in ("masked_fill", "view"):
            chain.ops.append((op, guard))
            return op.operands[0]
        if op.name in ("add", "where"):
            left, right = op.operands
            scores = left if self._reaches(left, CORE_OPS, 0) else right
            op.params["chain_operand"] = scores
            chain.ops.append((op, guard))
            return scores
        if op.name == "sub":
            left, right = op.operands
            if self._is_row_max_of(right, left):
                self._absorbed.update(loaded_names(right))
                return left
            raise Refusal(f"the scores have `{self._short(right)}` subtracted from them")
        raise Refusal(f"the scores pass through `{self._short(op.node)}` before softmax, which SDPA cannot express")

    # attention split across functions -------------------------------------------------------------
    def _helper_named(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The function `self.name` (a method of this class) or `name` (a function of this file) calls."""
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" \
                and self.owner is not None:
            return self.owner.methods.get(func.attr.value)
        return self.parsed.module_functions.get(func.value) if isinstance(func, cst.Name) else None

    def _callee(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """`self.scores(q, k)` (a method of this class) or `scores(q, k)` (a function of this file) whose
        body ends in its only `return`; None for anything else."""
        if not isinstance(node, cst.Call) or any(a.star for a in node.args):
            return None
        callee = self._helper_named(node.func)
        if callee is None or callee is self.function or callee in self._inlined or _single_return(callee) is None:
            return None
        if any(not (isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod"))
               for d in callee.decorators):
            return None  # another decorator may change what the call computes
        return callee

    def _bind_arguments(self, callee: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
        params = [p.name.value for p in callee.params.params]
        bound: dict[str, cst.BaseExpression] = {}
        kind = _method_kind(callee)
        if isinstance(call.func, cst.Attribute) and kind != "static":  # self.method(...): self (or its class)
            if not params:
                raise Refusal(f"`{callee.name.value}` takes no `self`")
            bound[params[0]] = cst.Name("self") if kind == "instance" else cst.parse_expression("type(self)")
            params = params[1:]
        for position, arg in enumerate(call.args):
            if arg.keyword is None:
                if position >= len(params):
                    raise Refusal(f"the call `{self._short(call)}` passes more arguments than it takes")
                bound[params[position]] = arg.value
            else:
                bound[arg.keyword.value] = arg.value
        for param in callee.params.params:
            if param.name.value not in bound and param.default is not None:
                bound[param.name.value] = param.default
        return bound

    def _merge_flow(self, function: cst.FunctionDef) -> None:
        self.flow = self.flow.merged_with(self.parsed.flow(function))
        self.values = ValueProver(self.parsed, self.flow, self.owner)

    def _enter_callee(self, call: cst.Call) -> cst.BaseExpression:
        """Continue the score walk inside the helper that returns the scores; its parameters are read as
        the caller's arguments."""
        callee = self._callee(call)
        self._inlined[callee] = (call, self._bind_arguments(callee, call))
        self._merge_flow(callee)
        return _single_return(callee).value

    def _leave_to_caller(self, returned: cst.Return) -> cst.Call:
        """The weights are returned by this function: continue at its one call site in the file, which
        becomes the home of the SDPA call."""
        sites = [call for call in _calls_to(self.parsed, self.function, self.owner)]
        through = _calls_through_objects(self.parsed, self.function, self.owner)
        if not sites and through:
            raise Refusal(f"the attention weights are returned to `{self._short(through[0])}`, a call through "
                          f"another object, which the rewrite does not follow (SDPA must replace the caller's "
                          f"value product)")
        if len(sites) != 1:
            raise Refusal("the attention weights are returned to the caller" if not sites else
                          "the attention weights are returned by a function called from several places")
        call = sites[0]
        caller = self._function_of(call)
        if caller is None or _single_return(self.function) is not returned:
            raise Refusal("the attention weights are returned to the caller")
        self._inlined[self.function] = (call, self._bind_arguments(self.function, call))
        self.home = caller
        self._merge_flow(caller)
        return call

    def _dotted_name(self, function: cst.FunctionDef) -> str:
        return next((name for f, _, name in self.parsed.functions if f is function), self.name)

    def _function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.parsed.parents.get(node)
        return node

    def _in_inlined(self, node: cst.CSTNode) -> bool:
        return self._function_of(node) in self._inlined

    # Q·K^T roles --------------------------------------------------------------------------------
    def _core_roles(self, core: Op, chain: _Chain, match: AttentionMatch) -> int | None:
        if core.name == "einsum":
            return self._einsum_roles(core, match)
        left, right = core.operands
        q_leaf, q_factors = self._strip_factors(left)
        k_leaf, k_factors = self._strip_factors(right)
        self._factors = q_factors + k_factors
        ndim = 3 if core.name in ("bmm", "baddbmm") else (self._ndim(q_leaf) or self._ndim(k_leaf))
        match.query = self._render(q_leaf)
        match.key = self._key_from_transposed(k_leaf, ndim)
        self._leaf_nodes = [q_leaf, k_leaf]
        if core.name == "baddbmm":
            self._baddbmm_terms(core, match)
        return ndim

    def _baddbmm_terms(self, core: Op, match: AttentionMatch) -> None:
        alpha, beta = core.params["alpha"], core.params["beta"]
        if alpha is not None:
            if not self.values.is_scalar(alpha):
                raise Refusal("baddbmm's alpha is not provably a Python number")
            self._factors.append(("mul", alpha))
        if beta is not None and number_value(beta) == 0:
            return
        if beta is not None and number_value(beta) != 1:
            raise Refusal("baddbmm's beta is neither 0 nor 1")
        bias = core.params["input"]
        match.masks.append(MaskTerm("float", self._render(bias), nodes=[bias], source=bias, same_dtype=True))

    def _absorb(self, op: Op) -> None:
        """A cast's arguments (`.type_as(scores)`, `.to(q.dtype)`) disappear with the block."""
        if isinstance(op.node, cst.Call):
            for arg in op.node.args:
                self._absorbed.update(loaded_names(arg.value))

    def _tensor_and_factor(self, op: Op) -> tuple[cst.BaseExpression, cst.BaseExpression | None]:
        """A mul/div op as (tensor, Python-number factor); the factor is None when none is provable.
        Multiplication commutes, so `s * x` and `x * s` both work; division only scales by its divisor."""
        tensor, factor = op.operands
        if op.name == "mul" and self.values.is_scalar(tensor) and not self.values.is_scalar(factor):
            tensor, factor = factor, tensor
        return (tensor, factor) if self.values.is_scalar(factor) else (tensor, None)

    def _strip_factors(self, node: cst.BaseExpression):
        factors = []
        while True:
            op = self.reader.read(node)
            if op is None or op.name not in ("mul", "div") or op.inplace:
                return node, factors
            tensor, factor = self._tensor_and_factor(op)
            if factor is None:
                return node, factors
            factors.append((op.name, factor))
            node = tensor

    def _key_from_transposed(self, node: cst.BaseExpression, ndim: int | None) -> str:
        """SDPA wants K as (..., S, E); the product used K^T. Undo a provable last-two-dims transpose,
        else transpose back explicitly (a view, always exact)."""
        op = self.reader.read(node)
        if op is not None and op.name == "mT":
            return self._render(op.operands[0])
        if op is not None and op.name == "transpose":
            dims = [int_value(d) for d in op.params["dims"]]
            if None not in dims and _last_two(dims, ndim):
                return self._render(op.operands[0])
        if op is not None and op.name == "permute":
            dims = [int_value(d) for d in op.params["dims"]]
            if None not in dims and len(dims) >= 2 and sorted(dims) == list(range(len(dims))):
                order = dims[:-2] + [dims[-1], dims[-2]]
                suffix = es.permutation_suffix(order, False)
                return self._render(op.operands[0], suffix)
        return self._render(node, ".transpose(-2, -1)")

    def _ndim(self, node: cst.BaseExpression, depth: int = 0) -> int | None:
        """Rank of a tensor when the source states it (view/reshape/permute/rearrange); else None."""
        if depth > 10:
            return None
        if isinstance(node, cst.Name):
            found = {self._ndim_of_definition(d, depth) for d in self.flow.definitions_of(node)}
            return found.pop() if len(found) == 1 else None
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            method, args = node.func.attr.value, node.args
            if method in ("view", "reshape") and args and not any(a.star for a in args):
                if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
                    return len(args[0].value.elements)
                return len(args)
            if method == "permute" and args:
                return len(args) if len(args) > 1 else None
            if method in ("transpose", "contiguous", "float", "half", "to", "type_as", "clone", "mul", "div"):
                return self._ndim(node.func.value, depth + 1)
        if isinstance(node, cst.Call):
            dotted = self.parsed.imported_name(node.func) or ""
            if dotted.endswith("rearrange") and len(node.args) >= 2 and \
                    isinstance(node.args[1].value, cst.SimpleString):
                return _einops_rank(node.args[1].value.evaluated_value)
        return None

    def _ndim_of_definition(self, definition: Definition, depth: int) -> int | None:
        if definition.kind != "assign":
            return None
        value = definition.value
        if definition.index is None:
            return self._ndim(value, depth + 1)
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
                value.func.attr.value in ("chunk", "split", "unbind"):
            base = self._ndim(value.func.value, depth + 1)
            return base - 1 if base and value.func.attr.value == "unbind" else base
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "map" \
                and value.args and isinstance(value.args[0].value, cst.Lambda):
            return self._ndim(value.args[0].value.body, depth + 1)
        return None

    def _einsum_roles(self, core: Op, match: AttentionMatch) -> int:
        query, key = core.operands
        try:
            (q_axes, k_axes), out_axes = self._spec(core)
            if len(out_axes) >= 2 and out_axes[-2] in k_axes and out_axes[-1] in q_axes:
                (q_axes, k_axes), (query, key) = (k_axes, q_axes), (key, query)  # 'bhjd,bhid->bhij', k, q
            layout = es.score_layout(q_axes, k_axes, out_axes)
        except es.EinsumMismatch as exc:
            raise Refusal(f"the Q·K^T einsum is not plain attention: {exc}") from None
        self._layout = layout
        self._has_ellipsis = es.ELLIPSIS in out_axes
        q_leaf, q_factors = self._strip_factors(query)
        k_leaf, k_factors = self._strip_factors(key)
        self._factors = q_factors + k_factors
        q_suffix = es.permutation_suffix(layout.q_order, self._has_ellipsis)
        k_suffix = es.permutation_suffix(layout.k_order, self._has_ellipsis)
        if q_suffix is None or k_suffix is None:
            raise Refusal("the einsum moves an ellipsis axis")
        k_suffix += es.broadcast_suffix(layout.k_unsqueeze)
        match.query, match.key = self._render(q_leaf, q_suffix), self._render(k_leaf, k_suffix)
        self._leaf_nodes = [q_leaf, k_leaf]
        return None if self._has_ellipsis else layout.ndim

    def _spec(self, op: Op):
        if op.params["spec"] is None:
            raise Refusal(f"the einsum spec `{self._short(op.params['spec_node'])}` is not a literal (an f-string "
                          f"with placeholders), so its axes cannot be read")
        inputs, output = es.parse_spec(op.params["spec"], op.params["einops"])
        if len(inputs) != 2:
            raise es.EinsumMismatch("the einsum does not take two operands")
        return inputs, output

    def _check_softmax_dim(self, softmax: Op, ndim: int | None) -> None:
        if softmax.name == "sequential":
            softmax = softmax.params["stages"][0]
        dim = int_value(softmax.params.get("dim"))
        if softmax.params.get("dim") is None:
            raise Refusal("softmax has no explicit dim, so the key dimension cannot be proved")
        if dim is None:
            raise Refusal(f"softmax's dim `{self._short(softmax.params['dim'])}` is not a literal")
        if dim != -1 and not (ndim is not None and dim == ndim - 1):
            raise Refusal(f"softmax runs over dim {dim}, which is not provably the key dimension")

    # forward: weights -> weights·V -----------------------------------------------------------------
    def _follow_weights(self, start: cst.CSTNode, ndim: int | None):
        node, dropouts, definitions, escapes = start, [], [], []
        self._weight_reads: set[cst.Name] = set()
        self._weights_transposed = False  # `V @ P^T` (channel-major VAE blocks) instead of `P @ V`
        for _ in range(MAX_CHAIN):
            parent = self.parsed.parents.get(node)
            definition = self._definition_of_value(node)
            if definition is not None:
                definitions.append(definition)
                node = self._next_weight_read(definition, escapes)
                self._weight_reads.add(node)
                continue
            if isinstance(parent, cst.Return) and self.home is self.function and not self._inlined:
                node = self._leave_to_caller(parent)
                continue
            consumers = self._consumers(node)
            consumer, op = consumers[0]
            if op is None:
                if isinstance(parent, (cst.Element, cst.Return)) or consumer is None:
                    raise Refusal("the attention weights are returned before any value product")
                raise Refusal(f"the attention weights flow into `{self._short(consumer)}`")
            if op.name in ("cast", "identity"):
                self._absorb(op)
                if op.name == "cast":
                    self._dtype_changes.append(op)
                node = op.node
            elif op.name == "dropout":
                dropouts.append(op)
                node = op.node
            elif op.name in ("transpose", "permute", "mT") and self._swaps_last_two(op, ndim):
                self._weights_transposed = not self._weights_transposed
                node = op.node
            elif op.name in ("matmul", "bmm") and op.operands[int(self._weights_transposed)] is node:
                return op, op.operands[1 - int(self._weights_transposed)], definitions, escapes, dropouts
            elif op.name == "einsum" and node in op.operands:
                other = op.operands[1] if op.operands[0] is node else op.operands[0]
                return op, other, definitions, escapes, dropouts
            elif op.name == "mul":
                raise Refusal(f"the attention weights are multiplied by "
                              f"`{self._short(op.operands[1] if op.operands[0] is node else op.operands[0])}` "
                              f"(a head mask or reweighting) before the value product")
            else:
                raise Refusal(f"the attention weights pass through `{self._short(op.node)}` before the value "
                              f"product (heads or positions are mixed)")
        raise Refusal("the weights are followed too far without reaching a value product")

    def _is_row_max_of(self, node: cst.BaseExpression, scores: cst.BaseExpression) -> bool:
        """`s - s.amax(dim=-1, keepdim=True).detach()`: softmax is invariant to a per-row shift."""
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "detach":
            node = node.func.value
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) \
                and int_value(node.slice[0].slice.value) == 0:
            node = node.value  # s.max(dim=-1, keepdim=True)[0]
        elif isinstance(node, cst.Attribute) and node.attr.value == "values":
            node = node.value
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("amax", "max")):
            return False
        dim = next((a.value for a in node.args if a.keyword is None or a.keyword.value == "dim"), None)
        keepdim = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "keepdim"), None)
        same = self.parsed.code(node.func.value).replace(" ", "") == self.parsed.code(scores).replace(" ", "")
        return same and int_value(dim) == -1 and isinstance(keepdim, cst.Name) and keepdim.value == "True"

    def _swaps_last_two(self, op: Op, ndim: int | None) -> bool:
        if op.name == "mT":
            return True
        dims = [int_value(d) for d in op.params["dims"]]
        if None in dims:
            return False
        if op.name == "transpose":
            return _last_two(dims, ndim)
        n = len(dims)
        return n >= 2 and dims == list(range(n - 2)) + [n - 1, n - 2]

    def _next_weight_read(self, definition: Definition, escapes: list[cst.Name]) -> cst.Name:
        """Of the reads of a weights variable, the one that continues the block; the others escape it."""
        continuing, others = [], []
        for read in self.flow.reads_of(definition):
            twin = {self._twin.id} if self._twin is not None and definition.id not in {self._twin.id} else set()
            if self.flow.reaching.get(read) not in (frozenset({definition.id}), frozenset({definition.id} | twin)):
                guarded = [self.flow.definitions[i] for i in self.flow.reaching.get(read, ()) if i != UNDEFINED
                           and self.flow.definitions[i].guards]
                where = f" under `if {self._short(guarded[-1].guards[-1].test)}`" if guarded else ""
                raise Refusal(f"the attention weights are reassigned{where} before the value product")
            consumer, op = self._consumers(read)[0]
            if isinstance(self.parsed.parents.get(read), cst.Return) and not self._inlined and \
                    _calls_to(self.parsed, self.function, self.owner):
                continuing.append(read)
            elif op is not None and (op.name in ("cast", "identity", "dropout", "transpose", "permute", "mT") or
                                   op.name in ("matmul", "bmm") or
                                   (op.name == "einsum" and read in op.operands)):
                continuing.append(read)
            elif op is not None and op.name in ("mul", "add", "sub", "div", "einsum", "matmul", "bmm",
                                                "softmax", "masked_fill", "where") and self._feeds_product(read):
                raise Refusal(f"the attention weights are transformed by `{self._short(op.node)}` "
                              f"before the value product")
            else:
                others.append(read)
        if len(continuing) != 1:
            raise Refusal("the attention weights are used by more than one operation" if continuing
                          else "the attention weights never reach a value product")
        escapes.extend(others)
        return continuing[0]

    def _value_roles(self, core: Op, output: Op, value_node, ndim, match: AttentionMatch) -> None:
        match.value = self._render(value_node)
        self._leaf_nodes.append(value_node)
        if self._weights_transposed:  # V @ P^T == (P @ V^T)^T
            match.value = self._render(value_node, ".transpose(-2, -1)")
            match.output_suffix = ".transpose(-2, -1)"
        if output.name == "einsum":
            if core.name != "einsum":
                raise Refusal("the value product is an einsum but the score product is not")
            try:
                (first, second), out_axes = self._spec(output)
                p_axes, v_axes = (first, second) if output.operands[1] is value_node else (second, first)
                layout = es.value_layout(self._layout, p_axes, v_axes, out_axes)
            except es.EinsumMismatch as exc:
                raise Refusal(f"the weights·V einsum is not plain attention: {exc}") from None
            v_suffix = es.permutation_suffix(layout.v_order, self._has_ellipsis)
            out_suffix = es.permutation_suffix(layout.out_order, self._has_ellipsis)
            if v_suffix is None or out_suffix is None:
                raise Refusal("the einsum moves an ellipsis axis")
            match.value = self._render(value_node, v_suffix + es.broadcast_suffix(layout.v_unsqueeze))
            match.output_suffix = out_suffix
        elif core.name == "einsum" and self._layout.ndim != (self._ndim(value_node) or self._layout.ndim):
            raise Refusal("V's rank differs from the scores' rank")

    def _dropout_role(self, dropouts: list[Op], match: AttentionMatch) -> None:
        if len(dropouts) > 1:
            raise Refusal("dropout is applied twice to the attention weights")
        if not dropouts:
            return
        op = dropouts[0]
        p = op.params.get("p")
        if p is None:
            p_code = "0.5"
        else:
            p_code = self._render(p)
            self._leaf_nodes.append(p)
        if number_value(p) == 0:
            return
        training = op.params.get("training")
        if training is None and not op.params.get("default_training", False):
            raise Refusal("dropout's training flag is not given")
        if training is None:
            match.dropout_p = p_code
            return
        if isinstance(training, cst.Name) and training.value in ("True", "False"):
            match.dropout_p = p_code if training.value == "True" else None
            return
        if not op.params.get("module"):
            self._leaf_nodes.append(training)
        match.dropout_p = f"{_atom(p_code)} if {self._render(training)} else 0.0"

    # scale and masks ----------------------------------------------------------------------------------
    def _scale_and_mask_roles(self, chain: _Chain, core: Op, match: AttentionMatch) -> None:
        applied = list(reversed(chain.ops))  # in the order the original applies them
        scale_positions = [i for i, (op, _) in enumerate(applied) if op.name in ("mul", "div")]
        self._views = [(i, op) for i, (op, _) in enumerate(applied) if op.name == "view"]
        if len(self._views) not in (0, 2):
            raise Refusal("the scores are reshaped without being reshaped back before softmax")
        for position, (op, guard) in enumerate(applied):
            if op.name in ("mul", "div"):
                self._factors.append((op.name, op.params["factor"]))
                continue
            if op.name == "view":
                continue
            term = self._mask_term(op, guard)
            if self._views and self._views[0][0] < position < self._views[1][0]:
                self._reshape_term(term)
            term.statement = self._statement(op.node)
            term.scaled_after = any(p > position for p in scale_positions)
            match.masks.append(term)
        match.scale = self._scale_code(match)
        for factor in self._factors:
            self._leaf_nodes.append(self.values.scalar_expression(factor[1]))
            self._scale_fact(factor[1], match)
        self._leaf_nodes.extend(guard.test for guard in self._factor_guards.values())
        for term in match.masks:
            if term.scaled_after and term.kind != "keep" and term.kind != "causal":
                raise Refusal("the scores are scaled after a finite or additive mask, which SDPA cannot express")

    def _scale_fact(self, factor: cst.BaseExpression, match: AttentionMatch) -> None:
        """SDPA's `scale` must be a Python number: a literal, a size, a math function, an int/float parameter or
        an attribute this class assigns only such values. A factor taken for one on weaker grounds (its name) is
        an assumption, and the patch that relies on it is unsafe."""
        code = self._short(factor)
        statement = f"`{code}` is a Python number, not a tensor"
        guess = self.values.scalar_guess(factor)
        if guess is None:
            match.facts.proved("scale-is-number", statement, "built from literals, sizes, math functions and "
                                                             "int/float values")
        else:
            match.facts.assumed("scale-is-number", statement, guess)

    def _mask_term(self, op: Op, guard: cst.If | None) -> MaskTerm:
        if op.name == "add":
            mask = op.operands[1] if op.params["chain_operand"] is op.operands[0] else op.operands[0]
            return MaskTerm("float", self._render(mask), guard=guard, nodes=[mask], source=mask, in_place=op.inplace)
        if op.name == "masked_fill":
            masked, fill = op.params["mask"], op.params["fill"]
            keep_given = False
        else:  # where(condition, scores, fill) keeps where True; where(condition, fill, scores) masks
            condition = op.params["condition"]
            chain_first = op.params["chain_operand"] is op.operands[0]
            fill = op.operands[1] if chain_first else op.operands[0]
            masked, keep_given = condition, chain_first
        kind = self.values.fill_kind(fill)
        if kind is None:
            raise Refusal(f"the mask fill value `{self._short(fill)}` is not provably -inf or a large negative "
                          f"number")
        keep = self._render(masked) if keep_given else _negate(self.parsed, masked)
        nodes = [masked]  # the fill is not emitted for boolean and causal masks
        fill_kind = mk.NEGINF if kind == "neginf" else mk.FINITE
        if self._is_causal_keep(keep, masked, keep_given):
            return MaskTerm("causal", keep, fill=self.parsed.code(fill), guard=guard, nodes=nodes,
                            fill_kind=fill_kind, source=masked, keeps_first_key=True)
        first = self._keeps_first_key(masked, keep_given)
        if kind == "neginf":
            return MaskTerm("keep", keep, guard=guard, nodes=nodes, fill_kind=fill_kind, source=masked,
                            keeps_first_key=first)
        masked_code = _negate(self.parsed, masked) if keep_given else self._render(masked)
        return MaskTerm("finite", masked_code, fill=self._render_fill(fill), guard=guard, nodes=[masked],
                        fill_kind=fill_kind, source=masked, keeps_first_key=first)

    def _reshape_term(self, term: MaskTerm) -> None:
        """A mask added while the scores were viewed as (b, h, L, S) and viewed back to (b*h, L, S)
        becomes `mask.expand(b, h, L, S).reshape(b*h, L, S)`: the same values in SDPA's layout."""
        (_, expand), (_, collapse) = self._views
        shapes = [expand.params["shape"], collapse.params["shape"]]
        if term.kind == "causal":
            term.kind = "keep"
        inferred = any(number_value(dim) == -1 for dim in shapes[0])  # expand() cannot infer a size
        term.reshape = tuple(", ".join(self._render(d) for d in shape) for shape in shapes) + (inferred,)
        term.nodes.extend(dim for shape in shapes for dim in shape)

    def _render_fill(self, fill: cst.BaseExpression) -> str:
        """`torch.finfo(scores.dtype).min` reads an intermediate that the rewrite removes: read the query."""
        chain_ids = {d.id for d in self._chain.definitions}
        replaced = {}
        for name in loaded_names(fill):
            if self.flow.reaching.get(name, frozenset()) <= chain_ids and self.flow.reaching.get(name):
                if not self._roots().same(name, self._leaf_nodes[0]):
                    raise Refusal(f"the mask fill reads `{name.value}`, whose dtype after a cast is not provably "
                                  f"the query's")
                replaced[name] = self._leaf_nodes[0]
                self._absorbed.add(name)
        if replaced and not isinstance(self._leaf_nodes[0], (cst.Name, cst.Attribute)):
            raise Refusal("the mask fill reads the scores' dtype and the query is not a plain name")
        return self.parsed.code(fill.visit(_Replace(replaced))) if replaced else self.parsed.code(fill)

    def _mask_base(self, masked: cst.BaseExpression) -> cst.BaseExpression:
        """The tensor a mask expression tests: `bias[...] == 0`, `~m`, `m.bool()` all read their operand."""
        base = masked
        while True:
            op = self.reader.read(base)
            if isinstance(base, cst.Comparison) and len(base.comparisons) == 1 and \
                    number_value(base.comparisons[0].comparator) in (0, 1):
                base = base.left
            elif isinstance(base, cst.UnaryOperation) and isinstance(base.operator, cst.BitInvert):
                base = base.expression
            elif op is not None and op.name in ("cast", "identity"):
                base = op.operands[0]
            elif isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) and not base.args \
                    and base.func.attr.value == "bool":  # nonzero is True: a 0/1 mask means the same
                base = base.func.value
            else:
                return base

    def _keeps_first_key(self, masked: cst.BaseExpression, keep_given: bool) -> bool:
        """`self.bias[:, :, S - L:S, :S]` (GPT-2): any rows of a lower triangle of ones, its columns sliced from
        0, keep key 0 in every row (row r keeps keys 0..r), so no query row is fully masked."""
        base, via = self._mask_base(masked), []
        definitions = self.flow.definitions_of(base) if isinstance(base, cst.Name) else []
        if len(definitions) == 1 and definitions[0].kind == "assign" and definitions[0].index is None:
            via = [definitions[0].value]  # `mask = self.bias[...].bool()`: its own `== 0` flips it too
            base = self._mask_base(definitions[0].value)
        if not (isinstance(base, cst.Subscript) and isinstance(base.value, cst.Attribute) and self.owner
                and isinstance(base.value.value, cst.Name) and base.value.value.value == "self"
                and len(base.slice) >= 2 and all(_is_full_slice(s) for s in base.slice[:-2])):
            return False
        rows, columns = (element.slice for element in base.slice[-2:])
        if not isinstance(rows, cst.Slice) or not isinstance(columns, cst.Slice) or columns.step is not None or \
                (columns.lower is not None and int_value(columns.lower) != 0):
            return False
        built = self.owner.only_value(base.value.attr.value)
        return built is not None and self._causal_polarity(_triangle(self.parsed, built), masked, keep_given, *via)

    def _is_causal_keep(self, keep: str, masked: cst.BaseExpression, keep_given: bool) -> bool:
        """The keep mask is a lower-triangular square of ones sliced [..., :T, :T]: `is_causal` is exact."""
        base = self._mask_base(masked)
        if isinstance(base, cst.Name):
            definitions = self.flow.definitions_of(base)
            if len(definitions) != 1 or definitions[0].kind != "assign" or definitions[0].index is not None:
                return False
            return self._causal_polarity(_triangle(self.parsed, definitions[0].value), masked, keep_given)
        if isinstance(base, cst.Subscript) and isinstance(base.value, cst.Attribute) \
                and isinstance(base.value.value, cst.Name) and base.value.value.value == "self" and self.owner:
            built = self.owner.only_value(base.value.attr.value)
            slices = base.slice
            if built is None or len(slices) < 2:
                return False
            leading, last_two = slices[:-2], slices[-2:]
            if not all(_is_full_slice(s) for s in leading):
                return False
            bounds = [_upper_bound(self.parsed, s) for s in last_two]
            if None in bounds or bounds[0] != bounds[1]:
                return False
            return self._causal_polarity(_triangle(self.parsed, built), masked, keep_given)
        if isinstance(base, cst.Call):
            return self._causal_polarity(_triangle(self.parsed, base), masked, keep_given)
        return False

    def _causal_polarity(self, triangle: str | None, masked: cst.BaseExpression, keep_given: bool,
                         *via: cst.BaseExpression) -> bool:
        """A lower triangle of ones marks attended positions, an upper one (diagonal=1) masked ones; the
        original must use it in the matching polarity (`== 0` and `~` flip it, in the mask expression or in
        the assignments `via` which it reads the triangle)."""
        if triangle is None:
            return False
        flipped = False
        for expression in (masked, *via):
            text = self.parsed.code(expression).replace(" ", "")
            flipped ^= text.endswith("==0") or text.startswith("~") or text.endswith("<1")
        true_means_attend = (triangle == "lower") != flipped
        return true_means_attend == keep_given

    def _assemble_mask(self, match: AttentionMatch) -> None:
        """One `attn_mask` (or `is_causal`) equal to the original's masks in SDPA's polarity."""
        terms = match.masks
        if not terms:
            return
        if len(terms) == 1 and terms[0].kind == "causal" and terms[0].guard is None:
            match.is_causal = True
            return
        if all(term.guard is None for term in terms):
            kinds = {"keep" if term.kind == "causal" else term.kind for term in terms}
            if len(terms) == 1:
                match.attn_mask = self._term_code(terms[0])
            elif kinds == {"keep"}:
                match.attn_mask = " & ".join(_atom(self._term_code(term)) for term in terms)
            elif kinds == {"float"}:
                match.attn_mask = " + ".join(_atom(self._term_code(term)) for term in terms)
            else:
                match.attn_mask = " + ".join(_atom(self._additive_code(term)) for term in terms)
            return
        if len(terms) == 1 and self.parsed.code(terms[0].guard.test).replace(" ", "") == \
                f"{self._term_code(terms[0])}isnotNone":
            match.attn_mask = self._term_code(terms[0])  # SDPA takes attn_mask=None as "no mask"
            return
        self._hoist_masks(match, terms)

    def _hoist_masks(self, match: AttentionMatch, terms: list[MaskTerm]) -> None:
        """Masks applied under `if`s are evaluated where the original applied them, into one variable that
        starts as None (SDPA's "no mask") and accumulates each term; several terms are added as floats."""
        if len({id(term.statement) for term in terms}) != len(terms):
            raise Refusal("two conditional masks are applied in one statement")
        if any(self._in_inlined(term.statement) for term in terms):
            raise Refusal("a conditional mask is applied inside a helper, and helpers are never edited")
        variable = self._fresh_name("attn_mask")
        first = terms[0]
        if first.guard is not None:  # the variable must exist when that `if` is not taken
            match.hoist_anchor, match.hoist_init = first.guard, f"{variable} = None"
        for position, term in enumerate(terms):
            if len(terms) == 1:
                match.hoisted[term.statement] = f"{variable} = {self._term_code(term)}"
            elif position == 0:
                match.hoisted[term.statement] = f"{variable} = {self._additive_code(term)}"
            elif first.guard is None:  # assigned unconditionally by the first term
                match.hoisted[term.statement] = f"{variable} = {variable} + {_atom(self._additive_code(term))}"
            else:
                code = _atom(self._additive_code(term))
                match.hoisted[term.statement] = f"{variable} = {code} if {variable} is None else {variable} + {code}"
            term.nodes = []  # evaluated in place: their names need not stay bound until the SDPA call
        match.attn_mask = variable

    def _additive_code(self, term: MaskTerm) -> str:
        """The term as a float mask in the query's dtype, for adding to other terms."""
        code = self._term_code(term)
        if term.kind in ("float", "finite"):
            return code
        torch_name, query = self._torch_and_query()
        return f"{torch_name}.where({code}, 0.0, float(\"-inf\")).to({query}.dtype)"

    def _plain_query(self) -> str | None:
        """The query as the SDPA call's site names it, when reading its dtype there costs nothing (a name or
        an attribute, never a call that would run twice)."""
        code = self._render(self._leaf_nodes[0])
        return code if isinstance(cst.parse_expression(code), (cst.Name, cst.Attribute)) else None

    # mask and dtype facts ---------------------------------------------------------------------------------
    def _roots(self) -> DtypeRoots:
        if self._dtype_roots is None:
            self._dtype_roots = DtypeRoots(self.parsed, self.owner, self.reader, self._flow_for, self._argument_of,
                                           self._helper_at, self._function_of, self.values.is_scalar)
        return self._dtype_roots

    def _argument_of(self, name: cst.Name) -> cst.BaseExpression | None:
        """The caller's argument for a parameter of an inlined helper."""
        function = self._function_of(name)
        if function not in self._inlined or not any(d.kind == "param" for d in self.flow.definitions_of(name)):
            return None
        return self._inlined[function][1].get(name.value)

    def _returned_by(self, call: cst.CSTNode) -> cst.BaseExpression | None:
        """What an inlined helper returns, at its call."""
        return next((_single_return(function).value for function, (site, _) in self._inlined.items()
                     if site is call and _single_return(function) is not None), None)

    def _helper_return(self, call: cst.Call) -> cst.BaseExpression | None:
        callee = self._callee(call)
        return _single_return(callee).value if callee is not None else None

    def _helper_at(self, call: cst.Call):
        """(what the helper called here returns, the helper, its parameters bound to this call's arguments);
        an inlined helper's parameters are already read as the caller's arguments."""
        returned = self._returned_by(call)
        if returned is not None:
            return returned, self._function_of(returned), {}
        callee = self._callee(call)
        if callee is None:
            return None
        try:
            bound = self._bind_arguments(callee, call)
        except Refusal:
            return None
        return _single_return(callee).value, callee, bound

    def _mask_and_dtype_facts(self, match: AttentionMatch, output: Op, value_node, ndim: int | None) -> None:
        """SDPA needs q, k, v of one dtype and masks of a rank and dtype it accepts; record what the source
        proves about them, and what fully masked rows do (see `masks`)."""
        roots = self._roots()
        query, key = self._leaf_nodes[0], self._leaf_nodes[1]
        weights = next(o for o in output.operands if o is not value_node)
        v_like_q = roots.same(value_node, query) or roots.same(value_node, key)
        floats = [term for term in match.masks if term.kind == "float" and not term.same_dtype]
        statement = "q, k and v have one dtype"
        if v_like_q:
            match.facts.proved("qkv-dtype", statement, "q and v come from one tensor, or one input through Linear "
                                                       "layers (which raise on another dtype)")
        elif roots.same(weights, query) or roots.same(weights, key):
            match.facts.proved("qkv-dtype", statement, "the weights reach the value product in the query's dtype, "
                                                       "and the value product raises unless v has theirs")
        elif floats and not self._dtype_changes:
            match.facts.proved("qkv-dtype", statement, "the value product gives v the scores' dtype, which is the "
                                                       "query's given the mask-dtype fact")
        else:
            match.facts.assumed("qkv-dtype", statement, f"the weights are cast "
                                f"(`{self._short(self._dtype_changes[-1].node)}`) before the value product, and "
                                f"nothing links v's dtype to q's" if self._dtype_changes else
                                "nothing links v's dtype to q's")
        for term in match.masks:
            if term.same_dtype:
                match.facts.proved("mask-dtype", f"the additive input `{self._short(term.source)}` has the query's "
                                   f"dtype", "baddbmm raises unless its input has its batches' dtype")
        for term in floats:
            mask_statement = f"the additive mask `{self._short(term.source)}` is not a float wider than the query"
            if self._plain_query() is None:
                match.facts.assumed("mask-dtype", f"the additive mask `{self._short(term.source)}` is a float of the "
                                    f"query's dtype", "the query is not a plain name to cast the mask to")
            elif self._dtype_changes:
                match.facts.assumed("mask-dtype", mask_statement, "a cast in the block hides its dtype (SDPA gets it "
                                    "cast to q's dtype, which changes a wider float mask)")
            elif term.in_place:
                match.facts.proved("mask-dtype", mask_statement, "added in place, so the original rounds the sum to "
                                   "the scores' dtype (the query's) where SDPA rounds the mask: equal up to that "
                                   "one rounding")
            elif v_like_q:
                match.facts.proved("mask-dtype", mask_statement, "a wider mask would make the weights, and so v, "
                                   "wider than q, but v and q share a dtype (SDPA gets the mask cast to q's dtype)")
            else:
                match.facts.assumed("mask-dtype", mask_statement, "its dtype is not visible here (SDPA gets it cast "
                                    "to q's dtype, which changes a wider float mask)")
        self._value_node = value_node
        self._mask_rank_fact(match, output, ndim)
        mk.record_row_facts(match.facts, match.masks)

    def _mask_rank_fact(self, match: AttentionMatch, output: Op, ndim: int | None) -> None:
        """SDPA takes masks of 2 to n dims for n-D scores (any rank up to 3 for 3-D ones); eager broadcasting
        also takes a 1-D mask, and a mask of more dims (giving a higher-rank output)."""
        sources = [term for term in match.masks if term.source is not None and term.reshape is None]
        if not sources or match.is_causal:
            return
        ranks = mk.RankBounds(self.parsed, self.owner, self.reader, self._ndim, self._reaching_values,
                              lambda call: self._returned_by(call) or self._helper_return(call),
                              self.values.is_scalar)
        bounds = [ranks.bounds(term.source) for term in sources]
        # the Q·K^T product broadcasts its batch dims: it has the rank of its larger operand
        leaves = [ranks.bounds(leaf) for leaf in self._leaf_nodes[:2]]
        low, high = (ndim, ndim) if ndim else mk.broadcast_bounds(leaves)
        # the most dims the weights can have, or the original raises: at the value product or after it
        upper = self._weights_rank(output) or self._output_rank(output)
        statement = "the mask has 2 to the scores' number of dims"
        few = [term for term, (least, _) in zip(sources, bounds) if least < 2 and (high is None or high > 3)]
        many = [] if upper is not None and upper <= max(low, 2) else \
            [term for term, (_, most) in zip(sources, bounds) if most is None or most > max(low, 2)]
        if not few and not many:
            match.facts.proved("mask-rank", statement, "its indexing, reshaping or creation bounds its rank, and "
                               "the product's operands (or the value product) the scores'")
        elif few:
            match.facts.assumed("mask-rank", statement, f"the rank of `{self._short(few[0].source)}` is not "
                                f"visible here, and SDPA rejects a 1-D mask on 4-D inputs")
        else:
            match.facts.assumed("mask-rank", statement, f"`{self._short(many[0].source)}` may have more dims than "
                                f"the scores (eager broadcasting then gives a higher-rank output; SDPA raises)")

    def _output_rank(self, output: Op) -> int | None:
        """The rank a `permute` of the output (through transposes, or one assignment) proves it has."""
        node = output.node
        for _ in range(6):
            parent = self.parsed.parents.get(node)
            call = self.parsed.parents.get(parent) if isinstance(parent, cst.Attribute) else None
            if isinstance(call, cst.Call) and call.func is parent and parent.attr.value == "permute":
                dims = [int_value(a.value) for a in call.args]
                if len(dims) == 1 and isinstance(call.args[0].value, (cst.Tuple, cst.List)):
                    dims = [int_value(e.value) for e in call.args[0].value.elements]
                return len(dims) if len(dims) > 1 and None not in dims else None
            if isinstance(call, cst.Call) and call.func is parent and parent.attr.value in ("transpose", "contiguous"):
                node = call
                continue
            definition = self._definition_of_value(node)
            reads = self._flow_for(node).reads_of(definition) if definition is not None else []
            if len(reads) != 1:
                return None
            node = reads[0]
        return None

    def _weights_rank(self, output: Op) -> int | None:
        """bmm takes 3-D operands only, and an einsum without an ellipsis operands of its spec's rank."""
        if output.name == "bmm":
            return 3
        if output.name == "einsum" and not self._has_ellipsis:
            (first, second), _ = self._spec(output)
            return len(first) if output.operands[0] is not self._value_node else len(second)
        return None

    def _reaching_values(self, name: cst.Name) -> list[cst.BaseExpression] | None:
        ids = self._flow_for(name).reaching.get(name)
        if not ids or UNDEFINED in ids:
            return None
        definitions = [self._flow_for(name).definitions[i] for i in ids]
        values = [_unpacked(d) if d.kind == "assign" else None for d in definitions]
        return None if None in values else values

    def _torch_and_query(self) -> tuple[str, str]:
        torch_name, query = self.parsed.module_aliases.get("torch"), self._plain_query()
        if torch_name is None or query is None:
            raise Refusal("the masks must be merged into a float mask in the query's dtype, and torch is not "
                          "imported or the query is not a plain name")
        return torch_name, query

    def _fresh_name(self, base: str) -> str:
        used = {name.value for name in loaded_names(self.function)} | \
            {d.name for d in self.flow.definitions.values()} | self._taken_names
        candidate, suffix = base, 0
        while candidate in used:
            suffix += 1
            candidate = f"{base}_{suffix}"
        self._taken_names.add(candidate)  # another block of this function may hoist a mask too
        return candidate

    def _term_code(self, term: MaskTerm) -> str:
        code = self._term_values(term)
        if term.reshape is None:
            return code
        expand, collapse, inferred = term.reshape
        if not inferred:
            return f"{_atom(code)}.expand({expand}).reshape({collapse})"
        # `scores.view(-1, w, h, L, S) + mask`: broadcast against a tensor of the scores' shape instead
        query, key = _atom(self._current.query), _atom(self._current.key)
        shape = f"(*{query}.shape[:-1], {key}.shape[-2])"
        if term.kind in ("float", "finite"):
            return f"({query}.new_zeros({shape}).view({expand}) + {_atom(code)}).view({collapse})"
        torch_name, _ = self._torch_and_query()
        return f"({query}.new_ones({shape}, dtype={torch_name}.bool).view({expand}) & {_atom(code)}).view({collapse})"

    def _term_values(self, term: MaskTerm) -> str:
        if term.kind == "float" and not term.same_dtype and self._plain_query():
            return f"{_atom(term.code)}.to({self._plain_query()}.dtype)"  # eager promotion adds the same values
        if term.kind != "finite":
            return term.code
        torch_name, query = self._torch_and_query()
        return f"{torch_name}.where({term.code}, {term.fill}, 0.0).to({query}.dtype)"

    def _scale_code(self, match: AttentionMatch) -> str | None:
        if not self._factors:
            return "1.0"
        if len(self._factors) == 1 and not self._factor_guards and self._is_default_scale(match, *self._factors[0]):
            return None
        parts, divisors = [], []
        for kind, factor in self._factors:
            code = self._render(self.values.scalar_expression(factor))
            if factor in self._factor_guards:
                test = self._render(self._factor_guards[factor].test)
                code = f"(1.0 if {test} else {code})" if factor in self._negated_factors else \
                    f"({code} if {test} else 1.0)"
            (parts if kind == "mul" else divisors).append(_atom(code))
        numerator = " * ".join(parts) if parts else "1.0"
        return numerator + "".join(f" / {d}" for d in divisors)

    def _is_default_scale(self, match: AttentionMatch, kind: str, factor: cst.BaseExpression) -> bool:
        """`/ math.sqrt(q.size(-1))`, `* k.size(-1) ** -0.5`, ...: exactly SDPA's default 1/sqrt(E), where
        E is the last dim of the query (and key) SDPA receives."""
        text = self.parsed.code(factor.with_changes(lpar=[], rpar=[])).replace(" ", "")
        leaves = "|".join(re.escape(code.replace(" ", "")) for code in (match.query, match.key))
        size = rf"\(?(?:{leaves})\.(?:size\(-1\)|shape\[-1\])\)?"
        root = rf"(?:math\.sqrt\({size}\)|{size}\*\*0\.5)"
        if kind == "div":
            return bool(re.fullmatch(root, text))
        return bool(re.fullmatch(rf"(?:1|1\.0?)/\(?{root}\)?|{size}\*\*\(?-0\.5\)?", text))

    # checks over the whole block --------------------------------------------------------------------
    def _check_reads(self, consumed: list[Definition], chain_reads: set[cst.Name], match) -> None:
        score_ids = {d.id for d in self._chain.definitions}
        for definition in consumed:
            for read in self.flow.reads_of(definition):
                if read not in chain_reads and read not in match.escapes and definition.id in score_ids:
                    translated = self._translate_metadata_read(read, match)
                    if translated is not None:
                        match.renamed[translated[0]] = translated[1]
                        continue
                if read not in chain_reads and read not in match.escapes:
                    raise Refusal(f"the intermediate `{definition.name}` is also used at line "
                                  f"{self.parsed.line(read)}")

    def _translate_metadata_read(self, read: cst.Name, match: AttentionMatch):
        """Reads of the scores' metadata survive the rewrite by reading Q and K instead: the scores have the
        query's dtype and device, shape (..., L, S) with L = Q.size(-2) and S = K.size(-2) in SDPA layout.
        Returns (node to replace, replacement code) or None."""
        if self._views:
            return None
        parent = self.parsed.parents.get(read)
        if not (isinstance(parent, cst.Attribute) and parent.value is read):
            return None
        query, key = _atom(match.query), _atom(match.key)
        attribute = parent.attr.value
        if attribute in ("dtype", "device"):
            return read, query
        outer = self.parsed.parents.get(parent)
        if attribute == "size" and isinstance(outer, cst.Call) and outer.func is parent and len(outer.args) == 1:
            dim = int_value(outer.args[0].value)
            return (outer, {-1: f"{key}.size(-2)", -2: f"{query}.size(-2)"}[dim]) if dim in (-1, -2) else None
        if attribute == "shape" and isinstance(outer, cst.Subscript) and len(outer.slice) == 1:
            index = outer.slice[0].slice
            if isinstance(index, cst.Index) and int_value(index.value) in (-1, -2):
                return outer, {-1: f"{key}.shape[-2]", -2: f"{query}.shape[-2]"}[int_value(index.value)]
            if isinstance(index, cst.Slice) and int_value(index.lower) == -2 and index.upper is None \
                    and index.step is None:
                return outer, f"({query}.shape[-2], {key}.shape[-2])"
        return None

    def _check_bindings(self, match: AttentionMatch, output_statement: cst.CSTNode) -> None:
        """Every name the SDPA call reads must mean at the value product what it meant where it was read."""
        env = self.flow.env_before.get(output_statement, {})
        nodes = list(self._leaf_nodes)
        for term in match.masks:
            nodes.extend(term.nodes)
        for call, _ in self._inlined.values():
            nodes.extend(arg.value for arg in call.args)
        for node in nodes:
            if self._in_inlined(node):
                continue
            for name in loaded_names(node):
                seen = self.flow.reaching.get(name)
                if seen is None:
                    continue
                now = env.get(name.value, frozenset({UNDEFINED}))
                if now == seen:
                    continue
                if seen <= {d.id for d in self._chain.definitions}:
                    use = self.parsed.parents.get(name, name)
                    if isinstance(self.parsed.parents.get(use), cst.Call):
                        use = self.parsed.parents[use]  # `s.size(-1)`, not `s.size`
                    raise Refusal(f"`{self._short(use)}` reads the scores, which the rewrite removes")
                raise Refusal(f"`{name.value}` is {self._how_rebound(now - seen)} between the scores and the value "
                              f"product")

    def _how_rebound(self, new: frozenset[int]) -> str:
        kinds = {self.flow.definitions[i].kind for i in new if i != UNDEFINED}
        if UNDEFINED in new and not kinds:
            return "deleted"
        return "written in place" if kinds and kinds <= {"store", "inplace", "aug"} else "reassigned"

    def _check_escapes(self, match: AttentionMatch) -> None:
        if not match.escapes:
            return
        where = ", ".join(sorted({str(self.parsed.line(read)) for read in match.escapes}))
        match.reason = (f"the attention weights are used outside the block (line {where}), and SDPA does not "
                        f"return them")
        score_ids = {d.id for d in self._chain.definitions}
        graph = self.flow.graph
        feedback = [d for d in self._weight_defs if d.id in graph and nx.descendants(graph, d.id) & score_ids]
        if feedback:  # residual attention: the weights reach the next iteration's scores
            match.unsafe_reason = (f"the weights `{feedback[0].name}` flow back into the scores (a loop), so they "
                                   f"cannot be replaced by None")
            return
        for read in match.escapes:
            parent = self.parsed.parents.get(read)
            if not isinstance(parent, (cst.Element, cst.Return, cst.Assign)):
                match.unsafe_reason = self._why_not_none(read, parent)
                return

    def _why_not_none(self, read: cst.Name, parent: cst.CSTNode) -> str:
        """Why the weights cannot simply be replaced by None where they escape, naming the real use."""
        line = self.parsed.line(read)
        if isinstance(parent, cst.Attribute) and parent.value is read:
            return f"the weights' `.{parent.attr.value}` is used at line {line}, and None has none"
        if isinstance(parent, cst.Arg):
            call = self.parsed.parents.get(parent)
            callee = self._short(call.func) if isinstance(call, cst.Call) else self._short(parent)
            return f"the weights are passed to `{callee}` at line {line}, which cannot take None"
        return f"the weights are used in `{self._short(parent)}` at line {line}, which cannot take None"

    # rendering ------------------------------------------------------------------------------------------
    def _render(self, node: cst.BaseExpression, suffix: str = "") -> str:
        code = self.parsed.code(self._as_home_expression(node))
        return (_atom(code) if suffix else code) + suffix

    def _as_home_expression(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """An expression of an inlined helper, with its parameters replaced by the call's arguments."""
        function = self._function_of(node)
        if function not in self._inlined:
            return node
        _, arguments = self._inlined[function]
        replaced = {}
        for name in loaded_names(node):
            definitions = self.flow.definitions_of(name)
            if any(d.kind != "param" for d in definitions):
                raise Refusal(f"`{name.value}`, local to `{function.name.value}`, is needed at the call site")
            if definitions:
                if name.value not in arguments:
                    raise Refusal(f"`{function.name.value}` is called without `{name.value}`")
                argument = arguments[name.value]
                replaced[name] = argument.with_changes(
                    lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if not _is_atom_node(argument) else argument
        return node.visit(_Replace(replaced)) if replaced else node

    def _short(self, node: cst.CSTNode) -> str:
        text = " ".join(self.parsed.code(node).split())
        return text if len(text) <= 60 else text[:57] + "..."


class _Replace(cst.CSTTransformer):
    """Replace given Name nodes (by identity) with other expressions."""

    def __init__(self, replacements: dict[cst.Name, cst.BaseExpression]) -> None:
        self.replacements = replacements

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.replacements.get(original_node, updated_node)


def _single_return(function: cst.FunctionDef) -> cst.Return | None:
    """The function's only `return`, when it is the last statement and returns a value."""
    body = function.body.body
    if not body or not isinstance(body[-1], cst.SimpleStatementLine) or not isinstance(body[-1].body[-1], cst.Return):
        return None
    last = body[-1].body[-1]
    finder = _ReturnFinder(function)
    function.visit(finder)
    return last if finder.returns == [last] and last.value is not None else None


class _CallFinder(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule, dotted: str) -> None:
        self.parsed, self.dotted, self.found = parsed, dotted, False

    def visit_Call(self, node: cst.Call) -> None:
        self.found = self.found or self.parsed.imported_name(node.func) == self.dotted


class _ReturnFinder(cst.CSTVisitor):
    def __init__(self, root: cst.FunctionDef) -> None:
        self.root, self.returns = root, []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.root

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.returns.append(node)


def _calls_to(parsed: ParsedModule, function: cst.FunctionDef, owner: ClassInfo | None) -> list[cst.Call]:
    """Call sites of a method (`self.name(...)` in its class) or of a module-level function (`name(...)`)."""
    name = function.name.value
    is_method = owner is not None and owner.methods.get(name) is function
    if not is_method and parsed.module_functions.get(name) is not function:
        return []
    finder = _CallSiteFinder(name, is_method)
    (owner.node if is_method else parsed.module).visit(finder)
    return finder.calls


def _calls_through_objects(parsed: ParsedModule, method: cst.FunctionDef, owner: ClassInfo | None) -> list[cst.Call]:
    """`attn.get_attention_scores(q, k)` or `self.attn.scores(q, k)` anywhere in the file, for a method no other
    class of the file defines: calls of this method through an object of its class, as far as names tell."""
    name = method.name.value
    if owner is None or owner.methods.get(name) is not method or \
            sum(1 for f, o, _ in parsed.functions if o is not None and f.name.value == name) != 1:
        return []
    finder = _CallSiteFinder(name, is_method=False, through_object=True)
    parsed.module.visit(finder)
    return finder.calls


class _CallSiteFinder(cst.CSTVisitor):
    def __init__(self, name: str, is_method: bool, through_object: bool = False) -> None:
        self.name, self.is_method, self.through_object, self.calls = name, is_method, through_object, []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self.through_object:
            hit = isinstance(func, cst.Attribute) and func.attr.value == self.name and \
                not (isinstance(func.value, cst.Name) and func.value.value == "self")
        elif self.is_method:
            hit = isinstance(func, cst.Attribute) and func.attr.value == self.name and \
                isinstance(func.value, cst.Name) and func.value.value == "self"
        else:
            hit = isinstance(func, cst.Name) and func.value == self.name
        if hit:
            self.calls.append(node)


def _method_on(consumer: cst.CSTNode | None, receiver: cst.CSTNode) -> str | None:
    """`view` for `receiver.view(...)`, `mT` for `receiver.mT`; None when `consumer` is no method of it."""
    if isinstance(consumer, cst.Call) and isinstance(consumer.func, cst.Attribute) and consumer.func.value is receiver:
        return consumer.func.attr.value
    if isinstance(consumer, cst.Attribute) and consumer.value is receiver:
        return consumer.attr.value
    return None


def _method_kind(function: cst.FunctionDef) -> str:
    """'static', 'class' or 'instance': what a call through `self.` binds to the first parameter."""
    names = {dec.decorator.value for dec in function.decorators if isinstance(dec.decorator, cst.Name)}
    return "static" if "staticmethod" in names else ("class" if "classmethod" in names else "instance")


def _unpacked(definition: Definition) -> cst.BaseExpression | None:
    """The value an assignment gives its name: the whole value, or its element in `a, b = x, y`."""
    value = definition.value
    if definition.index is None:
        return value
    if isinstance(value, (cst.Tuple, cst.List)) and definition.index < len(value.elements) and \
            not any(isinstance(e, cst.StarredElement) for e in value.elements):
        return value.elements[definition.index].value
    return None


def _is_atom_node(node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) or \
        bool(getattr(node, "lpar", ()))


def _unique(items: list) -> list:
    seen, out = set(), []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out


def _last_two(dims: list[int], ndim: int | None) -> bool:
    if sorted(dims) == [-2, -1]:
        return True
    if ndim is None:
        return False
    return sorted(d % ndim for d in dims) == [ndim - 2, ndim - 1]


def _atom(code: str) -> str:
    """Parenthesise code unless it is a name, attribute, call, subscript or literal."""
    try:
        node = cst.parse_expression(code)
    except cst.ParserSyntaxError:
        return f"({code})"
    return code if _is_atom_node(node) else f"({code})"


def _negate(parsed: ParsedModule, node: cst.BaseExpression) -> str:
    """The complement of a boolean mask (masked_fill and where raise on any other), written as simply as its
    form allows. `~m` running proves m bool (`~` raises on floats, and an int result would make the original
    raise); `m.logical_not()` is bool whatever m is."""
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and not node.lpar:
        target = node.comparisons[0]
        flipped = {cst.Equal: "!=", cst.NotEqual: "==", cst.LessThan: ">=", cst.GreaterThanEqual: "<",
                   cst.GreaterThan: "<=", cst.LessThanEqual: ">"}.get(type(target.operator))
        if flipped is not None:
            return f"{parsed.code(node.left)} {flipped} {parsed.code(target.comparator)}"
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return parsed.code(node.expression)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "logical_not" \
            and not node.args:  # `m` may be an int or float 0/1 mask: its complement's complement is `m.bool()`
        return f"{_atom(parsed.code(node.func.value))}.bool()"
    return f"~{_atom(parsed.code(node))}"


def _is_full_slice(element: cst.SubscriptElement) -> bool:
    s = element.slice
    return isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None


def _upper_bound(parsed: ParsedModule, element: cst.SubscriptElement) -> str | None:
    s = element.slice
    if isinstance(s, cst.Slice) and s.lower is None and s.step is None and s.upper is not None:
        return parsed.code(s.upper).replace(" ", "")
    return None


def _triangle(parsed: ParsedModule, node: cst.BaseExpression) -> str | None:
    """'lower' for `torch.tril(torch.ones(n, n))`, 'upper' for `torch.triu(torch.ones(n, n), diagonal=1)`
    (either spelling, then views/casts/bool/None-indexing); None for anything else, including non-squares."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            node.func.attr.value in ("view", "reshape", "bool", "to", "unsqueeze", "float", "byte", "int", "expand") \
            and isinstance(node.func.value, (cst.Call, cst.Subscript)):
        node = node.func.value
    while isinstance(node, cst.Subscript) and all(
            isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Name) and e.slice.value.value == "None"
            or _is_full_slice(e) for e in node.slice):
        node = node.value
    if not isinstance(node, cst.Call):
        return None
    dotted = parsed.imported_name(node.func)
    if dotted in ("torch.tril", "torch.triu") and node.args:
        kind, inner = dotted[-4:], node.args[0].value
        diagonal = next((a.value for a in node.args[1:] if a.keyword is None or a.keyword.value == "diagonal"), None)
    elif isinstance(node.func, cst.Attribute) and node.func.attr.value in ("tril", "triu") and dotted is None:
        kind, inner = node.func.attr.value, node.func.value
        diagonal = next((a.value for a in node.args if a.keyword is None or a.keyword.value == "diagonal"), None)
    else:
        return None
    wanted_diagonal = 0 if kind == "tril" else 1
    if (number_value(diagonal) if diagonal is not None else 0) != wanted_diagonal:
        return None
    if not (isinstance(inner, cst.Call) and parsed.imported_name(inner.func) == "torch.ones"):
        return None
    sizes = [a for a in inner.args if a.keyword is None]
    if len(sizes) == 1 and isinstance(sizes[0].value, (cst.Tuple, cst.List)):
        sizes = sizes[0].value.elements
    codes = [parsed.code(a.value).replace(" ", "") for a in sizes]
    if len(codes) != 2 or codes[0] != codes[1]:
        return None
    return "lower" if kind == "tril" else "upper"


def _einops_rank(pattern: str) -> int | None:
    if "->" not in pattern:
        return None
    right = pattern.split("->")[1]
    depth, count, token = 0, 0, False
    for char in right:
        if char == "(":
            depth += 1
            if depth == 1:
                count += 1
        elif char == ")":
            depth -= 1
        elif depth == 0:
            if char.isspace():
                token = False
            elif not token:
                token = True
                count += 1
        if char in "()":
            token = False
    return count
