"""Per-function def-use graph: which assignment each name read sees (reaching definitions).

The attention matcher walks values backwards (a name to the assignment it reads) and forwards (an
assignment to every place that reads it). Both need flow-sensitive answers: `attn = attn.softmax(-1)`
rebinds a name, `if mask is not None: scores = scores + mask` makes two definitions reach one read.
libcst's scope analysis is not flow-sensitive, so this module computes reaching definitions itself and
keeps them in a networkx graph (nodes: definitions; edges: definition -> definition that reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import networkx as nx

from advisor.static.tensor_views import is_library, storage_roots, view_aliases, writes_its_receiver
from advisor.static.walk import children, walk

UNDEFINED = -1  # marks "on some path this name is not bound here"

Env = dict[str, frozenset[int]]


@dataclass(eq=False)
class Definition:
    id: int
    name: str
    kind: str  # "assign", "aug", "inplace", "store" (`x[i] = v`, `out=x`), "param", "other"
    statement: cst.CSTNode | None  # the small statement (or compound statement) that binds the name
    value: cst.BaseExpression | None = None  # whole right-hand side ("assign"), operand ("aug"), call ("inplace")
    index: int | None = None  # position when bound by tuple unpacking
    guards: tuple[cst.If, ...] = ()  # enclosing `if` statements inside the function, outermost first
    negated: frozenset[cst.If] = frozenset()  # those of the guards whose `else:` (or `elif`) holds it
    previous: frozenset[int] = frozenset()  # "aug"/"inplace": the definitions this one updates
    annotation: cst.BaseExpression | None = None  # "param": its annotation
    default: cst.BaseExpression | None = None  # "param": its default value


@dataclass(eq=False)
class FunctionFlow:
    function: cst.FunctionDef
    definitions: dict[int, Definition] = field(default_factory=dict)
    reaching: dict[cst.Name, frozenset[int]] = field(default_factory=dict)  # read -> definitions it sees
    reads: dict[int, list[cst.Name]] = field(default_factory=dict)  # definition -> reads that see it
    env_before: dict[cst.CSTNode, Env] = field(default_factory=dict)  # small statement -> bindings before it
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)

    def merged_with(self, other: "FunctionFlow") -> "FunctionFlow":
        """A view over both functions: every map is keyed by node or by file-unique id, so a union is exact."""
        view = FunctionFlow(self.function)
        for part in (self, other):
            view.definitions.update(part.definitions)
            view.reaching.update(part.reaching)
            view.env_before.update(part.env_before)
            for def_id, reads in part.reads.items():
                view.reads.setdefault(def_id, []).extend(reads)
        view.graph = nx.compose(self.graph, other.graph)
        return view

    def definitions_of(self, read: cst.Name) -> list[Definition]:
        return [self.definitions[i] for i in sorted(self.reaching.get(read, ())) if i != UNDEFINED]

    def sees_undefined(self, read: cst.Name) -> bool:
        return UNDEFINED in self.reaching.get(read, ())

    def reads_of(self, definition: Definition) -> list[cst.Name]:
        return self.reads.get(definition.id, [])


def loaded_names(node: cst.CSTNode) -> list[cst.Name]:
    """Names read by an expression, in source order; lambda and comprehension variables excluded."""
    collector = _LoadCollector()
    walk(node, collector)
    return collector.names


class _LoadCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: list[cst.Name] = []
        self.bound: list[set[str]] = []

    def visit_Name(self, node: cst.Name) -> None:
        if not any(node.value in scope for scope in self.bound):
            self.names.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        walk(node.value, self)
        return False  # `.attr` is not a read of a local name

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(node.value, self)  # `keyword=` is not a read
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        params = {p.name.value for p in _all_params(node.params)}
        self.bound.append(params)
        walk(node.body, self)
        self.bound.pop()
        return False

    def _comprehension(self, node) -> bool:
        targets: set[str] = set()
        clause = node.for_in
        while clause is not None:
            targets |= {n.value for n in target_names(clause.target)}
            clause = clause.inner_for_in
        self.bound.append(targets)
        clause = node.for_in
        first = True
        while clause is not None:
            if first:  # the first iterable is evaluated outside the comprehension's scope
                self.bound.pop()
                walk(clause.iter, self)
                self.bound.append(targets)
                first = False
            else:
                walk(clause.iter, self)
            for condition in clause.ifs:
                walk(condition, self)
            clause = clause.inner_for_in
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                walk(getattr(node, part), self)
        self.bound.pop()
        return False

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension


def contains_call(node: cst.CSTNode) -> bool:
    """Whether evaluating the expression may run user code (so it cannot be re-evaluated or dropped)."""
    return isinstance(node, cst.Call) or any(contains_call(child) for child in children(node))


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    out = list(params.posonly_params) + list(params.params) + list(params.kwonly_params)
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            out.append(star)
    return out


def _capture_names(pattern: cst.MatchPattern) -> list[cst.Name]:
    """Names a `case` pattern binds (`case [x, *rest]`, `case {"k": v, **others}`, `case Point(x=px) as p`)."""
    names: list[cst.Name] = []

    class Captures(cst.CSTVisitor):
        def visit_MatchAs(self, node: cst.MatchAs) -> None:
            if node.name is not None:
                names.append(node.name)

        def visit_MatchStar(self, node: cst.MatchStar) -> None:
            if node.name is not None:
                names.append(node.name)

        def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
            if node.rest is not None:
                names.append(node.rest)

    walk(pattern, Captures())
    return names


def bound_names(statement: cst.CSTNode) -> list[cst.Name]:
    """The names an assignment statement binds (`a = b = v`, `a, b = v`, `a: T = v`, `a += v`)."""
    if isinstance(statement, cst.Assign):
        return [n for target in statement.targets for n in target_names(target.target)]
    if isinstance(statement, (cst.AnnAssign, cst.AugAssign)):
        return target_names(statement.target)
    return []


def target_names(target: cst.BaseExpression) -> list[cst.Name]:
    """The names an assignment or loop target binds (`a`, `a, (b, *c)`), in order."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in target_names(el.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


