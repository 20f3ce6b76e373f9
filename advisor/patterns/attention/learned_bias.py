"""Learned biases: an added term whose values are entries of a learned table (Swin's, BEiT's, LeViT's relative-position
biases: `self.table[self.index.view(-1)].view(N, N, -1).permute(2, 0, 1).unsqueeze(0)`).

Such a term is a score, not a mask: its values are trained through the same softmax as q·k^T, and SDPA adds it as a
float `attn_mask` exactly as the original adds it (its gradient, SDPA's mask gradient, reaches the table). It is read
through the roles that keep a table's values: gathers and views of the table, local names, this class's helper
methods (every `return`), and a dictionary attribute that memoises it (every store). The table is an attribute every
binding in its class makes an `nn.Parameter` (or None, whose gather raises in both versions), that the class never
writes in place, that no subclass in the file rebinds, and whose creation and initialisation name no mask value
(-inf, `finfo.min`, -1e4): a table filled with one is a mask, which `patterns.masks` judges as any other. An
`nn.Embedding` is not read as one (breaker round 43: its weight, reached through `m.named_parameters()` or handed to
another file's helper, took -inf where the class's reads could not see it).

Where the only evidence that an instance's attribute may hold another value is another file of the tree binding
attributes by computed names (`setattr(model, name, value)` in a utility that may never touch this class), the
reading stands but is not proved: `learned_reading` names the table and that file, and the fact stays assumed
(README's Identity at run time: such an attribute is never read as the class's own assignment). A table the class
binds only as an `nn.Parameter` is the exception: such bindings, through `nn.Module.__setattr__`, can put only a
Parameter there (`ClassInfo.rebound`'s `parameter`).

What is not proved: that no entry is large enough to swallow a row's scores (about 2^24 times them in fp32), where
SDPA's fused backward, which recomputes the weights from a log-sum-exp, gives other gradients. That is a property
of trained values, like the scores' own magnitude, which no rewrite checks either: the fact is accepted, and named.
The rank of such a term through helpers with several returns and memo dictionaries is `rank_bounds`' business.
"""

from __future__ import annotations

import libcst as cst

from advisor.patterns import scope
from advisor.patterns.attention.candidate import Candidate, flow_for, function_of
from advisor.patterns.attention.helpers import argument_of, helper_named
from advisor.patterns.dtypes import EINOPS
from advisor.patterns.values import ValueProver, is_loop_counter
from advisor.static.dataflow import is_self_attribute
from advisor.static.walk import children, walk

PARAMETERS = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
# methods whose result holds only elements of their receiver (indexing reads them too)
VALUE_KEEPING = {"view", "reshape", "permute", "transpose", "contiguous", "unsqueeze", "squeeze", "flatten",
                 "expand", "expand_as", "clone", "detach", "index_select", "gather", "movedim", "unflatten"}
MAX_DEPTH = 16


def learned_reading(c: Candidate, node: cst.BaseExpression) -> tuple[str, str | None, tuple[str, ...]] | None:
    """(`self.<table>`, None, ()) when every value `node` can hold is read from learned tables of this class (the
    first one named); (`self.<table>`, why, tables) where that holds as far as the class shows but other files of the
    tree bind attributes by computed names, so an instance's table, index or memo may not be the class's: `tables`
    are the attributes to check at run time (`isinstance(self.<t>, nn.Parameter)`) where only tables are in doubt,
    () where a memo is (anything may be stored in one); None otherwise."""
    found = _learned(c, node)
    if found is None:
        return None
    doubts = found[1]
    tables = tuple(dict.fromkeys(t for _, t in doubts)) if doubts and all(t for _, t in doubts) else ()
    return found[0][0], doubts[0][0] if doubts else None, tables


def learned_tables(c: Candidate, node: cst.BaseExpression) -> list[str] | None:
    """Every learned table (`self.<table>`) `node` reads, where `learned_reading` proves it without reservation: the
    term has the dtype of one of them (gathers and views keep it)."""
    found = _learned(c, node)
    return found[0] if found is not None and not found[1] else None


