"""The score chain's ops in the order the original applies them: scale factors become SDPA's `scale`, the rest
become mask terms (see `mask_terms`).

SDPA's scale must be a Python number (a tensor factor is folded into the query instead, see `tensor_scale`);
factors applied under an `if` become conditional expressions; a lone `1/sqrt(E)` of the query's or key's last dim
is SDPA's default and is left out. A finite or additive mask scaled
afterwards cannot be expressed (SDPA adds the mask after scaling).
"""

from __future__ import annotations

import math
import re

import libcst as cst

from advisor.patterns import scope
from advisor.patterns.attention.candidate import Candidate, parameter_claims, statement_of
from advisor.patterns.attention.mask_terms import enclosing_views, mask_term, reshape_term
from advisor.patterns.attention.rendering import at_home, short
from advisor.patterns.attention.result import Refusal
from advisor.patterns.attention.tensor_scale import check_placement
from advisor.patterns.call_site_facts import NUMBER, Claim
from advisor.patterns.values import MASK_FILL_FLOOR, ValueProver
from advisor.static.codegen import atomic, joined, number, parenthesized


def scale_and_mask_roles(c: Candidate) -> None:
    match, chain = c.match, c.chain
    applied = list(reversed(chain.ops))  # in the order the original applies them
    scale_positions = [i for i, (op, _) in enumerate(applied) if op.name in ("mul", "div")]
    chain.views = [(i, op) for i, (op, _) in enumerate(applied) if op.name == "view"]
    if len(chain.views) % 2:
        raise Refusal("the scores are reshaped without being reshaped back before softmax")
    capped = next((i for i, (op, _) in enumerate(applied) if op.name == "tanh"), None)
    post_cap: list[tuple[str, cst.BaseExpression]] = []
    masked_at = None  # where the first mask is applied
    for position, (op, guard) in enumerate(applied):
        if op.name == "tanh":
            if position != capped:
                raise Refusal("the scores pass through `tanh` twice")
            continue
        if op.name in ("mul", "div"):
            if "tensor_factor" in op.params:  # a tensor scale: applied to q by the rewrite, before any soft-cap
                if capped is not None and position > capped:
                    raise Refusal("a tensor scales the soft-capped scores, which the query cannot carry")
                continue
            (post_cap if capped is not None and position > capped else c.factors).append((op.name, op.params["factor"]))
            continue
        if op.name == "view":
            continue
        if capped is not None and position < capped:
            raise Refusal(f"a mask is applied before the soft-cap `{short(c.parsed, applied[capped][0].node)}`, "
                          f"where it is no longer a mask")
        term = mask_term(c, op, guard)
        views = enclosing_views(c, position)
        if views is not None:
            reshape_term(c, term, views)
        term.statement = statement_of(c.parsed, op.node)
        term.scaled_after = any(p > position for p in scale_positions)
        match.masks.append(term)
        masked_at = position if masked_at is None else masked_at
    check_placement(c, applied)
    match.scale = _scale(c)
    if capped is not None:
        _soft_cap(c, applied[capped][0], post_cap)
    for factor in c.factors + post_cap:
        c.leaf_nodes.append(c.values.scalar_expression(factor[1]))
        _scale_fact(c, factor[1])
    _divisor_fact(c, c.factors)
    _sign_fact(c, [op for position, (op, _) in enumerate(applied) if masked_at is not None and position > masked_at
                   and op.name in ("mul", "div")])
    c.leaf_nodes.extend(guard.test for guard in chain.factor_guards.values())
    late = [op for position, (op, _) in enumerate(applied) if masked_at is not None and position > masked_at
            and op.name in ("mul", "div")]
    for term in match.masks:
        if term.scaled_after and term.kind not in ("keep", "causal") and \
                not (term.kind == "finite" and _fill_stays_large(c, term, late)):
            raise Refusal("the scores are scaled after a finite or additive mask, which SDPA cannot express")


