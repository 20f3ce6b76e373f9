"""Facts about a parameter that its function cannot prove, proved at every call of it in the scanned tree.

Most attention takes its mask or scale from its caller. When the fact the rewrite needs (a mask's rank, that it
is not a float, that its values are small, that a scale is a number) is about a parameter used as is, each call
site is read where it builds the argument: `ids != pad` (a bool), `m[:, None, None, :]` (rank 4), `torch.zeros`
(values 0), `0.125` (a number). An argument that is itself a parameter of the caller is followed to the caller's
own calls. The fact is proved from call sites only when every call in the tree proves it (`Tree.sites` says None
when some use is not a visible call); the sites are listed with the fact. What the sites show is read as
`masks.RankBounds` reads a mask in the block itself, plus two small evaluators (dtype kind, value bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Callable

import libcst as cst

from advisor.patterns import masks as mk
from advisor.patterns.evaluated_masks import values_may_differ
from advisor.patterns.scope import ClassTable, nested_names, outer_names, overridden, self_names
from advisor.patterns.copy_cast_roles import dtype_name
from advisor.patterns.facts import FROM_CALL_SITES, FactSheet
from advisor.patterns.ops import OpReader, int_value, number_value, views_another_dtype
from advisor.patterns.values import NUMBER_FUNCTIONS, ValueProver
from advisor.static.dataflow import is_self
from advisor.static.walk import descendants
from advisor.static.call_sites import CallSite, Tree, bound_argument
from advisor.patterns.module_values import assigned_values
from advisor.static.module_index import ParsedModule

RANK, NOT_FLOAT, BOOL, SMALL, NUMBER, DROPS = "rank", "not-float", "bool", "small-values", "number", "drops-result"
FLOATING = "floating"  # a floating tensor: a block's `if m.dtype == torch.bool:` conversion is not taken
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64", "float", "double", "half"}
FLOAT_METHODS = {"float", "double", "half", "bfloat16"}
FLOAT_CREATORS = {"torch.zeros", "torch.ones", "torch.empty", "torch.rand", "torch.randn"}
DTYPE_KEEPING_METHODS = {"triu", "tril", "triu_", "tril_", "masked_fill", "masked_fill_", "fill_", "clone",
                         "contiguous", "detach", "view", "reshape", "unsqueeze", "squeeze", "expand", "transpose",
                         "permute", "flatten", "fill_diagonal_", "zero_", "neg", "abs"}
KEEPS_A_KEY = "small-values-or-causal"  # SMALL, or a causal additive mask (the block reads the rows as they are)
SMALL_LIMIT = 10.0  # |values| of an added mask that leave a row masked everywhere as precise as the scores
MAX_DEPTH = 4  # callers followed through parameters passed on
NON_FLOAT_DTYPES = {"bool", "int8", "uint8", "int16", "int32", "int64"}
NON_FLOAT_METHODS = {"bool", "long", "int", "byte", "short", "char", "logical_not", "logical_and", "logical_or",
                     "logical_xor", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isfinite"}
NARROW_INTEGERS = {"uint8", "int8", "int16"}  # integer dtypes whose arithmetic wraps within a mask's values
NARROW_INTEGER_METHODS = {"byte", "char", "short"}
INTEGER_METHODS = {"long", "int", "byte", "short", "char"}  # the non-float methods whose result is not bool
KEEP_VALUES = {"float", "double", "half", "bfloat16", "to", "type_as", "type", "contiguous", "clone", "detach",
               "unsqueeze", "view", "reshape", "expand", "expand_as", "transpose", "permute", "repeat", "flatten",
               "squeeze", "__getitem__", "long", "int", "flip", "roll"}
BOUNDED_CREATORS = {"torch.zeros": (0.0, 0.0), "torch.zeros_like": (0.0, 0.0), "torch.ones": (1.0, 1.0),
                    "torch.ones_like": (1.0, 1.0), "torch.rand": (0.0, 1.0), "torch.rand_like": (0.0, 1.0),
                    # torch's normal sampler maps finite-precision uniforms (Box-Muller): |x| < 8.6 in float64
                    "torch.randn": (-SMALL_LIMIT, SMALL_LIMIT), "torch.randn_like": (-SMALL_LIMIT, SMALL_LIMIT)}
BOUNDED_METHODS = {"new_zeros": (0.0, 0.0), "new_ones": (1.0, 1.0), "zero_": (0.0, 0.0)}
SHOWS = {RANK: "a mask whose indexing, reshaping or creation gives it a rank SDPA takes",
         NOT_FLOAT: "a bool or integer mask (SDPA gets its values exactly as q's dtype)",
         BOOL: "a bool mask (SDPA reads any other dtype as added values or rejects it)",
         SMALL: f"a mask whose values are at most {SMALL_LIMIT:g} in magnitude (zeros, 0/1, a comparison times a "
                f"small constant, a bounded random draw), which swallows no row: a row masked everywhere is "
                f"softmax(scores + mask) in both", NUMBER: "a Python number",
         KEEPS_A_KEY: f"a mask whose values are at most {SMALL_LIMIT:g} in magnitude, or a causal additive mask "
                      f"(-inf or a mask fill above the diagonal, 0 on and below it: key 0 of every row is 0), which "
                      f"swallows no row",
         FLOATING: "a floating mask (its construction shows it), so the block's conversion of a bool one is not "
                   "taken",
         DROPS: "nothing for the weights: each call's result is unused, indexed at another position, or unpacked "
                "into a name never read there"}

Interval = tuple[float, float]


@dataclass(frozen=True)
class Claim:
    """What every call of `function` must pass as `parameter`. `rank` bounds the mask's dims for RANK, and `peers`
    (q's and k's parameters) raise its upper bound to their least rank at the same call (the scores have at least
    theirs); `none_ok`: the block uses the parameter only when it is not None, so passing None proves it too."""

    function: cst.FunctionDef
    parameter: str
    check: str
    rank: mk.Bounds | None = None
    none_ok: bool = False
    peers: tuple[str, ...] = ()
    position: int | None = None  # DROPS: where the weights are in the tuple the function returns


def proved_at_sites(tree: Tree, parsed: ParsedModule, claims: tuple[Claim, ...]) -> list[str] | None:
    """The call sites (`path:line`) that prove every claim, or None when one call, or one claim, does not."""
    where: list[str] = []
    for claim in claims:
        found = _sites_prove(tree, parsed, claim.function, claim.parameter, claim, 0)
        if found is None:
            return None
        where.extend(site for site in found if site not in where)
    return where


def _sites_prove(tree: Tree, parsed: ParsedModule, function: cst.FunctionDef, parameter: str, claim: Claim,
                 depth: int) -> list[str] | None:
    sites = tree.sites(parsed, function, parameter)
    if not sites or depth > MAX_DEPTH:
        return None
    where: list[str] = []
    for site in sites:
        found = _site_proves(tree, site, claim, depth)
        if found is None:
            return None
        where.extend(found)
    return where


def _site_proves(tree: Tree, site: CallSite, claim: Claim, depth: int) -> list[str] | None:
    if claim.check == DROPS:  # about the call's result: what the caller does with it, not what it passes
        return [site.where] if _drops(site, claim.position) else None
    argument, scope = site.argument, site.scope
    if argument is None:
        return None
    if claim.none_ok and isinstance(argument, cst.Name) and argument.value == "None":
        return [site.where]
    passed_on = parameter_of(scope, argument) if scope is site.parsed else None
    if passed_on is not None:  # the caller's own parameter: what its callers pass (q and k are other values there)
        return _sites_prove(tree, scope, *passed_on, replace(claim, peers=()), depth + 1)
    return [site.where] if _holds(site, claim) else None


def parameter_of(parsed: ParsedModule, node: cst.BaseExpression) -> tuple[cst.FunctionDef, str] | None:
    """(function, parameter) when `node` is a read of that function's parameter and nothing else reaches it, or
    `self.x` whose class's only value for it is its `__init__`'s parameter (`self.scale = scale`)."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        owner = SiteScope(parsed, node).owner
        value = owner.only_value(node.attr.value) if owner is not None else None
        found = parameter_of(parsed, value) if isinstance(value, cst.Name) else None
        return found if found is not None and found[0] is owner.methods.get("__init__") else None
    if not isinstance(node, cst.Name):
        return None
    function = parsed.innermost(node, cst.FunctionDef)
    if function is None:
        return None
    flow = parsed.flow(function)
    definitions = flow.definitions_of(node)
    if flow.sees_undefined(node) or len(definitions) != 1 or definitions[0].kind != "param":
        return None
    owner = parsed.innermost(definitions[0].statement, cst.FunctionDef)
    return (owner, node.value) if owner is not None else None


