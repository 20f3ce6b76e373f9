"""libcst's parse of a module without its per-node validation.

Each libcst node checks itself when it is built (`CSTNode.__post_init__` runs `_validate`): that is for trees built
by hand, where a node may be inconsistent (an `Attribute` without a dot, a string with mismatched quotes). The
parser builds nodes only as its grammar allows, so on a file it parses every check passes, and they cost a fifth of
the parse (libcst's own comment on `__post_init__` says as much). Nodes built after the parse (the rewrites') are
checked as before."""

from __future__ import annotations

from functools import cache

import libcst as cst

_VALIDATE = cst.CSTNode.__post_init__


def _unchecked(self: cst.CSTNode) -> None:
    """What `__post_init__` does while the parser builds the tree: nothing."""


@cache
def _only_base_validates() -> bool:
    """Whether every node class inherits `__post_init__` from CSTNode (so replacing it there skips every check and
    nothing else): a libcst version whose node does more there keeps its checks. Read once per process."""
    pending, seen = [cst.CSTNode], set()
    while pending:
        kind = pending.pop()
        for sub in kind.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
    return not any("__post_init__" in vars(kind) for kind in seen)


def parse_module(source: str) -> cst.Module:
    """`cst.parse_module(source)`, the same tree, built without the nodes' checks. Not for threads that build
    nodes meanwhile (the scan builds none while a file parses)."""
    if cst.CSTNode.__post_init__ is not _VALIDATE or not _only_base_validates():
        return cst.parse_module(source)  # nested, or a node class with its own __post_init__
    cst.CSTNode.__post_init__ = _unchecked
    try:
        return cst.parse_module(source)
    finally:
        cst.CSTNode.__post_init__ = _VALIDATE
