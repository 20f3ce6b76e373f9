"""Errors a user can act on: the CLI prints them as one line and exits 2 (traceback only with --debug)."""

from __future__ import annotations

import re
import shlex

from advisor.contracts.finding import as_text

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but tab, DEL, C1: ESC starts sequences, \n breaks lines


class AdvisorError(Exception):
    """Bad input or a failed target: message is shown to the user as is."""


def visible(text: object) -> str:
    """User-controlled text for a terminal: control characters written as `\\xNN`, so a file name cannot drive it,
    and a file name's bytes that are not UTF-8 too, as JSON writes them (`contracts.finding.as_text`)."""
    return CONTROL.sub(lambda hit: f"\\x{ord(hit.group()):02x}", as_text(str(text)))


_GIT_ESCAPES = {ord("\a"): "\\a", ord("\b"): "\\b", ord("\t"): "\\t", ord("\n"): "\\n", ord("\v"): "\\v",
                ord("\f"): "\\f", ord("\r"): "\\r", ord('"'): '\\"', ord("\\"): "\\\\"}


def diff_name(side: str, path: str) -> str:
    """A diff header's file name (`a/PATH`): quoted as git quotes one when it holds a control character (or a tab,
    which ends the name in a header) or bytes that are not UTF-8 (a latin-1 `café.py`, read as surrogate escapes),
    so the header neither drives a terminal nor stops `git apply` reading it."""
    name = f"{side}/{path}"
    if not CONTROL.search(name) and "\t" not in name and is_utf8(name):
        return name + "\t" if " " in name else name  # as git writes it: `patch` ends a name at a space otherwise
    quoted = "".join(_GIT_ESCAPES.get(byte, chr(byte)) if byte < 0x80 and (byte >= 0x20 and byte != 0x7f
                                                                              or byte in _GIT_ESCAPES)
                     else f"\\{byte:03o}" for byte in name.encode("utf-8", "surrogateescape"))
    return f'"{quoted}"'


def is_utf8(name: str) -> bool:
    """Whether `name` holds no lone surrogate (the bytes of a file name that are not UTF-8, as Python reads them)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shell_join(words: list[str]) -> str:
    """`shlex.join`, but a word holding a file name's bytes that are not UTF-8 (lone surrogates) is written in
    bash's `$'...'` quoting with those bytes as `\\xNN`: the command still names the file, and the text is UTF-8
    (promise round 33: optimize's `apply_command` could not be written to its report)."""
    return " ".join(shlex.quote(word) if is_utf8(word) else _ansi_c_quoted(word) for word in words)


def _ansi_c_quoted(word: str) -> str:
    raw = word.encode("utf-8", "surrogateescape")
    return "$'" + "".join(chr(byte) if 0x20 <= byte < 0x7f and chr(byte) not in "\\'" else f"\\x{byte:02x}"
                          for byte in raw) + "'"