def _learned(c: Candidate, node: cst.BaseExpression) -> tuple[list[str], list[tuple[str, str | None]]] | None:
    """The learned tables `node` reads (sorted), and the reasons (computed names bound elsewhere) they may be
    others, each with the table it is about (None: a memo)."""
    if c.owner is None:
        return None
    read: set[str] = set()  # every `self.` name followed: no subclass may redefine one
    elsewhere: list[tuple[str, str | None]] = []
    tables = _tables(c, node, read, 0, elsewhere)
    if not tables or scope.overridden(c.scope.classes(), c.owner, read) is not None:
        return None
    return [f"self.{table}" for table in sorted(tables)], elsewhere


def _rebound(c: Candidate, attribute: str, elsewhere: list, parameter: bool = False, table: bool = False) -> bool:
    """An instance's attribute may hold another value than the class binds. Where the only evidence is other files
    binding attributes by computed names, the reading goes on and the reason is kept in `elsewhere`, with the
    attribute where it is a table (`table`). `parameter`: see ClassInfo.rebound."""
    why = c.owner.rebound(attribute, finite_ok=True, parameter=parameter)  # an init draw keeps a table finite
    if why is not None and c.owner.rebound_only_by_names_computed_elsewhere(attribute):
        elsewhere.append((why, attribute if table else None))
        return False
    return why is not None


def values_of(c: Candidate, node: cst.BaseExpression,
              elsewhere: list | None = None) -> list[cst.BaseExpression] | None:
    """What a call of this class's helper method (every `return`) or a read of a memo dictionary (`self.cache[k]`:
    every value stored) can give; None for anything else or when one of them cannot be followed. `elsewhere`: see
    `_rebound` (None: such a memo is not followed)."""
    if c.owner is None:
        return None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        function = helper_named(c, node.func)
        if function is None or function is c.function or function.decorators or function.asynchronous:
            return None
        returned = _returns(function)
        return returned if returned and None not in returned else None
    if isinstance(node, cst.Subscript) and is_self_attribute(node.value):
        return _memo_values(c, node.value.attr.value, elsewhere)
    return None


def _tables(c: Candidate, node: cst.BaseExpression, read: set[str], depth: int,
            elsewhere: list) -> set[str] | None:
    """The learned tables `node`'s values come from (the attribute names), or None."""
    if depth > MAX_DEPTH:
        return None
    below = lambda child: _tables(c, child, read, depth + 1, elsewhere)  # noqa: E731
    followed = values_of(c, node, elsewhere)
    if followed is not None:
        read.add((node.func if isinstance(node, cst.Call) else node.value).attr.value)
        return _all(below(value) for value in followed)
    if isinstance(node, cst.Subscript):  # a gather: elements of the table, whatever the index
        return below(node.value)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in VALUE_KEEPING:
        return below(node.func.value)
    if isinstance(node, cst.Attribute) and node.attr.value in ("T", "mT"):
        return below(node.value)
    if isinstance(node, cst.Call) and node.args and node.args[0].keyword is None and not node.args[0].star and \
            c.parsed.imported_name(node.func) in EINOPS:  # `rearrange(bias, 'i j h -> h i j')` keeps the values
        return below(node.args[0].value)
    if isinstance(node, cst.Name):
        argument = argument_of(c, node)
        if argument is not None:
            return below(argument)
        definitions = _reaching(c, node)
        return _all(below(value) for value in definitions) if definitions else None
    if is_self_attribute(node) and _is_learned(c, node.attr.value, elsewhere):
        read.add(node.attr.value)
        return {node.attr.value}
    return None


def _all(found) -> set[str] | None:
    tables: set[str] = set()
    for one in found:
        if not one:
            return None
        tables |= one
    return tables


def _reaching(c: Candidate, name: cst.Name) -> list[cst.BaseExpression] | None:
    flow = flow_for(c, name)
    ids = flow.reaching.get(name)
    if not ids or flow.sees_undefined(name):
        return None
    definitions = [flow.definitions[i] for i in ids]
    if any(d.kind != "assign" or d.index is not None for d in definitions):
        return None
    return [d.value for d in definitions]


