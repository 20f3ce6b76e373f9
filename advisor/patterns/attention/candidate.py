"""The state of one candidate block, as an explicit value the role functions take and fill in.

A softmax anchors a candidate; proving it walks the score chain backwards, the weights forwards, and may inline
helpers (merging their flows) or move the block's home to a caller. All of that is per candidate: it lives here,
created fresh for each softmax, so no role reads what an earlier candidate left behind. `FunctionScope` holds
what the candidates of one function share: the function, its readers, and the fresh names already taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from advisor.patterns import einsum as es
from advisor.patterns import scope
from advisor.patterns.attention.result import AttentionMatch
from advisor.patterns.dtypes import DtypeRoots
from advisor.patterns.ops import Op, OpReader
from advisor.patterns.values import ValueProver
from advisor.static.dataflow import Definition, FunctionFlow
from advisor.static.module_index import ClassInfo, ParsedModule

CORE_OPS = {"matmul", "bmm", "baddbmm", "einsum"}
MAX_CHAIN = 40
MAX_REBINDINGS = 8  # names followed back through their one assignment (to the tensor a dtype or rank is read off)


@dataclass
class FunctionScope:
    """One function being matched, and what its candidates share."""

    parsed: ParsedModule
    function: cst.FunctionDef
    owner: ClassInfo | None
    name: str
    reader: OpReader
    taken_names: set[str] = field(default_factory=set)  # fresh names earlier matches of this function chose
    split_reported: set[str] = field(default_factory=set)  # reasons given for attention split across functions
    _classes: scope.ClassTable | None = None

    def classes(self) -> scope.ClassTable:
        if self._classes is None:
            self._classes = self.parsed.derived(scope.ClassTable, scope.ClassTable.of)
        return self._classes


@dataclass
class ScoreChain:
    """What the backward walk collected: ops outermost first (with the `if` guarding each), definitions
    consumed, reads followed, and the guards under which scale factors apply."""

    ops: list[tuple[Op, cst.If | None]] = field(default_factory=list)
    definitions: list[Definition] = field(default_factory=list)
    reads: set[cst.Name] = field(default_factory=set)
    factor_guards: dict[cst.CSTNode, cst.If] = field(default_factory=dict)
    negated_factors: set[cst.CSTNode] = field(default_factory=set)  # factors applied in the `else:` of their guard
    guard_negated: bool = False  # the walk is inside the `else:` of the guard it entered
    twin: Definition | None = None  # the else branch's softmax when both branches of an `if` end in one
    twin_input: cst.Name | None = None
    views: list[tuple[int, Op]] = field(default_factory=list)  # (position applied, op) of view-and-back pairs


@dataclass
class WeightPath:
    """What the forward walk found: the value product, V, and everything met between softmax and it."""

    output: Op
    value_node: cst.BaseExpression
    definitions: list[Definition]
    escapes: list[cst.Name]
    dropouts: list[Op]
    reads: set[cst.Name]
    transposed: bool  # `V @ P^T` (channel-major VAE blocks) instead of `P @ V`
    casts: list[Op] = field(default_factory=list)  # the casts met, in order: the last sets the weights' dtype


@dataclass
class Candidate:
    """One softmax being proved the anchor of an attention block."""

    scope: FunctionScope
    flow: FunctionFlow  # the function's flow, merged with the flows of helpers the walk entered
    values: ValueProver
    home: cst.FunctionDef  # where the value product, and so the SDPA call, lives
    match: AttentionMatch | None = None
    softmax: Op | None = None
    inlined: dict[cst.FunctionDef, tuple[cst.Call, dict[str, cst.BaseExpression]]] = field(default_factory=dict)
    chain: ScoreChain = field(default_factory=ScoreChain)
    weights: WeightPath | None = None
    absorbed: set[cst.Name] = field(default_factory=set)  # reads that vanish with the rewrite (cast targets, ...)
    dtype_changes: list[Op] = field(default_factory=list)  # casts and softmax(dtype=) inside the block
    product_casts: list[Op] = field(default_factory=list)  # those on Q·K^T's operands (`q.float() @ k.float().mT`)
    # (query, key, q operand, k operand) with those casts kept, for v cast alike (products.keep_casts_with_value)
    operands_as_written: tuple | None = None
    factors: list[tuple[str, cst.BaseExpression]] = field(default_factory=list)  # ("mul" | "div", Python number)
    tensor_factors: list[tuple[str, cst.BaseExpression]] = field(default_factory=list)  # folded into the query
    unfolded_query: cst.BaseExpression | None = None  # the query before they are (its shape is the scores' rows')
    # the tensor factors each scale fact leaves unproved, which a guard may check (see `tensor_scale`)
    tensor_scale_reads: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    leaf_nodes: list[cst.BaseExpression] = field(default_factory=list)  # q, k, v, then what else SDPA reads
    identity_ok: set[str] = field(default_factory=set)  # deleted `self.x(...)` calls read right if x is an Identity
    # the deleted `self.x(...)` module calls: x -> (the block's `self.x`, the classes the patch stands for, None:
    # unknown), and why a call would be refused unless a run-time check guards it (see attention.module_guard)
    deleted_modules: dict[str, tuple[cst.Attribute, tuple[str, ...] | None]] = field(default_factory=dict)
    module_refusal: str | None = None
    # dropout probabilities whose range [0, 1] (F.dropout raises outside it, even when not training) is assumed
    dropout_reads: list[cst.BaseExpression] = field(default_factory=list)
    # F.dropout training flags whose type (a bool: F.dropout raises on an int or a tensor) is assumed
    training_reads: list[cst.BaseExpression] = field(default_factory=list)
    # (training flag, p) of a dropout in place, which must drop nothing for the patch to be exact (weights.py)
    inplace_dropout: tuple[cst.BaseExpression, cst.BaseExpression] | None = None
    # scale factors applied after a mask, whose sign (positive: -inf stays -inf) is assumed (see `scale`)
    positive_reads: list[cst.BaseExpression] = field(default_factory=list)
    layout: es.ScoreLayout | None = None  # the Q·K^T einsum's axes
    has_ellipsis: bool = False
    dtype_roots: DtypeRoots | None = None
    # the conditionals of a flag read as the flag off: `if <flag>:` (and `a if <flag> else b`) not taken, `if not
    # <flag>:` taken (see attention.flags)
    off: frozenset[cst.If | cst.IfExp] = frozenset()
    # what one proof step hands a later one (matcher.PROOF)
    core: Op | None = None  # the Q·K^T product the scores come from
    ndim: int | None = None  # the scores' rank
    softmax_dropouts: list[Op] = field(default_factory=list)  # dropout modules of the softmax's nn.Sequential
    consumed: list[Definition] = field(default_factory=list)  # the definitions the rewrite replaces
    output_statement: cst.CSTNode | None = None  # the statement of the value product
    zeroing: Op | None = None  # `masked_fill(m, 0)` on the weights (ESPnet, WeNet): see attention.zeroed_rows
    zeroed_rows: str | None = None  # why the zeroing makes a fully masked row 0 in the original, once proved

    @classmethod
    def start(cls, scope_: FunctionScope, off: frozenset[cst.If | cst.IfExp] = frozenset()) -> Candidate:
        taken = frozenset(node for node in off if is_negation(node.test))
        flow = scope_.parsed.flow(scope_.function, off - taken, taken)
        return cls(scope_, flow, ValueProver(scope_.parsed, flow, scope_.owner), scope_.function, off=off)

    @property
    def parsed(self) -> ParsedModule:
        return self.scope.parsed

    @property
    def function(self) -> cst.FunctionDef:
        return self.scope.function

    @property
    def owner(self) -> ClassInfo | None:
        return self.scope.owner

    @property
    def reader(self) -> OpReader:
        return self.scope.reader


def merge_flow(c: Candidate, function: cst.FunctionDef) -> None:
    """The walk entered `function` (a helper, or the caller): read its definitions as part of this block."""
    c.flow = c.flow.merged_with(c.parsed.flow(function))
    c.values = ValueProver(c.parsed, c.flow, c.owner)


def flow_for(c: Candidate, node: cst.CSTNode) -> FunctionFlow:
    """The merged view for the functions of this match; another function's own flow otherwise."""
    function = function_of(c.parsed, node)
    if function is c.function or function is c.home or function in c.inlined or function is None:
        return c.flow
    return c.parsed.flow(function)