def _holds(site: CallSite, claim: Claim) -> bool:
    argument, scope = site.argument, SiteScope(site.scope, site.argument)
    if claim.check == RANK:
        ranks = scope.ranks()
        low, high = ranks.bounds(argument)
        need_low, need_high = claim.rank
        if need_high is not None:
            need_high = max([need_high] + [ranks.bounds(peer)[0] for peer in _peer_arguments(site, claim)])
        return low >= need_low and (need_high is None or (high is not None and high <= need_high))
    if claim.check in (NOT_FLOAT, BOOL):
        return scope.not_float(argument, bool_only=claim.check == BOOL)
    if claim.check in (SMALL, KEEPS_A_KEY):
        return all(_swallows_no_row(scope, claim, value) for value in _unless_none(scope, argument, claim))
    if claim.check == NUMBER:
        return scope.python_number(argument)
    if claim.check == FLOATING:
        return all(scope.floating(value) for value in _unless_none(scope, argument, claim))
    return False


def _swallows_no_row(scope: "SiteScope", claim: Claim, node: cst.BaseExpression) -> bool:
    if values_may_differ(scope.parsed):
        return False  # torch's builders or settings replaced: what builds the mask may not compute as read
    bounds = scope.interval(node)
    if bounds is not None and max(abs(bounds[0]), abs(bounds[1])) <= SMALL_LIMIT:
        return True
    return claim.check == KEEPS_A_KEY and scope.causal_additive(node)


