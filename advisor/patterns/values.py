"""What a value is, proved from the source: a Python scalar (a valid SDPA `scale`), a mask fill value."""

from __future__ import annotations

import math
import operator
import re
import struct

import libcst as cst

from advisor.patterns.helper_bodies import branches
from advisor.contracts.finding import display_path
from advisor.static.global_reach import reached_by_name
from advisor.static.global_writes import through_globals
from advisor.patterns.ops import literal_string, number_value
from advisor.static.dataflow import FunctionFlow
from advisor.static.module_index import ClassInfo, ParsedModule
from advisor.static.outside_writes import ANY_ATTRIBUTE
from advisor.static.walk import descendants

# Names that real code gives to Python-number scale factors; used only where nothing better is known
# (an unannotated parameter, an attribute set outside this class). A name is not a proof: a value accepted
# on its name alone is a guess, and a rewrite relying on it is unsafe (see `ValueProver.scalar_guess`).
SCALAR_NAME = re.compile(r"(^|_)(scale|scaling|scale_factor|softmax_scale|norm_factor|inv_norm_factor|"
                         r"head_dim|dim_head|d_k|d_head|dk|head_size|sqrt\w*|temperature_scalar)$", re.I)
# constructor parameters that size a layer (`def __init__(self, dim, num_heads)`): numbers by every sane call, and
# taken for one as a guess that the constructions of the tree (call-site facts) or a run-time check prove
SIZE_NAME = re.compile(r"(^|_)(dim|dims|d_model|embed_dim|embed_size|hidden_size|hidden_dim|n_embd|n_embed|"
                       r"heads|num_heads|n_heads|n_head|nhead|num_attention_heads|head_count|d_k|d_v|dk|d_head|"
                       r"head_size)$", re.I)
# Objects that carry hyperparameters (`config.hidden_size`): their attributes are numbers by convention only.
CONFIG_NAME = re.compile(r"(^|_)(config|cfg|conf|args|opt|opts|hparams|hps|settings)$", re.I)
SCALAR_FUNCTIONS = {"math.sqrt", "math.pow", "math.log", "math.exp", "numpy.sqrt", "float", "int", "len", "max",
                    "min", "pow", "abs", "round"}
# these return a Python number whatever they are given (or raise): no need to prove their arguments
NUMBER_FUNCTIONS = {"math.sqrt", "math.pow", "math.log", "math.exp", "float", "int", "len"}
SIZE_METHODS = {"size", "dim", "numel", "ndimension", "__len__"}
MASK_FILL_FLOOR = -1e3  # a literal fill at or below this is a "large negative" mask value
# the largest finite value of each float dtype (torch.finfo(d).max): `masked_fill` raises on a fill beyond it
FLOAT_MAX = {"float16": 65504.0, "half": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
             "float": 3.4028234663852886e38, "float64": 1.7976931348623157e308, "double": 1.7976931348623157e308}


def finfo_extreme(parsed: ParsedModule, node: cst.BaseExpression) -> tuple[cst.Arg, float] | None:
    """(the argument of `torch.finfo(...)`, -1.0 or 1.0) for `torch.finfo(<dtype>).min` (-1), `.max` (1), or either
    negated; None for anything else."""
    negated = isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
    extreme = node.expression if negated else node
    if not (isinstance(extreme, cst.Attribute) and extreme.attr.value in ("min", "max") and
            isinstance(extreme.value, cst.Call) and parsed.imported_name(extreme.value.func) == "torch.finfo" and
            len(extreme.value.args) == 1):
        return None
    return extreme.value.args[0], -1.0 if (extreme.attr.value == "min") != negated else 1.0


