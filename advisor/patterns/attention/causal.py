"""Causal proof: a mask that is a lower triangle of ones, used in the matching polarity, is `is_causal`.

The triangle is found where the mask is built (a local assignment, or the buffer the class registers) and
sliced `[..., :T, :T]`; `== 0`, `~` and `< 1` flip the polarity. A triangle sliced from column 0 also proves
that every query row keeps key 0, which makes a finite fill exact (see `patterns.masks`); so does an added
buffer of -inf strictly above the diagonal and 0 elsewhere (CLIP's and Whisper's causal masks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from advisor.patterns.attention.triangles import keeps_first_key_in_every_dtype, size_codes, size_nodes, view_keeps
from advisor.patterns.evaluated_masks import every_row_keeps_a_key, values_may_differ
from advisor.patterns.module_values import assigned_values
from advisor.patterns.ops import CAST_METHODS, int_value, number_value
from advisor.static.module_index import ParsedModule
from advisor.static.tensor_reads import local_reads_leave_alone
from advisor.static.walk import walk

if TYPE_CHECKING:  # annotations only: call sites read masks here too (`call_site_facts`), without a Candidate
    from advisor.patterns.attention.candidate import Candidate

Resolve = Callable[[cst.Name], "list[cst.BaseExpression] | None"]  # what a name read holds
MAX_NAME_DEPTH = 8  # names followed from one mask
CAUSAL_EXTENT = "causal-extent"  # the triangle is (L, S): `is_causal` is exact only then
# what keeps a triangle of ones one: views, broadcasts and casts (0 and 1 survive every dtype)
TRIANGLE_KEEPING = {"view", "reshape", "unsqueeze", "expand", *CAST_METHODS, "bool", "byte", "int", "long"}
ROW_KEEPING = {"expand", *CAST_METHODS, "bool", "byte", "int", "long"}  # and each row of the last two dims a row


def mask_base(c: Candidate, masked: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor a mask expression tests: `bias[...] == 0`, `~m`, `m.bool()` all read their operand."""
    return _peeled(c, masked)[0]


# whether a comparison of a 0/1 tensor with 0 or 1 flips it (`== 0`, `!= 1`, `< 1`, `<= 0`) or keeps it (`!= 0`,
# `== 1`, `> 0`, `>= 1`); any other (`> 1`, `>= 0`) is no polarity of it
FLIPS = {(cst.Equal, 0): True, (cst.NotEqual, 1): True, (cst.LessThan, 1): True, (cst.LessThanEqual, 0): True,
         (cst.NotEqual, 0): False, (cst.Equal, 1): False, (cst.GreaterThan, 0): False, (cst.GreaterThanEqual, 1): False}


def _peeled(c: Candidate, masked: cst.BaseExpression) -> tuple[cst.BaseExpression, bool | None]:
    """The tensor a mask expression tests, and whether the expression flips its 0/1 values (each `~` and each
    flipping comparison once; None where a comparison is no polarity of a 0/1 tensor)."""
    base, flipped = masked, False
    while True:
        op = c.reader.read(base)
        if isinstance(base, cst.Comparison) and len(base.comparisons) == 1 and \
                number_value(base.comparisons[0].comparator) in (0, 1):
            flip = FLIPS.get((type(base.comparisons[0].operator), number_value(base.comparisons[0].comparator)))
            flipped = None if flip is None or flipped is None else flipped != flip
            base = base.left
        elif isinstance(base, cst.UnaryOperation) and isinstance(base.operator, cst.BitInvert):
            flipped = None if flipped is None else not flipped
            base = base.expression
        elif op is not None and op.name in ("cast", "identity"):
            base = op.operands[0]
        elif isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) and not base.args \
                and base.func.attr.value == "bool":  # nonzero is True: a 0/1 mask means the same
            base = base.func.value
        else:
            return base, flipped