LARGEST_SIZE = 2 ** 31  # a bound on any one size of a tensor (a dim of 2**31 elements or more is taken not to occur)
SCALED_FILL = "scaled-fill"


def _fill_stays_large(c: Candidate, term, late: list) -> bool:
    """A finite fill the scores are scaled after (`s.masked_fill(m == 0, -1e9)`, then `softmax(s / d ** 0.5)`):
    the original's masked scores are `fill * scale`, which still mask wherever the fill times the smallest the scale
    can be stays at or below MASK_FILL_FLOOR, as the fill alone must; the patch adds the fill after the scale (both
    give those keys no weight, and the same uniform rows where every key is masked, as the `fully-masked-rows` fact
    says). The scale's bounds are read from literals and sizes (at most LARGEST_SIZE) through `*`, `/`, `//`, `**`
    and square roots; its sign is `_sign_fact`'s."""
    fill = c.values.fill_value(term.fill) if term.fill is not None else None
    if not isinstance(fill, float) or any("tensor_factor" in op.params for op in late):
        return False
    smallest = 1.0
    for op in late:
        bounds = _magnitude(c, c.values.scalar_expression(op.params["factor"]))
        if bounds is None or bounds[0] <= 0:
            return False
        smallest *= bounds[0] if op.name == "mul" else 1.0 / bounds[1]
    if not fill * smallest <= MASK_FILL_FLOOR:
        return False
    c.match.facts.proved(SCALED_FILL, f"the masked scores stay at or below {MASK_FILL_FLOOR:g} after the scale",
                         f"the fill {fill:g} times the scale's least magnitude {smallest:.3g} (sizes below 2**31)")
    return True


def _magnitude(c: Candidate, node: cst.BaseExpression, depth: int = 0) -> tuple[float, float] | None:
    """Bounds on the magnitude of a scale factor: a number (a `self.` attribute assigned one among them), a size (1 to
    LARGEST_SIZE), a local assigned those, and products, quotients, floor quotients, powers and square roots of them;
    None for anything else (an attribute computed from constructor arguments, whose values no call fixes here)."""
    if depth > 8:
        return None
    number = c.values.literal_number(node)
    if number is None:
        number = c.values.constant_number(node)
    if number is not None:
        return abs(number), abs(number)
    if c.values.is_size(node):
        return 1.0, float(LARGEST_SIZE)
    below = lambda child: _magnitude(c, child, depth + 1)  # noqa: E731
    if isinstance(node, cst.Call) and (c.parsed.imported_name(node.func) or "") in SQUARE_ROOTS and \
            len(node.args) == 1:
        inner = below(node.args[0].value)
        return None if inner is None else (math.sqrt(inner[0]), math.sqrt(inner[1]))
    if isinstance(node, cst.BinaryOperation):
        return _combined(node, below(node.left), below(node.right), c.values.constant_number(node.right))
    if isinstance(node, cst.Name):
        definitions = c.flow.definitions_of(node)
        found = [below(d.value) if d.kind == "assign" and d.index is None else
                 (1.0, float(LARGEST_SIZE)) if d.kind == "assign" and ValueProver._is_shape(d.value) else None
                 for d in definitions]  # `b, n, c = x.shape`: sizes
        if not found or None in found or c.flow.sees_undefined(node):
            return None
        return min(low for low, _ in found), max(high for _, high in found)
    return None


SQUARE_ROOTS = {"math.sqrt", "numpy.sqrt"}