class ValueProver:
    """Answers questions about expressions inside one function."""

    def __init__(self, parsed: ParsedModule, flow: FunctionFlow | None, owner: ClassInfo | None,
                 guesses: list[str] | None = None,
                 constructor_guesses: list[tuple[cst.FunctionDef, str, str]] | None = None) -> None:
        self.parsed = parsed
        self.flow = flow
        self.owner = owner
        self.guesses = [] if guesses is None else guesses  # why a value was taken for a number without proof
        # the guesses that are `__init__` parameters defaulting to a number: (that `__init__`, parameter, why)
        self.constructor_guesses = [] if constructor_guesses is None else constructor_guesses
        self.unfollowed: list[str] = []  # forms met that the analysis does not follow (why a proof failed)

    def why_not_scalar(self, node: cst.BaseExpression) -> str | None:
        """When `is_scalar` fails because of a binding form the analysis does not follow, that form."""
        self.unfollowed.clear()
        self.is_scalar(node)
        return self.unfollowed[0] if self.unfollowed else None

    def scalar_guess(self, node: cst.BaseExpression) -> str | None:
        """None when `node` is proved a Python number from the source alone; else the first guess that
        `is_scalar` had to make (a name that suggests a number, an unannotated parameter, ...)."""
        self.guesses.clear()
        self.constructor_guesses.clear()
        proved = self.is_scalar(node)
        guess = self.guesses[0] if self.guesses else (None if proved else "it is not provably a number")
        self.guesses.clear()
        return guess

    def constructor_parameters(self, node: cst.BaseExpression) -> list[tuple[cst.FunctionDef, str]]:
        """The `__init__` parameters (each defaulting to a number) that are all `node` was taken for a number on,
        so that every construction passing a number there proves it; [] when it rests on anything else."""
        self.guesses.clear()
        self.constructor_guesses.clear()
        self.is_scalar(node)
        found = [(function, name) for function, name, _ in self.constructor_guesses]
        only = found and {why for *_, why in self.constructor_guesses} == set(self.guesses)
        self.guesses.clear()
        self.constructor_guesses.clear()
        return found if only else []

    def _guess(self, why: str) -> bool:
        self.guesses.append(why)
        return True

    # -- Python scalars ----------------------------------------------------------------------------
    def is_scalar(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """True when `node` is provably a Python number (never a tensor)."""
        if depth > 12:
            return False
        if number_value(node) is not None:
            return True
        if isinstance(node, cst.UnaryOperation):
            return self.is_scalar(node.expression, depth + 1)
        if isinstance(node, cst.BinaryOperation):
            return self.is_scalar(node.left, depth + 1) and self.is_scalar(node.right, depth + 1)
        if isinstance(node, cst.IfExp):
            return self.is_scalar(node.body, depth + 1) and self.is_scalar(node.orelse, depth + 1)
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):  # `scale or d ** -0.5`
            return self._is_scalar_or_none(node.left, depth + 1) and self.is_scalar(node.right, depth + 1)
        if isinstance(node, cst.Call):
            dotted = self.parsed.imported_name(node.func)
            if depth == 0 and self.scalar_expression(node) is not node:  # inside an expression it stays a tensor
                return self.is_scalar(self.scalar_expression(node), depth + 1)
            if dotted in NUMBER_FUNCTIONS:
                return True
            if dotted in SCALAR_FUNCTIONS:
                return all(self.is_scalar(a.value, depth + 1) or self.is_size(a.value) for a in node.args)
            return self.is_size(node) or self._helper_returns_scalar(node, depth)
        if isinstance(node, cst.Subscript):
            return self.is_size(node)
        if isinstance(node, cst.Name):
            return self._name_is_scalar(node, depth)
        if isinstance(node, cst.Attribute):
            return self._attribute_is_scalar(node, depth)
        return False

    def _is_scalar_or_none(self, node: cst.BaseExpression, depth: int) -> bool:
        if isinstance(node, cst.Name) and node.value == "None":
            return True
        definitions = self.flow.definitions_of(node) if isinstance(node, cst.Name) else []
        if definitions and all(d.kind == "param" and d.annotation is None and d.default is not None
                               and self.parsed.code(d.default) == "None" for d in definitions):
            return self._guess(f"the parameter `{node.value}` (default None) has no annotation, so a caller may "
                               f"pass a tensor")
        return self.is_scalar(node, depth)

    def scalar_expression(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """The Python number inside a 0-dim tensor built from it (`torch.full([], x, ...)`, `torch.tensor(x)`):
        SDPA's scale must be that number, not the tensor. Only where the tensor holds the number exactly (an int
        literal, a literal float32 represents, a float64 tensor) or rounded as the computation rounds (a tensor's
        dtype): `torch.tensor(0.1)` holds float32's 0.1, which the original's float64 scores are scaled by, so
        that one stays a tensor (folded into q)."""
        number = self._tensor_of_number(node)
        if number is None:
            return node
        value = number_value(number)
        dtypes = [a.value for a in node.args if a.keyword is not None and a.keyword.value == "dtype"]
        named = [self.parsed.imported_name(d) for d in dtypes]
        # an explicit dtype holds the number rounded to it (`torch.tensor(0.3330078125, dtype=torch.bfloat16)` holds
        # 0.333984375: breaker round 26); one this file does not name may be any
        exact = value is not None and all(name is not None and _dtype_holds(name, value) for name in named) and \
            (isinstance(number, cst.Integer) or _float32_holds(value) or bool(named))
        # float64, or the dtype of the tensor it scales (GPT-2's `s / torch.full([], d ** 0.5, dtype=s.dtype)`: the
        # scores', whose rounding the computation has anyway; another tensor's may be an integer dtype)
        held = any(self.parsed.imported_name(d) in ("torch.float64", "torch.double") or
                   isinstance(d, cst.Attribute) and d.attr.value == "dtype" and self._scales(node, d.value)
                   for d in dtypes)
        return number if exact or held else node

    def _scales(self, factor: cst.BaseExpression, tensor: cst.BaseExpression) -> bool:
        """`factor` multiplies or divides `tensor` itself (`s / factor`, `factor * s`): the same name."""
        product = self.parsed.parents.get(factor)
        if not isinstance(product, cst.BinaryOperation) or not isinstance(tensor, cst.Name):
            return False
        other = product.left if product.right is factor else product.right
        return isinstance(other, cst.Name) and other.value == tensor.value

    def _tensor_of_number(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """x of `torch.full([], x, ...)` or `torch.tensor(x, ...)` (a 0-dim tensor built from one number)."""
        if not isinstance(node, cst.Call):
            return None
        dotted = self.parsed.imported_name(node.func)
        positional = [a.value for a in node.args if a.keyword is None]
        if dotted == "torch.full" and len(positional) >= 2 and isinstance(positional[0], (cst.List, cst.Tuple)) \
                and not positional[0].elements:
            return positional[1]
        if dotted == "torch.tensor" and len(positional) == 1:
            return positional[0]
        return None

    @staticmethod
    def _is_shape(node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Attribute):
            return node.attr.value == "shape"
        if isinstance(node, cst.Subscript):
            return ValueProver._is_shape(node.value)
        return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            node.func.attr.value == "size" and not node.args

    def _helper_returns_scalar(self, call: cst.Call, depth: int) -> bool:
        """`default(self.scale, d ** -0.5)` with a module-level `def default(val, d): return val if exists(val)
        else d`: the result is one of the arguments, so it is a scalar when every candidate is."""
        if not isinstance(call.func, cst.Name) or any(a.keyword or a.star for a in call.args):
            return False
        helper = self.parsed.plain_functions.get(call.func.value)
        if helper is None:
            return False
        body = [s for s in helper.body.body if not (isinstance(s, cst.SimpleStatementLine)
                                                    and isinstance(s.body[0], cst.Expr))]
        if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or \
                not isinstance(body[0].body[0], cst.Return) or body[0].body[0].value is None:
            return False
        params = [p.name.value for p in helper.params.params]
        arguments = dict(zip(params, (a.value for a in call.args)))
        returned = body[0].body[0].value
        candidates = [returned.body, returned.orelse] if isinstance(returned, cst.IfExp) else [returned]
        return all(isinstance(c, cst.Name) and c.value in arguments and
                   (self.is_scalar(arguments[c.value], depth + 1) or self.is_size(arguments[c.value]))
                   for c in candidates)

    def is_size(self, node: cst.BaseExpression) -> bool:
        """`x.size(-1)`, `x.shape[-1]`, `len(x)`: integers read off a tensor's shape."""
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            return node.func.attr.value in SIZE_METHODS and len(node.args) <= 1
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute):
            return node.value.attr.value == "shape"
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Call):  # x.size()[-1]
            return self.is_size(node.value)
        if isinstance(node, cst.Call) and self.parsed.imported_name(node.func) == "len":
            return True
        return False

    def _name_is_scalar(self, node: cst.Name, depth: int) -> bool:
        definitions = self.flow.definitions_of(node)
        if not definitions:
            local = any(d.name == node.value for d in self.flow.definitions.values())  # read after a `del`
            module_level = None if local else self._global_is_scalar(node.value)
            if module_level is not None:
                return module_level
            return bool(SCALAR_NAME.search(node.value)) and not self.flow.sees_undefined(node) and \
                self._guess(f"`{node.value}` is not bound in this function; only its name suggests a number")
        for definition in definitions:
            if definition.kind == "param":
                annotation = definition.annotation
                if annotation is not None:
                    annotated = self.parsed.code(annotation).replace(" ", "")
                    if annotated not in ("float", "int", "float|None", "Optional[float]", "int|float"):
                        return False
                    # Python does not enforce it: a float may be a learned temperature passed as a tensor, an
                    # int a size read as a 0-d tensor (`x.shape[-1]` under tracing; breaker round 19b)
                    self._guess(f"the parameter `{definition.name}` is annotated "
                                f"`{self.parsed.code(annotation)}`, which Python does not enforce: a caller may "
                                f"still pass a tensor")
                elif self._constructor_guess(definition):
                    continue
                elif not (SCALAR_NAME.search(definition.name)
                          or (definition.default is not None and number_value(definition.default) is not None)):
                    return False
                else:
                    self._guess(f"the parameter `{definition.name}` has no int/float annotation, so a caller may "
                                f"pass a tensor")
            elif definition.kind == "assign" and definition.index is None:
                if not self.is_scalar(definition.value, depth + 1) or self._holds_tensor(definition.value):
                    return False
            elif definition.kind == "assign":  # `b, c, h, w = x.shape`: unpacked sizes are ints
                if not self._unpacked_is_scalar(definition, depth):
                    if not isinstance(definition.value, (cst.Tuple, cst.List)):  # a tuple's items say their own
                        self.unfollowed.append(f"`{definition.name}` is unpacked from "
                                               f"`{self.parsed.code(definition.value)}`, a form the analysis does "
                                               f"not follow")
                    return False
            elif definition.kind == "aug":
                if not self.is_scalar(definition.value, depth + 1):
                    return False
            elif not is_loop_counter(self.parsed, definition):
                return False
        return True

    def _global_is_scalar(self, name: str) -> bool | None:
        """A module-level constant (`TEMPERATURE = 1.0`): a number when every module-level binding is a number
        literal; a function of the file that rebinds it (`global TEMPERATURE`) makes that a guess. None when the
        file binds no such global (an import, a builtin)."""
        if name in self.parsed.imports:
            return None
        literal, setters = False, []
        for target in self.parsed.bindings.get(name, []):
            function = self.parsed.innermost(target, cst.FunctionDef)
            if function is not None:
                if any(item.name.value == name for g in descendants(function, (cst.Global,)) for item in g.names):
                    setters.append(function.name.value)
                continue  # else a local of that function
            if self.parsed.innermost(target, cst.ClassDef) is not None:
                if self._declared_global(name):
                    setters.append(self.parsed.innermost(target, cst.ClassDef).name.value)
                continue  # a class attribute, unless the class body declares it global
            if self._module_literal(target) is None:
                return False
            literal = True
        if not literal:
            return None if not setters else False
        if reached_by_name(self.parsed, name):
            return self._guess(f"the module-level `{name}` is a number here, but the file may rebind it by name "
                               f"(`globals()`, `vars()`, `exec`, a star import)")
        if setters:
            return self._guess(f"the module-level `{name}` is a number here, but `{setters[0]}` rebinds it "
                               f"(`global {name}`) to a value whose type is not visible")
        rebound = self._rebound_as_attribute(name)
        if rebound is not None:
            return self._guess(f"the module-level `{name}` is a number here, but {rebound}")
        return True

    def _module_literal(self, target: cst.CSTNode) -> float | None:
        """The number literal a module-level binding target is given: `T = 9`, or unpacked, `H, T = 4, 9`."""
        return number_value(self._module_value(target))

    def _module_value(self, target: cst.CSTNode) -> cst.BaseExpression | None:
        """The expression a module-level binding target is given: `T = 9`, or unpacked, `H, T = 4, 9` (None for
        any other binding)."""
        parents = self.parsed.parents
        owner = parents.get(target)
        if isinstance(owner, cst.AssignTarget):
            assign = parents.get(owner)
            return assign.value if isinstance(assign, cst.Assign) else None
        if not isinstance(owner, cst.Element) or any(isinstance(e, cst.StarredElement) for e in
                                                      getattr(parents.get(owner), "elements", [])):
            return None
        packed, bound = parents.get(owner), parents.get(parents.get(owner))
        assign = parents.get(bound)
        if not (isinstance(packed, (cst.Tuple, cst.List)) and isinstance(bound, cst.AssignTarget) and
                isinstance(assign, cst.Assign) and len(assign.targets) == 1 and
                isinstance(assign.value, (cst.Tuple, cst.List)) and
                len(assign.value.elements) == len(packed.elements) and
                not any(isinstance(e, cst.StarredElement) for e in assign.value.elements)):
            return None
        return assign.value.elements[packed.elements.index(owner)].value

    def _rebound_as_attribute(self, name: str) -> str | None:
        """Why a module-level name may hold another value when the code runs: a file of the scan assigns an
        attribute of that name on some object (`attn.SCALE = t` after `import attn`, `setattr(mod, "SCALE", t)`),
        or attributes by computed names; None when none does."""
        names = self.parsed.outside_attribute_writes[0]
        if name in names:
            return f"{self.parsed.outside_writer(name)} assigns `.{name}` on another object (this module's, maybe)"
        if ANY_ATTRIBUTE in names:
            return f"{self.parsed.outside_writer(ANY_ATTRIBUTE)} assigns attributes by computed names"
        writer = self.parsed.global_rebound_by_computed_name(name)
        if writer is not None:
            return f"{writer} assigns globals of a module it looks up by computed names"
        through = through_globals(self.parsed, self.parsed.tree) if self.parsed.tree is not None else None
        if through is not None:
            return f"`{display_path(through)}` reads a function's `__globals__`, which rebind any global"
        return None

    def _unpacked_is_scalar(self, definition, depth: int) -> bool:
        """`h, w = x.shape`; `a, b = d ** -0.5, 2`; `b, n, d, h = *q.shape, self.heads` (every item a number)."""
        value = definition.value
        if self._is_shape(value):
            return True
        if not isinstance(value, (cst.Tuple, cst.List)):
            return False
        items = value.elements
        if not any(isinstance(item, cst.StarredElement) for item in items):
            return len(items) > definition.index and self.is_scalar(items[definition.index].value, depth + 1)
        return all(self._is_shape(item.value) if isinstance(item, cst.StarredElement)
                   else self.is_scalar(item.value, depth + 1) for item in items)

    def _constructor_guess(self, definition) -> bool:
        """An unannotated `__init__` parameter defaulting to a number, or without a default but named as a size: a
        number as a guess every construction of the tree (call-site facts) or a run-time check may prove."""
        if not self._is_constructor(definition):
            return False
        if definition.default is not None and number_value(definition.default) is not None:
            why = f"the constructor parameter `{definition.name}` defaults to a number, but a caller may pass a tensor"
        elif definition.default is None and SIZE_NAME.search(definition.name):
            why = f"the constructor parameter `{definition.name}` is named as a size, but a caller may pass a tensor"
        else:
            return False
        self.constructor_guesses.append((self.parsed.innermost(definition.statement, cst.FunctionDef),
                                         definition.name, why))
        return self._guess(why)

    def _is_constructor(self, definition) -> bool:
        function = self.parsed.innermost(definition.statement, cst.FunctionDef)
        return function is not None and function.name.value == "__init__"

    def _attribute_is_scalar(self, node: cst.Attribute, depth: int) -> bool:
        if isinstance(node.value, cst.Name) and self.parsed.imported_name(node) in ("math.pi", "math.e"):
            return True
        if isinstance(node.value, cst.Name) and node.value.value == "self" and self.owner is not None:
            name = node.attr.value
            values = self.owner.attributes.get(name)
            if values and not all(self._assigned_is_scalar(v, depth) for v in values):
                return False
            rebound = self.owner.rebound(name, identity_ok=True)  # `x * Identity()` raises, as SDPA's scale= does
            if rebound is not None:
                return self._guess(f"{rebound}, so an instance's value may not be the one the class assigns")
            if values:
                return name not in self.owner.mutated or \
                    self._guess(f"`self.{name}` is also updated in place, which the analysis does not follow")
            if name in self.owner.unfollowed:
                self.unfollowed.append(f"`self.{name}` is assigned by an unpacking the analysis does not follow")
                return False
            return bool(SCALAR_NAME.search(name)) and \
                self._guess(f"`self.{name}` is not assigned in this class (inherited or set from outside); "
                            f"only its name suggests a number")
        root = node.value
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Name) and CONFIG_NAME.search(root.value):
            return self._guess(f"`{self.parsed.code(node)}` is a configuration value, a number only by convention")
        return bool(SCALAR_NAME.search(node.attr.value)) and \
            self._guess(f"`{self.parsed.code(node)}` is not assigned in this class; only its name suggests a number")

    def _assigned_is_scalar(self, value: cst.BaseExpression, depth: int) -> bool:
        """A value assigned to `self.x` in some method, proved with that method's own definitions."""
        function = self.parsed.innermost(value, cst.FunctionDef)
        if function is None:
            return False
        prover = ValueProver(self.parsed, self.parsed.flow(function), self.owner, self.guesses,
                             self.constructor_guesses)
        return prover.is_scalar(value, depth + 1) and not self._holds_tensor(value)

    def _holds_tensor(self, value: cst.BaseExpression) -> bool:
        """`torch.tensor(0.5)` bound to a name: its number is SDPA's scale only where the call is written inline
        (`scalar_expression`); the name holds the 0-d tensor, which SDPA's `scale=` rejects when it requires grad
        (and reads with a host sync otherwise)."""
        return self._tensor_of_number(value) is not None

    # -- strings ------------------------------------------------------------------------------------
    def constant_string(self, node: cst.BaseExpression, depth: int = 0) -> str | None:
        """The text of a string the source fixes: a literal, a local name bound once to one, `.replace` of one
        with literal arguments, and an f-string whose placeholders are such (audiocraft's einsum layouts);
        None for anything computed."""
        if depth > 8:
            return None
        text = literal_string(node)
        if text is not None:
            return text
        if isinstance(node, cst.Name):
            definitions = self.flow.definitions_of(node)
            if len(definitions) != 1 or self.flow.sees_undefined(node) or definitions[0].kind != "assign" \
                    or definitions[0].index is not None:
                return None
            return self.constant_string(definitions[0].value, depth + 1)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "replace" \
                and len(node.args) == 2 and all(a.keyword is None and a.star == "" for a in node.args):
            operands = (node.func.value, *(a.value for a in node.args))
            base, old, new = (self.constant_string(operand, depth + 1) for operand in operands)
            return None if None in (base, old, new) else base.replace(old, new)
        if isinstance(node, cst.FormattedString) and "b" not in node.prefix.lower():
            return self._formatted(node, depth)
        return None

    def _formatted(self, node: cst.FormattedString, depth: int) -> str | None:
        """An f-string with each plain `{name}` placeholder replaced by its constant text, read as a literal."""
        parts = []
        for part in node.parts:
            if isinstance(part, cst.FormattedStringExpression):
                if part.conversion is not None or part.format_spec is not None or part.equal is not None:
                    return None
                value = self.constant_string(part.expression, depth + 1)
                if value is None or any(ch in value for ch in "\\'\"{}\n"):
                    return None  # text that the literal would read differently
                part = cst.FormattedStringText(value)
            parts.append(part)
        return literal_string(node.with_changes(parts=parts))

    # -- mask fill values --------------------------------------------------------------------------
    def fill_kind(self, node: cst.BaseExpression, depth: int = 0) -> str | None:
        """'neginf' for -inf, 'finite' for a large negative finite number, None when not provable."""
        if depth > 8:
            return None
        code = self.parsed.code(node).replace(" ", "").replace('"', "'")
        if code in ("float('-inf')", "-float('inf')", "-math.inf", "-torch.inf", "-np.inf", "-numpy.inf",
                    "float('-Inf')", "-float('Inf')", "-float('infinity')", "float('-infinity')"):
            return "neginf"
        if re.fullmatch(r"-?torch\.finfo\(.*\)\.(min|max)", code):
            return "finite" if code.endswith(".min") != code.startswith("-") else None
        if self.dtype_extreme_helper_argument(node) is not None:
            return "finite"
        value = self.constant_number(node)
        if value is not None:
            return "neginf" if value == float("-inf") else ("finite" if value <= MASK_FILL_FLOOR else None)
        if isinstance(node, cst.Call) and self.parsed.imported_name(node.func) == "torch.tensor" and node.args:
            return self.fill_kind(node.args[0].value, depth + 1)
        if self.python_float_of(node) is not None:  # ESPnet's `float(torch.finfo(s.dtype).min)`
            return self.fill_kind(self.python_float_of(node), depth + 1)
        if isinstance(node, cst.Call) and self.parsed.imported_name(node.func) in ("torch.full", "torch.full_like") \
                and len(node.args) > 1 and (node.args[1].keyword is None or node.args[1].keyword.value == "fill_value"):
            return self.fill_kind(node.args[1].value, depth + 1)
        if isinstance(node, cst.Name) and self.flow is not None:  # no flow: a module-level expression
            definitions = self.flow.definitions_of(node)
            kinds = {self.fill_kind(d.value, depth + 1) if d.kind == "assign" and d.index is None
                     else (self.fill_kind(d.default, depth + 1) if d.kind == "param" and d.default else None)
                     for d in definitions}
            return kinds.pop() if len(kinds) == 1 and not self.flow.sees_undefined(node) else None
        if (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"
                and self.owner is not None):
            value = self.owner.only_value(node.attr.value)
            return self.fill_kind(value, depth + 1) if value is not None else None
        return None

    def python_float_of(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """`x` of the builtin `float(x)` (a fill's value is its argument's), None for anything else."""
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "float" and \
                len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star and \
                "float" not in self.parsed.bound_names and "float" not in self.parsed.imports:
            return node.args[0].value
        return None

    def fill_value(self, node: cst.BaseExpression, depth: int = 0) -> float | cst.BaseExpression | None:
        """What a finite fill holds: its number (`-1e9`, `torch.finfo(torch.float16).min`), or the tensor whose
        dtype's extreme it is (`torch.finfo(scores.dtype).min` gives `scores`); None when the source does not show
        it. Names and `self.` attributes are followed to their one value, as `fill_kind` follows them."""
        if depth > 8:
            return None
        number = self.constant_number(node)
        if number is not None:
            return number
        if self.python_float_of(node) is not None:
            return self.fill_value(self.python_float_of(node), depth + 1)
        helper_argument = self.dtype_extreme_helper_argument(node)
        if helper_argument is not None:
            return helper_argument
        extreme = finfo_extreme(self.parsed, node)
        if extreme is not None:
            argument, sign = extreme[0].value, extreme[1]
            dtype = (self.parsed.imported_name(argument) or "").removeprefix("torch.")
            if sign > 0:
                return None  # the largest value (`finfo.max`, `-finfo.min`): no fill
            if dtype in FLOAT_MAX:
                return -FLOAT_MAX[dtype]
            is_dtype = isinstance(argument, cst.Attribute) and argument.attr.value == "dtype"
            return argument.value if is_dtype else None
        if isinstance(node, cst.Call) and self.parsed.imported_name(node.func) == "torch.tensor" and node.args:
            return self.fill_value(node.args[0].value, depth + 1)
        if isinstance(node, cst.Name):
            definitions = self.flow.definitions_of(node)
            if len(definitions) != 1 or self.flow.sees_undefined(node) or definitions[0].kind != "assign" or \
                    definitions[0].index is not None:
                return None
            return self.fill_value(definitions[0].value, depth + 1)
        if (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"
                and self.owner is not None):
            value = self.owner.only_value(node.attr.value)
            return self.fill_value(value, depth + 1) if value is not None else None
        return None

    def dtype_extreme_helper_argument(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """`t` of `max_neg_value(t)` where `max_neg_value` is this file's undecorated one-parameter function whose
        body is `return -torch.finfo(p.dtype).max` (or `.min`) of that parameter (lucidrains' helper): the call is
        the most negative finite number of t's dtype, as if written in place. None for any other call."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name) or len(node.args) != 1 or \
                node.args[0].keyword is not None or node.args[0].star != "":
            return None
        helper = self.parsed.module_functions.get(node.func.value)
        if helper is None or node.func.value in self.parsed.bound_names or helper.decorators:
            return None
        params = helper.params
        if len(params.params) != 1 or isinstance(params.star_arg, cst.Param) or params.kwonly_params or \
                params.star_kwarg or params.posonly_params:
            return None
        shape = branches(helper)
        if shape is None or shape[0] is not None:
            return None
        parameter = params.params[0].name.value
        code = self.parsed.code(shape[1][0]).replace(" ", "")
        if code not in (f"-torch.finfo({parameter}.dtype).max", f"torch.finfo({parameter}.dtype).min") or \
                self.parsed.imported_name(cst.Name("torch")) != "torch":
            return None
        return node.args[0].value

    def constant_number(self, node: cst.BaseExpression | None, depth: int = 0) -> float | None:
        """The number an expression the source fixes holds: literals and arithmetic of them (`-2 ** 32 + 1`),
        `float("-1e20")`, `float(x)` and `int(x)` of one, and a module-level name bound only to one
        (`NEG_INF = -1e9`, not rebound by any function or by a write of another file); None otherwise."""
        if node is None or depth > 8:
            return None
        value = number_value(node)
        if value is not None:
            return value
        below = lambda child: self.constant_number(child, depth + 1)  # noqa: E731
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            inner = below(node.expression)
            return None if inner is None else -inner if isinstance(node.operator, cst.Minus) else inner
        if isinstance(node, cst.BinaryOperation) and type(node.operator) in _ARITHMETIC:
            left, right = below(node.left), below(node.right)
            try:
                return None if left is None or right is None else float(_ARITHMETIC[type(node.operator)](left, right))
            except (OverflowError, ZeroDivisionError, TypeError):  # TypeError: a complex power
                return None
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("float", "int") \
                and node.func.value not in self.parsed.bindings and node.func.value not in self.parsed.imports and \
                len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
            text = literal_string(node.args[0].value)
            try:
                number = float(text) if text is not None and node.func.value == "float" else below(node.args[0].value)
                return None if number is None else float(int(number)) if node.func.value == "int" else number
            except (ValueError, OverflowError):
                return None
        if isinstance(node, cst.Name) and (self.flow is None or not self.flow.definitions_of(node)) and \
                not any(d.name == node.value for d in (self.flow.definitions.values() if self.flow else ())):
            return self._global_number(node.value, depth)
        return None

    def _global_number(self, name: str, depth: int) -> float | None:
        """The number every module-level binding of `name` gives it, where no function rebinds it (`global`) and no
        file of the scan assigns it as an attribute."""
        if name in self.parsed.imports or self._rebound_as_attribute(name) is not None or \
                reached_by_name(self.parsed, name):
            return None
        if self._declared_global(name):
            return None  # `global NEG_INF` in a function or a class body rebinds it
        values = set()
        for target in self.parsed.bindings.get(name, []):
            if self.parsed.innermost(target, (cst.FunctionDef, cst.ClassDef)) is not None:
                continue  # a local of a function or a class attribute (no `global` declares it, above)
            values.add(self.constant_number(self._module_value(target), depth + 1))
        return values.pop() if len(values) == 1 else None

    def _declared_global(self, name: str) -> bool:
        return any(item.name.value == name for node in self.parsed.nodes_of(cst.Global) for item in node.names)

    def literal_number(self, node: cst.BaseExpression | None, depth: int = 0) -> float | None:
        """The number a literal, a local name assigned only that literal, or a `self.` attribute assigned only
        that literal in its class (`self.beta = 1.0`, BLOOM) holds; None when it is not such a literal."""
        if node is None or depth > 4:
            return None
        value = number_value(node)
        if value is not None:
            return value
        if isinstance(node, cst.Name):
            definitions = self.flow.definitions_of(node)
            values = {self.literal_number(d.value, depth + 1) if d.kind == "assign" and d.index is None else None
                      for d in definitions}
            return values.pop() if len(values) == 1 and not self.flow.sees_undefined(node) else None
        if (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"
                and self.owner is not None):
            return self.literal_number(self.owner.only_value(node.attr.value), depth + 1)
        return None


_ARITHMETIC = {cst.Add: operator.add, cst.Subtract: operator.sub, cst.Multiply: operator.mul,
               cst.Divide: operator.truediv, cst.Power: operator.pow}


def float32(value: float) -> float:
    """`value` rounded to float32 (what `torch.tensor(value)` holds by default); ±inf beyond its range."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _float32_holds(value: float) -> bool:
    """Whether float32 represents `value` exactly."""
    return float32(value) == value


def _dtype_holds(dtype: str, value: float) -> bool:
    """Whether a tensor of torch's `dtype` (a dotted name, `torch.bfloat16`) holds `value` exactly (torch imported
    only here)."""
    import torch

    kind = getattr(torch, dtype.rpartition(".")[2], None) if dtype.startswith("torch.") else None
    if not isinstance(kind, torch.dtype):
        return False
    try:
        return torch.tensor(value, dtype=kind).item() == value
    except (RuntimeError, TypeError, OverflowError):
        return False


def is_loop_counter(parsed: ParsedModule, definition) -> bool:
    """`i` of `for i in range(n)` or `for i, x in enumerate(xs)`: an int (the builtins, unless the file binds their
    names)."""
    loop = definition.statement
    if definition.kind != "other" or not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call) or \
            not isinstance(loop.iter.func, cst.Name) or loop.iter.func.value in parsed.bindings or \
            loop.iter.func.value in parsed.imports:
        return False
    target, builtin = loop.target, loop.iter.func.value
    if builtin == "range":
        return isinstance(target, cst.Name) and target.value == definition.name
    first = target.elements[0].value if isinstance(target, (cst.Tuple, cst.List)) and target.elements else None
    return builtin == "enumerate" and isinstance(first, cst.Name) and first.value == definition.name