def keeps_first_key(c: Candidate, masked: cst.BaseExpression, keep_given: bool) -> bool:
    """`self.bias[:, :, S - L:S, :S]` (GPT-2): any rows of a lower triangle of ones, its columns sliced from
    0, keep key 0 in every row (row r keeps keys 0..r), so no query row is fully masked."""
    base, via = mask_base(c, masked), []
    value = local_value(c, base) if isinstance(base, cst.Name) else None
    if value is not None:
        via = [value]  # `mask = self.bias[...].bool()`: its own `== 0` flips it too
        base = mask_base(c, value)
    built = _buffer_from_first_column(c, base, sliced=True)
    return built is not None and _causal_polarity(c, triangle(c.parsed, built), masked, keep_given, *via)


def keeps_first_key_bottom_right(c: Candidate, masked: cst.BaseExpression, keep_given: bool) -> bool:
    """`torch.ones((i, j), dtype=torch.bool).triu(j - i + 1)` with i, j the scores' query and key sizes (lucidrains'
    causal mask with a KV prefix): row r masks keys r + j - i + 1 onwards, so it keeps key 0 exactly where j >= i.
    Whether there are at least as many keys as queries is metadata: the caller may check it (see `guards`)."""
    base = mask_base(c, masked)
    via = []
    if isinstance(base, cst.Name):
        value = local_value(c, base)
        if value is None:
            return False
        via, base = [value], mask_base(c, value)
    base, outer = _under_views(base)
    if not (isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute) and base.func.attr.value == "triu"
            and c.parsed.imported_name(base.func) is None):
        return False
    ones, diagonal = base.func.value, next((a.value for a in base.args if a.keyword is None
                                            or a.keyword.value == "diagonal"), None)
    if not (isinstance(ones, cst.Call) and c.parsed.imported_name(ones.func) == "torch.ones") or diagonal is None:
        return False
    sizes = size_nodes([a.value for a in ones.args if a.keyword is None])
    if len(sizes) != 2 or not all(isinstance(size, cst.Name) for size in sizes) or \
            not _keeps_last_two(c.parsed, outer, [size.value for size in sizes]):
        return False
    rows, columns = sizes
    if [_scores_size(c, rows), _scores_size(c, columns)] != ["query", "key"] or rows.value == columns.value:
        return False
    if _linear(diagonal) != {columns.value: 1, rows.value: -1, "": 1}:
        return False
    return _causal_polarity(c, "upper", masked, keep_given, *via)


def _scores_size(c: Candidate, name: cst.Name) -> str | None:
    """"query" or "key" when `name` holds the scores' size on that axis (`i, j = s.shape[-2:]`, `s.size(-1)`)."""
    definitions = c.flow.definitions_of(name)
    if len(definitions) != 1 or definitions[0].kind != "assign":
        return None
    definition, value = definitions[0], definitions[0].value
    axis = None
    if definition.index is not None and isinstance(value, cst.Subscript) and len(value.slice) == 1 and \
            isinstance(value.slice[0].slice, cst.Slice) and int_value(value.slice[0].slice.lower) == -2 and \
            value.slice[0].slice.upper is None and value.slice[0].slice.step is None and definition.index < 2:
        axis, value = definition.index - 2, value.value
    elif definition.index is None and isinstance(value, cst.Subscript) and len(value.slice) == 1 and \
            isinstance(value.slice[0].slice, cst.Index):
        axis, value = int_value(value.slice[0].slice.value), value.value
    elif definition.index is None and isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
            value.func.attr.value == "size" and len(value.args) == 1:
        axis, value = int_value(value.args[0].value), cst.Attribute(value.func.value, cst.Name("shape"))
    if axis not in (-2, -1) or not (isinstance(value, cst.Attribute) and value.attr.value == "shape"
                                    and isinstance(value.value, cst.Name)):
        return None
    scores = {d.id for d in c.chain.definitions}
    reaching = c.flow.reaching.get(value.value, frozenset())
    if not reaching or not reaching <= scores:
        return None
    return "query" if axis == -2 else "key"