def _unless_none(scope: "SiteScope", argument: cst.BaseExpression, claim: Claim) -> list[cst.BaseExpression]:
    """What the claim is about at this call: the argument, or, where the block uses the parameter only when it is
    not None and the argument is a name that may hold None (`mask = None` then `if n > 1: mask = ...`), the other
    values it may hold (none: it is always None)."""
    values = scope.values(argument) if claim.none_ok and isinstance(argument, cst.Name) else None
    if not values or not any(_is_none(value) for value in values):
        return [argument]
    return [value for value in values if not _is_none(value)]


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _drops(site: CallSite, position: int) -> bool:
    """The call's result is never read at `position`: the call is a statement of its own, is indexed at another
    constant position, or is unpacked (no starred target) into a function's local name that nothing reads."""
    parsed, call = site.parsed, site.call
    parent = parsed.parents.get(call)
    if isinstance(parent, cst.Expr):
        return True
    if isinstance(parent, cst.Subscript) and parent.value is call and len(parent.slice) == 1 and \
            isinstance(parent.slice[0].slice, cst.Index):
        index = int_value(parent.slice[0].slice.value)
        return isinstance(index, int) and 0 <= index != position
    if not (isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1 and
            isinstance(parent.targets[0].target, (cst.Tuple, cst.List))):
        return False
    elements = parent.targets[0].target.elements
    if position >= len(elements) or any(isinstance(e, cst.StarredElement) for e in elements) or \
            not isinstance(elements[position].value, cst.Name):
        return False
    function = parsed.innermost(call, cst.FunctionDef)
    name = elements[position].value.value
    if function is None or name in outer_names(function) or name in nested_names(function) or \
            _reads_frame(parsed, function):
        return False
    flow = parsed.flow(function)
    bound = [d for d in flow.definitions.values() if d.statement is parent and d.name == name]
    return len(bound) == 1 and not flow.reads_of(bound[0])