def _combined(node: cst.BinaryOperation, left: tuple[float, float] | None, right: tuple[float, float] | None,
              exponent: float | None) -> tuple[float, float] | None:
    """The bounds of a product, quotient or floor quotient of two bounded magnitudes, or of a power with a constant
    exponent."""
    if left is None:
        return None
    if isinstance(node.operator, cst.Power):  # `d ** 0.5`, `d ** -0.5`
        if exponent is None or exponent == 0 or exponent < 0 and not left[0] > 0:
            return None
        powers = sorted((left[0] ** exponent, left[1] ** exponent))
        return powers[0], powers[1]
    if right is None:
        return None
    if isinstance(node.operator, cst.Multiply):
        return left[0] * right[0], left[1] * right[1]
    if isinstance(node.operator, cst.Divide) and right[0] > 0:
        return left[0] / right[1], left[1] / right[0]
    if isinstance(node.operator, cst.FloorDivide) and right[0] > 0:
        return math.floor(left[0] / right[1]), left[1] / right[0]
    return None


def _soft_cap(c: Candidate, tanh, post_cap: list[tuple[str, cst.BaseExpression]]) -> None:
    """`cap * tanh(s / cap)` (Gemma-2, Grok): the factors before the tanh are flex_attention's `scale`, those after
    it multiply the tanh: `match.softcap` is the score_mod's expression of `score` (each step under the `if` the
    original applies it in). SDPA has no argument for it: every other backend refuses the block."""
    if c.parsed.module_aliases.get("torch") is None:
        raise Refusal("the scores are soft-capped, and the module does not import torch, which the score_mod calls")
    match = c.match
    # a factor under the tanh's own `if` needs no test of its own inside that test's branch
    same_branch = [(kind, factor) for kind, factor in post_cap if _same_guard(c, factor, tanh.node)]
    with_guards = [(kind, factor) for kind, factor in post_cap if not _same_guard(c, factor, tanh.node)]
    capped = cst.BinaryOperation(_torch_call(c, "tanh", cst.Name("score")), cst.Multiply(),
                                 atomic(_product(c, with_guards, unguarded=same_branch)))
    match.softcap = when_applied(c, tanh.node, capped, cst.Name("score"))
    match.sdpa_refusal = (f"the scores are soft-capped by `{short(c.parsed, tanh.node)}` before softmax, which SDPA "
                          f"cannot express")


def _torch_call(c: Candidate, function: str, argument: cst.BaseExpression) -> cst.Call:
    """`torch.<function>(argument)`, as this module spells torch."""
    torch_name = cst.Name(c.parsed.module_aliases["torch"])
    return cst.Call(cst.Attribute(torch_name, cst.Name(function)), [cst.Arg(argument)])


def _scale_fact(c: Candidate, factor: cst.BaseExpression) -> None:
    """SDPA's `scale` must be a Python number: a literal, a size, a math function, an int/float parameter or
    an attribute this class assigns only such values. A factor taken for one on weaker grounds (its name) is
    an assumption, and the patch that relies on it is unsafe."""
    statement = f"`{short(c.parsed, factor)}` is a Python number, not a tensor"
    guess = c.values.scalar_guess(factor)
    if guess is None:
        c.match.facts.proved("scale-is-number", statement, "built from literals, sizes, math functions and "
                                                           "int/float values")
    else:
        claims = parameter_claims(c, [factor], NUMBER) or tuple(
            Claim(function, name, NUMBER) for function, name in c.values.constructor_parameters(factor))
        c.match.facts.assumed("scale-is-number", statement, guess, claims)


SCALE_NONZERO = "scale-nonzero"
SIZE_DIVISOR = "size-divisor"


def divisors_read(c: Candidate, factors: list[tuple[str, cst.BaseExpression]]) -> list[cst.BaseExpression]:
    """The divisors that are a read of a name or attribute holding no literal (`/ t`, `/ self.temperature`)."""
    found = [c.values.scalar_expression(factor) for kind, factor in factors if kind == "div"]
    return [node for node in found if isinstance(node, (cst.Name, cst.Attribute))
            and c.values.literal_number(node) is None]


