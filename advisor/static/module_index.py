"""One parsed file: libcst metadata (qualified names, parents, positions) and what each class binds on self."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import inspect
import os
import builtins
import re
import sys
from dataclasses import dataclass, field
from contextlib import contextmanager
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Callable, Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper

from advisor.contracts.finding import display_path
from advisor.static.line_index import LineIndex
from advisor.static.opening_imports import first_code_run
from advisor.static.package_functions import decorators_keep
from advisor.static.escaping_reads import escaping_reads
from advisor.static.outside_writes import (ANY_ATTRIBUTE, ANY_LISTED, ANY_RAW, ANY_TENSOR, ANY_TO_IDENTITY,
                                           ATTRIBUTE_TABLES, FINITE_DRAW, MODULE_GLOBALS, NAMED_BINDERS,
                                           NAMESPACE_READS, NARROWED, RESHAPING_IN_PLACE, STATE_LOADERS,
                                           UNSPELLED_MODULE_WRITES, file_writes, outside_writes_of_source)
from advisor.static.cst_parse import parse_module
from advisor.static.dataflow import FunctionFlow, build_flow, is_inplace_method, is_self, is_self_attribute
from advisor.static.positions import StatementPositions
from advisor.static.attribute_escapes import attribute_escape
from advisor.static.walk import TOKENS, WHITESPACE, descendants, fields_not_only, is_node, walk

if TYPE_CHECKING:
    from advisor.static.project import ProjectFacts


TORCH_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# packages whose functions a file may import by name to call as torch's (numpy's and einops' may return views
# torch's view ops do not name: `ravel`, `einops.repeat`)
LIBRARY_PACKAGES = frozenset({"torch", "math"})
# packages whose objects hold no tensor a caller passed and run none of the program's code when read or called
LIBRARY_ROOTS = frozenset({"torch", "numpy", "math", "einops", "functools", "operator"})
NAMESPACE_BINDERS = frozenset({"globals", "exec", "eval", "vars", "__dict__", "__builtins__", "builtins", "setattr",
                               "__import__", "importlib"})  # words of a file that may bind a module's names unseen


@lru_cache(maxsize=64)
def _qualified_writes(names: frozenset[str]) -> dict[str, list[tuple[str, bool, bool]]]:
    """The qualified entries of a set of outside writes by attribute: (entry, a finite draw, narrowed)."""
    found: dict[str, list[tuple[str, bool, bool]]] = {}
    for name in names:
        base, narrowed, _ = name.partition(NARROWED)
        if narrowed or base.endswith(FINITE_DRAW):
            found.setdefault(base.removesuffix(FINITE_DRAW), []).append(
                (name, base.endswith(FINITE_DRAW), bool(narrowed)))
    return found


IDENTIFIER = re.compile(r"[^\W\d]\w*")  # a name's spelling, for `ParsedModule.words`


@dataclass(eq=False)
class ClassInfo:
    """`self.x = ...` and `self.register_buffer("x", ...)` seen in any method of a class."""

    node: cst.ClassDef
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)
    outside: frozenset[str] = frozenset()  # attribute names the file writes on objects other than `self`
    outside_reshaped: frozenset[str] = frozenset()  # ... by writes other than into their elements
    writer: Callable[[str], str] = lambda attribute: "this file"  # where such a name is written (a file's name)
    # (entry, file) for each other file of the tree reading an attribute name where its tensor may be handed on
    # (static.escaping_reads; the entry qualified as `outside`'s)
    handed_on: Callable[[str], list[tuple[str, str]]] = lambda name: []
    plain_module: bool = False  # its bases are torch.nn.Module alone: no `isinstance(m, nn.Linear)` holds for it
    # where a read of the tensor it builds for an attribute may write it or hand it on
    # (static.attribute_escapes)
    escape: Callable[[str, bool, bool], str | None] = lambda attribute, elements_ok, finite_ok: None

    @cached_property
    def _collected(self) -> "_SelfAttributeCollector":
        collector = _SelfAttributeCollector()
        for method in self.methods.values():
            walk(method, collector)
        return collector

    @property
    def attributes(self) -> dict[str, list[cst.BaseExpression]]:
        return self._collected.attributes

    @property
    def mutated(self) -> set[str]:
        """Attributes some method writes in place (`self.x[i] = v`, `self.x += v`, `self.x.fill_(v)`, `out=`):
        their value is not the one expression assigned to them."""
        return self._collected.mutated

    @property
    def unfollowed(self) -> set[str]:
        return self._collected.unfollowed

    @property
    def binds_computed_names(self) -> bool:
        """Whether a method binds the instance's attributes by names it computes (`setattr(self, name, v)`)."""
        return bool(self._collected.computed)

    @property
    def persistent_buffers(self) -> set[str]:
        """Buffers a state dict saves and loads (registered without `persistent=False`)."""
        return self._collected.persistent

    def rebound(self, attribute: str, identity_ok: bool = False, elements_ok: bool = False,
                finite_ok: bool = False, parameter: bool = False) -> str | None:
        """Why an instance's attribute may hold another value than the class's assignments (None: it cannot,
        as far as this file shows): the file writes that name on another object, or binds attributes by names
        it computes (`setattr(m, name, v)`, `m._modules[name] = v`, a state-dict loading hook), on this class's
        instances or on any object. `identity_ok`: the caller's reading also holds for an `nn.Identity()` in
        its place (a dropout whose probability is read with a default); `elements_ok`: it reads only what writes
        into the value's elements keep (rank, dtype); `finite_ok`: ... and draws of finite values; `parameter`:
        the class registers the attribute as an `nn.Parameter` and derives from nn.Module alone, whose
        `__setattr__` (behind `setattr`, `add_module`, `register_buffer`) puts only a Parameter or None there, so
        only computed bindings that bypass it (ANY_RAW) count."""
        written = self.written_outside(attribute, elements_ok, finite_ok)
        if written is not None:
            return f"`.{attribute}` is also assigned outside the class in {self.writer(written)}"
        escape = self.escape(attribute, elements_ok, finite_ok)
        if escape is not None:
            return (f"{escape} may write the tensor or hand it on (an alias, a container, a call), so it may not "
                    "hold what the class built")
        if not (parameter and self.plain_module) or self.written_outside(ANY_RAW) is not None:
            written = self.written_outside(ANY_ATTRIBUTE)
            if written is not None:
                return (f"{self.writer(written)} sets attributes by computed names on other objects (`setattr(m, "
                        "name, ...)`)")
            written = self.written_outside(ANY_TO_IDENTITY)
            if written is not None and not identity_ok:
                return (f"{self.writer(written)} replaces modules by `nn.Identity()` under computed names "
                        "(`setattr(m, name, ...)`)")
        if self._collected.computed:
            return f"`{self.node.name.value}` sets its attributes by computed names (`setattr(self, name, ...)`)"
        return None

    def method_shadowed(self, name: str, outside: bool = True) -> str | None:
        """Why `self.name(...)` may not call the class's method `name` (None: nothing the file shows binds that
        name on an instance): the class assigns `self.name` (`self._mix = lambda ...` in `__init__` or any method,
        `self.__dict__["_mix"] = f`), the file writes it on another object (`m._mix = f`), or replaces the class's
        `__init__` (which may bind anything); `outside`: writes outside the class count (the op reader leaves them
        to the block's dispatch check, which names them). Bindings by computed names are the callers' to weigh."""
        if name in self.attributes or name in self.mutated or name in self.unfollowed:
            return f"`self.{name}` is assigned in the class, over its method"
        if self.written_outside("__init__") is not None:
            return f"`{self.node.name.value}.__init__` is replaced in {self.writer('__init__')}"
        written = self.written_outside(name) if outside else None
        return f"`.{name}` is also assigned outside the class in {self.writer(written)}" if written else None

    def rebound_only_by_names_computed_elsewhere(self, attribute: str, identity_ok: bool = False) -> bool:
        """Whether `rebound`'s only reasons are other files of the tree binding attributes by computed names
        (`setattr(m, name, ...)` in a utility that may never touch this class): weaker evidence than a write of this
        very name or a computed write in this file, so a caller may assume the class's value rather than refuse."""
        if self.written_outside(attribute) is not None or self._collected.computed:
            return False
        computed = [written for name in (ANY_ATTRIBUTE, ANY_TO_IDENTITY)
                    if (written := self.written_outside(name)) is not None and
                    not (name == ANY_TO_IDENTITY and identity_ok)]
        return bool(computed) and all(self.writer(name) != "this file" for name in computed)

    def written_outside(self, attribute: str, elements_ok: bool = False, finite_ok: bool = False,
                        any_class: bool = False) -> str | None:
        """How the file names a write of the attribute on objects other than `self` that may be this class's
        instances (None: no such write): itself; `attribute~drawn` for a torch.nn.init draw of its elements;
        `attribute@torch.nn.Linear` for a write on an object an `isinstance` test narrows to torch.nn classes, unless
        this class derives from torch.nn.Module alone. `elements_ok`: writes into the value's elements do not count;
        `finite_ok`: draws of finite values do not (a learned table's values are any finite ones); `any_class`: the
        attribute is read on an object of any class (a submodule's `forward`), so narrowed writes always count."""
        names = self.outside_reshaped if elements_ok else self.outside
        if attribute in names:
            return attribute
        for name, drawn, narrowed in _qualified_writes(names).get(attribute, ()):
            if not (drawn and finite_ok or narrowed and self.plain_module and not any_class):
                return name
        return None

    def class_value(self, attribute: str) -> cst.BaseExpression | None:
        """The one expression the class binds the attribute to (never rebound or updated by the class itself);
        other code may still rebind it (see `rebound`)."""
        values = self.attributes.get(attribute, [])
        single = len(values) == 1 and attribute not in self.mutated and attribute not in self.unfollowed
        return values[0] if single else None

    def held_module(self, attribute: str) -> cst.BaseExpression | None:
        """The one expression the class binds the attribute to, where no code may bind another: writes into the
        elements of what it holds (`nn.init.normal_(block.attn.qkv.weight)`, `model.attn.logit_scale.copy_(t)`)
        leave a module in place, so a caller reading which module runs may still read it."""
        return self.class_value(attribute) if self.rebound(attribute, elements_ok=True) is None else None

    def only_value(self, attribute: str) -> cst.BaseExpression | None:
        """The value every instance's attribute holds, as far as this file shows."""
        return self.class_value(attribute) if self.rebound(attribute) is None else None

    def shape_value(self, attribute: str) -> cst.BaseExpression | None:
        """The one expression the class binds the attribute to, whose rank and dtype every instance's attribute
        keeps as far as this file shows, its values aside: writes into its elements (`m.bias.data[..., :p] = 1`,
        `self.mask[0] = 0`, `m.bias.fill_(1)`) are allowed, since they change values, never rank or dtype."""
        values = self.shape_values(attribute)
        return values[0] if values is not None and len(values) == 1 else None

    def shape_values(self, attribute: str) -> list[cst.BaseExpression] | None:
        """Every expression the class binds the attribute to (`__init__` and a resizing method), as `shape_value`
        reads one: the attribute has the rank and dtype of one of them."""
        values = self.attributes.get(attribute, [])
        if not values or attribute in self._collected.reshaped or attribute in self.unfollowed:
            return None
        return values if self.rebound(attribute, elements_ok=True) is None else None


