"""Fixes that join runtime evidence to source: copies and casts."""
