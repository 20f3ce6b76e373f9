"""Python source bytes <-> text by the interpreter's own rules (PEP 263 coding line, UTF-8 BOM), so a rewrite
writes a file back in the encoding it was read in, BOM included."""

from __future__ import annotations

import io
import tokenize


class SourceDecodeError(ValueError):
    """The bytes are not text in the encoding the file declares (or UTF-8 when it declares none)."""


def decode_source(data: bytes) -> tuple[str, str]:
    """(text, codec). The codec is `utf-8-sig` when the file starts with a BOM: the text has no BOM, and
    encoding with that codec puts it back."""
    try:
        codec, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        declared = None
    except SyntaxError as exc:  # an unknown codec, a BOM contradicting the coding line, or non-UTF-8 first lines
        codec, declared = "utf-8", str(exc)
    try:
        text = data.decode(codec)
    except UnicodeDecodeError as exc:
        name = "UTF-8" if codec.startswith("utf-8") else codec
        raise SourceDecodeError(f"not valid {name} (byte {exc.start})") from None
    except (LookupError, UnicodeError, ValueError, TypeError) as exc:  # rot13, hex, zlib, undefined, punycode
        raise SourceDecodeError(f"its coding line names {codec!r}, which does not decode source text ({exc})") \
            from None
    if declared is not None:
        raise SourceDecodeError(declared)
    return text, codec


def encode_source(text: str, codec: str) -> bytes:
    """Raises SourceDecodeError when the text has a character the file's declared encoding cannot hold."""
    try:
        return text.encode(codec)
    except UnicodeEncodeError as exc:
        raise SourceDecodeError(f"the rewrite has a character {codec} cannot encode ({exc.object[exc.start]!r})") \
            from None
