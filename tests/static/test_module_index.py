"""ParsedModule's own parent map must be exactly libcst's ParentNodeProvider's, less whitespace and comments: every
analysis walks it."""

from pathlib import Path

import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from advisor.static.module_index import ParsedModule
from advisor.static.walk import WHITESPACE

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "fixtures" / "attention" / "public").glob("*.py"))[:8] + [ROOT / "advisor" / "cli.py"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_parent_map_equals_libcsts_provider(path):
    parsed = ParsedModule(path.read_text(), str(path))
    expected = MetadataWrapper(parsed.module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    assert dict(parsed.parents) == {node: parent for node, parent in expected.items() if type(node) not in WHITESPACE}


@pytest.mark.parametrize("path", SOURCES[:3], ids=lambda p: p.name)
def test_nodes_of_a_kind_are_the_parent_maps_instances_in_order(path):
    """`nodes_of` reads node types, not isinstance: the same nodes in the same order, for concrete kinds, several
    at once, and abstract bases."""
    import libcst as cst

    parsed = ParsedModule(path.read_text(), str(path))
    for kinds in [(cst.Call,), (cst.Import, cst.ImportFrom), (cst.Name, cst.Attribute, cst.SimpleString),
                  (cst.BaseSmallStatement, cst.BaseCompoundStatement), (cst.BaseExpression,)]:
        expected = [node for node in parsed.parents if isinstance(node, kinds)]
        assert expected and parsed.nodes_of(*kinds) == expected, kinds


@pytest.mark.parametrize("path", SOURCES[:3], ids=lambda p: p.name)
def test_names_and_attributes_by_spelling_are_the_filtered_nodes_in_order(path):
    """Call sites ask for the nodes spelled one name (an index built once per file, not a walk per name): the
    same nodes, in the same order, as filtering the whole parent map; a name the file never spells gives none."""
    import libcst as cst

    parsed = ParsedModule(path.read_text(), str(path))
    names = [node for node in parsed.parents if isinstance(node, cst.Name)]
    attributes = [node for node in parsed.parents if isinstance(node, cst.Attribute)]
    assert names and attributes
    for value in {node.value for node in names}:
        assert parsed.names_spelled(value) == [node for node in names if node.value == value]
        assert parsed.attributes_named(value) == [node for node in attributes if node.attr.value == value]
    assert parsed.names_spelled("never_spelled_anywhere") == parsed.attributes_named("never_spelled_anywhere") == []


@pytest.mark.parametrize("path", SOURCES[:3], ids=lambda p: p.name)
def test_parent_map_keys_keep_the_statements_in_source_order(path):
    """`imports` reads the map in order (the first import of a name wins): statements, imports among them, must
    come in libcst's visiting order (whitespace nodes may come elsewhere)."""
    import libcst as cst

    parsed = ParsedModule(path.read_text(), str(path))
    visited = []

    class Order(cst.CSTVisitor):
        def on_visit(self, node):
            visited.append(node)
            return True

    parsed.module.visit(Order())
    kinds = (cst.BaseSmallStatement, cst.BaseCompoundStatement)
    assert [n for n in parsed.parents if isinstance(n, kinds)] == [n for n in visited if isinstance(n, kinds)]


NESTED = '''
class A:
    def f(self):
        def g():
            class B:
                def h(self): pass
        return lambda: 0
    if flag:
        def i(self): pass
    else:
        try:
            def j(self): pass
        except* E:
            def k(self): pass
        finally:
            with c:
                def l(self): pass
match x:
    case 1:
        for y in z:
            while w:
                @decorated(lambda: 1)
                def m(a=lambda: 2): pass
'''


@pytest.mark.parametrize("source", [NESTED, *(path.read_text() for path in SOURCES)])
def test_functions_are_those_a_walk_of_every_node_finds(source):
    """The collector enters only what holds statements; a walk of every node finds the same functions, owners
    and dotted names, in the same order."""
    import libcst as cst

    from advisor.static.module_index import _FunctionCollector
    from advisor.static.walk import walk

    class EveryNode(cst.CSTVisitor):
        __init__ = _FunctionCollector.__init__
        visit_ClassDef, leave_ClassDef = _FunctionCollector.visit_ClassDef, _FunctionCollector.leave_ClassDef
        visit_FunctionDef, leave_FunctionDef = _FunctionCollector.visit_FunctionDef, _FunctionCollector.leave_FunctionDef

    parsed = ParsedModule(source, "m.py")
    reference = EveryNode()
    walk(parsed.module, reference)
    found = [(function, owner.node if owner else None, name) for function, owner, name in parsed.functions]
    assert found == [(function, owner.node if owner else None, name) for function, owner, name in reference.found]
    assert len(found) >= (8 if source is NESTED else 1)



def test_a_class_spreading_its_own_bindings_binds_names_it_does_not_show():
    """`self.add_module(*stage)`, `self.register_buffer(**spec)`: the class binds its attributes by names the
    source does not show, as `setattr(self, name, v)` does."""
    template = "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self, spec):\n" \
               "        super().__init__()\n        {binding}\n\n    def forward(self, x):\n        return x\n"
    for binding, computed in [("self.add_module(*spec)", True), ("self.register_buffer(**spec)", True),
                              ("self.register_buffer('b', spec)", False)]:
        parsed = ParsedModule(template.format(binding=binding), "m.py")
        owner = next(o for _, o, _ in parsed.functions if o is not None)
        assert owner.binds_computed_names == computed, binding
