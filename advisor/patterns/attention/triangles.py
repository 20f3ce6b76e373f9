"""Square masks built from triangles, read as the values of their three parts: below the diagonal, on it, above it.

Causal additive masks are spelled many ways: `torch.full((n, n), -inf).triu(1)`, `torch.where(tril, 0.0, -inf)`,
`torch.zeros(n, n).masked_fill(tril == 0, -1e4)`, `(1 - tril) * -1e9`, CLIP's helper (`m = torch.empty(n, n)`,
`m.fill_(-inf)`, `m.triu_(1)`, `return m`), or the PyTorch tutorial's helper (`mask = (torch.triu(torch.ones(n,
n)) == 1).transpose(0, 1)`, then `mask.float().masked_fill(mask == 0, -inf).masked_fill(mask == 1, 0.0)`), or the
key index compared with the query index (`(torch.arange(n)[None, :] > torch.arange(n)[:, None]) * -1e9`). Each is
constant in each part of every square, so evaluating the operations on the three values (`Parts`) reads them all,
where matching each spelling misses the next one. A mask 0 on and below the diagonal keeps key 0 of every row at 0:
no row is fully masked, whatever the part above holds (-inf or a fill).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace

import libcst as cst

from advisor.patterns.ops import int_value
from advisor.patterns.values import FLOAT_MAX, finfo_extreme, float32
from advisor.static.dataflow import is_self, loaded_names

MAX_DEPTH = 24  # operations followed from one mask
UNKNOWN = math.nan  # a part whose values the source does not fix (`torch.empty`)
CREATORS = {"torch.ones": 1.0, "torch.zeros": 0.0, "torch.empty": UNKNOWN}
SAME_VALUES = {"contiguous", "clone", "detach", "expand"}  # an n x n square stays one (n = 1 spreads its one value)
IN_PLACE = {"fill_", "zero_", "tril_", "triu_", "masked_fill_"}
# the largest finite value of each float dtype (a cast rounds beyond it to ±inf); None: an integer dtype
DTYPES = {"float32": 3.4028234663852886e38, "float": 3.4028234663852886e38, "float64": math.inf,
          "double": math.inf, "float16": 65504.0, "half": 65504.0, "bfloat16": 3.3895313892515355e38,
          "bool": 1.0, "uint8": None, "int8": None, "int16": None, "int32": None, "int64": None, "int": None,
          "long": None, "short": None}
# what each integer dtype holds without wrapping (int64 read no further than float32 arithmetic stays exact-ish)
INTEGER_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-2 ** 15, 2 ** 15 - 1),
                  "int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 31, 2 ** 31 - 1)}
CANONICAL = {"float": "float32", "double": "float64", "half": "float16", "int": "int32", "long": "int64",
             "short": "int16"}
CAST_METHODS = {"float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16", "bool": "bool",
                "long": "int64", "int": "int32", "byte": "uint8", "short": "int16"}
ARITHMETIC = {cst.Add: operator.add, cst.Subtract: operator.sub, cst.Multiply: operator.mul}
COMPARISONS = {cst.Equal: operator.eq, cst.NotEqual: operator.ne, cst.LessThan: operator.lt,
               cst.GreaterThan: operator.gt, cst.LessThanEqual: operator.le, cst.GreaterThanEqual: operator.ge}

Resolve = Callable[[cst.Name], "list[cst.BaseExpression] | None"]


@dataclass(frozen=True)
class Parts:
    """The value below the diagonal, on it and above it of every square in the last two dims (NaN: not fixed by
    the source, or NaN), the tensor's `ndim`, the side of its squares as the source spells it, and its dtype."""

    below: float
    diagonal: float
    above: float
    ndim: int
    side: str
    dtype: str = "float32"  # what holds the values: arithmetic and fills round to it (float16 overflows at 65504)

    @property
    def values(self) -> tuple[float, float, float]:
        return self.below, self.diagonal, self.above

    def map(self, function) -> Parts | None:
        """Each known value through `function` (None from it: no parts); unknown ones stay unknown."""
        values = [value if math.isnan(value) else function(value) for value in self.values]
        return None if None in values else replace(self, below=values[0], diagonal=values[1], above=values[2])

    @property
    def keeps_first_key(self) -> bool:
        """0 on and below the diagonal (key 0 of row r is below it, of row 0 on it), nothing positive above."""
        return self.below == 0 and self.diagonal == 0 and self.above <= 0