def _returns(function: cst.FunctionDef) -> list[cst.BaseExpression | None]:
    """The value of every `return` of the function itself (not of functions nested in it)."""
    found: list[cst.BaseExpression | None] = []

    class Returns(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node.value)

    walk(function, Returns())
    return found


def _is_learned(c: Candidate, attribute: str, elsewhere: list) -> bool:
    """Every binding of `self.<attribute>` in the class is `nn.Parameter(t)` (or None), never written in place nor
    from outside the class, and no mask value appears where it is created or passed to a function (an `init`)."""
    owner = c.owner
    values = owner.attributes.get(attribute, [])
    parameters = [v for v in values if not (isinstance(v, cst.Name) and v.value == "None")]
    if not parameters or not all(isinstance(v, cst.Call) and c.parsed.imported_name(v.func) in PARAMETERS
                                 for v in parameters):
        return False
    # where no binding is None the attribute is always a registered parameter, which only a Parameter replaces
    if attribute in owner.mutated or attribute in owner.unfollowed or \
            _rebound(c, attribute, elsewhere, parameter=len(parameters) == len(values), table=True):
        return False
    calls = [call for method in owner.methods.values() for call in _calls_passing(method, attribute)]
    return not any(_names_mask_value(c, part) for part in parameters + calls)


def _calls_passing(method: cst.FunctionDef, attribute: str) -> list[cst.Call]:
    """Calls with an argument that reads `self.<attribute>` (`trunc_normal_(self.table, std=.02)`,
    `constant_(self.table.data, v)`)."""
    found = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if any(_uses(a.value, attribute) for a in node.args):
                found.append(node)

    walk(method, Calls())
    return found


def _names_mask_value(c: Candidate, expression: cst.BaseExpression) -> bool:
    """Some part of `expression` is -inf or a large negative number (in its own function's flow)."""
    function = function_of(c.parsed, expression)
    if function is None:
        return True
    values = ValueProver(c.parsed, c.parsed.flow(function), c.owner)
    pending: list[cst.CSTNode] = [expression]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.BaseExpression) and values.fill_kind(node) is not None:
            return True
        pending.extend(children(node))
    return False


def _memo_values(c: Candidate, attribute: str,
                 elsewhere: list | None) -> list[cst.BaseExpression] | None:
    """The values a dictionary attribute memoises (`self.cache[key] = value`), when the class only ever binds it to
    an empty dictionary, stores into it by key, reads it by key and tests it (`key in self.cache`, `if self.cache:`),
    and nothing outside the class binds it."""
    owner = c.owner
    bindings = owner.attributes.get(attribute, [])
    if not bindings or attribute in owner.unfollowed or not all(_empty_dict(c, v) for v in bindings):
        return None  # not a memo (a learned table read by index): no reason about it is kept
    if owner.rebound(attribute) is not None if elsewhere is None else _rebound(c, attribute, elsewhere):
        return None
    stored: list[cst.BaseExpression] = []
    for method in owner.methods.values():
        for use in _uses(method, attribute):
            parent = c.parsed.parents.get(use)
            if isinstance(parent, cst.AssignTarget) and parent.target is use:
                continue  # `self.cache = {}`, checked above
            if isinstance(parent, cst.Subscript) and parent.value is use:
                holder = c.parsed.parents.get(parent)
                if isinstance(holder, cst.AssignTarget):  # `self.cache[key] = value`
                    statement = c.parsed.parents.get(holder)
                    if len(statement.targets) != 1:
                        return None
                    stored.append(statement.value)
                elif isinstance(holder, (cst.AugAssign, cst.AnnAssign, cst.Element, cst.StarredElement, cst.For,
                                         cst.WithItem, cst.CompFor)):
                    return None  # stored by a form whose value is not followed
                continue
            if isinstance(parent, cst.ComparisonTarget) and isinstance(parent.operator, (cst.In, cst.NotIn)):
                continue
            if _tested(c, use):
                continue
            return None  # passed on, or a method of the dictionary (`update`, `setdefault`) that may store anything
    return stored or None