def _linear(node: cst.BaseExpression) -> dict[str, float] | None:
    """`j - i + 1` as {"j": 1, "i": -1, "": 1} (names and integers under + and -); None for anything else."""
    if isinstance(node, cst.Name):
        return {node.value: 1}
    if int_value(node) is not None:
        return {"": int_value(node)} if int_value(node) else {}
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _linear(node.expression)
        return None if inner is None else {key: -value for key, value in inner.items()}
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        left, right = _linear(node.left), _linear(node.right)
        if left is None or right is None:
            return None
        sign = 1 if isinstance(node.operator, cst.Add) else -1
        total = dict(left)
        for key, value in right.items():
            total[key] = total.get(key, 0) + sign * value
        return {key: value for key, value in total.items() if value}
    return None


def added_keeps_first_key(c: Candidate, mask: cst.BaseExpression) -> bool:
    """An added mask, under views and casts that keep its rows (`under_row_views`), that is 0 at a key of every
    row: the class's buffer `self.buf` or `self.buf[..., :L, :S]` (columns from 0), or a tensor built as a causal
    additive mask (`built_keeps_first_key`) where it is added, in a local or a module-level name. No fill can
    swallow such a row."""
    return reads_causal_additive(c, mask, lambda name: assigned_values(c.parsed, name))


def reads_causal_additive(c, mask: cst.BaseExpression, values_of: Resolve) -> bool:
    """`mask` reads a causal additive mask, 0 at a key of every row: a buffer of the class of `c` (a `Candidate`,
    or any reader with its `parsed`, `owner`, `reader` and `values`) read from column 0, an expression built as
    one, or a name whose every value `values_of` gives (None: not all are visible) is built as one. Call sites ask
    this too (`call_site_facts`), with what the names hold there."""
    base = under_row_views(mask)
    built = _buffer_from_first_column(c, base, sliced=False)
    if built is None:
        read = under_row_reads(base)
        return built_keeps_first_key(c, read, values_of) or \
            read is base and every_row_keeps_a_key(c.parsed, base, values_of, sliced=False)  # rows read whole
    if isinstance(built, cst.Name):  # `self.register_buffer("mask", mask)`: what the local holds there, that read
        registered = lambda name: assigned_values(c.parsed, name, followed=(built,))  # noqa: E731
        return built_keeps_first_key(c, built, registered) or not isinstance(base, cst.Subscript) and \
            every_row_keeps_a_key(c.parsed, built, registered, sliced=False)  # the buffer's rows read whole
    return built_keeps_first_key(c, built, values_of)


# torch's own builders of a causal additive mask: `torch.triu(torch.full((sz, sz), -inf), diagonal=1)`
TORCH_CAUSAL_MASKS = frozenset({"torch.nn.Transformer.generate_square_subsequent_mask",
                                "torch.nn.modules.transformer.Transformer.generate_square_subsequent_mask",
                                "torch.nn.modules.transformer._generate_square_subsequent_mask"})