def square_parts(c, node: cst.BaseExpression, values_of: Resolve) -> Parts | None:
    """The parts of the square mask `node` builds, reading names through `values_of` (exactly one value each) and
    helpers of the file whose body is straight-line (`_Reader.helper`); None where the source does not build a
    square. `c`: a Candidate, or any reader with its `parsed` and `values`."""
    return _Reader(c, values_of).parts(node, {}, 0)


FLOATS = ("float16", "bfloat16", "float32", "float64")
EVERY_DTYPE = (*FLOATS, "bool", "uint8", "int8", "int16", "int32", "int64")
MAX_UNKNOWN_DTYPES = 2  # dtypes read in every combination (10 * 10 readings at most)


def keeps_first_key_in_every_dtype(c, node: cst.BaseExpression, values_of: Resolve) -> bool:
    """Whether the square mask `node` builds keeps key 0 of every row (`Parts.keeps_first_key`) whatever dtypes the
    dtypes it reads but the source does not name hold: Whisper's and transformers' `torch.full((n, n),
    torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)`, read once for each float dtype `x` may have (`torch.finfo`
    takes floats only) and each dtype a `dtype=` argument alone may name (bool and integers too)."""
    reader = _Reader(c, values_of)
    parts = reader.parts(node, {}, 0)
    if parts is not None or not reader.unknown or len(reader.unknown) > MAX_UNKNOWN_DTYPES:
        return parts is not None and parts.keeps_first_key
    codes = sorted(reader.unknown)
    choices = [FLOATS if reader.unknown[code] else EVERY_DTYPE for code in codes]
    for chosen in itertools.product(*choices):
        reading = _Reader(c, values_of, dict(zip(codes, chosen)))
        parts = reading.parts(node, {}, 0)
        if reading.raises:
            continue  # `torch.finfo` of a dtype read as bool or an integer: no mask is built
        if parts is None or not parts.keeps_first_key or set(reading.unknown) - set(codes):
            return False
    return True


