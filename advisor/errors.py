"""Errors a user can act on: the CLI prints them as one line and exits 2 (traceback only with --debug)."""


class AdvisorError(Exception):
    """Bad input or a failed target: message is shown to the user as is."""