def built_keeps_first_key(c, node: cst.BaseExpression, values_of: Resolve, depth: int = 0) -> bool:
    """A mask built from constants alone whose column 0 is small in every row (computed: `evaluated_masks`), or a
    square (or a stack of squares, `torch.full((1, 1, n, n), -inf)`) built -inf or a mask fill (-1e9,
    `finfo.min`) strictly above the diagonal and 0 elsewhere (`torch.full((n, n), -inf).triu(1)`, or a helper of
    this file that builds one, CLIP's and Whisper's causal masks), or 0 on and below it and a mask fill above
    (`torch.zeros(n, n).masked_fill(torch.tril(torch.ones(n, n)) == 0, -1e4)`, or `torch.where` of the triangle,
    0.0 and the fill): column 0 is 0 in every row. So is one joined beside zeros along the keys
    (`torch.hstack([torch.zeros((n, p)), causal])`, the reference Llama's cache prefix): every row keeps the causal
    part's key at 0. Under views and casts that keep its rows; names read through `values_of` (every value must be
    one)."""
    node = under_row_views(node)
    if depth > MAX_NAME_DEPTH or values_may_differ(c.parsed):
        return False
    if isinstance(node, cst.Name):
        values = values_of(node)
        return bool(values) and all(built_keeps_first_key(c, value, values_of, depth + 1) for value in values)
    if isinstance(node, cst.Call) and c.parsed.imported_name(node.func) in TORCH_CAUSAL_MASKS:
        return True
    if _joined_beside_zeros(c, node, values_of, depth):
        return True
    if keeps_first_key_in_every_dtype(c, node, values_of):  # a square 0 on and below its diagonal, however spelled
        return True
    return every_row_keeps_a_key(c.parsed, node, values_of)  # any other mask built from constants, computed


def _joined_beside_zeros(c, node: cst.BaseExpression, values_of: Resolve, depth: int) -> bool:
    """`torch.cat([...], dim=-1)`, or `torch.hstack([...])` / `torch.cat([...], dim=1)` of 2-D pieces (one of them
    a 2-size `torch.zeros`, so the others are 2-D too or the join raises): pieces side by side along the keys,
    each `torch.zeros(...)` or a causal additive mask, one of them causal: its key at 0 is in every row."""
    if not isinstance(node, cst.Call):
        return False
    dotted = c.parsed.imported_name(node.func)
    args = [a for a in node.args if a.keyword is None]
    dim = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "dim"),
               args[1].value if len(args) == 2 else None)
    if dotted not in ("torch.cat", "torch.concat", "torch.hstack") or not args or \
            not isinstance(args[0].value, (cst.List, cst.Tuple)) or dotted == "torch.hstack" and len(node.args) != 1:
        return False
    pieces = [element.value for element in args[0].value.elements if not isinstance(element, cst.StarredElement)]
    if len(pieces) != len(args[0].value.elements):
        return False
    zeros = [piece for piece in pieces if isinstance(piece, cst.Call) and
             c.parsed.imported_name(piece.func) == "torch.zeros"]
    plane = any(_sizes_count(zero) == 2 for zero in zeros)  # the pieces are 2-D
    along_keys = plane if dotted == "torch.hstack" or number_value(dim) == 1 else number_value(dim) == -1
    causal = [piece for piece in pieces if piece not in zeros]
    return along_keys and bool(causal) and all(built_keeps_first_key(c, piece, values_of, depth + 1) for piece in causal)


def _sizes_count(creator: cst.Call) -> int | None:
    """How many sizes a creator call names (`torch.zeros(a, b)`, `torch.zeros((a, b))`); None for `*sizes`."""
    sizes = [a for a in creator.args if a.keyword is None]
    if any(a.star for a in sizes):
        return None
    if len(sizes) == 1 and isinstance(sizes[0].value, (cst.Tuple, cst.List)):
        elements = sizes[0].value.elements
        return None if any(isinstance(e, cst.StarredElement) for e in elements) else len(elements)
    return len(sizes)