class _Reader:
    def __init__(self, c, values_of: Resolve, dtypes: dict[str, str] | None = None) -> None:
        self.c, self.parsed, self.values_of = c, c.parsed, values_of
        self.dtypes = dtypes or {}  # the code of a dtype the source does not name -> the dtype it is read as
        self.unknown: dict[str, bool] = {}  # such codes met: True where a `torch.finfo` reads it (a float)
        self.raises = False  # this reading takes `torch.finfo` of a dtype that is no float

    def parts(self, node: cst.BaseExpression, local: dict[str, Parts | None], depth: int) -> Parts | None:
        if depth > MAX_DEPTH:
            return None
        below = lambda child: self.parts(child, local, depth + 1)  # noqa: E731
        if isinstance(node, cst.Name):
            if node.value in local:
                return local[node.value]
            values = self.values_of(node)
            return below(values[0]) if values and len(values) == 1 else None
        if isinstance(node, cst.Subscript):
            return _leading_nones(node, below(node.value))
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert) and \
                _is_bool(node.expression):  # `~` of an integer tensor is bitwise
            inner = below(node.expression)
            return inner.map(lambda v: 1.0 - v) if inner is not None else None
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            inner = below(node.expression)
            return inner.map(operator.neg) if inner is not None else None
        if isinstance(node, cst.Attribute) and node.attr.value in ("T", "mT"):
            return _transposed(below(node.value), 2 if node.attr.value == "T" else None)
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and \
                type(node.comparisons[0].operator) in COMPARISONS:
            test = node.comparisons[0]
            compare, number = COMPARISONS[type(test.operator)], self._number(test.comparator)
            grid = self._index_grid(node.left, test.comparator, compare)
            if grid is not None:
                return grid
            inner = below(node.left)
            compared = inner.map(lambda v: float(compare(v, number))) if inner is not None and number is not None \
                else None
            return replace(compared, dtype="bool") if compared is not None else None
        if isinstance(node, cst.BinaryOperation) and type(node.operator) in ARITHMETIC:
            return self._arithmetic(ARITHMETIC[type(node.operator)], node.left, node.right, below)
        if isinstance(node, cst.Call) and not any(a.star for a in node.args):
            return self._call(node, below, depth)
        return None

    def _index_grid(self, left: cst.BaseExpression, right: cst.BaseExpression, compare) -> Parts | None:
        """`torch.arange(n)[None, :] > torch.arange(n)[:, None]`: the key index against the query index of every
        cell, read where it is below (key < query), on and above the diagonal."""
        sides = [self._index_axis(left), self._index_axis(right)]
        if None in sides or sides[0][1] != sides[1][1] or {sides[0][0], sides[1][0]} != {"key", "query"}:
            return None
        cells = {"below": (0, 1), "diagonal": (0, 0), "above": (1, 0)}  # (key, query) of a cell of each part
        values = {part: float(compare(*(key, query) if sides[0][0] == "key" else (query, key)))
                  for part, (key, query) in cells.items()}
        return Parts(values["below"], values["diagonal"], values["above"], 2, sides[0][1], "bool")

    def _index_axis(self, node: cst.BaseExpression) -> tuple[str, str] | None:
        """("key", n) for `torch.arange(n)` as a row (`[None, :]`, `[None]`, `.unsqueeze(0)`, or alone, broadcast),
        ("query", n) as a column (`[:, None]`, `.unsqueeze(1)`, `.unsqueeze(-1)`); None for anything else."""
        kind = "key"
        if isinstance(node, cst.Subscript):
            codes = [self.parsed.code(element.slice).replace(" ", "") for element in node.slice]
            kind = {("None", ":"): "key", ("None",): "key", (":", "None"): "query"}.get(tuple(codes))
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value == "unsqueeze" and len(node.args) == 1:
            kind = {0: "key", 1: "query", -1: "query"}.get(int_value(node.args[0].value))
            node = node.func.value
        if kind is None or not (isinstance(node, cst.Call) and self.parsed.imported_name(node.func) == "torch.arange"
                                and len(node.args) == 1 and node.args[0].keyword is None):
            return None
        return kind, self.parsed.code(node.args[0].value).replace(" ", "")

    def _number(self, node: cst.BaseExpression) -> float | None:
        """A number the source fixes, a fill of a named dtype's extreme (`torch.finfo(torch.float32).min`)
        included; not one of a tensor's dtype, whose magnitude no part could add to."""
        number = self.c.values.constant_number(node)
        if number is None and self.c.values.fill_kind(node) == "neginf":  # `-np.inf`, `-math.inf`, ...
            return -math.inf
        extreme = _dtype_extreme(self.parsed, node) if number is None else None
        if extreme is not None:  # `torch.finfo(x.dtype).min`: read as each float x may hold
            dtype = extreme[0] if extreme[0] in FLOAT_MAX else self._dtype(extreme[0], float_only=True)
            self.raises = self.raises or dtype is not None and dtype not in FLOAT_MAX
            return extreme[1] * FLOAT_MAX[dtype] if dtype in FLOAT_MAX else None
        fill = self.c.values.fill_value(node) if number is None else None
        return number if number is not None else fill if isinstance(fill, float) else None

    def _dtype(self, code: str, float_only: bool = False) -> str | None:
        """The dtype the unnamed dtype `code` is read as in this reading; None (noted as met) in the first."""
        if code in self.dtypes:
            return self.dtypes[code]
        self.unknown[code] = self.unknown.get(code, False) or float_only
        return None

    def _dtype_named(self, node: cst.BaseExpression) -> str:
        """The dtype `torch.float16` (or `x.dtype`, as this reading takes it) names; "" when none."""
        named = (self.parsed.imported_name(node) or "").removeprefix("torch.")
        if named in DTYPES or not isinstance(node, (cst.Name, cst.Attribute)):
            return named
        return self._dtype(self.parsed.code(node).replace(" ", "")) or ""

    def _arithmetic(self, apply, left_node, right_node, below) -> Parts | None:
        """Elementwise arithmetic in float32, the result held in the dtype torch promotes to (a float16 sum beyond
        65504 is ±inf there; an integer one that could wrap is not read)."""
        left, right = below(left_node), below(right_node)
        if left is None and right is None:
            return None
        if left is not None and right is not None:
            if (left.ndim, left.side) != (right.ndim, right.side):
                return None
            values = [_rounded(apply, a, b) for a, b in zip(left.values, right.values)]
            return _held(replace(left, below=values[0], diagonal=values[1], above=values[2]),
                         _promoted(left.dtype, right.dtype))
        number_node = right_node if left is not None else left_node
        number = self._number(number_node)
        if number is None:
            return None
        tensor = left if left is not None else right
        dtype = _with_number(tensor.dtype, _is_integer_literal(number_node))
        return _held(left.map(lambda v: _rounded(apply, v, number)) if left is not None else
                     right.map(lambda v: _rounded(apply, number, v)), dtype)

    def _call(self, node: cst.Call, below, depth: int) -> Parts | None:
        dotted = self.parsed.imported_name(node.func)
        args = [a.value for a in node.args if a.keyword is None]
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if dotted in CREATORS or dotted == "torch.full":
            return self._created(dotted, args, keywords)
        if dotted in ("torch.tril", "torch.triu") and args:
            return _triangle(below(args[0]), dotted[-4:], _diagonal(args[1:], keywords))
        if dotted == "torch.where" and len(args) == 3:
            return _where(below(args[0]), self._value(args[1], below), self._value(args[2], below))
        if isinstance(node.func, cst.Name) and node.func.value in self.parsed.plain_functions:
            return self.helper(self.parsed.plain_functions[node.func.value], depth)
        method = self._own_method(node.func)
        if method is not None:  # open_clip's `self.build_causal_mask()`, registered as a buffer
            return self.helper(method, depth)
        if not isinstance(node.func, cst.Attribute) or dotted is not None:
            return None
        method, receiver = node.func.attr.value, node.func.value
        inner = below(receiver)
        if inner is None:
            return None
        if method in ("tril", "triu", "tril_", "triu_"):
            return _triangle(inner, method[:4], _diagonal(args, keywords))
        if method in ("fill_", "zero_"):
            value = self._number(args[0]) if method == "fill_" and len(args) == 1 and not keywords else \
                0.0 if method == "zero_" and not args else None
            return None if value is None else _held(replace(inner, below=value, diagonal=value, above=value),
                                                    inner.dtype)
        if method == "t" and not args:
            return _transposed(inner, 2)
        if method == "transpose" and len(args) == 2:
            dims = sorted(int_value(arg) for arg in args if int_value(arg) is not None)
            return _transposed(inner, None if dims == [-2, -1] else 2 if dims == [0, 1] else -1)
        if method in ("masked_fill", "masked_fill_") and len(args) == 2:  # the fill is held in the tensor's dtype
            filled = _where(below(args[0]), self._value(args[1], below), inner)
            return _held(filled, inner.dtype) if filled is not None else None
        if method in CAST_METHODS and not args or method in ("to", "type") and len(args) == 1 and not keywords:
            return _cast(inner, CAST_METHODS.get(method) or self._dtype_named(args[0]))
        if method in ("view", "reshape") and not keywords:
            return self._viewed(inner, args)
        if method in SAME_VALUES or method == "unsqueeze" and len(args) == 1 and int_value(args[0]) == 0:
            return replace(inner, ndim=inner.ndim + (method == "unsqueeze"))
        return None

    def _value(self, node: cst.BaseExpression, below) -> Parts | float | None:
        """A tensor's parts, or a number (`torch.where(m, 0.0, fill)`, `m.masked_fill(c, -inf)`)."""
        number = self._number(node)
        return number if number is not None else below(node)

    def _created(self, dotted: str, args: list, keywords: dict) -> Parts | None:
        if set(keywords) - {"dtype", "device", "fill_value"}:
            return None
        sizes, value, fill = args, CREATORS.get(dotted), None
        if dotted == "torch.full":
            fill = args[1] if len(args) == 2 else keywords.get("fill_value")
            sizes, value = args[:1], self._number(fill) if fill is not None else None
        if value is None:
            return None
        codes = size_codes(self.parsed, sizes)
        if len(codes) < 2 or codes[-1] != codes[-2] or any("*" in code for code in codes):
            return None
        inferred = "int64" if _is_integer_literal(fill) else "float32"  # `torch.full(s, 1)` is int64
        parts = Parts(value, value, value, len(codes), codes[-1], inferred)
        dtype = keywords.get("dtype")
        return parts if dtype is None else _cast(parts, self._dtype_named(dtype))

    def _viewed(self, inner: Parts, sizes: list) -> Parts | None:
        """`view(1, 1, n, n)` of an n x n square."""
        codes = size_codes(self.parsed, sizes)
        return replace(inner, ndim=len(codes)) if inner.ndim == 2 and view_keeps(codes, [inner.side] * 2) else None

    def _own_method(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The class's own method `self.<name>` calls: undecorated, bound over by nothing the file shows, and
        redefined by no subclass of the tree."""
        from advisor.patterns.scope import ClassTable, overridden

        owner = getattr(self.c, "owner", None)
        if owner is None or not (isinstance(func, cst.Attribute) and is_self(func.value)):
            return None
        name = func.attr.value
        method = owner.methods.get(name)
        if method is None or method.decorators or owner.method_shadowed(name) is not None or \
                overridden(self.parsed.derived(ClassTable, ClassTable.of), owner, {name}) is not None:
            return None
        return method

    def helper(self, function: cst.FunctionDef, depth: int) -> Parts | None:
        """What a function of the file returns, where its body is a docstring, single-name assignments, in-place
        calls on a local no assignment reads (no other name can share its storage), then `return <expr>`,
        evaluated in order. Its parameters are unknown (they only name sizes, which squares compare by text)."""
        params = function.params
        local: dict[str, Parts | None] = {p.name.value: None for p in (*params.posonly_params, *params.params,
                                                                         *params.kwonly_params)}
        body = list(function.body.body)
        if body and _is_docstring(body[0]):
            body = body[1:]
        if not body or not all(isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 for s in body):
            return None
        *steps, last = [s.body[0] for s in body]
        read_by_assignments = {name.value for step in steps if isinstance(step, cst.Assign)
                               for name in loaded_names(step.value)}
        for step in steps:
            if isinstance(step, cst.Assign) and len(step.targets) == 1 and isinstance(step.targets[0].target, cst.Name):
                local[step.targets[0].target.value] = self.parts(step.value, dict(local), depth + 1)
            elif isinstance(step, cst.Expr) and isinstance(call := step.value, cst.Call) and \
                    isinstance(call.func, cst.Attribute) and call.func.attr.value in IN_PLACE and \
                    isinstance(call.func.value, cst.Name) and call.func.value.value not in read_by_assignments:
                local[call.func.value.value] = self.parts(call, dict(local), depth + 1)
            else:
                return None
        return self.parts(last.value, local, depth + 1) if isinstance(last, cst.Return) and last.value else None


def _dtype_extreme(parsed, node: cst.BaseExpression) -> tuple[str, float] | None:
    """(the dtype's code, -1.0 or 1.0) for `torch.finfo(<dtype>).min` (-1), `.max` (1), or either negated
    (`values.finfo_extreme`, its dtype given positionally): the code is a dtype's name (`float16`) where torch names
    it, else the dtype expression's text (`x.dtype`)."""
    extreme = finfo_extreme(parsed, node)
    if extreme is None or extreme[0].keyword is not None:
        return None
    argument = extreme[0].value
    named = (parsed.imported_name(argument) or "").removeprefix("torch.")
    return (named if named in FLOAT_MAX else parsed.code(argument).replace(" ", "")), extreme[1]


def size_nodes(sizes: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """The sizes a creator or a view is given: one by one (`n, n`), or as one tuple or list."""
    if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
        return [element.value for element in sizes[0].elements]
    return sizes


def size_codes(parsed, sizes: list[cst.BaseExpression]) -> list[str]:
    """Those sizes as the source spells them (squares compare their sides by text)."""
    return [parsed.code(size).replace(" ", "") for size in size_nodes(sizes)]


def view_keeps(codes: list[str], last_two: list[str]) -> bool:
    """A view of a 2-D tensor to `codes` keeps its two sizes as the last dims: leading 1s only (or one -1, then 1)."""
    return len(codes) >= 2 and codes[-2:] == last_two and all(code in ("1", "-1") for code in codes[:-2]) and \
        codes.count("-1") <= 1


def _triangle(inner: Parts | None, kind: str, diagonal: int | None) -> Parts | None:
    """`tril(x, d)` keeps what is on or below diagonal d and zeroes the rest, `triu(x, d)` what is on or above it;
    `tril(x, 1)` and `triu(x, -1)` keep part of a part (None)."""
    if inner is None:
        return None
    if kind == "tril" and diagonal in (0, -1):
        return replace(inner, diagonal=inner.diagonal if diagonal == 0 else 0.0, above=0.0)
    if kind == "triu" and diagonal in (0, 1):
        return replace(inner, below=0.0, diagonal=inner.diagonal if diagonal == 0 else 0.0)
    return None


def _diagonal(args: list, keywords: dict) -> int | None:
    diagonal = args[0] if args else keywords.get("diagonal")
    return 0 if diagonal is None else int_value(diagonal)


def _transposed(inner: Parts | None, rank: int | None) -> Parts | None:
    """The squares transposed, where the dims swapped are the last two (`rank`: the only rank at which they are;
    None: any; -1: none)."""
    if inner is None or rank is not None and inner.ndim != rank:
        return None
    return replace(inner, below=inner.above, above=inner.below)


def _where(condition: Parts | None, chosen: Parts | float | None, other: Parts | float | None) -> Parts | None:
    """`torch.where(condition, chosen, other)` part by part (a part whose test is unknown is unknown)."""
    if condition is None or chosen is None or other is None or any(
            isinstance(p, Parts) and (p.side, p.ndim) != (condition.side, condition.ndim) for p in (chosen, other)):
        return None
    picked = []
    for index, test in enumerate(condition.values):
        options = [option if isinstance(option, float) else option.values[index] for option in (chosen, other)]
        picked.append(UNKNOWN if math.isnan(test) else options[0] if test else options[1])
    tensors = [option.dtype for option in (chosen, other) if isinstance(option, Parts)]
    dtype = _promoted(*tensors) if len(tensors) == 2 else tensors[0] if tensors else "float32"
    return _held(replace(condition, below=picked[0], diagonal=picked[1], above=picked[2]), dtype)


def _cast(inner: Parts | None, dtype: str) -> Parts | None:
    """The values a cast to `dtype` gives: nonzero is 1 in bool, a float rounds to ±inf beyond its dtype's range, an
    integer dtype truncates finite values (an infinity has no value there); None for a dtype not named."""
    if inner is None or dtype not in DTYPES:
        return None
    largest, dtype = DTYPES[dtype], CANONICAL.get(dtype, dtype)
    if dtype == "bool":
        cast = inner.map(lambda v: float(v != 0))
    elif largest is None:
        cast = inner.map(lambda v: float(int(v)) if math.isfinite(v) else None)
    else:
        cast = inner.map(lambda v: v if abs(v) <= largest else math.copysign(math.inf, v))
    return replace(cast, dtype=dtype) if cast is not None else None


def _held(parts: Parts | None, dtype: str) -> Parts | None:
    """Values computed in float32 as a tensor of `dtype` holds them: a narrower float overflows to ±inf, an integer
    outside its dtype's range (which wraps: uint8's `0 - 1` is 255) is not read, nor a non-finite one (no integer
    holds it)."""
    if parts is None:
        return None
    if dtype in ("float16", "bfloat16"):
        return _cast(parts, dtype)
    if DTYPES.get(dtype, 0.0) is None:
        low, high = INTEGER_RANGES[CANONICAL.get(dtype, dtype)]
        if any(not math.isnan(v) and not low <= v <= high for v in parts.values):
            return None
    return replace(parts, dtype=dtype)


FLOAT_WIDTH = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}


def _promoted(first: str, second: str) -> str:
    """torch's type promotion of two tensors' dtypes (integers taken as int64, the widest they reach here)."""
    if first == second:
        return first
    floats = [dtype for dtype in (first, second) if dtype in FLOAT_WIDTH]
    if len(floats) == 2:
        return "float32" if set(floats) == {"float16", "bfloat16"} else max(floats, key=FLOAT_WIDTH.get)
    if floats:
        return floats[0]
    return second if first == "bool" else first if second == "bool" else "int64"


def _with_number(dtype: str, integer: bool) -> str:
    """A tensor's dtype with a Python number: a float makes a bool or integer tensor float32, an int a bool one
    int64; otherwise the tensor's dtype holds the result."""
    if dtype in FLOAT_WIDTH:
        return dtype
    return "int64" if integer else "float32"


def _is_integer_literal(node: cst.BaseExpression | None) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)


def _leading_nones(node: cst.Subscript, inner: Parts | None) -> Parts | None:
    """`m[None, None]`, `m[None, :, :]`: new leading dims, then whole ones."""
    if inner is None:
        return None
    added = 0
    for position, element in enumerate(node.slice):
        index = element.slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Name) and index.value.value == "None" \
                and added == position:
            added += 1
        elif not (isinstance(index, cst.Slice) and index.lower is None and index.upper is None and index.step is None):
            return None
    return replace(inner, ndim=inner.ndim + added)


def _rounded(apply, a: float, b: float) -> float:
    """`apply(a, b)` as float32 computes it (NaN where it is undefined: 0 * inf, inf - inf)."""
    try:
        return float32(float(apply(a, b)))
    except (OverflowError, ValueError):
        return UNKNOWN


def _is_bool(node: cst.BaseExpression) -> bool:
    """An expression whose dtype is bool by its form: a comparison, `.bool()`, `~` of one."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return _is_bool(node.expression)
    return isinstance(node, cst.Comparison) or isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
        and node.func.attr.value == "bool" and not node.args


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and \
        isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.SimpleString)

