"""Generated parts of the repository's Markdown files: the text between two marker comments is regenerated from
the code, and a test keeps each equal to what the code says."""

from __future__ import annotations


def between(text: str, start: str, end: str, body: str, what: str) -> str:
    """`text` with `body` between its markers (a text without them is an error naming `what` they mark)."""
    first, last = text.find(start), text.find(end)
    if first < 0 or last < first:
        raise ValueError(f"the file has no {what} markers")
    return text[:first + len(start)] + "\n" + body + "\n" + text[last:]


def rewrite_file(path: str, regenerate) -> None:
    """Regenerate a file's marked part in place (read before opening for writing: a file without markers stays as
    it was)."""
    with open(path, encoding="utf-8") as handle:
        text = regenerate(handle.read())
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
