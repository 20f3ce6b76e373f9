"""python_ast.nodes yields what ast.walk yields but the expression contexts, on every fixture and odd forms."""

import ast

import pytest

from advisor.static.python_ast import nodes
from fixture_models import fixture_paths

ODD = """from . import (a as b, c)
@decorate(lambda x: x if x else -x)
async def f(*args, key: int = 1, **kwargs) -> "T":
    global g
    async with a as (b, c):
        yield [y async for y in z if (w := y)]
    match key:
        case {"k": [1, *rest]} | Point(x=0) as p if rest:
            del x[1:2, ::3]
    try:
        pass
    except* (ValueError, TypeError) as e:
        raise e from None
    finally:
        print(f"{x!r:>{width}}", *args, sep="")
class C(Base, metaclass=M):
    x: int = 0; y = x @ y
"""


@pytest.mark.parametrize("source", [ODD, *(path.read_text() for path in fixture_paths("positive"))])
def test_nodes_are_ast_walks_less_the_contexts(source):
    tree = ast.parse(source)
    expected = [node for node in ast.walk(tree) if not isinstance(node, ast.expr_context)]
    found = nodes(tree)
    assert len(found) == len(expected) and {id(node) for node in found} == {id(node) for node in expected}