def under_row_views(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor under casts, `expand` and leading None-indexing (`m[None, None]`), which keep each row of the
    last two dims a row (a fill cast to a narrower float stays a fill, or becomes -inf); a reshape, an `unsqueeze`
    or a None between the last two dims would not."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in ROW_KEEPING:
            node = node.func.value
        elif isinstance(node, cst.Subscript) and _leading_nones(node.slice):
            node = node.value
        else:
            return node


def under_row_reads(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor under `under_row_views` and indexings that keep column 0 in each row they keep (`m[:T, :T]`,
    `m[..., S - L:S, :S]`: any rows, columns sliced from 0): a mask that is 0 at a key of every row, read so, still
    is (Whisper's `mask[:n_ctx, :n_ctx]`)."""
    while True:
        node = under_row_views(node)
        if not (isinstance(node, cst.Subscript) and _first_column_kept(node.slice)):
            return node
        node = node.value


def _first_column_kept(elements) -> bool:
    """`[..., rows, :S]`: leading whole dims (or `...`), a slice of rows, columns sliced from 0 without a step; or
    `[..., :S]`, every row whole."""
    if len(elements) < 2:
        return False
    *leading, rows, columns = (element.slice for element in elements)
    if not leading and isinstance(rows, cst.Index) and isinstance(rows.value, cst.Ellipsis):
        rows = cst.Slice(lower=None, upper=None)
    whole = all(isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None or
                isinstance(s, cst.Index) and isinstance(s.value, cst.Ellipsis) for s in leading)
    return whole and isinstance(rows, cst.Slice) and isinstance(columns, cst.Slice) and columns.step is None and \
        (columns.lower is None or int_value(columns.lower) == 0)


def _leading_nones(elements) -> bool:
    """`[None, None]`, `[None, :, :]`: new leading dims, then whole ones."""
    nones = [isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Name) and e.slice.value.value == "None"
             for e in elements]
    whole = [_is_full_slice(e) for e in elements]
    return all(n or w for n, w in zip(nones, whole)) and nones == sorted(nones, reverse=True)


def _buffer_from_first_column(c: Candidate, node: cst.BaseExpression, sliced: bool) -> cst.BaseExpression | None:
    """What the class's only assignment of `self.buf` built, when `node` reads it as `self.buf[..., rows, :S]`
    (any rows, columns from 0; leading dims whole) or, unless `sliced`, as `self.buf` itself; else None."""
    base = node
    if isinstance(base, cst.Subscript):
        if len(base.slice) < 2 or not all(_is_full_slice(s) for s in base.slice[:-2]):
            return None
        rows, columns = (element.slice for element in base.slice[-2:])
        if not isinstance(rows, cst.Slice) or not isinstance(columns, cst.Slice) or columns.step is not None or \
                (columns.lower is not None and int_value(columns.lower) != 0):
            return None
        base = base.value
    elif sliced:
        return None
    if not (isinstance(base, cst.Attribute) and isinstance(base.value, cst.Name) and base.value.value == "self"
            and c.owner):
        return None
    return _class_tensor(c, base.attr.value)


def _class_tensor(c: Candidate, attribute: str) -> cst.BaseExpression | None:
    """What the class binds a tensor attribute to, where every instance holds it when the code runs: not where
    another file writes it nor where the tree runs modules with state given by name (`functional_call`), which may
    pass any tensor in its place (`only_value`)."""
    return c.owner.only_value(attribute)


def local_value(c: Candidate, name: cst.Name) -> cst.BaseExpression | None:
    """What a local mask's one plain assignment reaching this read built, where every read of the name in its
    function leaves the tensor alone: `y = mask.add_(1)`, `zap(mask)`, `torch.Tensor.fill_(mask, 1)`,
    `mask.__setitem__(0, 1)`, `torch.as_tensor(mask).fill_(1)`, `{"m": mask}` may write it after it was built
    (breaker round 12)."""
    definitions = c.flow.definitions_of(name)
    if len(definitions) != 1 or definitions[0].kind != "assign" or definitions[0].index is not None:
        return None
    function = c.parsed.innermost(name, cst.FunctionDef)
    if function is None or not local_reads_leave_alone(c.parsed, function, name.value):
        return None
    return definitions[0].value


def is_causal_keep(c: Candidate, masked: cst.BaseExpression, keep_given: bool) -> bool:
    """The keep mask is a lower-triangular square of ones sliced [..., :T, :T]: `is_causal` is exact."""
    base = mask_base(c, masked)
    if isinstance(base, cst.Name):
        value = local_value(c, base)
        return value is not None and _causal_polarity(c, triangle(c.parsed, value), masked, keep_given)
    if isinstance(base, cst.Subscript) and isinstance(base.value, cst.Attribute) \
            and isinstance(base.value.value, cst.Name) and base.value.value.value == "self" and c.owner:
        built = _class_tensor(c, base.value.attr.value)
        slices = base.slice
        if built is None or len(slices) < 2:
            return False
        leading, last_two = slices[:-2], slices[-2:]
        if not all(_is_full_slice(s) for s in leading):
            return False
        bounds = [_upper_bound(c.parsed, s) for s in last_two]
        if None in bounds or bounds[0] != bounds[1]:
            return False
        return _causal_polarity(c, triangle(c.parsed, built), masked, keep_given)
    if isinstance(base, cst.Call):
        return _causal_polarity(c, triangle(c.parsed, base), masked, keep_given)
    return False


def _causal_polarity(c: Candidate, kind: str | None, masked: cst.BaseExpression, keep_given: bool,
                     *via: cst.BaseExpression) -> bool:
    """A lower triangle of ones marks attended positions, an upper one (diagonal=1) masked ones; the
    original must use it in the matching polarity (`== 0` and `~` flip it, in the mask expression or in
    the assignments `via` which it reads the triangle)."""
    flips = [_peeled(c, expression)[1] for expression in (masked, *via)]
    if kind is None or None in flips:
        return False
    true_means_attend = (kind == "lower") != (sum(flips) % 2 == 1)
    return true_means_attend == keep_given


def _is_full_slice(element: cst.SubscriptElement) -> bool:
    s = element.slice
    return isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None


def _upper_bound(parsed: ParsedModule, element: cst.SubscriptElement) -> str | None:
    s = element.slice
    if isinstance(s, cst.Slice) and s.lower is None and s.step is None and s.upper is not None:
        return parsed.code(s.upper).replace(" ", "")
    return None


def triangle(parsed: ParsedModule, node: cst.BaseExpression) -> str | None:
    """'lower' for a square lower triangle of ones (`torch.tril(torch.ones(n, n))`, `torch.ones(n, n).tril()`,
    `.tril_()`), 'upper' for a square of ones strictly above the diagonal (`triu(..., diagonal=1)`), under any
    views, casts and None-indexing (they keep the 0/1 values where they are); None for anything else, including
    non-squares and other diagonals. The matcher's causal proof and the flash backend's bottom-right check both
    read a mask's triangle here."""
    node, outer = _under_views(node)
    if not isinstance(node, cst.Call):
        return None
    dotted = parsed.imported_name(node.func)
    if dotted in ("torch.tril", "torch.triu") and node.args:
        kind, inner, options = dotted[-4:], node.args[0].value, node.args[1:]
    elif isinstance(node.func, cst.Attribute) and node.func.attr.value in ("tril", "triu", "tril_", "triu_") \
            and dotted is None:
        kind, inner, options = node.func.attr.value[:4], node.func.value, node.args
    else:
        return None
    if _diagonal(options, default=0) != (0 if kind == "tril" else 1):
        return None
    if not (isinstance(inner, cst.Call) and parsed.imported_name(inner.func) == "torch.ones"):
        return None
    codes = size_codes(parsed, [a.value for a in inner.args if a.keyword is None])
    if len(codes) != 2 or codes[0] != codes[1] or not _keeps_last_two(parsed, outer, codes):
        return None
    return "lower" if kind == "tril" else "upper"


def _under_views(node: cst.BaseExpression) -> tuple[cst.BaseExpression, list[cst.CSTNode]]:
    """The tensor under views, broadcasts, casts and None-indexing (`m.view(1, 1, n, n).bool()`, `m[None, None]`),
    and those steps, innermost first (`_keeps_last_two` checks what each does to the last two dims)."""
    steps = []
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in TRIANGLE_KEEPING:
            steps.append(node)
            node = node.func.value
        elif isinstance(node, cst.Subscript) and all(
                isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Name) and e.slice.value.value == "None"
                or _is_full_slice(e) for e in node.slice):
            steps.append(node)
            node = node.value
        else:
            return node, steps[::-1]


def _keeps_last_two(parsed: ParsedModule, steps: list[cst.CSTNode], last_two: list[str]) -> bool:
    """Whether the steps (innermost first) applied to a 2-D tensor of sizes `last_two` (as the source spells them)
    leave those two its last dims, in place: a view adds leading 1s only (`view(1, 1, n, n)`; `view(1, 1, 4, 16)` of
    an 8 x 8 triangle is another mask), `expand` keeps them (-1 or the same size), `unsqueeze` and None-indexing
    insert dims before them only (`m[:, None]` of a square is (n, 1, n)), casts change no dim."""
    ndim = 2
    for step in steps:
        if isinstance(step, cst.Subscript):
            ndim = _indexed_ndim(step, ndim)
        elif step.func.attr.value in ("view", "reshape", "expand"):
            codes = size_codes(parsed, [a.value for a in step.args])
            if any(a.keyword is not None or a.star for a in step.args) or len(codes) < max(ndim, 2):
                return False
            # `expand` to leading sizes other than 1 broadcasts the scores up in the original (breaker round 12)
            ok = all(code in ("-1", size) for code, size in zip(codes[-2:], last_two)) and \
                all(code in ("-1", "1") for code in codes[:-2]) \
                if step.func.attr.value == "expand" else view_keeps(codes, last_two)
            ndim = len(codes) if ok else None
        elif step.func.attr.value == "unsqueeze":
            dims = [a.value for a in step.args if a.keyword is None or a.keyword.value == "dim"]
            dim = int_value(dims[0]) if len(dims) == 1 else None
            dim = None if dim is None else dim + ndim + 1 if dim < 0 else dim
            ndim = ndim + 1 if dim is not None and 0 <= dim <= ndim - 2 else None
        if ndim is None:
            return False
    return True


def _indexed_ndim(index: cst.Subscript, ndim: int) -> int | None:
    """The dims after full slices and Nones, where every None comes before the slice of the second-to-last dim."""
    sliced = 0
    for element in index.slice:
        if _is_full_slice(element):
            sliced += 1
        elif sliced >= ndim - 1:
            return None  # a None between the last two dims, or after them
    return ndim + len(index.slice) - sliced if sliced <= ndim else None


def _diagonal(options: list[cst.Arg] | tuple[cst.Arg, ...], default: int | None = None) -> float | None:
    """The `diagonal` a tril/triu call passes (positionally or by keyword), or `default` when it passes none."""
    diagonal = next((a.value for a in options if a.keyword is None or a.keyword.value == "diagonal"), None)
    return number_value(diagonal) if diagonal is not None else default


def triangle_side(c: Candidate, masked: cst.BaseExpression) -> cst.BaseExpression | None:
    """The side n of the square triangle of ones a causal mask is built from (`tril(ones(n, n))`, followed through
    one local name), which the `causal-extent` check compares with the scores' sizes; None for a buffer."""
    base = mask_base(c, masked)
    if isinstance(base, cst.Name):
        base = local_value(c, base)
    if base is None or triangle(c.parsed, base) is None:
        return None

    class _Ones(cst.CSTVisitor):
        sides: list[cst.BaseExpression] = []

        def visit_Call(self, call: cst.Call) -> None:
            if c.parsed.imported_name(call.func) == "torch.ones" and not self.sides:
                sizes = [a.value for a in call.args if a.keyword is None]
                self.sides = [e.value for e in sizes[0].elements] if len(sizes) == 1 and \
                    isinstance(sizes[0], (cst.Tuple, cst.List)) else sizes

    ones = _Ones()
    walk(base, ones)
    return ones.sides[0] if ones.sides else None
