"""The workload `advisor optimize` runs when given no TARGET (copied to a temporary folder first)."""