def _tested(c: Candidate, node: cst.CSTNode) -> bool:
    """`node` is only tested for truth: an `if`'s or `while`'s test, under `not`, `and` and `or` (timm's LeViT:
    `if mode and self.attention_bias_cache:`)."""
    parent = c.parsed.parents.get(node)
    while isinstance(parent, cst.BooleanOperation) or \
            isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        node, parent = parent, c.parsed.parents.get(parent)
    return isinstance(parent, (cst.If, cst.While)) and parent.test is node


def _uses(node: cst.CSTNode, attribute: str) -> list[cst.Attribute]:
    """Every `self.<attribute>` in `node`."""
    found = []

    class Uses(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if is_self_attribute(node) and node.attr.value == attribute:
                found.append(node)

    walk(node, Uses())
    return found


def _empty_dict(c: Candidate, value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Dict) and not value.elements or \
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict" and not value.args


INTEGER_DTYPES = {f"torch.{name}" for name in ("long", "int64", "int", "int32", "int16", "int8")}
INTEGER_CASTS = {"long", "int", "short"}
CREATORS = {f"torch.{name}" for name in ("empty", "zeros", "ones", "full", "arange", "tensor", "as_tensor")}


def _new_of(value: cst.BaseExpression, attribute: str) -> bool:
    """`self.<attribute>.new_empty(...)` (or `new_zeros`, ...): a tensor of the attribute's own dtype."""
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
        value.func.attr.value.startswith("new_") and "dtype" not in {a.keyword.value for a in value.args if a.keyword} \
        and is_self_attribute(value.func.value) and value.func.value.attr.value == attribute


def integer_index(c: Candidate, node: cst.BaseExpression, depth: int = 0) -> bool:
    """`node` is an integer tensor, so indexing by it gathers (one dim read, the index's dims given) rather than
    selects by a boolean mask: created with an integer `dtype=` (a registered index buffer), `torch.randint`, cast
    by `.long()`, or a view of one; or a loop counter (`for head, ... in enumerate(...)`), an int."""
    if depth > MAX_DEPTH:
        return False
    below = lambda child: integer_index(c, child, depth + 1)  # noqa: E731
    if isinstance(node, cst.Name):  # a loop counter (an int), or assigned integer tensors
        flow = flow_for(c, node)
        definitions = flow.definitions_of(node)
        if definitions and not flow.sees_undefined(node) and all(is_loop_counter(c.parsed, d) for d in definitions):
            return True
        values = _reaching(c, node)
        return bool(values) and all(below(value) for value in values)
    if is_self_attribute(node) and c.owner is not None:
        values = c.owner.shape_values(node.attr.value)  # element writes (`.copy_`) keep the dtype
        # a rebinding `self.index.new_empty(...)` keeps the dtype the other bindings give it
        others = [value for value in values or [] if not _new_of(value, node.attr.value)]
        return bool(others) and all(below(value) for value in others)
    if not isinstance(node, cst.Call):
        return False
    dotted = c.parsed.imported_name(node.func)
    dtype = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "dtype"), None)
    if dotted == "torch.randint":
        return dtype is None or c.parsed.imported_name(dtype) in INTEGER_DTYPES
    if dotted in CREATORS:
        return dtype is not None and c.parsed.imported_name(dtype) in INTEGER_DTYPES
    if isinstance(node.func, cst.Attribute) and dotted is None:
        method = node.func.attr.value
        if method in INTEGER_CASTS and not node.args:
            return True
        if method == "to" and len(node.args) == 1 and node.args[0].keyword is None:
            return c.parsed.imported_name(node.args[0].value) in INTEGER_DTYPES
        if method in VALUE_KEEPING - {"gather", "index_select"}:
            return below(node.func.value)
    return False
