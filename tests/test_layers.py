"""Layers import one way (docs/architecture.md, "Layers"; ../shared/DESIGN.md, "Layers").

Every module of the package under test is parsed with ``ast``; every import of an arrowlake
module (at module level, under ``if TYPE_CHECKING:`` or inside a function) must name a module
of its own layer or one below. Imports inside functions that only hide a circle are not allowed
at all, and the modules that import each other at run time must form no cycle. The checker
itself is tested on made-up sources below, so a violation cannot slip through unnoticed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import arrowlake

#: Lowest first. A module may import modules of its own layer and of the layers before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("pure", ("arrowlake.errors", "arrowlake.schema", "arrowlake.expressions",
              "arrowlake.pandas_arrow", "arrowlake.lazy", "arrowlake.units",
              # The native core (Rust, arrowlake._native) and its typed wrapper.
              "arrowlake.native", "arrowlake._native")),
    ("metastore", ("arrowlake.metastore",)),
    ("io", ("arrowlake.io",)),
    ("merge", ("arrowlake.merge",)),
    ("scan", ("arrowlake.scan",)),
    # table/ is layered within: options and the state the code below the facade takes; the key
    # path; changelogs; writes (plan and commit); table maintenance; the facade on top
    # (table.py, staged writes, schema evolution, transactions).
    ("table state", ("arrowlake.table.options", "arrowlake.table.state")),
    ("table keys", ("arrowlake.table.keys",)),
    ("table changelogs", ("arrowlake.table.changelogs",)),
    ("table writes", ("arrowlake.table.writes",)),
    ("table maintenance", ("arrowlake.table.maintenance",)),
    ("table", ("arrowlake.table",)),
    ("streaming", ("arrowlake.streaming",)),
    # The published Iceberg view: metadata written from the metastore (table.py and
    # table/health.py reach it through hooks it registers on import).
    ("iceberg", ("arrowlake.iceberg",)),
    # The maintenance service: follows commits, compacts, expires and removes orphans.
    ("maintenance", ("arrowlake.maintenance",)),
    ("integrations", ("arrowlake.integrations",)),
    # Scan.to_dask()/to_torch() reach them through scan/adapters.py; lake.py imports them so
    # that every scan of a lake's tables has them.
    ("scan adapters", ("arrowlake.dask", "arrowlake.torch")),
    # lake.py creates tables, and Lake.from_pandas calls integrations/pandas.py.
    ("entry", ("arrowlake.lake",)),
    # Engine adapters.
    ("adapters", ("arrowlake.cli", "arrowlake.spark", "arrowlake.flight",
                  "arrowlake.iceberg_rest")),
    # arrowlake/__init__.py: the public names, re-exported from every layer.
    ("package", ("arrowlake",)),
]

PACKAGE_DIR = Path(arrowlake.__file__).parent


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (a new package must be placed)."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # The root package is its own layer; its submodules belong to the others.
            nested = prefix != "arrowlake" and module.startswith(prefix + ".")
            if (module == prefix or nested) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in this test "
                             "and to the Layers table of docs/architecture.md")
    return best


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported arrowlake module
    line: int
    where: str  # "module", "type-checking", "lazy" (arrowlake.lazy.lazy_module) or "function"
    names: tuple[str, ...] = ()  # the names taken from it (``from m import a, b``)


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (``arrowlake.scan.read``)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, source: str, known: set[str], is_package: bool = False
               ) -> list[Import]:
    """The imports of arrowlake modules in ``source``, the text of ``module``. ``from a import
    b`` names module ``a.b`` when that is a module in ``known``, else ``a``."""
    found: list[Import] = []
    package = module if is_package else module.rpartition(".")[0]

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, node.module] if node.module else base)

    def add(target: str, line: int, where: str, names: tuple[str, ...] = ()) -> None:
        if target == "arrowlake" or target.startswith("arrowlake."):
            found.append(Import(module, target, line, where, names))

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, where)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    add(sub, node.lineno, where)
                else:
                    add(base, node.lineno, where, (alias.name,))
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "id", None) == "lazy_module"
                   or getattr(node.func, "attr", None) == "lazy_module")):
            # A module imported on first use (arrowlake.lazy): placed like any import, but not
            # run when the module loads, so no part of a cycle.
            add(node.args[0].value, node.lineno, "lazy" if where == "module" else where)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where = "function"
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body \
                    and where == "module":
                visit(child, "type-checking")
            else:
                visit(child, where)

    visit(ast.parse(source), "module")
    return found


def all_imports(package_dir: Path = PACKAGE_DIR) -> list[Import]:
    modules = module_names(package_dir)
    known = set(modules)
    out: list[Import] = []
    for name, path in modules.items():
        out += imports_of(name, path.read_text(encoding="utf-8"), known,
                          is_package=path.name == "__init__.py")
    return out


def upward(imports: list[Import]) -> list[str]:
    """The imports that name a module of a higher layer, described."""
    bad = []
    for imp in imports:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if dst > src:
            bad.append(f"{imp.source}:{imp.line} ({LAYERS[src][0]}) imports {imp.target} "
                       f"({LAYERS[dst][0]}) [{imp.where}]")
    return bad


def function_level(imports: list[Import]) -> list[str]:
    return [f"{imp.source}:{imp.line} imports {imp.target} inside a function"
            for imp in imports if imp.where == "function"]


def private_names(imports: list[Import]) -> list[str]:
    """Names starting with an underscore taken from another module: a module's private parts
    are its own (the compiled ``arrowlake._native`` is a module, not a private name)."""
    return [f"{imp.source}:{imp.line} takes {name} from {imp.target}"
            for imp in imports for name in imp.names
            if name.startswith("_") and not name.startswith("__") and name != "_native"]


def cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles among the imports of modules, those for type checking included (a cycle that
    only type checking closes is still a circle of knowledge between the modules); imports
    made on first use (``lazy_module``) are not part of one."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.where in ("module", "type-checking") and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


# -- the package --------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    for name in module_names(PACKAGE_DIR):
        layer_of(name)


def test_no_module_imports_a_higher_layer():
    assert upward(all_imports()) == []


def test_no_function_level_imports_of_arrowlake_modules():
    # Optional third-party packages (pandas, obstore, boto3, ...) may still be imported where
    # they are used; an arrowlake module never needs to be.
    assert function_level(all_imports()) == []


def test_no_import_cycles():
    assert cycles(all_imports()) == []


def test_no_private_name_is_imported_across_modules():
    assert private_names(all_imports()) == []


def test_the_read_path_runs_top_down():
    """table -> scan -> merge -> io, and the merge lives in its own package."""
    imports = all_imports()
    edges = {(i.source, i.target) for i in imports}
    assert ("arrowlake.scan.read", "arrowlake.merge.read") in edges
    assert ("arrowlake.table.table", "arrowlake.scan.scan") in edges
    assert not [i for i in imports if i.source.startswith("arrowlake.merge")
                and layer_of(i.target) >= layer_of("arrowlake.scan")]
    assert not (PACKAGE_DIR / "table" / "merge_read.py").exists()
    # Only sources count: a checkout may keep a stale __pycache__ of the old package.
    assert not list((PACKAGE_DIR / "table" / "merging").glob("*.py"))


# -- the checker, on made-up sources ------------------------------------------------------------

KNOWN = {"arrowlake", "arrowlake.errors", "arrowlake.io", "arrowlake.io.storage",
         "arrowlake.table", "arrowlake.table.table", "arrowlake.table.writes",
         "arrowlake.table.writes.keyed",
         "arrowlake.scan", "arrowlake.scan.read"}


def test_checker_reports_an_upward_import_at_module_level():
    source = "import os\nfrom arrowlake.table.table import Table\n"
    found = imports_of("arrowlake.io.storage", source, KNOWN)
    assert found == [Import("arrowlake.io.storage", "arrowlake.table.table", 2, "module",
                            ("Table",))]
    assert upward(found) == [
        "arrowlake.io.storage:2 (io) imports arrowlake.table.table (table) [module]"]


def test_checker_reports_upward_imports_for_type_checking_and_in_functions():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from arrowlake.table.table import Table\n"
        "def read():\n"
        "    import arrowlake.scan.read\n"
        "    return arrowlake.scan.read\n"
    )
    found = imports_of("arrowlake.io.storage", source, KNOWN)
    assert [(i.target, i.where) for i in found] == [
        ("arrowlake.table.table", "type-checking"), ("arrowlake.scan.read", "function")]
    assert len(upward(found)) == 2


def test_checker_places_lazy_modules_like_imports_but_outside_cycles():
    source = ("from arrowlake.lazy import lazy_module\n"
              "tables = lazy_module('arrowlake.table.table')\n"
              "storage = lazy_module('arrowlake.io.storage')\n")
    found = imports_of("arrowlake.scan.read", source, KNOWN | {"arrowlake.lazy"})
    assert [(i.target, i.where) for i in found] == [
        ("arrowlake.lazy", "module"), ("arrowlake.table.table", "lazy"),
        ("arrowlake.io.storage", "lazy")]
    assert upward(found) == [
        "arrowlake.scan.read:2 (scan) imports arrowlake.table.table (table) [lazy]"]
    back = Import("arrowlake.io.storage", "arrowlake.scan.read", 1, "module")
    assert cycles([*found, back]) == []


def test_checker_reports_function_level_imports_even_of_lower_layers():
    source = (
        "class Scan:\n"
        "    def plan(self):\n"
        "        from arrowlake.errors import ValidationError\n"
        "        return ValidationError\n"
    )
    found = imports_of("arrowlake.scan.read", source, KNOWN)
    assert upward(found) == []
    assert function_level(found) == [
        "arrowlake.scan.read:3 imports arrowlake.errors inside a function"]


def test_checker_resolves_submodules_and_relative_imports():
    source = ("from arrowlake.table.writes import keyed\n"
              "from arrowlake import errors\n"
              "from . import storage\n"
              "from ..table import table\n")
    found = imports_of("arrowlake.io.object_store", source, KNOWN)
    assert [i.target for i in found] == [
        "arrowlake.table.writes.keyed", "arrowlake.errors", "arrowlake.io.storage",
        "arrowlake.table.table"]
    assert len(upward(found)) == 2  # the two table modules


def test_checker_finds_cycles_also_of_type_checking_imports():
    a = Import("arrowlake.scan.read", "arrowlake.scan.split", 1, "module")
    b = Import("arrowlake.scan.split", "arrowlake.scan.read", 1, "module")
    typed = Import("arrowlake.scan.split", "arrowlake.scan.read", 1, "type-checking")
    lazy = Import("arrowlake.scan.split", "arrowlake.scan.read", 1, "lazy")
    circle = [["arrowlake.scan.read", "arrowlake.scan.split", "arrowlake.scan.read"]]
    assert cycles([a, b]) == circle
    assert cycles([a, typed]) == circle
    assert cycles([a, lazy]) == []


def test_checker_finds_private_names_taken_from_other_modules():
    source = ("from arrowlake.io.storage import Storage, _helper\n"
              "from arrowlake import _native\n"
              "from arrowlake.table.table import __all__\n")
    found = imports_of("arrowlake.scan.read", source, KNOWN)
    assert private_names(found) == [
        "arrowlake.scan.read:1 takes _helper from arrowlake.io.storage"]


def test_checker_places_every_layer():
    assert LAYERS[layer_of("arrowlake")][0] == "package"
    assert LAYERS[layer_of("arrowlake.merge.read")][0] == "merge"
    assert LAYERS[layer_of("arrowlake.lake")][0] == "entry"
    with pytest.raises(AssertionError, match="belongs to no layer"):
        layer_of("arrowlake.unplaced")
