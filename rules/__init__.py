"""The rule files (one TOML file per rule), installed as the package `advisor.rules`; see advisor/registry.py."""