class _FlowBuilder:
    """Walks a function body once, in order, threading the environment of reaching definitions."""

    def __init__(self, function: cst.FunctionDef, first_id: int, off: frozenset[cst.If | cst.IfExp] = frozenset(),
                 on: frozenset[cst.If | cst.IfExp] = frozenset(), libraries: frozenset[str] = frozenset()) -> None:
        self.flow = FunctionFlow(function)
        self._libraries = libraries
        self._off, self._on = off, on
        self._hidden = frozenset(name for node in off | on if isinstance(node, cst.IfExp)  # the branch never taken
                                 for name in loaded_names(node.orelse if node in on else node.body))
        self._next_id = first_id
        self._made: dict[tuple[int, str, int | None], Definition] = {}  # a loop body is walked more than once
        self._in_else: set[cst.If] = set()
        self._jumps: list[dict[type, Env]] = []  # per enclosing loop: bindings at its `continue`s and `break`s
        self._at: tuple = (function, ())  # the statement being walked, and its `if` guards
        self._aliases: dict[str, frozenset[str]] | None = None  # read at the first write: `aliases`

    def build(self) -> FunctionFlow:
        env: Env = {}
        for param in _all_params(self.flow.function.params):
            definition = self._define(param.name.value, "param", param, env, ())
            definition.annotation = param.annotation.annotation if param.annotation else None
            definition.default = param.default
        self._block(self.flow.function.body, env, ())
        return self.flow

    # -- definitions and reads -------------------------------------------------------------------
    def _define(self, name: str, kind: str, statement, env: Env, guards, **fields) -> Definition:
        key = (id(statement), name, fields.get("index"))
        definition = self._made.get(key)
        if definition is None:
            definition = Definition(self._next_id, name, kind, statement, guards=guards,
                                    negated=frozenset(self._in_else), **fields)
            self._next_id += 1
            self._made[key] = definition
            self.flow.definitions[definition.id] = definition
            self.flow.graph.add_node(definition.id, name=name)
        else:  # walked again inside a loop: what it updates may now include a later iteration's value
            definition.previous = definition.previous | fields.get("previous", frozenset())
        env[name] = frozenset({definition.id})
        return definition

    def _read(self, node: cst.CSTNode, env: Env) -> None:
        for name in self._loads(node):
            seen = env.get(name.value, frozenset({UNDEFINED}))
            before = self.flow.reaching.get(name, frozenset())
            self.flow.reaching[name] = seen | before  # a loop's later walk only adds definitions
            for def_id in seen - before:
                if def_id != UNDEFINED:
                    self.flow.reads.setdefault(def_id, []).append(name)
        for target in _walrus_targets(node):  # `(q := q * 2)` rebinds q for the rest of the function
            statement, guards = self._at
            self._define(target.value, "other", statement, env, guards)

    def _loads(self, node: cst.CSTNode) -> list[cst.Name]:
        """The names `node` reads, but those in the branch of an `off` conditional expression (never taken)."""
        names = loaded_names(node)
        return [name for name in names if name not in self._hidden] if self._hidden else names

    def _link(self, definition: Definition, sources: list[cst.Name]) -> None:
        for name in sources:
            for def_id in self.flow.reaching.get(name, ()):
                if def_id != UNDEFINED:
                    self.flow.graph.add_edge(def_id, definition.id)

    # -- statements --------------------------------------------------------------------------------
    def _block(self, block, env: Env, guards) -> Env:
        body = block.body if isinstance(block, (cst.IndentedBlock, cst.SimpleStatementSuite)) else block
        for statement in body:
            env = self._statement(statement, env, guards)
        return env

    def _statement(self, statement, env: Env, guards) -> Env:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self._small(small, env, guards)
            return env
        if isinstance(statement, cst.BaseSmallStatement):  # the body of a one-line `if f: x = v` (a suite)
            self._small(statement, env, guards)
            return env
        if isinstance(statement, cst.If):
            self._mark(statement, env, guards)
            self._read(statement.test, env)
            inner = guards + (statement,)
            taken = None if statement in self._off else self._block(statement.body, dict(env), inner)
            if statement in self._on:  # its test holds where this flow runs: its `else:` never does
                return taken
            self._in_else.add(statement)
            if statement.orelse is None:
                other = env
            elif isinstance(statement.orelse, cst.If):
                other = self._statement(statement.orelse, dict(env), inner)
            else:
                other = self._block(statement.orelse.body, dict(env), inner)
            self._in_else.discard(statement)
            return other if taken is None else _merge(taken, other)
        if isinstance(statement, (cst.For, cst.While)):
            return self._loop(statement, env, guards)
        if isinstance(statement, cst.With):
            self._mark(statement, env, guards)
            for item in statement.items:
                self._read(item.item, env)
                if item.asname is not None:
                    for name in target_names(item.asname.name):
                        self._define(name.value, "other", statement, env, guards)
            return self._block(statement.body, env, guards)
        if isinstance(statement, (cst.Try, cst.TryStar)):
            self._mark(statement, env, guards)
            merged, current = dict(env), dict(env)
            for inner in statement.body.body:  # an exception may leave the body after any statement
                current = self._statement(inner, current, guards + (statement,))
                merged = _merge(merged, current)
            for handler in statement.handlers:
                caught, name = dict(merged), handler.name.name if handler.name is not None else None
                if isinstance(name, cst.Name):  # `except E as q:` binds q, and unbinds it when the handler ends
                    self._define(name.value, "other", statement, caught, guards + (statement,))
                caught = self._block(handler.body, caught, guards + (statement,))
                if isinstance(name, cst.Name):
                    caught[name.value] = frozenset({UNDEFINED})
                merged = _merge(merged, caught)
            for extra in (statement.orelse, statement.finalbody):
                if extra is not None:
                    merged = self._block(extra.body, merged, guards)
            return merged
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            self._mark(statement, env, guards)
            self._define(statement.name.value, "other", statement, env, guards)
            return env
        if isinstance(statement, cst.Match):  # each case like an `if` branch; none taken is a path too
            self._mark(statement, env, guards)
            self._read(statement.subject, env)
            merged = env
            for case in statement.cases:
                case_env = dict(env)
                for name in _capture_names(case.pattern):
                    self._define(name.value, "other", statement, case_env, guards)
                if case.guard is not None:
                    self._read(case.guard, case_env)
                merged = _merge(merged, self._block(case.body, case_env, guards + (statement,)))
            return merged
        return env  # other rare forms: bindings inside are not tracked

    def _loop(self, statement: cst.For | cst.While, env: Env, guards) -> Env:
        """Walk the body until the bindings at the loop top are stable: a definition made in one iteration
        reaches the reads of the next (and the iterable or test, re-evaluated each time)."""
        head = dict(env)
        self._jumps.append({})
        while True:
            self._jumps[-1].clear()
            self._mark(statement, head, guards)
            self._read(statement.iter if isinstance(statement, cst.For) else statement.test, head)
            inner_env = dict(head)
            if isinstance(statement, cst.For):
                for name in target_names(statement.target):
                    self._define(name.value, "other", statement, inner_env, guards)
            after = self._block(statement.body, inner_env, guards + (statement,))
            jumps = self._jumps[-1]
            widened = _merge(head, after)
            if cst.Continue in jumps:  # a `continue` goes back to the loop top with what it had bound
                widened = _merge(widened, jumps[cst.Continue])
            if widened == head:
                break
            head = widened
        jumps = self._jumps.pop()
        if statement.orelse is not None:
            head = self._block(statement.orelse.body, head, guards)
        return _merge(head, jumps[cst.Break]) if cst.Break in jumps else head

    def _mark(self, statement, env: Env, guards) -> None:
        before = self.flow.env_before.get(statement, {})
        self.flow.env_before[statement] = _merge(before, env) if before else dict(env)
        self._at = (statement, tuple(g for g in guards if isinstance(g, cst.If)))  # where `(x := v)` binds

    def _small(self, small: cst.BaseSmallStatement, env: Env, guards) -> None:
        self._mark(small, env, guards)
        if_guards = tuple(g for g in guards if isinstance(g, cst.If))
        if isinstance(small, cst.Assign):
            self._read(small.value, env)
            for target in small.targets:
                self._read_target_parts(target.target, env)
            sources = self._loads(small.value)
            for target in small.targets:
                self._bind(target.target, small.value, small, env, if_guards, sources)
                self._stores(target.target, small, env, if_guards)
        elif isinstance(small, cst.Del):
            self._read_target_parts(small.target, env)
            for name in target_names(small.target):
                env[name.value] = frozenset({UNDEFINED})  # a read after `del x` raises: nothing reaches it
        elif isinstance(small, cst.AnnAssign):
            if small.value is not None:
                self._read(small.value, env)
                self._bind(small.target, small.value, small, env, if_guards, self._loads(small.value))
        elif isinstance(small, cst.AugAssign):
            self._read(small.value, env)
            self._read(small.target, env)
            if isinstance(small.target, (cst.Subscript, cst.Attribute)):  # `x[i] += v`, `x.data *= 2`; on a name,
                self._store(small.target, small, env, if_guards)  # the "aug" definition below
            if isinstance(small.target, cst.Name):
                previous = env.get(small.target.value, frozenset())
                definition = self._define(small.target.value, "aug", small, env, if_guards,
                                          value=small.value, previous=previous)
                self._link(definition, self._loads(small.value) + [small.target])
                self._written_through([small.target.value], small, env, if_guards)
        elif isinstance(small, cst.Expr):
            self._read(small.value, env)
            receiver = _inplace_receiver(small.value)
            if receiver is not None:
                previous = env.get(receiver.value, frozenset())
                definition = self._define(receiver.value, "inplace", small, env, if_guards,
                                          value=small.value, previous=previous)
                self._link(definition, self._loads(small.value))
                self._written_through([receiver.value], small, env, if_guards)
            elif isinstance(small.value, cst.Call) and is_inplace_method(small.value.func):  # `m[:, :p].fill_(1)`
                self._store(small.value.func.value, small, env, if_guards)
        elif isinstance(small, (cst.Continue, cst.Break)) and self._jumps:
            jumps = self._jumps[-1]
            jumps[type(small)] = _merge(jumps[type(small)], env) if type(small) in jumps else dict(env)
        elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
            for alias in small.names:  # `import math as q` inside the function rebinds q there
                bound = alias.asname.name if alias.asname is not None else alias.name
                while isinstance(bound, cst.Attribute):  # `import a.b` binds a
                    bound = bound.value
                if isinstance(bound, cst.Name):
                    self._define(bound.value, "other", small, env, if_guards)
        else:
            for child in children(small):
                if isinstance(child, cst.BaseExpression):
                    self._read(child, env)
        written, called = _written_in(small)  # a name this function never binds (a function of the module, as
        # `l2norm` beside q in `map(l2norm, (q, k))`) holds no method of one of its tensors
        called = [c for c in called if not isinstance(c, cst.Name) or c.value in env and self.aliases.get(c.value)]
        for target in written + called:
            self._store(target, small, env, if_guards)  # `out=x`, `y = x.add_(1)`, `cb = x.mul_; cb(2)`

    def _store(self, target, statement, env: Env, guards) -> None:
        """`x[i] = v`, `x[i] += v`, `out=x`, `x.narrow(0, 0, 2).fill_(1)`: the tensor x is written in place, which
        is a new value of x (for a name; writes through attributes are checked where they matter, see
        patterns.scope), and of every name x may view or be viewed by."""
        roots = storage_roots(target, self._libraries)
        self._written_through([root.value for root in roots], statement, env, guards, themselves=True)

    @property
    def aliases(self) -> dict[str, frozenset[str]]:
        """The function's names that may share storage (a write through one writes what it may view), read once."""
        if self._aliases is None:
            self._aliases = view_aliases(self.flow.function, self._libraries)
        return self._aliases

    def _written_through(self, names: list[str], statement, env: Env, guards, themselves: bool = False) -> None:
        """A "store" definition of each name whose storage a write of `names` may change besides them (`m2 =
        mask[:, :p]; m2 += 1`), and of `names` themselves unless the write defines them already (`x += v`)."""
        shared = {alias for written in names for alias in self.aliases.get(written, ())} - set(names)
        for name in [*names, *sorted(shared)] if themselves else sorted(shared):
            if name in env:
                self._define(name, "store", statement, env, guards, previous=env.get(name, frozenset()))

    def _read_target_parts(self, target, env: Env) -> None:
        """`self.x[i] = v` and `obj.attr = v` read names on the left-hand side too; `x[i] = v` also writes x."""
        if isinstance(target, (cst.Attribute, cst.Subscript)):
            self._read(target, env)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._read_target_parts(element.value, env)

    def _stores(self, target, statement, env: Env, guards) -> None:
        if isinstance(target, cst.Subscript):
            self._store(target, statement, env, guards)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._stores(element.value, statement, env, guards)

    def _bind(self, target, value, statement, env: Env, guards, sources) -> None:
        if isinstance(target, cst.Name):
            definition = self._define(target.value, "assign", statement, env, guards, value=value)
            self._link(definition, sources)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for position, element in enumerate(target.elements):
                for name in target_names(element.value):
                    definition = self._define(name.value, "assign", statement, env, guards, value=value,
                                              index=position)
                    self._link(definition, sources)


