"""Hugging Face and deprecated-API attention configuration rules (static, on the user's own code)."""
