"""The registry reads rule units from a package: ORDER first, then every other unit by name; a code declared
twice or a rule without its docs is refused."""

from __future__ import annotations

import textwrap

import pytest

from advisor.registry import families, load_rules

UNIT = textwrap.dedent('''\
    from advisor.contracts.family import Family
    from advisor.contracts.rule import Rule

    RULE = Rule(code="{code}", kind="k", title="A title", summary="s", fix="none", fix_safety="safe",
                fix_summary="report", what="{what}", why="Why it is slow to run.", fix_doc="No fix is offered here.",
                example="x = 1")
    FAMILY = Family(name="{name}", rules=(RULE,))
''')


def _package(tmp_path, monkeypatch, name: str, units: dict[str, str], order: tuple[str, ...] = ()):
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text(f"ORDER = {order!r}\n")
    for module, text in units.items():
        (root / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_new_family_is_one_file_and_runs_after_the_ordered_ones(tmp_path, monkeypatch):
    package = _package(tmp_path, monkeypatch, "units_order", {
        "alpha": UNIT.format(code="X100", what="Finds alpha things.", name="alpha"),
        "zeta": UNIT.format(code="X200", what="Finds zeta things.", name="zeta"),
        "beta": UNIT.format(code="X300", what="Finds beta things.", name="beta")}, order=("zeta",))
    assert [family.name for family in families(package)] == ["zeta", "alpha", "beta"]
    assert list(load_rules(package)) == ["X100", "X200", "X300"]


def test_a_code_declared_twice_or_a_missing_doc_section_is_refused(tmp_path, monkeypatch):
    twice = _package(tmp_path, monkeypatch, "units_twice", {
        "a": UNIT.format(code="X100", what="Finds a things.", name="a"),
        "b": UNIT.format(code="X100", what="Finds b things.", name="b")})
    with pytest.raises(ValueError, match="X100 is declared twice"):
        load_rules(twice)
    undocumented = _package(tmp_path, monkeypatch, "units_undocumented", {
        "a": UNIT.format(code="X100", what=" ", name="a")})
    with pytest.raises(ValueError, match="X100: missing what"):
        load_rules(undocumented)