def expression_root(node: cst.BaseExpression) -> cst.BaseExpression:
    """What a chain of attributes, subscripts and calls starts from (`box` of `box.t[0].mul_`, `Ops` of
    `Ops.norm(q)`): a Name where the chain starts at one."""
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node


def is_self(node: cst.BaseExpression) -> bool:
    """`self`: the instance a method runs on."""
    return isinstance(node, cst.Name) and node.value == "self"


def is_self_attribute(node: cst.CSTNode) -> bool:
    """`self.x`: an attribute of the instance a method runs on."""
    return isinstance(node, cst.Attribute) and is_self(node.value)


def is_inplace_method(func: cst.BaseExpression) -> bool:
    """`x.fill_`, `x.add_`: a trailing underscore is torch's naming for methods that write their receiver; so do
    the operator methods `x.__setitem__`, `x.__imul__`."""
    return isinstance(func, cst.Attribute) and writes_its_receiver(func.attr.value)


def _inplace_receiver(expression: cst.BaseExpression) -> cst.Name | None:
    """`x.masked_fill_(...)` as a statement rebinds x's value: treat it as a definition of x."""
    if isinstance(expression, cst.Call) and is_inplace_method(expression.func) \
            and isinstance(expression.func.value, cst.Name):
        return expression.func.value
    return None