def defined_between(c: Candidate, read: cst.Name, start: cst.CSTNode, stop: cst.CSTNode,
                    start_at_end: bool = False) -> Definition | None:
    """A definition of `read`'s name in its function whose statement starts from `start` on (from its end, with
    `start_at_end`) and before `stop` starts, and does not hold `stop`, where both lie in that function: code that
    may run between them.
    Equal reaching definitions do not rule it out in a loop, whose back edge brings a rebinding in the body to both
    reads (`if i == 1: q = q * 4.0` between the scores and the value product: breaker round 21)."""
    function = function_of(c.parsed, read)
    if function_of(c.parsed, start) is not function or function_of(c.parsed, stop) is not function:
        return None
    first = _position(c, start, end=start_at_end)
    last = _position(c, stop)
    for definition in flow_for(c, read).definitions.values():
        if definition.name == read.value and definition.kind != "param" and definition.statement is not None and \
                function_of(c.parsed, definition.statement) is function and \
                first <= _position(c, definition.statement) < last and \
                not c.parsed.within(stop, definition.statement):  # `o = w @ o` binds after reading
            return definition
    return None


def seen_from_behind(c: Candidate, name: cst.Name) -> bool:
    """Whether a definition the read `name` sees starts after it: a loop brings it back. Two reads of one name
    seeing the same definitions then need not see one value (a rebinding between them reaches both); where every
    definition a read sees lies before it, they do."""
    flow = flow_for(c, name)
    here = _position(c, name)
    definitions = (flow.definitions.get(index) for index in flow.reaching.get(name, ()))
    return any(definition is not None and definition.kind != "param" and definition.statement is not None and
               _position(c, definition.statement) > here for definition in definitions)


