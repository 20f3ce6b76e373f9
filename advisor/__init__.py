"""advisor: find what makes PyTorch model code slow and rewrite the source to fix it.

`advisor.scan`, `advisor.fix`, `advisor.profile` and `advisor.optimize` (advisor.api) are loaded on first use, so
`import advisor` stays cheap (no torch, no libcst)."""

from advisor.workload import Workload

__all__ = ["Workload", "scan", "fix", "profile", "optimize"]
__version__ = "0.1.0"
API = ("scan", "fix", "profile", "optimize")


def __getattr__(name: str):
    if name in API:
        from advisor import api

        return getattr(api, name)
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")
