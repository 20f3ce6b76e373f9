"""The backward walk: from the softmax input down to the Q·K^T product, peeling the score chain.

Each step is one op on the scores: a cast or identity (absorbed), a scale (a Python number, or a tensor that
`tensor_scale` folds into the query), a mask (`masked_fill`, `where`, an added tensor), a view and its view back,
or a row-max subtraction (softmax ignores it). Reads are followed to their one definition; an update under an `if` carries that guard until the walk
leaves the `if`; a helper returning the scores is entered. Anything else is a refusal naming the form.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns.attention import shifts
from advisor.patterns.attention.anchors import reaches
from advisor.patterns.attention.candidate import CORE_OPS, MAX_CHAIN, Candidate, function_of
from advisor.patterns.attention.causal import keeps_first_key
from advisor.patterns.attention.helpers import argument_of, callee, enter_callee, helper_named, single_return
from advisor.patterns.attention.rendering import short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.ops import Op, int_value, number_value
from advisor.static.codegen import nonzero
from advisor.static.dataflow import UNDEFINED, Definition, contains_call, loaded_names


def peel_scores(c: Candidate, node: cst.BaseExpression) -> Op:
    """Walk from the softmax input down to the Q·K^T product, recording every op on the way in `c.chain`.
    Inside a guarded update (`if mask is not None: s = s.view(...); s = s + mask; ...`) every op carries
    the guard, until the walk leaves the `if` back to the value the `if` started from."""
    chain = c.chain
    guard: cst.If | None = None
    entry: frozenset[int] | None = None  # what the walk must reach when it leaves the guard
    if chain.twin is not None:  # `if c: ...; s = softmax(s) else: s = softmax(s)`: start inside the if
        guard, entry = chain.twin.guards[-1], frozenset(c.flow.reaching[chain.twin_input])
        chain.definitions.append(chain.twin)
        chain.reads.add(chain.twin_input)
    cursor: cst.BaseExpression | Op | frozenset[int] = node
    for _ in range(MAX_CHAIN):
        if isinstance(cursor, cst.Name) and argument_of(c, cursor) is not None:
            raise Refusal(_through_parameter(c, cursor))
        if isinstance(cursor, cst.Name):
            chain.reads.add(cursor)
            cursor = frozenset(c.flow.reaching.get(cursor, ()))
        if isinstance(cursor, frozenset):
            if guard is not None and cursor == entry:
                guard = entry = None
            elif guard is not None and not _inside(c, cursor, guard):
                raise Refusal("a conditional update of the scores does not update the same value")
            before = _branch_masks(c, cursor) if guard is None else None
            if before is not None:  # each branch of an `if` chain masked the same scores: go on from them
                cursor = before
                continue
            cursor, new_guard, new_entry = _step_definitions(c, cursor)
            if new_guard is not None:
                if guard is not None:
                    raise Refusal("the scores are updated under nested conditions")
                guard, entry = new_guard, new_entry
                # the update sits in the `else:` of its `if`: a factor there applies when the test is false
                chain.guard_negated = guard in chain.definitions[-1].negated
            continue
        op = cursor if isinstance(cursor, Op) else c.reader.read(cursor)
        if op is None and guard is None and callee(c, cursor) is not None:
            cursor = enter_callee(c, cursor)  # the scores are computed by a helper method
            continue
        if op is None:
            raise Refusal(_why_unrecognised(c, cursor, guard))
        if op.name in CORE_OPS:
            if guard is not None:
                raise Refusal("the Q·K^T product itself is computed conditionally")
            return op
        cursor = _peel_one(c, op, guard)
    raise Refusal("the score computation is too long to follow")


def _through_parameter(c: Candidate, parameter: cst.Name) -> str:
    """Why the walk stops at a helper's parameter: the caller's tensor itself comes back (returned unchanged, or
    updated in place, which also changes the caller's tensor and every view of it), and the walk does not follow
    it out to the call."""
    helper = function_of(c.parsed, parameter)
    updates = [op for op, _ in c.chain.ops if function_of(c.parsed, op.node) is helper]
    how = f"updated in place there (`{short(c.parsed, updates[-1].node)}`)" if updates else "returned unchanged"
    return (f"the scores are the caller's tensor passed to the helper `{helper.name.value}` as its parameter "
            f"`{parameter.value}` and {how}; the walk does not follow a parameter back to the call")


def _why_unrecognised(c: Candidate, node: cst.CSTNode, guard: cst.If | None) -> str:
    """Why the score walk stops at `node`, naming the form when it is a known one."""
    text = short(c.parsed, node)
    if isinstance(node, cst.Call):
        if c.parsed.imported_name(node.func) in ("torch.cat", "torch.concat", "torch.concatenate"):
            return (f"the scores are joined from several sources by `{text}`, so one softmax spans several "
                    f"key sets (one SDPA call would need their keys and values concatenated)")
        helper = helper_named(c, node.func)
        if helper is not None and single_return(helper) is None:
            return f"the scores come from `{text}`, a helper with more than one `return`, which is not inlined"
        if helper is not None and guard is not None:
            return (f"the scores come from `{text}`, a helper called under `if {c.parsed.code(guard.test)}:`, "
                    f"which the walk does not enter{_writes_in_place(c, helper)}")
        module = _submodule(c, node.func)
        if module is not None:
            return f"the scores pass through `{c.parsed.code(node.func)}`, {module}"
    return f"the scores come from `{text}`, which is not a recognised operation"


# torch layers applied to the scores: the axis each one mixes (reads as its channels or features)
MIXING_LAYERS = {**{f"torch.nn.Conv{n}d": "dim 1 (the heads, for (B, heads, L, S) scores: talking heads)"
                    for n in (1, 2, 3)},
                 "torch.nn.Linear": "the last dim (the keys)", "torch.nn.Bilinear": "the last dim (the keys)"}


def _submodule(c: Candidate, func: cst.BaseExpression) -> str | None:
    """What `self.<name>`, a module the class builds and calls on the scores, is: a torch layer and the axis it
    mixes, which no SDPA mask expresses, or a module whose forward the walk does not follow."""
    if c.owner is None or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and
                               func.value.value == "self") or func.attr.value in c.owner.methods:
        return None
    built = [value for value in c.owner.attributes.get(func.attr.value, []) if isinstance(value, cst.Call)]
    if not built:
        return None
    dotted = c.parsed.imported_name(built[0].func)
    torch_layer = dotted is not None and dotted.startswith("torch.nn.")
    layer = f"`nn.{dotted.rsplit('.', 1)[-1]}`" if torch_layer else f"`{c.parsed.code(built[0].func)}`"
    if dotted in MIXING_LAYERS:
        return (f"built as {layer}: a learned layer over the scores mixes them across {MIXING_LAYERS[dotted]}, "
                f"which no SDPA mask expresses")
    return (f"built as {layer}: a module's forward is not followed (the rewrite reads terms added to the scores, "
            f"and a module may compute anything from them)")


def _writes_in_place(c: Candidate, helper: cst.FunctionDef) -> str:
    """`; it writes into ... in place (`stmt`)` where the helper stores into one of its parameters' elements."""
    params = {p.name.value for p in helper.params.params}
    flow = c.parsed.flow(helper)
    stores = [d for d in flow.definitions.values() if d.kind == "store" and d.name in params]
    if not stores:
        return ""
    statement = min(stores, key=lambda d: c.parsed.line(d.statement)).statement
    return (f"; it writes into its parameter `{stores[0].name}` in place (`{short(c.parsed, statement)}`), a term on "
            f"part of the scores that no single added mask is read from")


def _inside(c: Candidate, ids: frozenset[int], guard: cst.If) -> bool:
    return len(ids) == 1 and UNDEFINED not in ids and guard in c.flow.definitions[next(iter(ids))].guards


def _step_definitions(c: Candidate, ids: frozenset[int]):
    """Follow a read to what it reads: one definition, or the last update inside an `if` that may not run.
    Returns (what the definition computes, the `if` it entered or None, the definitions before that `if`)."""
    definitions = [c.flow.definitions[i] for i in sorted(ids) if i != UNDEFINED]
    if UNDEFINED in ids or not definitions:
        raise Refusal("the scores are not defined on every path")
    if len(definitions) >= 2:
        live = {d.id: tuple(g for g in d.guards if g not in c.off) for d in definitions}  # an off `if`'s else runs
        deepest = max(definitions, key=lambda d: (len(live[d.id]), d.id))  # the last update
        guard = live[deepest.id][-1] if live[deepest.id] else None
        inside = [d for d in definitions if guard in d.guards]
        outside = [d for d in definitions if guard not in d.guards]
        if (len(inside) == 1 and outside and deepest.kind in ("assign", "aug", "inplace")
                and deepest.index is None and all(live[d.id][:len(live[deepest.id]) - 1] ==
                                                  live[deepest.id][:-1] for d in outside)):
            c.chain.definitions.append(deepest)
            return _definition_input(c, deepest), guard, frozenset(d.id for d in outside)
    if len(definitions) != 1:
        raise Refusal(_several_paths(c, definitions))
    definition = definitions[0]
    if definition.kind == "store":
        raise Refusal(f"the scores are written in place by `{short(c.parsed, definition.statement)}`")
    if definition.kind not in ("assign", "aug", "inplace") or definition.index is not None:
        raise Refusal(f"the scores come from `{definition.name}`, which is not computed in this function")
    c.chain.definitions.append(definition)
    return _definition_input(c, definition), None, None


def _branch_masks(c: Candidate, ids: frozenset[int]) -> frozenset[int] | None:
    """`if a: s = s + x elif b: s = s.masked_fill(m, -inf) else: ...`: two or more branches of one `if`/`elif` chain
    each mask the scores the chain starts from (adds, fills, `where`s, nothing else), so on every path SDPA gets that
    path's masks. Records each branch's ops under its own `if` (hoisted where the branch applies them, see
    `attn_mask`) and returns the definitions the chain starts from; None where the definitions are not that form."""
    if UNDEFINED in ids:
        return None
    definitions = [c.flow.definitions[i] for i in sorted(ids)]
    live = {d.id: tuple(g for g in d.guards if g not in c.off) for d in definitions}  # an off `if`'s else runs
    deepest = max(live.values(), key=len)
    for depth, head in enumerate(deepest):  # the `if` whose chain's branches hold the updates
        updates = [d for d in definitions if live[d.id][depth:depth + 1] == (head,)]
        if len(updates) >= 2 and all(live[d.id][:depth] == deepest[:depth] for d in definitions) and \
                all(set(live[d.id][depth:]) <= set(_elif_chain(head)) for d in updates) and \
                all(len(live[d.id]) == depth for d in definitions if d not in updates):
            break
    else:
        return None
    starts = {_peel_branch(c, update, live[update.id][-1]) for update in updates}
    skipped = frozenset(d.id for d in definitions if d not in updates)  # the paths no branch takes
    if len(starts | ({skipped} if skipped else set())) != 1:
        raise Refusal(f"the branches of `if {short(c.parsed, head.test)}` update different values")
    return starts.pop()


def _elif_chain(head: cst.If) -> list[cst.If]:
    chain = [head]
    while isinstance(chain[-1].orelse, cst.If):
        chain.append(chain[-1].orelse)
    return chain


def _peel_branch(c: Candidate, update: Definition, branch: cst.If) -> frozenset[int]:
    """Record one branch's mask ops, from its last update back to the scores the chain starts from (returned)."""
    where = ("under the `else:` of" if branch in update.negated else "under") + f" `if {short(c.parsed, branch.test)}`"
    definition = update
    for _ in range(MAX_CHAIN):
        value = _definition_input(c, definition) if definition.kind in ("assign", "aug", "inplace") and \
            definition.index is None else None
        op = value if isinstance(value, Op) else c.reader.read(value) if value is not None else None
        if op is None or op.name not in ("add", "masked_fill", "where"):
            raise Refusal(f"{where}, the scores are assigned by `{short(c.parsed, definition.statement)}`, which is "
                          f"no mask; SDPA takes the other paths only where an `if` whose test runs no code (a flag, "
                          f"`x is None`) skips this one")
        c.chain.definitions.append(definition)
        operand = _peel_one(c, op, branch)
        if not isinstance(operand, cst.Name):
            raise Refusal(f"{where}, the scores are `{short(c.parsed, operand)}`, not a name this walk follows")
        c.chain.reads.add(operand)
        ids = frozenset(c.flow.reaching.get(operand, ()))
        inner = c.flow.definitions.get(next(iter(ids))) if len(ids) == 1 else None
        if inner is None or inner.guards != update.guards or inner.negated != update.negated:
            return ids  # left the branch
        definition = inner
    raise Refusal("the score computation is too long to follow")


def _several_paths(c: Candidate, definitions: list[Definition]) -> str:
    """Why the walk stops where several assignments reach the scores: each is named, with its line."""
    named = ", ".join(f"`{short(c.parsed, d.statement)}` (line {c.parsed.line(d.statement)})" for d in definitions
                      if d.statement is not None)
    return (f"the scores are assigned on several paths ({named}); a path SDPA does not express is skipped only "
            f"behind an `if` whose test runs no code (a flag, `x is None`), where every other path is one it does")


def _definition_input(c: Candidate, definition: Definition) -> cst.BaseExpression | Op:
    """The expression a definition computes; augmented and in-place updates become ops on the old value."""
    if definition.kind == "assign":
        return definition.value
    statement = definition.statement
    if definition.kind == "aug":
        op_names = {cst.MultiplyAssign: "mul", cst.DivideAssign: "div", cst.AddAssign: "add"}
        name = op_names.get(type(statement.operator))
        if name is None:
            raise Refusal(f"the scores are updated by `{short(c.parsed, statement)}`")
        return Op(name, statement, [statement.target, statement.value], inplace=True)
    op = c.reader.read(definition.value)
    if op is None or op.name not in ("masked_fill", "mul", "div", "add"):
        raise Refusal(f"the scores are updated in place by `{short(c.parsed, definition.value)}`")
    return op


def _peel_one(c: Candidate, op: Op, guard: cst.If | None) -> cst.BaseExpression:
    """Record one op of the score chain and return the operand that carries the scores."""
    chain = c.chain
    if op.name in ("cast", "identity"):
        absorb(c, op)
        if op.name == "cast":
            c.dtype_changes.append(op)
            for later, _ in chain.ops:  # walked already: applied after this cast, to scores of its dtype
                later.params["cast_before"] = True
        return op.operands[0]
    if op.name in ("mul", "div"):
        tensor, factor = tensor_and_factor(c, op)
        if factor is None:  # a tensor scale, folded into the query (see `tensor_scale`)
            unfollowed = c.values.why_not_scalar(op.operands[1])
            operands = tensor_operands(c, op)
            if unfollowed is not None or operands is None:
                raise Refusal(f"the scale `{short(c.parsed, op.operands[1])}` cannot be proved a Python number: "
                              f"{unfollowed}" if unfollowed is not None else
                              f"the scores are scaled by `{short(c.parsed, op.operands[1])}`, which also carries "
                              f"the scores")
            tensor, factor = operands
            op.params["tensor_factor"] = factor
        if guard is not None and contains_call(guard.test):
            raise Refusal(f"the scale is applied under `if {short(c.parsed, guard.test)}`, a condition that "
                          f"calls a function and cannot be re-evaluated")
        op.params["factor"] = factor
        if guard is not None:  # becomes `(factor if <test> else 1.0)`, or `(1.0 if <test> else factor)`
            chain.factor_guards[factor] = guard
            if chain.guard_negated:
                chain.negated_factors.add(factor)
        chain.ops.append((op, guard))
        return tensor
    if op.name in ("masked_fill", "view"):
        chain.ops.append((op, guard))
        return op.operands[0]
    if op.name == "tanh":  # soft-capping (`cap * tanh(s / cap)`): only FlexAttention's score_mod expresses it
        if guard is not None and contains_call(guard.test):
            raise Refusal(f"the scores are soft-capped under `if {short(c.parsed, guard.test)}`, a condition that "
                          f"calls a function and cannot be re-evaluated")
        if guard is not None:  # the score_mod applies it where the test holds, as the scale's guarded factors
            chain.factor_guards[op.node] = guard
            if chain.guard_negated:
                chain.negated_factors.add(op.node)
        chain.ops.append((op, guard))
        return op.operands[0]
    if op.name in ("add", "where"):
        left, right = op.operands
        # `where(pad, torch.finfo(s.dtype).min, s)`: the fill reads the scores' dtype, and is still the fill
        filled = op.name == "where" and c.values.fill_kind(left) is not None
        scores = left if not filled and reaches(c, left, CORE_OPS, 0) else right
        if op.params.get("optional") and scores is not left:
            raise Refusal(f"the scores are the argument `{short(c.parsed, op.node)}` tests for None, and the mask the "
                          f"one it adds where they are not None")
        if op.name == "add" and _dropped_shift(c, right if scores is left else left, op):
            return scores
        op.params["chain_operand"] = scores
        chain.ops.append((op, guard))
        return scores
    if op.name == "sub":
        left, right = op.operands
        if _is_row_max_of(c, right, left) or _dropped_shift(c, right, op):
            c.absorbed.update(loaded_names(right))
            return left
        fill = _zero_one_fill(c, op)
        if fill is not None:
            chain.ops.append((fill, guard))
            return fill.operands[0]
        raise Refusal(f"the scores have `{short(c.parsed, right)}` subtracted from them")
    raise Refusal(f"the scores pass through `{short(c.parsed, op.node)}` before softmax, which SDPA cannot express")


def _dropped_shift(c: Candidate, operand: cst.BaseExpression, op: Op) -> bool:
    """A finite Python number added to the scores drops out (see `shifts`); one that is a number only on some
    paths is kept as an added mask, with its numbers noted for `attn_mask`."""
    held = shifts.addend(c, operand)
    if held.numbers and held.other:
        op.params["number_paths"] = held.numbers
    if not held.numbers or held.other:
        return False
    shifts.drop_shift(c, operand, held.numbers)
    c.absorbed.update(loaded_names(operand))
    return True


def _zero_one_fill(c: Candidate, op: Op) -> Op | None:
    """OpenAI GPT-2's `s * b - F * (1 - b)` read as `where(b.bool(), s, -F)`: equal where b is 0 or 1 (there
    `s * 1 - F * 0` is s and `s * 0 - F * 1` is -F, for finite scores), which a triangle of ones sliced from
    column 0 proves (every row then also keeps key 0). None for any other form or values."""
    product, penalty = (c.reader.read(operand) for operand in op.operands)
    if product is None or penalty is None or product.name != "mul" or penalty.name != "mul":
        return None
    fill, complement = penalty.operands if number_value(penalty.operands[0]) is not None else penalty.operands[::-1]
    complement = c.reader.read(complement.with_changes(lpar=(), rpar=())) if isinstance(
        complement, cst.BinaryOperation) else None
    if number_value(fill) is None or number_value(fill) <= 0 or complement is None or complement.name != "sub" \
            or number_value(complement.operands[0]) != 1:
        return None
    mask = complement.operands[1]
    scores, factor = product.operands
    if not reaches(c, scores, CORE_OPS, 0):
        scores, factor = factor, scores
    if c.parsed.code(factor) != c.parsed.code(mask) or contains_call(mask) or not reaches(c, scores, CORE_OPS, 0):
        return None
    keep = nonzero(factor)
    if not keeps_first_key(c, keep, True):  # b is a lower triangle of ones, so only 0 and 1
        return None
    c.absorbed.update(loaded_names(mask))
    return Op("where", op.node, [scores, cst.UnaryOperation(cst.Minus(), fill)],
              {"condition": keep, "chain_operand": scores, "source": factor})


def absorb(c: Candidate, op: Op) -> None:
    """A cast's arguments (`.type_as(scores)`, `.to(q.dtype)`) disappear with the block."""
    if isinstance(op.node, cst.Call):
        for arg in op.node.args:
            c.absorbed.update(loaded_names(arg.value))


def tensor_and_factor(c: Candidate, op: Op) -> tuple[cst.BaseExpression, cst.BaseExpression | None]:
    """A mul/div op as (tensor, Python-number factor); the factor is None when none is provable.
    Multiplication commutes, so `s * x` and `x * s` both work; division only scales by its divisor."""
    tensor, factor = op.operands
    if op.name == "mul" and c.values.is_scalar(tensor) and not c.values.is_scalar(factor):
        tensor, factor = factor, tensor
    return (tensor, factor) if c.values.is_scalar(factor) else (tensor, None)


def tensor_operands(c: Candidate, op: Op) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(scores, tensor factor) of a `mul`/`div` of the scores by something not provably a number; None when the
    scores are not exactly one side (a divisor carrying the scores is no scale)."""
    left, right = op.operands
    if op.inplace:  # `s *= t`: the target carries the scores
        return None if reaches(c, right, CORE_OPS, 0) else (left, right)
    carries = [reaches(c, operand, CORE_OPS, 0) for operand in (left, right)]
    if carries == [True, False]:
        return left, right
    if carries == [False, True] and op.name == "mul" and not op.inplace:
        return right, left
    return None


def _is_row_max_of(c: Candidate, node: cst.BaseExpression, scores: cst.BaseExpression) -> bool:
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
    same = c.parsed.code(node.func.value).replace(" ", "") == c.parsed.code(scores).replace(" ", "")
    return same and int_value(dim) == -1 and isinstance(keepdim, cst.Name) and keepdim.value == "True"