def _position(c: Candidate, node: cst.CSTNode, end: bool = False) -> tuple[int, int]:
    """(line, column) where `node` starts (or ends), for source order."""
    code_range = c.parsed.positions[node]
    at = code_range.end if end else code_range.start
    return at.line, at.column


def in_inlined(c: Candidate, node: cst.CSTNode) -> bool:
    return function_of(c.parsed, node) in c.inlined


def function_of(parsed: ParsedModule, node: cst.CSTNode) -> cst.FunctionDef | None:
    return parsed.innermost(node, cst.FunctionDef)


def statement_of(parsed: ParsedModule, node: cst.CSTNode) -> cst.CSTNode:
    while not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        node = parsed.parents[node]
    return node


def definition_of_value(c: Candidate, node: cst.CSTNode) -> Definition | None:
    """The definition an assignment of `node` (its whole value) makes, if exactly one."""
    parent = c.parsed.parents.get(node)
    if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node:
        found = [d for d in flow_for(c, node).definitions.values() if d.statement is parent and d.index is None]
        return found[0] if len(found) == 1 else None
    return None


def one_assigned_value(c: Candidate, name: cst.Name) -> cst.BaseExpression | None:
    """The value of the one plain assignment (`x = ...`, not unpacked) that every path brings to the read `name`."""
    flow = flow_for(c, name)
    definitions = flow.definitions_of(name)
    if len(definitions) == 1 and not flow.sees_undefined(name) and definitions[0].kind == "assign" and \
            definitions[0].index is None:
        return definitions[0].value
    return None


def product_read(c: Candidate, read: cst.Name, names: tuple[str, ...] = ("matmul", "bmm"),
                 scaled_ok: bool = False) -> Op | None:
    """The op of the score product `read` sees, where it sees only that step of the block's scores and the op is
    one of `names` (a `matmul`'s shape is Q's and K's batch dims broadcast, then L and S); `scaled_ok`: or that
    product times or divided by a proved Python number (`torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)`), which
    has its shape."""
    definitions = c.flow.definitions_of(read)
    if len(definitions) != 1 or c.flow.sees_undefined(read) or definitions[0].kind != "assign" or \
            definitions[0] not in c.chain.definitions:
        return None
    op = c.reader.read(definitions[0].value)
    if scaled_ok and op is not None and op.name in ("mul", "div") and isinstance(op.node, cst.BinaryOperation) and \
            c.values.scalar_guess(op.node.right) is None:
        op = c.reader.read(op.node.left)
    return op if op is not None and op.name in names else None


