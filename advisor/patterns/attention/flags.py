"""Weights that leave only on request, and scores changed on one path only: `if output_attentions:` (fairseq's
`if need_weights:`) reshapes, keeps or returns the weights, so with the flag on the block cannot be SDPA, but with
it off the weights never leave; `if self.rel_pos is not None: attn = self.rel_pos(attn)` (a module applied to the
scores, which no role reads) or `if self.training: attn = attn + noise(attn)` changes the scores before the softmax
where the test holds, and the other paths (`elif bias is not None: attn = attn + bias`, or none) may be SDPA's.

The block is then proved in the function as it runs with the flag off: the flow reads the `if <flag>:` statements
after the softmax (`if head_mask is not None: w = w * head_mask` too: with no head mask it is not taken), those of
every flag at once (T5 multiplies by a head mask and returns the weights under `if output_attentions:`), or one
`if` before the softmax that binds a name the softmax reads, as not taken, and an `if not <flag>:` after the
softmax (Llama's `if not output_attentions: attn_weights = None`) as taken (`Candidate.off` holds them all); every
path left is proved as any other (a bias added under `elif x is not None:` becomes the mask SDPA gets). The patch
branches on the flag where the block starts: the SDPA path, with those statements replaced by their `else:`
(`match.unwrap`) or body (`match.take`), where the flag is off, and the original statements, verbatim, where it
is on. The flag must hold the same value at the branch and at each `if`, and its truth test must run no code and
read no tensor: proved where every binding that reaches it is a `bool`-annotated parameter or a bool/None literal,
or where the test is an identity comparison with None (`x is not None`, a bool whatever x is), otherwise checked at
run time (`flag is None or flag is False`).
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from advisor.patterns import scope
from advisor.patterns.attention.candidate import Candidate, FunctionScope, is_negation, statement_of
from advisor.patterns.attention.guards import holds_at, span_of
from advisor.patterns.attention.result import AttentionMatch, Refusal
from advisor.patterns.ops import Op
from advisor.static.codegen import joined
from advisor.static.dataflow import Definition, loaded_names
from advisor.static.module_index import ParsedModule
from advisor.static.walk import walk

FLAG = "flag-is-bool"
MAX_FLAGS = 3  # flags tried per softmax: each try is one more proof of the block
BOOL_ANNOTATIONS = {"bool", "Optional[bool]", "typing.Optional[bool]", "bool|None", "None|bool"}


def flag_worlds(shared: FunctionScope, softmax: Op) -> list[frozenset[cst.If | cst.IfExp]]:
    """Per flag (a name or attribute chain tested alone, or compared with None, by an `if` statement after the
    softmax), those `if` statements: read as not taken, they give the function as it runs with that flag off; then
    all of them at once, where there are several flags. Then each `if` before
    the softmax whose test runs no code (a flag, or `x is None`, `x is not None`) and that binds a name the
    softmax reads: read as not taken, it gives the function on the paths where the scores skip that branch."""
    parsed = shared.parsed
    at = parsed.line(statement_of(parsed, softmax.node))
    collector = _FlagIfs()
    walk(shared.function.body, collector)
    groups: dict[str, list[cst.If]] = {}
    for node in collector.found:
        if parsed.line(node) > at:
            groups.setdefault(parsed.code(flag_of(node)), []).append(node)
    read = {name.value for name in loaded_names(softmax.operands[0])}
    flow = parsed.flow(shared.function)
    paths = [frozenset({node}) for node in collector.found
             if parsed.end_line(node) < at and not is_negation(node.test) and any(
                 node in d.guards and d.name in read for d in flow.definitions.values())]
    alone = [frozenset(group) for group in groups.values()][:MAX_FLAGS]
    together = [frozenset(node for group in groups.values() for node in group)] if len(groups) > 1 else []
    return (alone + together + paths)[:MAX_FLAGS + 1]


def by_flag(parsed: ParsedModule, off: frozenset[cst.If | cst.IfExp]) -> list[frozenset[cst.If | cst.IfExp]]:
    """The statements and expressions of `off` grouped by the flag they test."""
    groups: dict[str, set[cst.If | cst.IfExp]] = {}
    for node in off:
        groups.setdefault(parsed.code(flag_of(node)), set()).add(node)
    return [frozenset(group) for _, group in sorted(groups.items())]


def stays_inside(match: AttentionMatch | None) -> bool:
    """A proof in the flag-off world that the patch can use: every role proved and no weights leaving."""
    return match is not None and match.output_node is not None and not match.escapes and match.reason is None


def plan_flag(c: Candidate, output_statement: cst.CSTNode) -> None:
    """The branch on the flag (`match.flag_test`, or a guard check of it) and the `if` statements the SDPA path
    replaces by their `else:`; a Refusal where the branch cannot be placed or the flag can change before an `if`."""
    if not c.off:
        return
    match, parsed = c.match, c.parsed
    if c.home is not c.function:  # helpers the block calls (`self._scores(q, k)`) stay where they are
        raise Refusal("the block leaves its function, where the flag's branch cannot follow it")
    if scope.is_scripted(parsed, c.home, c.owner):
        raise Refusal("the function is compiled by TorchScript, where each branch must bind the same names")
    match.unwrap = sorted((node for node in c.off if not is_negation(node.test)), key=parsed.line)
    match.take = sorted((node for node in c.off if is_negation(node.test)), key=parsed.line)
    span = span_of(c, output_statement)
    tests = [flag_of(node) for node in sorted(c.off, key=parsed.line)]
    if span is None or not holds_at(c, span[0], span[-1], tests):
        raise Refusal("the flag's `if` statements and the block are not one run of statements with the flag "
                      "unchanged")
    for test in tests:  # a property's getter runs at each test, and the patch tests the flag once more
        prop = _own_property(c, test)
        if prop is not None:
            raise Refusal(f"`{parsed.code(prop)}` runs a method of the class (a property) each time the flag is "
                          "tested, and the patch tests it once more where the block starts")
    nested = scope.rebound_by_nested_function(c.home, {name.value for test in tests for name in loaded_names(test)})
    if nested is not None:  # `def ask(): nonlocal output_attentions; output_attentions = True` (breaker round 19)
        raise Refusal(nested)
    match.guard_span = span
    by_text: dict[str, list[cst.BaseExpression]] = {}
    for test in tests:
        by_text.setdefault(parsed.code(test), []).append(test)
    branch, checks = [], []
    for text, same in by_text.items():
        statement = f"`{text}` is a Python bool or None, so its truth test runs no code and reads no tensor"
        proof = _bool_proof(c, same)
        if proof is not None:
            match.facts.proved(FLAG, statement, proof)
            branch.append(_negated(same[0]))
        else:
            match.facts.assumed(FLAG, statement, "it is neither annotated `bool` nor bound to a bool literal")
            checks.append(parse_template_expression("{f} is None or {f} is False", f=same[0]))
    if branch:
        match.flag_test = branch[0] if len(branch) == 1 else joined(cst.And, branch)
    if checks:
        match.guard_checks[FLAG] = checks


def _own_property(c: Candidate, test: cst.BaseExpression) -> cst.Attribute | None:
    """`self.<name>` in the flag's chain where the class defines `<name>` as a method (a property; breaker round
    33: a getter counting steps ran twice a call)."""
    node = test.left if isinstance(test, cst.Comparison) else test
    while isinstance(node, cst.Attribute):
        if isinstance(node.value, cst.Name) and node.value.value == "self" and c.owner is not None and \
                node.attr.value in c.owner.methods:
            return node
        node = node.value
    return None


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """`x is None` for `x is not None` (and back), else `not test`."""
    if _none_identity(test):
        target = test.comparisons[0]
        flipped = cst.IsNot() if isinstance(target.operator, cst.Is) else cst.Is()
        return test.with_changes(comparisons=[target.with_changes(operator=flipped)])
    return cst.UnaryOperation(cst.Not(), test)


def _bool_proof(c: Candidate, tests: list[cst.BaseExpression]) -> str | None:
    """How every binding of the flag that reaches the tests is a bool or None, or None when one is not."""
    if all(_none_identity(test) for test in tests):
        return "an identity comparison with None is a bool and calls no `__bool__` or `__eq__`"
    if not all(isinstance(test, cst.Name) for test in tests):
        return None
    bindings = {d.id: d for test in tests for d in c.flow.definitions_of(test)}
    if not bindings or any(c.flow.sees_undefined(test) for test in tests):
        return None
    ways = [_bool_binding(c, definition) for definition in bindings.values()]
    return None if None in ways else "; ".join(sorted(set(ways)))


def _bool_binding(c: Candidate, definition: Definition) -> str | None:
    if definition.kind == "param" and definition.annotation is not None:
        annotation = c.parsed.code(definition.annotation).replace(" ", "")
        return f"the parameter is annotated `{annotation}`" if annotation in BOOL_ANNOTATIONS else None
    if definition.kind == "assign" and definition.index is None and isinstance(definition.value, cst.Name) and \
            definition.value.value in ("True", "False", "None"):
        return f"bound to `{definition.value.value}` at line {c.parsed.line(definition.statement)}"
    return None


class _FlagIfs(cst.CSTVisitor):
    """`if <name or attribute chain>:` and `if <chain> is (not) None:` statements of one function body (not
    `elif`s, which cannot be replaced by their `else:` alone; not in nested functions), and conditional expressions
    with such a test (BERT's `outputs = (context, probs) if output_attentions else (context,)`)."""

    def __init__(self) -> None:
        self.found: list[cst.If | cst.IfExp] = []

    def visit_If(self, node: cst.If) -> bool:
        if _is_flag_test(node.test):
            self.found.append(node)
        walk(node.test, self)
        self._branches(node)
        return False

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if _is_flag_test(node.test):
            self.found.append(node)

    def _branches(self, node: cst.If) -> None:
        walk(node.body, self)
        if isinstance(node.orelse, cst.Else):
            walk(node.orelse.body, self)
        elif isinstance(node.orelse, cst.If):
            self._branches(node.orelse)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def flag_of(node: cst.If | cst.IfExp) -> cst.BaseExpression:
    """The flag a conditional tests: `f` of `if f:` and of `if not f:` (which the flag off takes), the comparison
    of `if x is not None:`."""
    return node.test.expression if is_negation(node.test) else node.test


def _is_flag_test(test: cst.BaseExpression) -> bool:
    return _plain(test) or _none_identity(test) or is_negation(test) and not test.lpar and _plain(test.expression)


def _plain(test: cst.BaseExpression) -> bool:
    while isinstance(test, cst.Attribute):
        test = test.value
    return isinstance(test, cst.Name) and test.value not in ("True", "False", "None")


def _none_identity(test: cst.BaseExpression) -> bool:
    """`<name or attribute chain> is None` or `... is not None`: no code runs but the chain's reads."""
    return isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar and \
        isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot)) and _plain(test.left) and \
        isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"