def _divisor_fact(c: Candidate, factors: list[tuple[str, cst.BaseExpression]]) -> None:
    """The original divides the scores by a number, and a zero (or NaN) gives infinities and NaN there; the patch
    would compute `1.0 / t`, which raises ZeroDivisionError (and SDPA reads a NaN scale otherwise). A divisor that
    is a read of a parameter or attribute is assumed nonzero and not NaN (guarded `isinstance(t, (int, float)) and t != 0 and t * 0.0 == 0.0`, see
    attention.guards); one built from literals, sizes and math functions is taken as the head size shows it."""
    reads = divisors_read(c, factors)
    if reads:
        c.match.facts.assumed(SCALE_NONZERO, f"the divisor `{short(c.parsed, reads[0])}` is neither 0 nor NaN",
                              "it is read from a parameter or attribute (a 0 would make the patch raise "
                              "ZeroDivisionError where the original gives NaN)")
    built = [node for node in (c.values.scalar_expression(factor) for kind, factor in factors if kind == "div")
             if node not in reads and c.values.literal_number(node) is None]
    computed = [node for node in built if not _one_size(c, node)]
    if computed:  # `math.log(S)`, `math.sqrt(d // 16)`: 0 on inputs that are not empty (breaker round 23)
        c.match.facts.assumed(SIZE_DIVISOR, f"the divisor `{short(c.parsed, computed[0])}` is not 0",
                              "it is computed by a subtraction or a function other than a root (`math.log(S)` is 0 "
                              "for one key), and a 0 would make the patch raise ZeroDivisionError where the "
                              "original gives NaN")
    elif built:
        c.match.facts.accepted(SIZE_DIVISOR, f"the divisor `{short(c.parsed, built[0])}` is not 0",
                               "it is built from sizes and names by roots, products, quotients and sums: where it "
                               "is 0 (an empty key axis or head dim, a size divided down to 0) the patch's `1.0 / "
                               "...` raises ZeroDivisionError where the original returns an empty or NaN result "
                               "(breaker round 22): a loud failure where the original's values are already lost; "
                               "where the patch keeps SDPA's default scale instead (`/ math.sqrt(q.size(-1))`), a "
                               "head dim of 0 gives scores of 0 and the mean of v where the original's are 0/0, "
                               "NaN (breaker round 49): q and k carry nothing, and every value the original "
                               "returns is NaN")


ROOTS = frozenset({"math.sqrt", "numpy.sqrt", "float", "int", "abs"})


def _constant(c: Candidate, node: cst.BaseExpression) -> float | None:
    """A literal number, or arithmetic of literals (`1 / 2`)."""
    literal = c.values.literal_number(node)
    if literal is not None or not isinstance(node, cst.BinaryOperation):
        return literal
    left, right = _constant(c, node.left), _constant(c, node.right)
    if left is None or right is None:
        return None
    operator = type(node.operator)
    if operator is cst.Divide:
        return left / right if right else None
    return {cst.Add: left + right, cst.Subtract: left - right, cst.Multiply: left * right}.get(operator)


def _one_size(c: Candidate, node: cst.BaseExpression) -> bool:
    """A divisor 0 only where a size or name in it is: sizes, names, attributes and positive literals under
    `math.sqrt`, `float`, `int`, `abs`, a positive power, `*`, `/`, `//` and `+` (`math.sqrt(C // self.heads)`,
    `float(self.layer_idx + 1)`, `c ** (1 / 2)`); not a subtraction, a negative literal or another function
    (`math.log(S)` is 0 for one key)."""
    literal = c.values.literal_number(node)
    if literal is not None:
        return literal > 0
    if isinstance(node, cst.Call):
        return len(node.args) == 1 and c.parsed.imported_name(node.func) in ROOTS and \
            _one_size(c, node.args[0].value) or isinstance(node.func, cst.Attribute) and \
            node.func.attr.value == "size"
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Power):
            exponent = _constant(c, node.right)
            return exponent is not None and exponent > 0 and _one_size(c, node.left)
        return isinstance(node.operator, (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Add)) and \
            _one_size(c, node.left) and _one_size(c, node.right)
    if isinstance(node, (cst.Name, cst.Attribute)):
        return True
    return isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) and \
        node.value.attr.value == "shape"