def consumers(c: Candidate, node: cst.CSTNode) -> list[tuple[cst.CSTNode | None, Op | None]]:
    """Where a value goes: (the expression that consumes it, that expression's Op if it is one)."""
    parent = c.parsed.parents.get(node)
    if isinstance(parent, cst.Arg):
        call = c.parsed.parents.get(parent)
        return [(call, c.reader.read(call))]
    if isinstance(parent, cst.Attribute) and parent.value is node:
        call = c.parsed.parents.get(parent)
        if isinstance(call, cst.Call) and call.func is parent:
            return [(call, c.reader.read(call))]
        return [(parent, c.reader.read(parent))]
    if isinstance(parent, cst.BinaryOperation):
        return [(parent, c.reader.read(parent))]
    listed = listed_operand_of(c, node)
    if listed is not None:
        return [listed]
    definition = definition_of_value(c, node)
    reads = flow_for(c, node).reads_of(definition) if definition is not None else []
    return [(read, None) for read in reads] or [(None, None)]  # `saved = w` with saved never read: nowhere


def is_negation(test: cst.BaseExpression) -> bool:
    """`not x`: a conditional that, read with x's flag off, is taken."""
    return isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)


def listed_operand_of(c: Candidate, node: cst.CSTNode) -> tuple[cst.Call, Op] | None:
    """CvT's `torch.einsum('bhlt,bhtv->bhlv', [attn, v])`: the call (and its Op) that reads `node` as one operand
    of a list or tuple passed whole; None for any other element."""
    element = c.parsed.parents.get(node)
    listed = c.parsed.parents.get(element) if isinstance(element, cst.Element) else None
    argument = c.parsed.parents.get(listed) if isinstance(listed, (cst.List, cst.Tuple)) else None
    call = c.parsed.parents.get(argument) if isinstance(argument, cst.Arg) else None
    op = c.reader.read(call) if isinstance(call, cst.Call) else None
    return (call, op) if op is not None and any(operand is node for operand in op.operands) else None


def parameter_claims(c: Candidate, nodes: list[cst.BaseExpression], check: str, guards: list[cst.If | None] = (),
                     rank: tuple[int, int | None] | None = None, peers: list[cst.BaseExpression] = ()) -> tuple:
    """What every call of this block's function must pass for a fact about `nodes` to hold, when each node is
    a parameter of it read as is (see `call_site_facts`); () when one is anything else. A node used only under
    `if <it> is not None:` (its guard) is proved by a call that passes None too."""
    from advisor.patterns.call_site_facts import FLOATING, Claim, parameter_of

    claims = []
    for node, guard in zip(nodes, list(guards) + [None] * (len(nodes) - len(guards))):
        found, kept = parameter_of(c.parsed, node), check
        converted = found is None and (found := _bool_conversion_of(c.parsed, node)) is not None
        if found is None:
            found, kept = _local_of_parameter(c.parsed, node, check)
        if found is None or found[0] in c.inlined:
            return ()
        same = [parameter_of(c.parsed, peer) for peer in peers]
        none_ok = _tests_not_none(c.parsed, guard, found[1], node)
        claims.append(Claim(found[0], found[1], kept, rank, none_ok,
                            tuple(p[1] for p in same if p is not None and p[0] is found[0])))
        if converted:  # every call passes a floating mask: the conversion is never taken
            claims.append(Claim(found[0], found[1], FLOATING, None, none_ok))
    return tuple(claims)


