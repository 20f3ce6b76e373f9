"""The layering of ARCHITECTURE.md, computed from the code: each module's layer comes from that file's table, and
no import runs up a layer and module-level imports make no cycle; only the registry loads the rule units; no two
modules share a file name. In tests/, no test module imports another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "advisor"
TESTS = ROOT / "tests"
LOADERS = {"import_module", "lazy_import", "__import__"}
# Imports that still run up, each named in ARCHITECTURE.md; the list only shrinks.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _layer_table() -> list[tuple[str, list[str]]]:
    """(layer, its package entries) bottom up, read from ARCHITECTURE.md's table."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers, bottom up", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [(layer.strip(), re.findall(r"`([^`]+)`", packages)) for layer, packages in rows]


TABLE = _layer_table()


def _layer_of(relative: str) -> int:
    """The layer index of a file under advisor/ (or of rules/): the table's most specific entry that holds it."""
    best, length = None, -1
    for index, (_, entries) in enumerate(TABLE):
        for entry in entries:
            holds = relative.startswith(entry) if entry.endswith("/") else relative == entry
            if holds and len(entry) > length:
                best, length = index, len(entry)
    assert best is not None, f"{relative} is in no layer of ARCHITECTURE.md's table"
    return best


def _file_of(module: str) -> str | None:
    """advisor.x.y -> its path relative to advisor/ ("rules/..." for the rule units); None: not a module."""
    parts = module.split(".")[1:]
    if parts[:1] == ["rules"]:
        return "rules/"
    for candidate in (Path(*parts).with_suffix(".py") if parts else None, Path(*parts, "__init__.py")):
        if candidate is not None and (PACKAGE / candidate).is_file():
            return candidate.as_posix()
    return None


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return skipped


def _imports(path: Path) -> list[str]:
    """The advisor modules a file imports when it runs (by statement, or by name through a loader call)."""
    return _module_imports(ast.parse(path.read_text(encoding="utf-8")))


def _module_imports(tree: ast.Module) -> list[str]:
    skipped = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{alias.name}" if _file_of(f"{node.module}.{alias.name}") else node.module
                      for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in LOADERS \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append(node.args[0].value)
    return [name for name in found if name == "advisor" or name.startswith("advisor.")]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_import_runs_up_a_layer():
    upward = []
    for path in _modules():
        relative = path.relative_to(PACKAGE).as_posix()
        mine = _layer_of(relative)
        for name in _imports(path):
            target = _file_of(name)
            if name == "advisor" or target is None:
                continue
            theirs = _layer_of(target)
            if theirs > mine and (relative, name) not in KNOWN_UPWARD:
                upward.append(f"{relative} ({TABLE[mine][0]}) imports {name} ({TABLE[theirs][0]})")
    assert upward == []


def test_no_module_level_import_cycle():
    """Imports a module runs when it loads (module level, not type-checking only) make no cycle between advisor's
    modules; the rule units' lazy imports of the engines sit inside their hooks, after everything has loaded. The
    package itself (`import advisor`, read for its path) is no edge."""
    graph = nx.DiGraph()
    for path in _modules():
        relative = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_level = ast.Module(body=[node for node in tree.body if not isinstance(node, ast.If)
                                        or getattr(node.test, "id", None) != "TYPE_CHECKING"], type_ignores=[])
        for name in _module_imports(module_level):
            target = _file_of(name)
            if name != "advisor" and target is not None and target != relative:
                graph.add_edge(relative, target)
    assert list(nx.simple_cycles(graph)) == []


def test_only_the_registry_loads_the_rule_units():
    loaders = [path.relative_to(PACKAGE).as_posix() for path in _modules()
               if any(name == "advisor.rules" or name.startswith("advisor.rules.") for name in _imports(path))]
    assert loaders == []  # registry.py loads them through RULES_PACKAGE, a name its loader call reads
    registry = (PACKAGE / "registry.py").read_text(encoding="utf-8")
    assert 'RULES_PACKAGE = "advisor.rules"' in registry


def test_the_table_names_every_layer_once_and_the_rules_last():
    names = [layer for layer, _ in TABLE]
    assert len(names) == len(set(names)) and names[0] == "contracts" and names[-1] == "rules"


def test_no_two_modules_share_a_file_name():
    by_name: dict[str, list[str]] = {}
    for path in _modules():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(path.relative_to(PACKAGE).as_posix())
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_one_class_per_name_where_two_roles_once_shared_one():
    """A class name says which role it plays: the matcher's Candidate (a softmax being proved) is the only one."""
    defined = [path.relative_to(PACKAGE).as_posix() for path in _modules()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ClassDef) and node.name == "Candidate"]
    assert defined == ["patterns/attention/candidate.py"]


def _imported_names(tree: ast.Module) -> set[str]:
    """Every dotted part of every name a module imports, by statement or through a loader call."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {part for alias in node.names for part in alias.name.split(".")}
        elif isinstance(node, ast.ImportFrom):
            names |= set((node.module or "").split(".")) | {alias.name for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in LOADERS \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            names |= set(node.args[0].value.split("."))
    return names


def test_no_test_module_imports_another():
    """What tests share lives in helper modules (tests/fixture_models.py and its neighbours), never in a test
    module: importing one runs its collection-time code, and finds it only where pytest already put its folder on
    sys.path."""
    test_modules = {path.stem for path in TESTS.rglob("test_*.py")}
    importing = {path.relative_to(TESTS).as_posix(): sorted(_imported_names(ast.parse(path.read_text(encoding="utf-8")))
                                                            & test_modules)
                 for path in sorted(TESTS.rglob("*.py"))}
    assert {path: names for path, names in importing.items() if names} == {}
