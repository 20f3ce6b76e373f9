"""Attention backends: which kernel a site can get, how to emit it, and runtime checks."""
