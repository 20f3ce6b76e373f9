"""advisor's command line run in the test's own process: its exit code, stdout and stderr as a user sees them,
without the torch import a fresh process pays (for tests that need no process of their own)."""

from __future__ import annotations

from advisor.cli import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