class ParsedModule:
    """A file parsed once; every analysis of it shares this metadata."""

    def __init__(self, source: str, path: str, project: "ProjectFacts | None" = None, tree=None,
                 trust_imports: bool = False) -> None:
        self.source = source
        self.path = path
        self.project = project  # what the other files of the scanned tree register (None: this file alone)
        self.tree = tree  # static.call_sites.Tree: the scanned files, read on demand (None: this file alone)
        self.trust_imports = trust_imports  # read each import's name as imported wherever it may be bound anew
        self.wrapper = MetadataWrapper(parse_module(source), unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self._flows: dict[tuple[cst.FunctionDef, frozenset[cst.If]], FunctionFlow] = {}
        self._mentions: dict[tuple[cst.CSTNode, str], bool] = {}
        self._derived: dict[object, object] = {}

    @cached_property
    def parents(self) -> dict[cst.CSTNode, cst.CSTNode]:
        """Node -> parent, the map libcst's ParentNodeProvider gives less its whitespace and comments (walk.WHITESPACE:
        about half of a file's nodes, which no analysis asks about), built by reading the node dataclasses' fields
        directly (7x faster than the provider's visitor on a large file; tests/static/test_module_index checks
        equality). Its keys come depth first, each node before its children, fields in declaration order."""
        parents: dict[cst.CSTNode, cst.CSTNode] = {}
        nodes: list[cst.CSTNode] = [self.module]  # a stack of nodes and, beside it, of their parents
        above: list[cst.CSTNode | None] = [None]
        while nodes:
            node, parent = nodes.pop(), above.pop()
            if parent is not None:
                parents[node] = parent  # on the way down, so the keys come in libcst's visiting order
            children = []
            for name in _child_fields(type(node)):
                value = getattr(node, name)
                kind = type(value)
                if kind is list or kind is tuple:
                    children.extend(child for child in value if is_node(child) and type(child) not in WHITESPACE)
                elif kind not in WHITESPACE and is_node(value):
                    children.append(value)
            if children:
                children.reverse()
                nodes.extend(children)
                above.extend([node] * len(children))
        return parents

    def nodes_of(self, *kinds: type) -> list[cst.CSTNode]:
        """The file's nodes that are instances of `kinds`, in the parent map's (visiting) order, remembered: each
        node's type is looked up in the set of the file's node types that are `kinds`, as libcst's node classes
        are ABCs, whose isinstance check costs several times more over every node of a file."""
        key = ("nodes_of", kinds)
        if key not in self._derived:
            wanted = {kind for kind in set(map(type, self.parents)) if issubclass(kind, kinds)}
            self._derived[key] = [node for node in self.parents if type(node) in wanted]
        return self._derived[key]

    def uses_of(self, names: frozenset[str] | None) -> list[cst.BaseExpression]:
        """The file's references to any of `names` (qualified; None: to anything imported), resolved through its
        imports: calls, decorators, base classes and values passed on alike."""
        resolved = self.derived(ParsedModule.uses_of, _imported_references)
        return [node for node, name in resolved if names is None or name in names]

    def names_spelled(self, value: str) -> list[cst.Name]:
        """The file's `Name` nodes spelled `value`, in visiting order: call-site questions ask one name at a time,
        and filtering every node of the file for each made a tree's scan grow with files x names."""
        return self._by_key(cst.Name, lambda node: node.value).get(value, [])

    def attributes_named(self, attr: str) -> list[cst.Attribute]:
        """The file's `x.attr` nodes, in visiting order (see names_spelled)."""
        return self._by_key(cst.Attribute, lambda node: node.attr.value).get(attr, [])

    def _by_key(self, kind: type, key_of) -> dict[str, list]:
        key = ("by_key", kind)
        if key not in self._derived:
            groups: dict[str, list] = {}
            for node in self.nodes_of(kind):
                groups.setdefault(key_of(node), []).append(node)
            self._derived[key] = groups
        return self._derived[key]

    @cached_property
    def positions(self) -> StatementPositions:
        """Resolved only when a finding needs a line number, and only for the top-level statements that hold the
        nodes asked about (static.positions)."""
        return StatementPositions(self.wrapper, self.source, self.parents.get)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def derived(self, key: object, build):
        """build(self), computed once per file: for what another layer reads from the whole file on behalf of each
        block (per block, it grows with the square of the blocks in the file)."""
        if key not in self._derived:
            self._derived[key] = build(self)
        return self._derived[key]

    def tree_matches(self, key: str, pattern: re.Pattern) -> bool:
        """Whether `pattern` matches this file's text or that of another file of its tree (once per file and `key`,
        once per scan for the tree)."""
        return self.derived(("tree-matches", key), lambda parsed: pattern.search(parsed.source) is not None or (
            parsed.tree is not None and parsed.tree.any_file_matches(key, pattern)))

    def mentions(self, node: cst.CSTNode, word: str) -> bool:
        """Whether `word` (lower case) occurs in the node's code, in any case; remembered, since every method of a
        class asks it of the class. Read from the source lines of its top-level statement (positions.region), so
        the node's code is regenerated only where those lines say the word and hold more than the node."""
        key = (node, word)
        if key not in self._mentions:
            region = self.positions.region(node)
            if region is not None and (word not in region[0].lower() or region[1]):
                self._mentions[key] = word in region[0].lower()  # the source's lines: no code regenerated
            else:
                self._mentions[key] = word in self.code(node).lower()
        return self._mentions[key]

    def statement_spans(self, statements: list[cst.CSTNode]) -> dict[cst.CSTNode, tuple[int, int]] | None:
        """Where each of `statements` (top-level statements) lies in the source, its leading comments and blank
        lines included, so a rewrite can regenerate only the statements it changes. Checked, not assumed: each must
        render to exactly its slice of the source; None when one does not (then rewrites render the module). Each
        slice starts at the statement's first line as `ast` places it (positions.starts), so only the statements
        asked about are regenerated; without those lines every statement is, one after another from the top."""
        starts = self.positions.starts
        if not starts:
            return self._spans_from_the_top(statements)
        spans = {}
        for statement in statements:
            start, code = self.positions.offset(starts[statement]), self.code(statement)
            if not self.source.startswith(code, start):
                return None
            spans[statement] = (start, start + len(code))
        return spans

    def _spans_from_the_top(self, statements: list[cst.CSTNode]) -> dict[cst.CSTNode, tuple[int, int]] | None:
        header = "".join(self.code(line) for line in self.module.header)
        if not self.source.startswith(header):
            return None
        spans, cursor = {}, len(header)
        for statement in self.module.body:
            code = self.code(statement)
            if not self.source.startswith(code, cursor):
                return None
            spans[statement] = (cursor, cursor + len(code))
            cursor += len(code)
        return {statement: spans[statement] for statement in statements}

    @cached_property
    def lines(self) -> LineIndex:
        return LineIndex(self.source)

    @cached_property
    def words(self) -> frozenset[str]:
        """Every identifier-like word of the source, in code, strings and comments alike (computed once; rewrites
        ask per finding whether a name they would add may be used: `B, H, F, D = q.shape` binds `F`, which
        whitespace-separated tokens (`F,`) did not show, and the added `import ... as F` was shadowed)."""
        return frozenset(IDENTIFIER.findall(self.source))

    def within(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        """Whether `node` is `ancestor` or lies inside it."""
        while node is not None and node is not ancestor:
            node = self.parents.get(node)
        return node is ancestor

    def top_statement_index(self, node: cst.CSTNode) -> int:
        """The index in the module's body of the module-level statement holding `node`."""
        while self.parents.get(node) is not self.module:
            node = self.parents[node]
        order = self.derived(ParsedModule.top_statement_index,
                             lambda p: {id(statement): i for i, statement in enumerate(p.module.body)})
        return order[id(node)]

    def innermost(self, node: cst.CSTNode, kind: type | tuple[type, ...]) -> cst.CSTNode | None:
        """`node` itself when it is a `kind`, else its nearest ancestor that is one (None at the module)."""
        while node is not None and not isinstance(node, kind):
            node = self.parents.get(node)
        return node

    def frame(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The function whose run evaluates `node`: the nearest def whose body holds it (a parameter's default, an
        annotation or a decorator is evaluated where the def statement runs); None at module or class level."""
        child, node = node, self.parents.get(node)
        while node is not None:
            if isinstance(node, cst.FunctionDef) and child is node.body:
                return node
            child, node = node, self.parents.get(node)
        return None

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def end_line(self, node: cst.CSTNode) -> int:
        return self.positions[node].end.line

    def imported_name(self, node: cst.CSTNode) -> str | None:
        """The dotted name an expression refers to through imports ('torch.nn.functional.softmax'), or a
        builtin's name ('float'); None for anything else. Imports are resolved from the file's import
        statements (libcst's scope-based QualifiedNameProvider costs ~2x the whole analysis)."""
        parts: list[str] = []
        while isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
            node = node.value
        if not isinstance(node, cst.Name):
            return None
        base = self.imports.get(node.value)
        if base is not None and node.value in self.bound_names or node.value in self.rebound_by_imports:
            return None  # the import's name is rebound somewhere in the file: which object it is here is not seen
        if base is None and node.value in self.name_aliases:
            return ".".join([self.name_aliases[node.value]] + parts[::-1])
        if base is None:
            return node.value if not parts and node.value in BUILTINS and node.value not in self.bound_names else None
        return ".".join([base] + parts[::-1])

    @cached_property
    def imports(self) -> dict[str, str]:
        """Local name -> dotted module or object, from every import statement in the file."""
        return _imports(self)

    def builtins_intact(self, names: tuple[str, ...]) -> bool:
        """Whether each name reads the builtin wherever the file's code runs: nothing binds, imports or may rebind
        it (a star import, `exec`); emitted code calling them (a guard's `isinstance(s, (int, float))`) means them."""
        return not any(name in self.bound_names or name in self._defined_names or name in self.imports or
                       name in self.rebound_by_imports for name in names)

    @cached_property
    def rebound_by_imports(self) -> frozenset[str]:
        """Names whose first import may not be what the code reads (breaker round 44): a name imported again as
        something else (`from helpers import softmax` after torch's, in a function too), one a star import may
        rebind after its import (`from helpers import *` binds any name; torch's star imports bind torch's
        `__all__`, `float` among them) and builtins a star import may rebind; names the file binds through its
        namespace, every name (`globals()[n] = v`, `exec("from helpers import *")`, `builtins.exec`, `run = exec`:
        breaker round 45). None with `trust_imports` (a reading that only reports what it finds)."""
        if self.trust_imports:
            return frozenset()
        candidates = set(self.imports) | set(dir(builtins))
        if self.binds_any_global or self.frames_elsewhere is not None:
            return frozenset(candidates)
        rebound = {name for name, targets in _imports(self, every_binding=True).items() if len(targets) > 1}
        first_import: dict[str, int] = {}
        for node in self.nodes_of(cst.Import, cst.ImportFrom):
            if not isinstance(node.names, cst.ImportStar):
                for name in _imports_bound_by(self, node):
                    first_import.setdefault(name, self.top_statement_index(node))
        for index, star in self.every_star_import:
            module = _name_code(self, star.module) if star.module and not star.relative else None
            bindable = _star_bound_names(module)
            if bindable is None and self.tree is not None and star.module is not None:
                bindable = self.tree.star_bound_names(self, star)
            rebound |= {name for name in candidates if (bindable is None or name in bindable) and
                        index > first_import.get(name, -1)}
        return frozenset(rebound)

    @cached_property
    def torch_functional_spelling(self) -> str | None:
        """How the module spells torch.nn.functional through a module name it already has (`F`, `nn.functional`,
        `torch.nn.functional`, in that order of preference); None where it has none (a rewrite adds an import)."""
        aliases = self.module_aliases
        if "torch.nn.functional" in aliases:
            return aliases["torch.nn.functional"]
        if "torch.nn" in aliases:
            return f"{aliases['torch.nn']}.functional"
        return f"{aliases['torch']}.nn.functional" if "torch" in aliases else None

    @cached_property
    def literal_all(self) -> frozenset[str] | None:
        """The module's `__all__`, where it is a literal list of strings and the only mention of the name."""
        return _literal_all(self)

    @cached_property
    def names_a_star_import_takes(self) -> frozenset[str] | None:
        """What `from <this module> import *` binds in the importer: a literal `__all__`, else the public names
        its module level binds (by imports too); None where it may bind others (its own star imports, `exec`,
        `globals()`, `setattr`)."""
        bound, any_name = _scope_bindings(self.module.body)
        replaced = self._replaced_by_name
        if any_name or self.every_star_import or self.binds_any_global or self.nodes_of(cst.Global) or any(
                isinstance(call.func, cst.Name) and call.func.value in ("globals", "setattr", "__import__")
                for call in self.nodes_of(cst.Call)):
            return None  # `global softmax` in a function binds a module name no module-level statement shows
        listed = self.literal_all
        if listed is not None:
            return listed | replaced
        if os.path.basename(self.path) == "__init__.py":
            return None  # a package's namespace holds its submodules too, whoever imports them
        names = set(bound) | set(_imports(self, module_level=True)) | replaced
        return frozenset(name for name in names if not name.startswith("_"))

    @cached_property
    def name_aliases(self) -> dict[str, str]:
        """Names bound once in the whole file, at module level, to an imported object (`matmul = torch.matmul`):
        the name is that object wherever it is read."""
        counts: dict[str, int] = {}
        for name in _assigned_names(self.parents.items()):
            counts[name.value] = counts.get(name.value, 0) + 1
        aliases = {}
        for statement in self.module.body:
            assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and \
                len(statement.body) == 1 else None
            if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and \
                    isinstance(assign.targets[0].target, cst.Name):
                name = assign.targets[0].target.value
                dotted = self._through_imports(assign.value)
                if dotted is not None and counts.get(name) == 1 and name not in self.imports:
                    aliases[name] = dotted
        return aliases

    def _through_imports(self, node: cst.CSTNode) -> str | None:
        """`torch.matmul` -> 'torch.matmul' through the import statements alone (no alias, no builtin)."""
        parts: list[str] = []
        while isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
            node = node.value
        base = self.imports.get(node.value) if isinstance(node, cst.Name) else None
        if base is None or node.value in self.bound_names:
            return None
        return ".".join([base] + parts[::-1])

    @cached_property
    def module_functions(self) -> dict[str, cst.FunctionDef]:
        """The file's top-level functions that are the one value of their name when the module has run: none is
        defined or bound again at module scope (a `def` in a module-level `if True:`, `for` or `with` block runs
        after the first one, breaker round 12), imported over (a star import after it too), or replaced through
        `globals()`, `setattr` on an object other than `self`, its `__code__`, `exec` or `eval`."""
        bound, _ = _scope_bindings(self.module.body)
        replaced = self._replaced_by_name
        stars = [line for line, node in enumerate(self.module.body) if isinstance(node, cst.SimpleStatementLine)
                 and any(isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)
                         for small in node.body)]  # a star import after a def may replace it
        return {s.name.value: s for line, s in enumerate(self.module.body) if isinstance(s, cst.FunctionDef)
                and not any(star > line for star in stars) and bound.get(s.name.value) == 1
                and s.name.value not in self.imports and ANY_ATTRIBUTE not in replaced
                and s.name.value not in replaced}

    @cached_property
    def plain_functions(self) -> dict[str, cst.FunctionDef]:
        """`module_functions` whose body is what a call runs: each decorator returns the function unchanged
        (static.package_functions.keeps_function; a wrapper may compute, write or return anything else). Readers of
        a helper's body read these; the file's own writes of the name count already, the tree's are the caller's."""
        return {name: function for name, function in self.module_functions.items() if decorators_keep(self, function)}

    @cached_property
    def _replaced_by_name(self) -> frozenset[str]:
        """Module names the file may rebind without a binding statement: `f.__code__ = g` (f), `setattr(obj, "f",
        g)` on anything but `self` (f; any name where computed), `globals()` used otherwise than read by a literal
        key, `vars()`, `exec`, `eval`, a frame's `f_globals` and a function's `__globals__` (any name:
        ANY_ATTRIBUTE)."""
        found: set[str] = {ANY_ATTRIBUTE} if self.binds_any_global or any(
            isinstance(call.func, cst.Name) and call.func.value == "globals" and not self._literal_read(call)
            for call in self.nodes_of(cst.Call)) else set()
        for node in self.attributes_named("__code__"):
            target = self.parents.get(node)
            if isinstance(target, (cst.AssignTarget, cst.AugAssign)) and isinstance(node.value, cst.Name):
                found.add(node.value.value)
        for call in self.nodes_of(cst.Call):
            func = call.func.value if isinstance(call.func, cst.Name) else None
            if func == "setattr" and len(call.args) >= 2 and not is_self(call.args[0].value):
                key = call.args[1].value
                found.add(key.evaluated_value if isinstance(key, cst.SimpleString) else ANY_ATTRIBUTE)
        return frozenset(found)

    @cached_property
    def frames_elsewhere(self):
        """The first site of another file of the tree that reaches a frame's or a function's globals (any module's,
        this one's too: static.project.frame_globals), or None."""
        sites = self.project.frame_globals if self.project is not None else ()
        return next((site for site in sites if site.path != self.path), None)

    @cached_property
    def binds_any_global(self) -> bool:
        """Whether the file may bind any of its module-level names without naming it: `globals()` used otherwise
        than subscripted to read (`globals()[group + "_" + name](x)` binds nothing), `vars()`, `exec`/`eval` (by
        any spelling), a frame's `f_globals`, a function's `__globals__`."""
        if self.attributes_named("f_globals") or self.attributes_named("__globals__") or self._code_runner_named:
            return True  # a frame's or a function's namespace: `sys._getframe(0).f_globals.update(...)`
        if any(isinstance(node.value, cst.Name) and self.imports.get(node.value.value) == "sys"
               for node in self.attributes_named("modules")) or self.imports.get("modules") == "sys.modules":
            return True  # a module object, this one's too: `sys.modules[__name__].__dict__.update(F=1)` (round 46)
        if any(isinstance(call.func, cst.Name) and call.func.value == "getattr" and len(call.args) >= 2 and
               not isinstance(call.args[1].value, cst.SimpleString) and
               any(str(part.evaluated_value).startswith("__")
                   for part in descendants(call.args[1].value, (cst.SimpleString,)))
               for call in self.nodes_of(cst.Call)):
            return True  # `getattr(f, "__glob" + "als__")["F"] = 1`
        return any(isinstance(call.func, cst.Name) and (
            call.func.value in ("exec", "eval") or call.func.value == "vars" and not call.args or
            call.func.value == "globals" and not self._literal_read(call, any_key=True))
            for call in self.nodes_of(cst.Call))

    @cached_property
    def _code_runner_named(self) -> bool:
        """`exec` or `eval` reached otherwise than called by its bare name (`builtins.exec(...)`, `run = exec`):
        code run from a string may bind any name (breaker round 45). `model.eval()` is a method, not the builtin."""
        for node in self.nodes_of(cst.Name):
            parent = self.parents.get(node)
            method = isinstance(parent, cst.Attribute) and parent.attr is node and not (
                isinstance(parent.value, cst.Name) and parent.value.value in ("builtins", "__builtins__"))
            if node.value in ("exec", "eval") and not method and not (
                    isinstance(parent, cst.Call) and parent.func is node):
                return True
        return False

    def _literal_read(self, call: cst.Call, any_key: bool = False) -> bool:
        """`globals()["__file__"]`: the namespace read by a literal key (`any_key`: by any key), nothing bound."""
        index = self.parents.get(call)
        subscript = index if isinstance(index, cst.Subscript) and index.value is call else None
        return subscript is not None and len(subscript.slice) == 1 and \
            isinstance(subscript.slice[0].slice, cst.Index) and \
            (any_key or isinstance(subscript.slice[0].slice.value, cst.SimpleString)) and \
            not isinstance(self.parents.get(subscript), (cst.AssignTarget, cst.AugAssign, cst.Del))

    @cached_property
    def bindings(self) -> dict[str, list[cst.Name]]:
        """Every binding target in the file other than imports, by name."""
        found: dict[str, list[cst.Name]] = {}
        for name in _assigned_names(self.parents.items()):
            found.setdefault(name.value, []).append(name)
        return found

    @cached_property
    def bound_names(self) -> frozenset[str]:
        """Names bound anywhere in the file other than by imports (so a local `max = ...` is not taken for the
        builtin, nor a local `F = ...` for the imported module), `def` and `class` statements outside class bodies
        included (a nested `def sdp_kernel(...)` shadows the imported one in its function: breaker round 21)."""
        return frozenset(self.bindings) | frozenset(self._defined_names & (set(self.imports) | BUILTINS))

    @cached_property
    def _defined_names(self) -> frozenset[str]:
        """The names `def` and `class` statements bind outside class bodies."""
        return frozenset(node.name.value for node in self.nodes_of(cst.FunctionDef, cst.ClassDef)
                         if not isinstance(self.parents.get(self.parents.get(node)), cst.ClassDef))

    @cached_property
    def star_imports(self) -> list[tuple[int, cst.ImportFrom]]:
        """(index in the module's body, statement) of each module-level `from X import *` of a module outside torch:
        it may bind any name when it runs (`F` from `from helpers import *`, breaker round 18)."""
        return [(index, star) for index, star in self.every_star_import if not (
            not star.relative and star.module is not None and _name_code(self, star.module).split(".")[0] == "torch")]

    @cached_property
    def every_star_import(self) -> list[tuple[int, cst.ImportFrom]]:
        """(index in the module's body, statement) of each `from X import *` (only legal at module level), in a
        `try:` or `if` block too."""
        return [(self.top_statement_index(node), node) for node in self.nodes_of(cst.ImportFrom)
                if isinstance(node.names, cst.ImportStar)]

    @cached_property
    def module_aliases(self) -> dict[str, str]:
        """Dotted module -> the local name it is bound to at module level: {'torch.nn.functional': 'F'}. A name
        also bound otherwise (`F = ...`, `for torch in ...`, an import of something else in a function) is left
        out, as is one imported only inside a function (`def f(): import torch.nn.functional as F`) or only where
        it may not run (under `if MYPY:`, a version gate, a loop, an `except` or `else:` block): code emitted with it
        elsewhere could mean another object, or nothing."""
        aliases: dict[str, str] = {}
        everywhere = _imports(self, every_binding=True)
        deleted = {name.value for statement in self.nodes_of(cst.Del) for name in
                   ([statement.target] if isinstance(statement.target, cst.Name) else
                    [e.value for e in getattr(statement.target, "elements", ()) if isinstance(e.value, cst.Name)])}
        for local, dotted in _imports(self, module_level=True, always=True, before_code_runs=True).items():
            if local not in self.bound_names and local not in deleted and everywhere[local] == {dotted}:
                aliases.setdefault(dotted, local)
        return aliases

    @cached_property
    def calls_and_classes(self) -> tuple[list[cst.Call], list[cst.ClassDef]]:
        """Every call and every class statement of the file, in one walk (for file-wide questions: hooks
        registered, modules scripted, subclasses)."""
        return self.nodes_of(cst.Call), self.nodes_of(cst.ClassDef)

    @cached_property
    def calls_by_name(self) -> dict[str, list[cst.Call]]:
        """The file's calls by the name they call (`f` of `f(...)` and of `obj.f(...)`), in `calls_and_classes`
        order: finding a function's call sites per attention block by reading every call of the file grew with
        the square of the blocks in it."""
        found: dict[str, list[cst.Call]] = {}
        for call in self.calls_and_classes[0]:
            name = _callee_name(call.func)
            if name is not None:
                found.setdefault(name, []).append(call)
        return found

    @cached_property
    def function_names(self) -> dict[cst.FunctionDef, str]:
        """Each function's dotted name (as in `functions`)."""
        return {function: name for function, _, name in reversed(self.functions)}

    @cached_property
    def method_name_counts(self) -> dict[str, int]:
        """How many methods of the file's classes have each name."""
        counts: dict[str, int] = {}
        for function, owner, _ in self.functions:
            if owner is not None:
                counts[function.name.value] = counts.get(function.name.value, 0) + 1
        return counts

    def flow(self, function: cst.FunctionDef, off: frozenset[cst.If | cst.IfExp] = frozenset(),
             on: frozenset[cst.If | cst.IfExp] = frozenset()) -> FunctionFlow:
        """`off` / `on`: `if` statements and conditional expressions of `function` read as never / always taken
        (see `build_flow`)."""
        key = (function, off, on)
        if key not in self._flows:
            first_id = 1_000_000 * len(self._flows)  # file-unique ids: flows of two functions can merge
            self._flows[key] = build_flow(function, first_id, off, on, self.library_functions)
        return self._flows[key]

    @cached_property
    def library_functions(self) -> frozenset[str]:
        """Names the file binds only by one import from torch or math (`from torch import einsum`): a call of one
        computes what the library's does (static.tensor_views). None where a name is also imported otherwise,
        assigned, defined or deleted (`del sum` gives back the builtin), nor in a file that may bind names unseen
        (`globals()[...]`, `exec`, a star import: breaker round 39)."""
        if self.words & NAMESPACE_BINDERS or self.star_imports:
            return frozenset()
        bound = {name.value for name in _assigned_names(self.parents.items())} | set(self.module_functions) | \
            {name.value for node in self.nodes_of(cst.Del) for name in descendants(node.target, (cst.Name,))}
        every = _imports(self, every_binding=True)
        return frozenset(name for name, dotted in self.imports.items() if "." in dotted and
                         dotted.split(".")[0] in LIBRARY_PACKAGES and name not in bound and len(every[name]) == 1)

    @cached_property
    def functions(self) -> list[tuple[cst.FunctionDef, ClassInfo | None, str]]:
        """Every function with its enclosing class (if a method) and its dotted name."""
        collector = _FunctionCollector()
        walk(self.module, collector)
        outside, reshaped = self.outside_attribute_writes
        for info in {id(owner): owner for _, owner, _ in collector.found if owner is not None}.values():
            info.outside, info.outside_reshaped, info.writer = outside, reshaped, self.outside_writer
            info.handed_on = self.handed_on_elsewhere
            info.escape = functools.partial(attribute_escape, self, info)
            info.plain_module = bool(info.node.bases) and all(
                not base.keyword and self.imported_name(base.value) in TORCH_MODULE for base in info.node.bases)
        return collector.found

    def owner_of(self, function: cst.CSTNode | None) -> ClassInfo | None:
        """The class `function` is a method of (None for a function of no class, or a node that is not one of the
        file's functions): one lookup, where a scan of `functions` per block made a file's time grow with the square
        of its blocks."""
        entry = self.function_entry(function)
        return entry[0] if entry is not None else None

    def function_entry(self, function: cst.CSTNode | None) -> tuple[ClassInfo | None, str] | None:
        """(its class, its dotted name) for one of the file's functions; None for any other node."""
        return self._function_entries[0].get(function)

    def methods_named(self, name: str) -> list[cst.FunctionDef]:
        """The methods of the file's classes named `name`, in `functions`' order."""
        return self._function_entries[1].get(name, [])

    def function_named(self, dotted: str) -> tuple[cst.FunctionDef, ClassInfo | None] | None:
        """The first function of the file whose dotted name is `dotted`, with its class."""
        return self._function_entries[2].get(dotted)

    @cached_property
    def _function_entries(self) -> tuple[dict, dict, dict]:
        """`functions` indexed three ways: function -> (class, dotted name), method name -> methods, dotted name ->
        (function, class) (the first entry wins, as a scan of `functions` finds it)."""
        by_node: dict[cst.FunctionDef, tuple[ClassInfo | None, str]] = {}
        methods: dict[str, list[cst.FunctionDef]] = {}
        by_dotted: dict[str, tuple[cst.FunctionDef, ClassInfo | None]] = {}
        for function, owner, dotted in self.functions:
            by_node.setdefault(function, (owner, dotted))
            by_dotted.setdefault(dotted, (function, owner))
            if owner is not None:
                methods.setdefault(function.name.value, []).append(function)
        return by_node, methods, by_dotted

    def handed_on_elsewhere(self, name: str) -> list[tuple[str, str]]:
        """(entry, file) for each other file of the tree that reads the attribute `name` (or, as `name()`, the result
        of a method) where a tensor it holds may be handed on (static.escaping_reads); for ANY_TENSOR this file too,
        whose own reads by name static.attribute_escapes follows, but not a module's tensors listed whole (`sd =
        m.state_dict(); sd["bias"] = t; m.load_state_dict(sd)` in the model's own file, breaker round 18)."""
        found = self.project.escaping_elsewhere(name, self.path) if self.project is not None else []
        if name == ANY_TENSOR and self.lists_tensors_whole:
            found = [(ANY_TENSOR, self.path), *found]
        return found

    @cached_property
    def lists_tensors_whole(self) -> bool:
        """This file hands a module's tensors on listed whole (`state_dict()`, `buffers()` stored or passed on) and
        loads a state dict: what it loads may be a listing it changed. (A listing only read, `sum(b.numel() for b in
        m.buffers())`, changes nothing; another file's listing counts without a load, as static.escaping_reads
        reads it.)"""
        return "load_state_dict" in self.words and any(entry.partition(NARROWED)[0] in (ANY_TENSOR, ANY_LISTED)
                                                       for entry in file_writes(self.source, escaping_reads).escaping)

    def note_read(self, path: str) -> None:
        """A file besides this one the analysis read: a result the scan cache keeps is valid only while it is
        unchanged (`noting_package_reads`)."""
        if _NOTED:
            _NOTED[-1].add(os.path.realpath(path))

    def package_module(self, dotted: str) -> "ParsedModule | None":
        """Another file of this file's package, by the module name an import gives it ('fairseq.utils', or '.utils'
        relative to this file); None outside the package or for a file that cannot be read or parsed. The file is
        noted while an analysis is recorded (`noting_package_reads`)."""
        path = _package_file(self.path, dotted)
        if path is not None:
            self.note_read(path)
        return _parse_file(path) if path is not None else None

    @cached_property
    def top_level_classes(self) -> dict[str, ClassInfo]:
        """Classes defined once, at module level, by name."""
        found: dict[str, list[ClassInfo]] = {}
        for info in {id(owner): owner for _, owner, _ in self.functions if owner is not None}.values():
            found.setdefault(info.node.name.value, []).append(info)
        return {name: infos[0] for name, infos in found.items()
                if len(infos) == 1 and infos[0].node in self.module.body}

    @cached_property
    def outside_attribute_writes(self) -> tuple[frozenset[str], frozenset[str]]:
        """Names of attributes this file writes on some object other than a method's own `self`
        (`model.attn.scale = ...`, `block.bias[:, :2] = 1`, `setattr(m, "softmax", ...)`, `m.bias.fill_(1)`), and
        those of them written otherwise than into their elements (`m.bias = t`, `m.bias.data = t`,
        `m.bias.unsqueeze_(0)`). Any instance's attribute of a name in the first set may then hold another value
        than its class assigns, so no proof may read the class's own assignment as the value; one in the first
        set only keeps its rank and dtype. The other files of the scanned tree count as this one (static.project):
        a training script's `blk.attn.bias.data = band` rebinds the buffer the model file's class assigns."""
        names, reshaped = set(self.own_outside_writes[0]), set(self.own_outside_writes[1])
        if self.project is not None:
            if self.project.registration_hooks:
                names |= {ANY_ATTRIBUTE, ANY_RAW}  # a hook elsewhere may replace any submodule, parameter or
                reshaped |= {ANY_ATTRIBUTE, ANY_RAW}  # buffer as it is set, with any value
            elsewhere, reshaped_elsewhere = self.project.names_written_elsewhere(self.path)
            names |= elsewhere
            reshaped |= reshaped_elsewhere
        return frozenset(names), frozenset(reshaped)

    @cached_property
    def own_outside_writes(self) -> tuple[frozenset[str], frozenset[str]]:
        """`outside_writes` of this file alone."""
        names, reshaped = outside_writes_of_source(self.source, own=True)
        return frozenset(names), frozenset(reshaped)

    def global_rebound_by_computed_name(self, name: str, spelled: bool = False) -> str | None:
        """Where a file of the tree may bind this module's global `name` by a computed name, on a module the import
        machinery gives (`setattr(sys.modules[m], attr, v)`, static.outside_writes.MODULE_GLOBALS), in words; None
        where no such write's pattern spells it (`cls.__name__ + "Fast"` spells no `mask`). `spelled`: only
        patterns with a literal part count (see outside_writes.UNSPELLED_MODULE_WRITES)."""
        for written in sorted(self.outside_attribute_writes[0]):
            if written.startswith(MODULE_GLOBALS) and fnmatch.fnmatchcase(name, written[len(MODULE_GLOBALS):]) and \
                    not (spelled and written == UNSPELLED_MODULE_WRITES):
                return self.outside_writer(written)
        return None

    def outside_writer(self, attribute: str) -> str:
        """Where an attribute written outside its class is written: this file, or the first other file of the
        tree that writes it."""
        elsewhere = self.project.writes_elsewhere(self.path) if self.project is not None else ()
        if attribute in self.own_outside_writes[0]:
            return "this file"
        return next((f"`{display_path(w.path)}`" for w in elsewhere if attribute in w.names), "this file")



def _package_file(path: str, dotted: str) -> str | None:
    """Where module `dotted` lives, looked up only inside the package that holds `path` (the folders above it that
    have an `__init__.py`): `.utils` beside it, `fairseq.utils` under the package's root."""
    folder = os.path.dirname(os.path.abspath(path))
    level = len(dotted) - len(dotted.lstrip("."))
    if level:
        for _ in range(level - 1):
            folder = os.path.dirname(folder)
        parts = dotted[level:].split(".") if dotted[level:] else []
    else:
        while os.path.isfile(os.path.join(folder, "__init__.py")):
            folder = os.path.dirname(folder)
        parts = dotted.split(".")
        if not os.path.isfile(os.path.join(folder, parts[0], "__init__.py")) or \
                not os.path.abspath(path).startswith(os.path.join(folder, parts[0]) + os.sep):
            return None  # not this file's own package
    base = os.path.join(folder, *parts)
    for candidate in (os.path.join(base, "__init__.py"), base + ".py"):  # Python imports the package if both exist
        if parts and os.path.isfile(candidate):
            return candidate
    return None


_NOTED: list[set[str]] = []  # while an analysis is recorded: the package files it read (innermost last)


@contextmanager
def noting_package_reads() -> Iterator[set[str]]:
    """The real paths of the package files `package_module` reads inside the block (a helper read as a softmax or an
    optional mask add): a result kept by the scan cache is valid only while they are unchanged."""
    found: set[str] = set()
    _NOTED.append(found)
    try:
        yield found
    finally:
        _NOTED.pop()


def _parse_file(path: str) -> "ParsedModule | None":
    try:
        stat = os.stat(path)
        return _parse_cached(path, stat.st_mtime_ns, stat.st_size)
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, ValueError):
        return None


@lru_cache(maxsize=64)
def _parse_cached(path: str, mtime_ns: int, size: int) -> "ParsedModule":
    """Keyed by the file's mtime and size, so an edit is read again."""
    with open(path, encoding="utf-8") as handle:
        return ParsedModule(handle.read(), path)


BUILTINS = {"float", "int", "len", "max", "min", "abs", "round", "pow", "map", "bool", "eval", "exec"}


def _imported_references(parsed: "ParsedModule") -> list[tuple[cst.BaseExpression, str]]:
    """Each outermost `Name`/`Attribute` of the file that resolves through its imports, with the dotted name: read
    once per file (the tree-wide readers ask `uses_of` several times a file)."""
    found = []
    for node in parsed.nodes_of(cst.Name, cst.Attribute):
        parent = parsed.parents[node]
        if isinstance(parent, cst.Attribute) and parent.value is node or isinstance(parent, (cst.ImportAlias,
                                                                                             cst.AsName)):
            continue
        name = parsed.imported_name(node)
        if name is not None:
            found.append((node, name))
    return found


def _imports(parsed: "ParsedModule", module_level: bool = False, every_binding: bool = False,
             always: bool = False, before_code_runs: bool = False) -> dict:
    """Local name -> dotted module or object, from the file's import statements in source order (the first binding
    of a name wins); `module_level`: only statements outside functions and classes; `always`: only those that run
    whenever the module does; `before_code_runs`: only those above the first module-level statement that may run
    the module's code (opening_imports.first_code_run); `every_binding`: local name -> the set of everything any
    statement binds it to."""
    imports: dict = {}
    bind = (lambda local, dotted: imports.setdefault(local, set()).add(dotted)) if every_binding else \
        imports.setdefault
    first_run = first_code_run(parsed) if before_code_runs else None
    for node in parsed.nodes_of(cst.Import, cst.ImportFrom):
        if module_level and (parsed.innermost(node, (cst.FunctionDef, cst.ClassDef)) is not None or
                             _under_type_checking(parsed, node)) or always and not _runs_always(parsed, node) or \
                first_run is not None and parsed.top_statement_index(node) >= first_run:
            continue
        for local, dotted in _imports_bound_by(parsed, node).items():
            bind(local, dotted)
    return imports


def _imports_bound_by(parsed: "ParsedModule", node: cst.Import | cst.ImportFrom) -> dict[str, str]:
    """Local name -> dotted module or object, for what one import statement binds (nothing for a star import)."""
    bound: dict[str, str] = {}
    if isinstance(node, cst.Import):
        for alias in node.names:
            dotted = _name_code(parsed, alias.name)
            if alias.asname is not None:
                bound[_name_code(parsed, alias.asname.name)] = dotted
            else:
                bound[dotted.split(".")[0]] = dotted.split(".")[0]
    elif not isinstance(node.names, cst.ImportStar):
        base = "." * len(node.relative) + (_name_code(parsed, node.module) if node.module is not None else "")
        for alias in node.names:
            local = alias.asname.name if alias.asname else alias.name
            name = _name_code(parsed, alias.name)
            bound[_name_code(parsed, local)] = f"{base}{name}" if base.endswith(".") else f"{base}.{name}"
    return bound


def _literal_all(parsed: "ParsedModule") -> frozenset[str] | None:
    """The names of a module-level `__all__ = [...]` (or a tuple) of string literals, the only mention of the name
    in the file; None otherwise."""
    mentions = [name for name in parsed.nodes_of(cst.Name) if name.value == "__all__"]
    target = parsed.parents.get(mentions[0]) if len(mentions) == 1 else None
    assign = parsed.parents.get(target) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and
            isinstance(assign.value, (cst.List, cst.Tuple)) and
            parsed.parents.get(parsed.parents.get(assign)) is parsed.module):
        return None  # `__all__.append(...)`, `__all__ += [...]` in a `try:`, a second binding under `if`
    names = [element.value.evaluated_value for element in assign.value.elements
             if isinstance(element.value, cst.SimpleString)]
    return frozenset(names) if len(names) == len(assign.value.elements) else None


def _star_bound_names(module: str | None) -> frozenset[str] | None:
    """The names `from module import *` binds, for a torch module already imported here (its `__all__`, else its
    public names); None (any name) for every other module, relative ones too."""
    loaded = sys.modules.get(module) if module is not None and module.split(".")[0] == "torch" else None
    if loaded is None:
        return None
    names = getattr(loaded, "__all__", None)
    names = names if names is not None else [n for n in dir(loaded) if not n.startswith("_")]
    # torch.nn.functional's `torch` is the module `torch`, whatever imported it
    return frozenset(n for n in names if not (inspect.ismodule(getattr(loaded, n, None)) and
                                              getattr(loaded, n).__name__ == n))


MAY_NOT_RUN = (cst.If, cst.For, cst.While, cst.ExceptHandler, cst.ExceptStarHandler, cst.Else, cst.Match)


def _runs_always(parsed: "ParsedModule", node: cst.CSTNode) -> bool:
    """A module-level statement that runs whenever the module does: in no `if`, loop, `except` or `else:` block (a
    `try:` or `with` body runs, or the module raises)."""
    return parsed.innermost(parsed.parents.get(node), MAY_NOT_RUN) is None


def _under_type_checking(parsed: "ParsedModule", node: cst.CSTNode) -> bool:
    """Inside `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`), which never runs."""
    while node is not None:
        parent = parsed.parents.get(node)
        if isinstance(parent, cst.If) and node is parent.body and \
                parsed.code(parent.test).replace(" ", "").split(".")[-1] == "TYPE_CHECKING":
            return True
        node = parent
    return False


def _name_code(parsed: "ParsedModule", node: cst.CSTNode) -> str:
    """`parsed.code(node)` of a name or dotted name in an import, without running codegen for the usual spelling
    (no parentheses, no space around the dots); anything else is generated."""
    if isinstance(node, cst.Name) and not node.lpar and not node.rpar:
        return node.value
    if isinstance(node, cst.Attribute) and not node.lpar and not node.rpar and _tight(node.dot):
        return f"{_name_code(parsed, node.value)}.{_name_code(parsed, node.attr)}"
    return parsed.code(node)


def _tight(dot: cst.Dot) -> bool:
    return all(isinstance(space, cst.SimpleWhitespace) and not space.value
               for space in (dot.whitespace_before, dot.whitespace_after))


@lru_cache(maxsize=None)
def _child_fields(node_type: type) -> tuple[str, ...]:
    """The fields that can hold a node of the parent map (not whitespace), in declaration order."""
    wanted = set(fields_not_only(node_type, WHITESPACE))
    return tuple(f.name for f in dataclasses.fields(node_type) if f.name in wanted)


# Where a name is bound, by node type: the field holding the target (`with ... as`/`except ... as` one level down)
_BINDING_FIELDS = {cst.AssignTarget: "target", cst.AnnAssign: "target", cst.AugAssign: "target", cst.For: "target",
                   cst.CompFor: "target", cst.NamedExpr: "target", cst.Param: "name", cst.AsName: "name",
                   cst.MatchAs: "name", cst.MatchStar: "name", cst.MatchMapping: "rest"}  # `case {"s": SCALE}:`


def _assigned_names(nodes) -> list[cst.Name]:
    """Every name a statement or expression binds among `nodes`: assignment, loop, `with ... as`, `except ... as`,
    walrus and comprehension targets, `match` captures (breaker round 33), and parameters. A `def` or `class`
    statement's own name is a definition, not a rebinding (a helper redefined by `f = torch.compile(f)` shows up as
    the assignment); an import's `as` name is the import's."""
    found: list[cst.Name] = []

    def bind(target: cst.CSTNode | None) -> None:
        if isinstance(target, cst.Name):
            found.append(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                bind(element.value)
        elif isinstance(target, cst.StarredElement):
            bind(target.value)

    for node, parent in nodes:
        field_name = _BINDING_FIELDS.get(type(node))
        if field_name is not None and not (isinstance(node, cst.AsName) and isinstance(parent, cst.ImportAlias)):
            bind(getattr(node, field_name))
    return found


class _FunctionCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[cst.FunctionDef, ClassInfo | None, str]] = []
        self.classes: list[ClassInfo] = []
        self.path: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        info = ClassInfo(node)
        bound, any_name = _scope_bindings(node.body.body)  # `locals()` or `exec` in the body may bind any name
        for statement in node.body.body:
            if isinstance(statement, cst.FunctionDef) and bound.get(statement.name.value) == 1 and not any_name:
                info.methods[statement.name.value] = statement
        self.classes.append(info)
        self.path.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()
        self.path.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self.classes[-1] if self.classes and node in self.classes[-1].methods.values() else None
        self.found.append((node, owner, ".".join(self.path + [node.name.value])))
        self.path.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.path.pop()



def _scope_bindings(statements) -> tuple[dict[str, int], bool]:
    """How often a scope's statements bind each name: a `def` or `class` (in the scope's `if`/`for`/`with`/`try`
    blocks too: a function defined again in `if True:` is the one the scope holds, breaker round 12), an assignment,
    a loop, a walrus; not inside functions, classes, lambdas and comprehensions, which are scopes of their own. And
    whether the statements call `locals`, `exec`, `eval` or `vars`, which may bind any name."""
    counts: dict[str, int] = {}
    pending: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(statement, None) for statement in statements]
    any_name = False
    while pending:
        current, parent = pending.pop()
        if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            counts[current.name.value] = counts.get(current.name.value, 0) + 1
            continue
        if isinstance(current, (cst.Lambda, cst.CompFor)):
            continue
        if isinstance(current, cst.Call) and isinstance(current.func, cst.Name) and \
                current.func.value in ("locals", "exec", "eval", "vars"):
            any_name = True
        for name in _assigned_names([(current, parent)]):
            counts[name.value] = counts.get(name.value, 0) + 1
        pending.extend((child, current) for child in current.children if is_node(child))
    return counts, any_name


