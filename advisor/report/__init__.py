"""Renderers: rich terminal output, JSON, SARIF."""
