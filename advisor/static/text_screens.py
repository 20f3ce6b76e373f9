"""Regular-expression parts for the text screens of the tree-wide pass, written to read each character of a line
once: `start[^\\n]*end` rescans the rest of the line from every `start`, so a long line holding `start` many times
(a generated table of `getattr(o, "a1", 0)` calls, 300 KB: 163 s) took time in the square of its length (breaker
round 53). Each part finds a match on exactly the lines the plain form does."""

from __future__ import annotations


def then_on_line(start: str, end: str, excluded: str = r"\n") -> str:
    """`start`, then `end` later on its line, with no character of `excluded` between (a class body, as in
    `[^...]`): `start[^excluded]*end`, read from the last `start` before each `end` instead of from each `start`.
    `end` must not begin inside a match of `start`."""
    return rf"(?:{start})(?:(?!{start})[^{excluded}])*(?:{end})"


def on_line_after(start: str, *ends: str) -> str:
    """`start`, then every one of `ends` later on its line, in any order: tried from the line's first `start` only
    (the one with the most of the line after it)."""
    wanted = "".join(rf"(?=[^\n]*(?:{end}))" for end in ends)
    return rf"(?m:^)(?:(?!{start})[^\n])*(?:{start}){wanted}"