def _written_in(small: cst.BaseSmallStatement) -> tuple[list[cst.BaseExpression], list[cst.BaseExpression]]:
    """What the calls of a statement may write in place, besides a statement that is itself one in-place call (read
    above): `out=` arguments, the receiver of an in-place method called inside an expression (`y = x.add_(1)`,
    `x.__imul__(2)`) and the first argument of one called unbound (`torch.Tensor.fill_(x, 1)`), and what a call of
    a value may be (`cb(2)` where `cb = x.mul_`, `partial(torch.Tensor.mul_, x)(2)`: tensor_views joins a bound
    in-place method to its tensor): (what is written, the values called)."""
    visitor = _Writes(small.value if isinstance(small, cst.Expr) else None)
    walk(small, visitor)
    return visitor.found, visitor.called


class _Writes(cst.CSTVisitor):
    """`_written_in`'s walk of one statement (`own`: the statement's own call, read by the caller)."""

    def __init__(self, own: cst.BaseExpression | None):
        self.own = own
        self.found: list[cst.BaseExpression] = []
        self.called: list[cst.BaseExpression] = []

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "out":
            self.found.append(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if is_inplace_method(func):
            if is_library(func.value):
                self.found.extend(arg.value for arg in node.args[:1] if arg.keyword is None)
            elif node is not self.own:
                self.found.append(func.value)
        elif isinstance(func, (cst.Name, cst.Call)):
            self.called.append(func)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _merge(left: Env, right: Env) -> Env:
    merged: Env = {}
    for name in set(left) | set(right):
        merged[name] = left.get(name, frozenset({UNDEFINED})) | right.get(name, frozenset({UNDEFINED}))
    return merged


def _walrus_targets(node: cst.CSTNode) -> list[cst.Name]:
    """The names `node`'s assignment expressions bind in the function (those in comprehensions too, as Python
    binds them; not those of a lambda's own scope), in source order."""
    collector = _WalrusCollector()
    walk(node, collector)
    return collector.targets


class _WalrusCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.targets: list[cst.Name] = []

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        if isinstance(node.target, cst.Name):
            self.targets.append(node.target)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def build_flow(function: cst.FunctionDef, first_id: int = 0, off: frozenset[cst.If | cst.IfExp] = frozenset(),
               on: frozenset[cst.If | cst.IfExp] = frozenset(),
               libraries: frozenset[str] = frozenset()) -> FunctionFlow:
    """Definition ids start at `first_id`: give each function of a file its own range, so that flows of a
    caller and a callee can be merged into one view when attention is split across them. The `if` statements and
    conditional expressions in `off` are never taken (the flow of the function where their test is false; their
    bodies are not read), those in `on` always are (their `else` is not read). `libraries`: the module's names of
    library functions (`tensor_views.storage_roots`)."""
    return _FlowBuilder(function, first_id, off, on, libraries).build()
