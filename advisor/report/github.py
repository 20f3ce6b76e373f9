"""GitHub Actions workflow commands (`::warning file=...::message`): each finding becomes an annotation on its lines
in the pull request's diff, with no upload step (SARIF needs code scanning). Escaping is GitHub's own (the
actions/toolkit `issueCommand`): `%`, CR and LF in the message; those and `:` and `,` in a property. Other terminal
control characters (a file name's ESC) are then written `\\xNN`, as in every other format, so none reaches the log."""

from __future__ import annotations

from advisor.contracts.finding import Finding, ScanError, display_path, located_message
from advisor.errors import visible


def github_annotations(findings: list[Finding], errors: list[ScanError]) -> list[str]:
    """One line per finding (`warning`, the level SARIF gives them) and per file that could not be scanned
    (`error`)."""
    lines = [_command("warning", located_message(f), file=display_path(f.path),
                      **({} if "cell" in f.extra else {"line": f.line, "endLine": f.end_line}),
                      title=f"advisor {f.rule}")
             for f in findings]
    lines += [_command("error", e.message, file=display_path(e.path), title="advisor: not scanned") for e in errors]
    return lines


def _command(level: str, message: str, **properties) -> str:
    fields = ",".join(f"{name}={_escape_property(str(value))}" for name, value in properties.items())
    return f"::{level} {fields}::{_escape_data(message)}"


def _escape_data(text: str) -> str:
    return visible(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
