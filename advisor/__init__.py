"""advisor: find what makes PyTorch model code slow and rewrite the source to fix it.

`advisor.scan`, `advisor.fix`, `advisor.profile` and `advisor.optimize` (advisor.api) are loaded on first use, so
`import advisor` stays cheap (no torch, no libcst)."""

from advisor.workload import Workload

__all__ = ["Workload", "capture", "scan", "fix", "profile", "optimize"]
__version__ = "0.1.0"
API = ("scan", "fix", "profile", "optimize")


def __getattr__(name: str):
    """`advisor.capture` and the API import torch or libcst on first use: `import advisor` (the CLI's parser) stays
    light."""
    if name == "capture":
        from advisor.model_calls import capture

        return capture
    if name in API:
        from advisor import api

        return getattr(api, name)
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")
