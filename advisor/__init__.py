"""advisor: find what makes PyTorch model code slow and rewrite the source to fix it."""

from advisor.workload import Workload

__all__ = ["Workload", "capture"]


def __getattr__(name: str):
    """`advisor.capture` imports torch on first use: `import advisor` (the CLI's parser) stays light."""
    if name == "capture":
        from advisor.model_calls import capture

        return capture
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")
__version__ = "0.1.0"