SCALE_POSITIVE = "scale-positive"
POSITIVE_FUNCTIONS = {"math.sqrt", "math.exp", "torch.exp", "numpy.sqrt", "numpy.exp"}


def _sign_fact(c: Candidate, late: list) -> None:
    """A factor applied after a -inf mask multiplies -inf: a positive one keeps it -inf (SDPA's mask, added after its
    scale, is the same), 0 makes it NaN and a negative one +inf, where SDPA still masks. A factor positive by its form
    (a positive literal, a square root, an exponential, a size) needs nothing; a literal that is not positive is
    refused; a read of a parameter or attribute is assumed positive (guarded `isinstance(s, (int, float)) and s >
    0`, see attention.guards), anything else, a tensor factor included, assumed."""
    unknown, guardable = [], True
    for op in late:
        factor = op.params["factor"]
        tensor = "tensor_factor" in op.params
        value = factor if tensor else c.values.scalar_expression(factor)
        literal = None if tensor else c.values.literal_number(value)
        if literal is not None:
            if not literal > 0:
                raise Refusal(f"the masked scores are scaled by `{short(c.parsed, factor)}`, which is not positive "
                              f"(-inf times it is NaN or +inf, where SDPA masks)")
            continue
        if not _positive_form(c, value):
            unknown.append(value)
            guardable = guardable and not tensor and isinstance(value, (cst.Name, cst.Attribute))
    if not unknown:
        return
    c.positive_reads = unknown if guardable else []
    c.match.facts.assumed(SCALE_POSITIVE, f"`{short(c.parsed, unknown[0])}`, which scales the masked scores, is "
                          f"positive", "its sign is not visible here (-inf times 0 is NaN, times a negative number "
                          "+inf, where SDPA still masks)")


def _positive_form(c: Candidate, node: cst.BaseExpression, depth: int = 0) -> bool:
    """Positive by its form: a positive literal, `math.sqrt`/`exp` of anything, `x.exp()`, a size (`q.size(-1)`),
    a local assigned one, and products, quotients and powers of those (a zero size is a degenerate head)."""
    if depth > 8:
        return False
    literal = c.values.literal_number(node)
    if literal is not None:
        return literal > 0
    if isinstance(node, cst.Call):
        dotted = c.parsed.imported_name(node.func) or ""
        return dotted in POSITIVE_FUNCTIONS or isinstance(node.func, cst.Attribute) and \
            node.func.attr.value == "exp" and not node.args or c.values.is_size(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
        return _positive_form(c, node.left, depth + 1) and _positive_form(c, node.right, depth + 1)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        return _positive_form(c, node.left, depth + 1)
    if isinstance(node, cst.Name):
        definitions = c.flow.definitions_of(node)
        if len(definitions) != 1 or definitions[0].kind != "assign" or c.flow.sees_undefined(node):
            return False
        value = definitions[0].value  # `b, n, c = x.shape`: a size
        return ValueProver._is_shape(value) if definitions[0].index is not None else _positive_form(c, value, depth + 1)
    return c.values.is_size(node)


def _scale(c: Candidate) -> cst.BaseExpression | None:
    """The product of the factors over the divisors; a factor applied under an `if` is 1.0 when it is not. A product
    of ints (`* self.mult` with `self.mult = 2`), and, where TorchScript compiles the function, any product that may
    be an int, is passed as `float(...)`: TorchScript's SDPA takes a `float?` scale only, and a user may script the
    module from outside the scanned tree."""
    if not c.factors:
        return number(1.0)
    if len(c.factors) == 1 and not c.chain.factor_guards and _is_default_scale(c, *c.factors[0]):
        return None
    product = _product(c, c.factors)
    ints = all(kind == "mul" and _int_literal(c, c.values.scalar_expression(factor)) for kind, factor in c.factors)
    if not ints and (_surely_float(product) or not scope.is_scripted(c.parsed, c.home, c.owner)):
        return product
    return cst.Call(cst.Name("float"), [cst.Arg(product)])


def _int_literal(c: Candidate, node: cst.BaseExpression | None, depth: int = 0) -> bool:
    """An int literal, or a local name or `self.` attribute assigned only int literals (`self.mult = 2`)."""
    while isinstance(node, cst.UnaryOperation):
        node = node.operand
    if isinstance(node, cst.Integer):
        return True
    if depth > 4:
        return False
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return c.owner is not None and _int_literal(c, c.owner.only_value(node.attr.value), depth + 1)
    if isinstance(node, cst.Name):
        definitions = c.values.flow.definitions_of(node)
        return bool(definitions) and not c.values.flow.sees_undefined(node) and all(
            d.kind == "assign" and d.index is None and _int_literal(c, d.value, depth + 1) for d in definitions)
    return False


def _surely_float(node: cst.BaseExpression) -> bool:
    """A float literal, a true division, or a product or sum with one such operand."""
    while isinstance(node, cst.UnaryOperation):
        node = node.operand
    if isinstance(node, cst.Float):
        return True
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, cst.Divide) or \
            isinstance(node.operator, (cst.Multiply, cst.Add, cst.Subtract)) and \
            (_surely_float(node.left) or _surely_float(node.right))
    return False


