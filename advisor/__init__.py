"""advisor: find what makes PyTorch model code slow and rewrite the source to fix it."""

from advisor.workload import Workload

__all__ = ["Workload"]
__version__ = "0.1.0"
