"""static.cst_parse builds the tree libcst's parse builds, and leaves the nodes' checks on for every node built
after it."""

import libcst as cst
import pytest

from advisor.static.cst_parse import parse_module
from fixture_models import fixture_paths

ODD = """from . import (a as b, c)
@decorate(lambda x: x if x else -x)
async def f(*args, key: int = 1, **kwargs) -> "T":
    async with a as (b, c):
        yield [y async for y in z if (w := y)]
    match key:
        case {"k": [1, *rest]} | Point(x=0) if rest:
            print(f"{x!r:>{width}}", *args, sep="")
class C[T](Base, metaclass=M):
    x: int = 0; y = x @ y  # a comment
"""
SOURCES = [ODD, "x = 1\r\ny = 2", "x = 1", "", "# only a comment\n", *(path.read_text() for path in fixture_paths("positive"))]


@pytest.mark.parametrize("source", SOURCES)
def test_the_tree_is_libcsts(source):
    tree = parse_module(source)
    assert tree.deep_equals(cst.parse_module(source)) and tree.code == source


def test_nodes_built_after_a_parse_are_checked():
    parse_module("x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Attribute(value=cst.Name("a"), attr=cst.Name("b"), lpar=[cst.LeftParen()])  # unbalanced parentheses


def test_a_parse_error_leaves_the_checks_on():
    with pytest.raises(cst.ParserSyntaxError):
        parse_module("def (:\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Attribute(value=cst.Name("a"), attr=cst.Name("b"), lpar=[cst.LeftParen()])
