"""Attention backends a rewrite can target. The choices live here, not in site.py, so the CLI can offer them
without importing the static analysis (libcst)."""

REQUESTABLE = ("sdpa", "flash", "flash-attn", "flex")