FRAME_READERS = ("locals", "vars", "eval", "exec", "_getframe", "currentframe")


def _reads_frame(parsed: ParsedModule, function: cst.FunctionDef) -> bool:
    """The function reads its locals by other means than their names (`locals()["w"]`, `eval("w")`,
    `sys._getframe().f_locals`)."""
    return any(parsed.innermost(call, cst.FunctionDef) is function
               for name in FRAME_READERS for call in parsed.calls_by_name.get(name, []))


def _peer_arguments(site: CallSite, claim: Claim) -> list[cst.BaseExpression]:
    """What this call passes for q's and k's parameters (those it writes out; a default is no tensor)."""
    found = []
    for peer in claim.peers:
        bound = bound_argument(claim.function, site.call, peer, skip_self=site.method, caller=site.parsed)
        if bound and not bound[1] and bound[0] is not None:
            found.append(bound[0])
    return found


@dataclass(frozen=True)
class MaskReader:
    """What the causal-mask readers (`attention.causal`) ask of where a mask is read, at a call site."""

    parsed: ParsedModule
    owner: object  # the caller's class (`module_index.ClassInfo`), or None
    reader: OpReader
    values: ValueProver


class SiteScope:
    """An expression at a call site: what its names hold there (assignments in its function, a module-level
    tensor assigned once, an attribute its class assigns once), read without running anything."""

    def __init__(self, parsed: ParsedModule, node: cst.CSTNode) -> None:
        self.parsed = parsed
        self.argument = node  # the call site's argument, which the callee (the block's function) takes on
        self.function = parsed.frame(node)
        self.owner = parsed.owner_of(self.function)

    def ranks(self) -> mk.RankBounds:
        prover = self.prover()
        return mk.RankBounds(self.parsed, self.owner, OpReader(self.parsed, self.owner), lambda node: None,
                             self.values, lambda call: None,
                             prover.is_scalar if prover is not None else lambda node: number_value(node) is not None)

    def prover(self) -> ValueProver | None:
        return ValueProver(self.parsed, self.parsed.flow(self.function), self.owner) if self.function else None

    def causal_additive(self, node: cst.BaseExpression) -> bool:
        """`node` is a causal additive mask, 0 at key 0 of every row, as the block's own would be proved
        (`causal.reads_causal_additive`), reading names as they are here (a module-level call reads globals)."""
        from advisor.patterns.attention.causal import reads_causal_additive

        if self._subclass_binds(self_names([node])):
            return False
        flow = self.parsed.flow(self.function) if self.function else None
        reader = MaskReader(self.parsed, self.owner, OpReader(self.parsed, self.owner),
                            ValueProver(self.parsed, flow, self.owner))
        return reads_causal_additive(reader, node, self.values)

    def _subclass_binds(self, attributes: set[str]) -> bool:
        """Whether a subclass of the caller's class (in its file or the tree) binds or overrides one of `self`'s
        `attributes`: at the call, `self` may be its instance, holding another value than the class assigns."""
        if self.owner is None or not attributes:
            return False
        return overridden(self.parsed.derived(ClassTable, ClassTable.of), self.owner, attributes) is not None

    def values(self, name: cst.Name) -> list[cst.BaseExpression] | None:
        """The values assigned to `name` that reach this read (`module_values.assigned_values`)."""
        return assigned_values(self.parsed, name, followed=(name, self.argument))

    def _resolved(self, node: cst.BaseExpression) -> list[cst.BaseExpression] | None:
        if isinstance(node, cst.Name):
            return self.values(node)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self" \
                and self.owner is not None:
            if self._subclass_binds({node.attr.value}):
                return None  # a subclass binds it otherwise: `self` may be its instance
            value = self.owner.only_value(node.attr.value)
            return [value] if value is not None else None
        return None

    def python_number(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """A Python number, never a tensor (not even one wrapping a number, as `torch.tensor(0.1)`, which SDPA's
        `scale` does not take): literals, arithmetic of numbers, `math.sqrt`/`float`/`int`/`len`, sizes."""
        if depth > 12:
            return False
        below = lambda child: self.python_number(child, depth + 1)  # noqa: E731
        if number_value(node) is not None:
            return True
        resolved = self._resolved(node)
        if resolved is not None:
            return all(below(value) for value in resolved)
        if isinstance(node, cst.UnaryOperation):
            return below(node.expression)
        if isinstance(node, cst.BinaryOperation):
            return below(node.left) and below(node.right)
        if isinstance(node, cst.IfExp):
            return below(node.body) and below(node.orelse)
        if isinstance(node, cst.Call) and self.parsed.imported_name(node.func) in NUMBER_FUNCTIONS:
            return True
        prover = self.prover()
        return prover is not None and prover.is_size(node)

    def not_float(self, node: cst.BaseExpression, depth: int = 0, bool_only: bool = False) -> bool:
        """A bool or integer tensor (SDPA gets it as q's dtype: its values exactly); with `bool_only`, a bool one."""
        if depth > 12:
            return False
        below: Callable[[cst.BaseExpression], bool] = \
            lambda child: self.not_float(child, depth + 1, bool_only)  # noqa: E731
        kinds = {"bool"} if bool_only else NON_FLOAT_DTYPES
        methods = NON_FLOAT_METHODS - INTEGER_METHODS if bool_only else NON_FLOAT_METHODS
        if isinstance(node, cst.Comparison):
            return True
        resolved = self._resolved(node)
        if resolved is not None:
            return all(below(value) for value in resolved)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return below(node.expression)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            # bool only where both sides are; no float where one side is a tensor that is none (`band | is_global`:
            # `&`, `|` and `^` raise on a float tensor), but of two other values (`DEFAULTS | extras`, dicts) nothing
            return (all if bool_only else any)(below(side) for side in (node.left, node.right))
        if isinstance(node, cst.Subscript):
            return below(node.value)
        if not isinstance(node, cst.Call) or _writes_out(node):
            return False
        dtype = next((dtype_name(self.parsed, a.value) for a in node.args if a.keyword is not None
                      and a.keyword.value == "dtype"), None)
        dotted = self.parsed.imported_name(node.func) or ""
        if dtype is not None:
            return dtype in kinds
        if dotted in ("torch.randint", "torch.randint_like") and not bool_only or \
                dotted.split(".")[-1] in methods and dotted.startswith("torch."):
            return True
        if dotted in ("torch.tril", "torch.triu") and node.args:
            return below(node.args[0].value)
        if isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            if method in methods:
                return True
            if method == "to" and node.args and dtype_name(self.parsed, node.args[0].value) is not None:
                return dtype_name(self.parsed, node.args[0].value) in kinds
            if (method in KEEP_VALUES - {"float", "double", "half", "bfloat16", "to", "type_as", "type"} -
                    INTEGER_METHODS or method in ("tril", "triu", "masked_fill")) and not views_another_dtype(node):
                return below(node.func.value)
        return False

    def floating(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """A floating-point tensor, as its construction shows (open_clip's causal buffer: `torch.empty(n, n)`, then
        `fill_(-inf)` and `triu_(1)`, in a helper method): a creation from sizes with no dtype or a float one,
        `torch.full` of a float fill, a float cast, torch's causal builder, and methods and functions that keep
        the dtype of one."""
        from advisor.patterns.attention.causal import TORCH_CAUSAL_MASKS

        if depth > 12 or values_may_differ(self.parsed):
            return False
        below = lambda child: self.floating(child, depth + 1)  # noqa: E731
        resolved = self._resolved(node)
        if resolved is None and isinstance(node, cst.Name):
            resolved = self._bound_values(node)
        if resolved is not None:
            return all(below(value) for value in resolved)
        if isinstance(node, cst.Subscript):
            return below(node.value)
        if not isinstance(node, cst.Call) or any(a.star for a in node.args) or _writes_out(node):
            return False
        dtype = next((dtype_name(self.parsed, a.value) for a in node.args if a.keyword is not None
                      and a.keyword.value == "dtype"), None)
        dotted = self.parsed.imported_name(node.func) or ""
        if dotted in FLOAT_CREATORS or dotted == "torch.full":
            if dtype is not None:
                return dtype in FLOAT_DTYPES
            fill = node.args[1].value if dotted == "torch.full" and len(node.args) > 1 else None
            return dotted != "torch.full" or fill is not None and _float_literal(self.parsed, fill)
        if dotted in TORCH_CAUSAL_MASKS:
            return True
        if dotted in ("torch.triu", "torch.tril") and node.args:
            return below(node.args[0].value)
        if dotted or not isinstance(node.func, cst.Attribute):
            return False
        method = node.func.attr.value
        if method in FLOAT_METHODS and not node.args:
            return True
        if method == "to" and node.args and dtype_name(self.parsed, node.args[0].value) is not None:
            return dtype_name(self.parsed, node.args[0].value) in FLOAT_DTYPES
        if method in DTYPE_KEEPING_METHODS and not views_another_dtype(node):
            return below(node.func.value)
        helper = self.owner.methods.get(method) if self.owner is not None and is_self(node.func.value) else None
        if helper is None or helper.decorators or self._subclass_binds({method}) or \
                self.owner.method_shadowed(method) is not None:
            return False
        returned = [r.value for r in descendants(helper, (cst.Return,))
                    if self.parsed.innermost(r, cst.FunctionDef) is helper]
        return bool(returned) and None not in returned and \
            all(SiteScope(self.parsed, value).floating(value, depth + 1) for value in returned)

    def _bound_values(self, name: cst.Name) -> list[cst.BaseExpression] | None:
        """What the function's plain assignments bind to a local, where every other binding of it updates it in
        place (`mask.fill_(-inf)`, `mask[0] = 1`, `mask += m`), which keeps a tensor's dtype; None for a parameter,
        an unpacking or a name bound otherwise."""
        function = self.parsed.frame(name)
        if function is None:
            return None
        definitions = [d for d in self.parsed.flow(function).definitions.values() if d.name == name.value]
        if not definitions or any(d.kind not in ("assign", "inplace", "store", "aug") or
                                  d.kind == "assign" and (d.index is not None or d.value is None)
                                  for d in definitions):
            return None
        return [d.value for d in definitions if d.kind == "assign"] or None

    def interval(self, node: cst.BaseExpression, depth: int = 0) -> Interval | None:
        """Bounds on every value of the tensor or number `node`; None when the source does not show them."""
        if depth > 12:
            return None
        below = lambda child: self.interval(child, depth + 1)  # noqa: E731
        number = number_value(node)
        if number is not None:
            return number, number
        if _is_bool(node):
            return 0.0, 1.0
        resolved = self._resolved(node)
        if resolved is not None:
            return _union([below(value) for value in resolved])
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            inner = below(node.expression)
            return None if inner is None else (-inner[1], -inner[0])
        if isinstance(node, cst.BinaryOperation):
            return _arithmetic(node, below(node.left), below(node.right))
        if isinstance(node, cst.Subscript):
            return below(node.value)
        if isinstance(node, cst.Call):
            return self._call_interval(node, below)
        return None

    def _call_interval(self, node: cst.Call, below) -> Interval | None:
        if self._narrow_integer(node) or _writes_out(node):
            return None  # its arithmetic wraps: `(ids == 0).byte() * -10` is 246; `out=` has its own dtype
        dotted = self.parsed.imported_name(node.func) or ""
        args = [a.value for a in node.args if a.keyword is None]
        if dotted in BOUNDED_CREATORS:
            return BOUNDED_CREATORS[dotted]
        if dotted == "torch.full" and len(args) >= 2:
            return below(args[1])
        if dotted == "torch.randint" and len(args) in (2, 3):  # randint([low,] high, size): low <= x < high
            bounds = [number_value(arg) for arg in ([cst.Integer("0")] + args[:1] if len(args) == 2 else args[:2])]
            return None if None in bounds else (bounds[0], bounds[1] - 1)
        if dotted in ("torch.tril", "torch.triu") and args:
            return _union([below(args[0]), (0.0, 0.0)])
        if dotted == "torch.where" and len(args) == 3:
            return _union([below(args[1]), below(args[2])])
        if not isinstance(node.func, cst.Attribute):
            return None
        method, receiver = node.func.attr.value, node.func.value
        if method in BOUNDED_METHODS:
            return BOUNDED_METHODS[method]
        if method in ("new_full", "fill_") and args:
            return below(args[-1])
        if method == "uniform_" and len(args) == len(node.args) <= 2:  # every element drawn in [from, to]
            low, high = [*args, None, None][:2]
            return _union([below(low) if low is not None else (0.0, 0.0),
                           below(high) if high is not None else (1.0, 1.0)])
        if method in ("tril", "triu"):
            return _union([below(receiver), (0.0, 0.0)])
        if method == "masked_fill" and len(args) == 2:
            covered = _complementary_fill(receiver, args[0])
            if covered is not None:  # every element is one fill or the other (Swin's shifted-window mask)
                return _union([below(covered), below(args[1])])
            return _union([below(receiver), below(args[1])])
        if method in KEEP_VALUES and not views_another_dtype(node):
            return below(receiver)
        return None


    def _narrow_integer(self, node: cst.Call) -> bool:
        """A call whose result is an integer tensor narrower than int32 (`.byte()`, `.to(torch.uint8)`,
        `torch.ones(..., dtype=torch.int8)`)."""
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in NARROW_INTEGER_METHODS:
            return True
        return any(dtype_name(self.parsed, arg.value) in NARROW_INTEGERS for arg in node.args)


def _float_literal(parsed: ParsedModule, node: cst.BaseExpression) -> bool:
    """A float number as written: `-1e9`, `0.0`, `float("-inf")`, `-math.inf` (torch.full then makes a float
    tensor; an int fill makes an integer one)."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    if isinstance(node, cst.Float):
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "float" and \
            "float" not in parsed.bindings:
        return True
    return parsed.imported_name(node) in ("math.inf", "torch.inf", "numpy.inf", "math.nan")


def _complementary_fill(receiver: cst.BaseExpression, condition: cst.BaseExpression) -> cst.BaseExpression | None:
    """The first fill of `x.masked_fill(c, a).masked_fill(~c, b)` (`receiver` the first call, `condition` the
    second's), where the two conditions are complements read in one expression: `m != 0` and `m == 0` (exact
    complements, NaN included), `c` and `~c`, calling nothing (a call may give other values each time); every
    element then holds `a` or `b` (Swin's `attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask ==
    0, 0.0)`). None for anything else."""
    if not (isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and
            receiver.func.attr.value == "masked_fill" and len(receiver.args) == 2 and
            all(arg.keyword is None and not arg.star for arg in receiver.args)):
        return None
    first = receiver.args[0].value
    if descendants(first, (cst.Call, cst.NamedExpr)) or descendants(condition, (cst.Call, cst.NamedExpr)):
        return None
    return receiver.args[1].value if _complements(first, condition) or _complements(condition, first) else None


def _complements(one: cst.BaseExpression, other: cst.BaseExpression) -> bool:
    if isinstance(other, cst.UnaryOperation) and isinstance(other.operator, cst.BitInvert):
        return other.expression.deep_equals(one)
    if not (isinstance(one, cst.Comparison) and isinstance(other, cst.Comparison) and
            len(one.comparisons) == len(other.comparisons) == 1):
        return False
    flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(one.comparisons[0].operator))
    return flipped is not None and isinstance(other.comparisons[0].operator, flipped) and \
        one.left.deep_equals(other.left) and one.comparisons[0].comparator.deep_equals(other.comparisons[0].comparator)


def _is_bool(node: cst.BaseExpression) -> bool:
    """An expression whose values are 0 and 1: a comparison, `.bool()`, a logical method, `~`/`&`/`|` of those."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value in NON_FLOAT_METHODS - {"long", "int", "byte", "short", "char"}
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return _is_bool(node.expression)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
        return _is_bool(node.left) and _is_bool(node.right)
    return isinstance(node, cst.Comparison)


def _union(options: list[Interval | None]) -> Interval | None:
    if not options or any(option is None for option in options):
        return None
    return min(low for low, _ in options), max(high for _, high in options)


EXACT_MAGNITUDE = 256.0  # bfloat16 holds every integer up to here: beyond, a sum may round, or overflow in float16


def _arithmetic(node: cst.BinaryOperation, left: Interval | None, right: Interval | None) -> Interval | None:
    """Bounds on a sum, difference, product or quotient, computed exactly; only where every bound stays within
    EXACT_MAGNITUDE, since the tensor may hold its values in float16 or bfloat16 (`full(-6e4, dtype=half) * 2` is
    -inf there, and adding 1.2e5 back leaves -inf, not 0)."""
    if left is None or right is None or max(map(abs, (*left, *right))) > EXACT_MAGNITUDE:
        return None
    if isinstance(node.operator, cst.Add):
        found = left[0] + right[0], left[1] + right[1]
    elif isinstance(node.operator, cst.Subtract):
        found = left[0] - right[1], left[1] - right[0]
    elif isinstance(node.operator, cst.Multiply):
        products = [a * b for a in left for b in right]
        found = min(products), max(products)
    elif isinstance(node.operator, cst.Divide) and right[0] == right[1] and right[0] != 0:
        products = [a / right[0] for a in left]
        found = min(products), max(products)
    else:
        return None
    return found if max(map(abs, found)) <= EXACT_MAGNITUDE else None


def describe(claim: Claim) -> str:
    return SHOWS[claim.check]


def settle_from_call_sites(tree: Tree, parsed: ParsedModule, facts: FactSheet) -> None:
    """Each assumed fact whose claims every call site in the tree proves becomes proved from call sites."""
    for fact in list(facts.assumptions):
        if fact.claims:
            sites = proved_at_sites(tree, parsed, fact.claims)
            if sites:
                facts.from_call_sites(fact, sites, " and ".join(dict.fromkeys(SHOWS[c.check] for c in fact.claims)))


WEIGHTS_DROPPED = "weights-dropped"


def settle_dropped_weights(tree: Tree, parsed: ParsedModule, match) -> None:
    """Weights returned to callers that all drop them (`match.dropped`): None stands in for them at every call in
    the tree, so the rewrite that returns None is exact there (proved from call sites, the sites listed)."""
    if not match.dropped:
        return
    sites = proved_at_sites(tree, parsed, match.dropped)
    if not sites:
        return
    position = match.dropped[0].position
    match.facts.assumed(WEIGHTS_DROPPED, f"no caller reads the weights the function returns (element {position})",
                        "its callers are outside the block")
    fact = next(f for f in match.facts.assumptions if f.name == WEIGHTS_DROPPED)
    match.facts.from_call_sites(fact, sites, SHOWS[DROPS])


def weights_dropped(facts: FactSheet) -> bool:
    return any(fact.name == WEIGHTS_DROPPED and fact.status == FROM_CALL_SITES for fact in facts.facts)


def _writes_out(call: cst.Call) -> bool:
    """`torch.ne(ids, 0, out=buf)` (or `**options` that may hold it): the result is `buf`, of `buf`'s dtype,
    whatever the function's own would be."""
    return any(arg.keyword is not None and arg.keyword.value == "out" or arg.star == "**" for arg in call.args)
