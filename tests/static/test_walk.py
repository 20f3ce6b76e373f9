"""static.walk calls a visitor's methods exactly as libcst's own visit does (same nodes, same order, children
skipped where visit_X returns False), over every fixture and every node type they hold."""

import libcst as cst
from libcst.metadata import PositionProvider
import pytest

from advisor.static.module_index import ParsedModule
from advisor.static.walk import unseen_layout, walk
from fixture_models import fixture_paths

FIXTURES = fixture_paths("positive")
ODD_FORMS = '''from os import *
from . import (a as b, c)
@decorate(lambda x: x if x else -x)
async def f(*args, key: int = 1, **kwargs) -> "T":
    global g
    async with a as (b, c):
        yield [y async for y in z if (w := y)]
    match key:
        case {"k": [1, *rest]} | Point(x=0) if rest:
            pass
    try:
        del x[1:2, ::3]
    except* (ValueError, TypeError) as e:
        raise e from None
    finally:
        print(f"{x!r:>{width}}", *args, sep="")
class C[T](Base, metaclass=M):
    x: int = 0; y = x @ y
'''


class _Recorder:
    """Records every visit and leave; skips the children of every second function (visit returns False)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.functions = 0

    def record_visit(self, node) -> bool:
        self.events.append(("visit", id(node)))
        if isinstance(node, cst.FunctionDef):
            self.functions += 1
            return self.functions % 2 == 1
        return True

    def record_leave(self, node) -> None:
        self.events.append(("leave", id(node)))


class _Hooked(_Recorder, cst.CSTVisitor):
    """For libcst's own visit: every node through on_visit/on_leave."""

    def on_visit(self, node):
        return self.record_visit(node)

    def on_leave(self, original_node):
        self.record_leave(original_node)


class _Generic(_Recorder, cst.CSTVisitor):
    """The same recording through visit_/leave_ methods of every node type, as walk dispatches them."""


for _kind in {t for t in vars(cst).values() if isinstance(t, type) and issubclass(t, cst.CSTNode)}:
    setattr(_Generic, f"visit_{_kind.__name__}", _Recorder.record_visit)
    setattr(_Generic, f"leave_{_kind.__name__}", _Recorder.record_leave)


def test_fixtures_exist():
    assert len(FIXTURES) > 20


@pytest.mark.parametrize("source", [ODD_FORMS, *(path.read_text() for path in FIXTURES)])
def test_walk_visits_as_libcst_does(source):
    module = cst.parse_module(source)
    expected, walked = _Hooked(), _Generic()
    module.visit(expected)
    walk(module, walked)
    assert walked.events == expected.events and expected.functions > 0


class _CodeOnly(cst.CSTVisitor):
    """Methods for a few code node types and one token type only: the walk skips the rest of the layout."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.functions = 0

    def visit_FunctionDef(self, node) -> bool:
        self.events.append(("visit", id(node)))
        self.functions += 1
        return self.functions % 2 == 1

    def visit_Name(self, node) -> None:
        self.events.append(("visit", id(node)))

    def leave_Call(self, original_node) -> None:
        self.events.append(("leave", id(original_node)))

    def visit_Comma(self, node) -> None:
        self.events.append(("visit", id(node)))


@pytest.mark.parametrize("source", [ODD_FORMS, *(path.read_text() for path in FIXTURES)])
def test_a_walk_that_skips_layout_calls_what_libcst_calls(source):
    module = cst.parse_module(source)
    expected, walked = _CodeOnly(), _CodeOnly()
    module.visit(expected)
    walk(module, walked)
    assert walked.events == expected.events and expected.functions > 0
    assert cst.Comma not in unseen_layout(_CodeOnly) and cst.SimpleWhitespace in unseen_layout(_CodeOnly)
    assert unseen_layout(_Generic) == frozenset()


def test_a_visitor_that_overrides_on_visit_is_refused():
    with pytest.raises(TypeError):
        walk(cst.parse_module("x = 1\n"), _Hooked())


ODD_LAYOUTS = [ODD_FORMS, "x = 1", "# only a comment\n", "a = 1; b = 2\n\n\n@d\n# c\n@e\nclass K: pass\n",
               "@(\n  d)\ndef f(): pass\n"]


@pytest.mark.parametrize("source", [*ODD_LAYOUTS, *(path.read_text() for path in FIXTURES[:8])])
def test_positions_by_statement_are_libcst_positions(source):
    """Asked node by node, deepest first (each top-level statement computed on its own), the positions are the
    ones libcst's PositionProvider resolves for the whole module. Odd layouts may fall back to the whole module
    (no trailing newline, a decorator whose line `ast` reads elsewhere, syntax newer than `ast`) and are still
    right; real files never need to."""
    parsed = ParsedModule(source, "m.py")
    expected = parsed.wrapper.resolve(PositionProvider)
    nodes = [node for node in list(parsed.parents)[::-1] if node in expected]  # a few whitespace nodes have none
    assert [parsed.positions[node] for node in nodes] == [expected[node] for node in nodes]
    assert source in ODD_LAYOUTS or not parsed.positions.whole