def _local_of_parameter(parsed: ParsedModule, node: cst.BaseExpression,
                        check: str) -> tuple[tuple[cst.FunctionDef, str] | None, str]:
    """((function, parameter), check) where `node` reads a local its function binds once, before the read, to
    that parameter or an indexing of it that keeps what `check` is about (Whisper's and Llama's `causal_mask =
    attention_mask[:, :, :, : key_states.shape[-2]]`): a mask's dtype and bounds on its values under any indexing,
    its rank under slices, a key kept in every row under `causal.under_row_reads` (else only bounds on values, the
    check returned); and the function never rebinds or writes the parameter (the local may be a view of it).
    (None, check) otherwise."""
    from advisor.patterns.attention.causal import under_row_reads
    from advisor.patterns.call_site_facts import BOOL, FLOATING, KEEPS_A_KEY, NOT_FLOAT, RANK, SMALL, parameter_of

    function = parsed.innermost(node, cst.FunctionDef) if isinstance(node, cst.Name) else None
    if function is None:
        return None, check
    flow = parsed.flow(function)
    definitions = flow.definitions_of(node)
    if flow.sees_undefined(node) or len(definitions) != 1 or definitions[0].kind != "assign" or \
            definitions[0].index is not None or definitions[0].value is None:
        return None, check
    value = definitions[0].value
    if check == KEEPS_A_KEY and not isinstance(under_row_reads(value), cst.Name):
        check = SMALL  # rows read otherwise: only small values keep every row's keys
    if check == KEEPS_A_KEY:
        base = under_row_reads(value)
    elif check in (SMALL, NOT_FLOAT, BOOL, FLOATING):
        base = _under_indexing(value, lambda element: True)
    elif check == RANK:
        base = _under_indexing(value, _keeps_a_dim)
    else:
        base = value
    found = parameter_of(parsed, base) if isinstance(base, cst.Name) else None
    if found is None or found[0] is not function or \
            any(d.name == found[1] and d.kind != "param" for d in flow.definitions.values()):
        return None, check
    return found, check


def _under_indexing(node: cst.BaseExpression, kept) -> cst.BaseExpression:
    """The tensor under subscripts each of whose elements `kept` accepts."""
    while isinstance(node, cst.Subscript) and all(kept(element.slice) for element in node.slice):
        node = node.value
    return node


def _keeps_a_dim(element: cst.BaseSlice) -> bool:
    """A slice, or `...`: the dim (or dims) stay, so the rank does."""
    return isinstance(element, cst.Slice) or isinstance(element, cst.Index) and \
        isinstance(element.value, cst.Ellipsis)


def _bool_conversion_of(parsed: ParsedModule, node: cst.BaseExpression) -> tuple[cst.FunctionDef, str] | None:
    """(function, parameter) where `node` reads either the parameter or what the function's conversion of a bool
    one binds, and nothing else: open_clip's `if attn_mask is not None and attn_mask.dtype == torch.bool:` ...
    `attn_mask = new_attn_mask` (no `else:`). Where every call passes a floating mask the conversion is not taken,
    so the read is the parameter as passed."""
    function = parsed.innermost(node, cst.FunctionDef) if isinstance(node, cst.Name) else None
    if function is None:
        return None
    flow = parsed.flow(function)
    definitions = flow.definitions_of(node)
    if flow.sees_undefined(node) or sorted(d.kind for d in definitions) != ["assign", "param"]:
        return None
    converted = next(d for d in definitions if d.kind == "assign")
    test = parsed.innermost(converted.statement, cst.If)
    if test is None or test.orelse is not None or parsed.innermost(test, cst.FunctionDef) is not function or \
            not _tests_bool_dtype(parsed, test.test, node.value):
        return None
    return function, node.value


def _tests_bool_dtype(parsed: ParsedModule, test: cst.BaseExpression, name: str) -> bool:
    """`name.dtype == torch.bool`, alone or after `name is not None and`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _tests_bool_dtype(parsed, test.right, name) and isinstance(test.left, cst.Comparison) and \
            parsed.code(test.left).replace(" ", "") == f"{name}isnotNone"
    return isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
        isinstance(test.comparisons[0].operator, (cst.Equal, cst.Is)) and \
        parsed.code(test.left).replace(" ", "") == f"{name}.dtype" and \
        parsed.imported_name(test.comparisons[0].comparator) == "torch.bool"


def _tests_not_none(parsed: ParsedModule, guard: cst.If | None, name: str, node: cst.CSTNode) -> bool:
    """`node` lies in the body of `if name is not None:`."""
    if guard is None or not isinstance(guard.test, cst.Comparison) or len(guard.test.comparisons) != 1:
        return False
    test, target = guard.test, guard.test.comparisons[0]
    if not (isinstance(test.left, cst.Name) and test.left.value == name and isinstance(target.operator, cst.IsNot)
            and isinstance(target.comparator, cst.Name) and target.comparator.value == "None"):
        return False
    while node is not None and node is not guard:
        if node is guard.body:
            return True
        node = parsed.parents.get(node)
    return False