def _holds_no_definition(self, node: cst.CSTNode) -> bool:
    return False


# a function or class is defined only as a statement: the walk enters only what holds statements
_HOLD_STATEMENTS = {cst.Module, cst.IndentedBlock, cst.If, cst.Else, cst.For, cst.While, cst.Try, cst.TryStar,
                    cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.With, cst.FunctionDef, cst.ClassDef,
                    cst.Match, cst.MatchCase}
for _kind in {kind for kind in vars(cst).values() if isinstance(kind, type) and issubclass(kind, cst.CSTNode)} - \
        _HOLD_STATEMENTS - WHITESPACE - TOKENS:
    setattr(_FunctionCollector, f"visit_{_kind.__name__}", _holds_no_definition)


class _SelfAttributeCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.attributes: dict[str, list[cst.BaseExpression]] = {}
        self.mutated: set[str] = set()
        self.reshaped: set[str] = set()  # mutated otherwise than by writes into the elements
        self.unfollowed: set[str] = set()  # bound by an unpacking whose values are not paired with targets
        self.computed = False  # some method binds `self` attributes by a name computed at run time
        self.persistent: set[str] = set()  # buffers registered without `persistent=False`: a state dict loads them

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "_load_from_state_dict":  # an override that may load any buffer its own way
            self.computed = True

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if is_self_attribute(target.target):
                self.attributes.setdefault(target.target.attr.value, []).append(node.value)
            elif isinstance(target.target, (cst.Tuple, cst.List)):
                self._unpacked(target.target, node.value)
            else:
                self._written(target.target)

    def _unpacked(self, target: cst.Tuple | cst.List, value: cst.BaseExpression) -> None:
        """`self.a, self.b = x, y` pairs each attribute with its value; another unpacking gives it an unknown one."""
        elements = [element.value for element in target.elements]
        values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
        paired = values is not None and len(values) == len(elements) and \
            not any(isinstance(v, cst.StarredElement) for v in values)
        for position, element in enumerate(elements):
            if is_self_attribute(element):
                if paired:
                    self.attributes.setdefault(element.attr.value, []).append(values[position].value)
                else:
                    self.unfollowed.add(element.attr.value)
            else:
                self._written(element)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._written(node.target)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "out":
            self._written(node.value)

    def _written(self, target: cst.BaseExpression, elements_only: bool = False) -> None:
        table = _attribute_table_key(target)
        names = {a.attr.value for a in _written_attributes(target) if is_self_attribute(a)}
        self.mutated.update(names)
        if not (elements_only or table is None and _element_store(target)):
            self.reshaped.update(names)
        if table is not None and is_self(table[0]):
            name = _literal_name(table[1])
            self.computed |= name is None
            if name is not None:
                self.mutated.add(name)
                self.reshaped.add(name)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and is_self_attribute(node.target):
            self.attributes.setdefault(node.target.attr.value, []).append(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if is_inplace_method(func):  # `self.mask.fill_(...)`, `self.bias.data.copy_(...)`
            self._written(func.value, elements_only=func.attr.value not in RESHAPING_IN_PLACE)
        if isinstance(func, cst.Attribute) and func.attr.value in STATE_LOADERS and is_self(func.value):
            self.computed = True
        if isinstance(func, cst.Attribute) and func.attr.value not in NAMESPACE_READS and \
                is_self(_namespace_owner(func.value)):  # `self.__dict__.update(kw)`, `vars(self).update(scale=t)`
            names = [arg.keyword.value for arg in node.args if arg.keyword is not None]
            self.computed |= not names or len(names) < len(node.args)
            self.mutated.update(names)
            self.reshaped.update(names)
            return
        binding = named_binding(node)
        if binding is None and isinstance(func, cst.Attribute) and func.attr.value in NAMED_BINDERS and \
                is_self(func.value) and any(a.star for a in node.args):
            self.computed = True  # `self.add_module(*stage)`, `self.register_buffer(**spec)`: names not shown
            return
        if binding is None or not is_self(binding[0]):
            return
        name = _literal_name(binding[1])
        value = _bound_value(node)
        if name is None:
            self.computed = True
        elif value is not None and isinstance(func, cst.Attribute) and func.attr.value != "__setattr__":
            self.attributes.setdefault(name, []).append(value)  # `self.register_buffer("bias", torch.tril(...))`
            if func.attr.value == "register_buffer" and not _not_persistent(node):
                self.persistent.add(name)
        else:  # `setattr(self, "bias", v)`: read as a write the analysis does not pair
            self.mutated.add(name)
            self.reshaped.add(name)


def _written_attributes(target: cst.BaseExpression) -> list[cst.Attribute]:
    """The attributes a write to `target` changes: `x.a = v`, `x.a[i] = v`, `x.a, y.b = ...`, and every attribute
    a write goes through (`x.a.data = v`, `x.a.b[i] = v` change what `x.a` holds)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [a for element in target.elements for a in _written_attributes(element.value)]
    found = []
    while isinstance(target, (cst.Subscript, cst.Attribute)):
        if isinstance(target, cst.Attribute):
            found.append(target)
        target = target.value
    return found


def _element_store(target: cst.BaseExpression) -> bool:
    """`x.a[i] = v`, `x.a.data[..., :p] += v`: a store into the elements of what the attributes hold, which keeps
    every attribute on the way bound to the same object, of the same rank and dtype (a tensor's `__setitem__`
    writes in place)."""
    return isinstance(target, cst.Subscript)


def named_binding(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(receiver, name expression) of a call that binds an attribute by name: `setattr(m, name, v)`,
    `m.__setattr__(name, v)`, `m.register_buffer(name, t)`, `m.add_module(name, child)`, ..."""
    func, args = call.func, [a for a in call.args if a.keyword is None and not a.star]
    if isinstance(func, cst.Name) and func.value == "setattr" and len(args) >= 2:
        return args[0].value, args[1].value
    if isinstance(func, cst.Attribute) and func.attr.value in NAMED_BINDERS:
        if isinstance(func.value, cst.Name) and func.value.value == "object" and len(args) >= 2:
            return args[0].value, args[1].value  # `object.__setattr__(self, name, v)`
        keyword = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "name"), None)
        name = args[0].value if args else keyword
        return (func.value, name) if name is not None else None
    return None