def _same_guard(c: Candidate, node: cst.CSTNode, other: cst.CSTNode) -> bool:
    guards, negated = c.chain.factor_guards, c.chain.negated_factors
    return guards.get(node) is guards.get(other) and (node in negated) == (other in negated)


def _product(c: Candidate, factors: list[tuple[str, cst.BaseExpression]],
             unguarded: list[tuple[str, cst.BaseExpression]] = ()) -> cst.BaseExpression:
    """The product of the factors over the divisors (those of `unguarded` without their `if`), 1.0 where there are
    none."""
    parts, divisors = [], []
    plain = {id(factor) for _, factor in unguarded}
    for kind, factor in [*factors, *unguarded]:
        value = at_home(c, c.values.scalar_expression(factor))
        if id(factor) not in plain:
            value = when_applied(c, factor, value, number(1.0))
        (parts if kind == "mul" else divisors).append(atomic(value))
    return joined(cst.Divide, [joined(cst.Multiply, parts) if parts else number(1.0), *divisors])


def when_applied(c: Candidate, node: cst.CSTNode, value: cst.BaseExpression,
                 otherwise: cst.BaseExpression) -> cst.BaseExpression:
    """`value`, or `(value if <test> else otherwise)` for a step the original applies under an `if`."""
    guard = c.chain.factor_guards.get(node)
    if guard is None:
        return value
    negated = node in c.chain.negated_factors
    return parenthesized(cst.IfExp(test=at_home(c, guard.test), body=otherwise if negated else value,
                                   orelse=value if negated else otherwise))


def _is_default_scale(c: Candidate, kind: str, factor: cst.BaseExpression) -> bool:
    """`/ math.sqrt(q.size(-1))`, `* k.size(-1) ** -0.5`, ...: exactly SDPA's default 1/sqrt(E), where
    E is the last dim of the query (and key) SDPA receives."""
    text = c.parsed.code(factor.with_changes(lpar=[], rpar=[])).replace(" ", "")
    leaves = "|".join(re.escape(c.parsed.code(leaf).replace(" ", "")) for leaf in (c.match.query, c.match.key))
    size = rf"\(?(?:{leaves})\.(?:size\(-1\)|shape\[-1\])\)?"
    root = rf"(?:math\.sqrt\({size}\)|{size}\*\*0\.5)"
    if kind == "div":
        return bool(re.fullmatch(root, text))
    return bool(re.fullmatch(rf"(?:1|1\.0?)/\(?{root}\)?|{size}\*\*\(?-0\.5\)?", text))