def _not_persistent(call: cst.Call) -> bool:
    """`register_buffer(name, t, persistent=False)` (or `False` third): the buffer is left out of state dicts."""
    flag = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "persistent"), None)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    flag = flag if flag is not None or len(positional) < 3 else positional[2].value
    return isinstance(flag, cst.Name) and flag.value == "False"


def _bound_value(call: cst.Call) -> cst.BaseExpression | None:
    """The value a `register_buffer`/`add_module`-style call binds (its second positional argument; the third of
    `setattr(obj, name, value)` and `object.__setattr__(obj, name, value)`)."""
    args = [a for a in call.args if a.keyword is None and not a.star]
    position = 2 if isinstance(call.func, cst.Name) or isinstance(call.func.value, cst.Name) and \
        call.func.value.value == "object" else 1
    return args[position].value if len(args) > position else None


def _attribute_table_key(target: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(owner, key) of a store into a module's attribute table: `m._modules[name] = child`,
    `self.__dict__["bias"] = t`."""
    if not (isinstance(target, cst.Subscript) and len(target.slice) == 1 and
            isinstance(target.slice[0].slice, cst.Index)):
        return None
    table = target.value
    owner = table.value if isinstance(table, cst.Attribute) and table.attr.value in ATTRIBUTE_TABLES else \
        _namespace_owner(table)
    return (owner, target.slice[0].slice.value) if owner is not None else None


def _namespace_owner(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`m` of `m.__dict__` or `vars(m)`: the dictionary that holds m's attributes."""
    if isinstance(node, cst.Attribute) and node.attr.value == "__dict__":
        return node.value
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "vars" and \
            len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
        return node.args[0].value
    return None


def _literal_name(node: cst.BaseExpression) -> str | None:
    return node.evaluated_value if isinstance(node, cst.SimpleString) and \
        isinstance(node.evaluated_value, str) else None


def _callee_name(func: cst.BaseExpression) -> str | None:
    """`f` for `f(...)` and `m.f(...)`."""
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
