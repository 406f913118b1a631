"""The package layout holds (docs/architecture.md): no import circles, and imports run one way only.

Every ``import`` and ``from ... import`` in ``precompile/`` and ``cache_backends/`` is read with ``ast`` — those
inside functions too, since a lazy import that climbs back is still a circle when it runs — except those under
``if TYPE_CHECKING:``, which never run.  Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``
first, so each import is also an arrow to those packages (but not to the packages around the importing module
itself, which have run already): such arrows count for circles (a package's ``__init__`` that imported upward
would close one), while the layer order applies to the modules an import names.  ``importlib.import_module`` of a
literal name of ours counts as an import too.  The test fails on any circle among modules, and on any import of a
module in a higher layer (:data:`LAYERS`, lowest first).  The one exception is a package's module-level
``__getattr__`` handing out a public name on first use (:data:`LAZY_API`): it runs after every import is done.

``tools/`` is read the same way: no circle among its modules (a lazy import that breaks one is still one), nothing
of the two packages imports it, and it keeps its wings (:data:`TOOL_WINGS`) and at most six entries besides them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("precompile", "cache_backends")
#: The folders of ``tools/`` (tools/__init__.py says what each holds).
TOOL_WINGS = frozenset({"bench", "profile", "cases", "gpu", "install"})

#: Lowest first.  A module may import its own layer and those below it, never one above.  A module belongs to
#: the layer of the longest entry that names it: an entry names its package's modules, or (:data:`EXACT`) one module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("precompile.errors",),
    ("precompile.config", "precompile._version"),
    ("cache_backends",),  # the backends and their opener: of precompile, only the two layers below
    ("precompile.metrics",),
    ("precompile.manifest",),
    ("precompile.inductor",),
    ("precompile.key",),
    ("precompile.loader",),
    ("precompile.store",),
    ("precompile.builder",),
    ("precompile.function",),
    ("precompile.recipes",),
    ("precompile.ops",),
    ("precompile.integrations",),
    ("precompile.cli",),
    ("precompile", "precompile.__main__"),  # the public API
)
#: Entries of :data:`LAYERS` that name one module, not a package's: a new package must be given its own layer.
EXACT = frozenset({"precompile", "precompile.__main__"})
#: The modules of precompile that ``cache_backends`` may import (it knows URLs and backends only: no trust, no store).
BACKENDS_MAY_IMPORT = frozenset({"precompile.errors", "precompile.config"})
#: ``(package, module)``: a package's module-level ``__getattr__`` imports ``module`` to hand out a public name.
LAZY_API = frozenset({("cache_backends", "cache_backends.registry")})
#: The wings of ``precompile.inductor`` (its README), split by when their code runs, and the wings each may import;
#: ``""`` is its root (the shim and what every side uses).  Nothing on the load side imports the build side, so a
#: fast load imports none of it (tests/loader/test_fast_load.py checks that in a fresh process).
INDUCTOR = "precompile.inductor"
WINGS: dict[str, frozenset[str]] = {
    "": frozenset({""}),
    "load": frozenset({"", "load"}),
    "build": frozenset({"", "build", "load"}),
    "dynamo": frozenset({"", "dynamo"}),
}


def modules(repo: Path = REPO, roots: tuple[str, ...] = ROOTS) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of the packages ``roots`` (default: the two) under ``repo``."""
    found = {}
    for root in roots:
        for path in sorted((repo / root).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _dynamic_import(node: ast.AST) -> str | None:
    """The literal module name of ``importlib.import_module("...")`` / ``import_module("...")``, else None."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
                (isinstance(func, ast.Name) and func.id == "import_module"):
            return node.args[0].value
    return None


def _runtime_imports(tree: ast.Module, lazy_api: list[str] | None = None) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that can run: all but those under ``if TYPE_CHECKING:``, plus literal
    ``import_module`` calls (as ``import NAME``).  Those inside a module-level ``__getattr__`` are appended to
    ``lazy_api`` instead, when it is given."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_getattr = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((n, in_getattr) for n in node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        dynamic = _dynamic_import(node)
        if dynamic is not None:
            if in_getattr and lazy_api is not None:
                lazy_api.append(dynamic)
            else:
                yield ast.Import(names=[ast.alias(name=dynamic)])
        getattr_def = isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and node in tree.body
        stack.extend((n, in_getattr or getattr_def) for n in ast.iter_child_nodes(node))


def _targets(name: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path],
             parents: bool = True) -> set[str]:
    """The modules of ours an import statement in module ``name`` names, with their parent packages if
    ``parents`` (which it runs first)."""
    wanted = []
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if known[name].name == "__init__.py" else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    own = name.split(".")
    ancestors = {".".join(own[:i]) for i in range(1, len(own))}  # the packages around ``name``: run already
    out = set()
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if not target:
            continue  # not ours
        out.add(target)
        if parents:  # a.b.c runs a and a.b first
            parts = target.split(".")
            out |= {p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in known} - ancestors
    return out - {name}


def import_graph(parents: bool = True, repo: Path = REPO, roots: tuple[str, ...] = ROOTS) -> dict[str, set[str]]:
    """``{module: modules of ours its import statements run}`` over the packages ``roots`` (default: the two);
    with ``parents=False``, only the modules they name (not the packages around them).  A package's lazy API
    lookups are left out (:func:`lazy_api_lookups`)."""
    known = modules(repo, roots)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = set()
        lazy: list[str] | None = [] if path.name == "__init__.py" else None
        for node in _runtime_imports(tree, lazy):
            graph[name] |= _targets(name, node, known, parents)
    return graph


def lazy_api_lookups(repo: Path = REPO) -> set[tuple[str, str]]:
    """``(package, module)`` for each literal ``import_module`` in a package's module-level ``__getattr__``."""
    found = set()
    for name, path in modules(repo).items():
        if path.name == "__init__.py":
            lazy: list[str] = []
            for _ in _runtime_imports(ast.parse(path.read_text()), lazy):
                pass
            found |= {(name, m) for m in lazy}
    return found


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of the longest entry naming ``module``.

    Raises:
        AssertionError: no entry names it (a new package: give it its layer).
    """
    best, depth = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            named = module == prefix or (prefix not in EXACT and module.startswith(prefix + "."))
            if named and prefix.count(".") > depth:
                best, depth = i, prefix.count(".")
    if best < 0:
        raise AssertionError(f"module {module} is in no layer of tests/test_layout.py: add its package to LAYERS")
    return best


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def climbs(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a higher layer, in words."""
    return [f"{a} (layer {LAYERS[layer(a)][0]}) imports {b} (layer {LAYERS[layer(b)][0]})"
            for a, targets in sorted(graph.items()) for b in sorted(targets) if layer(b) > layer(a)]


def wing(module: str) -> str | None:
    """The wing of :data:`INDUCTOR` that ``module`` is in (``""``: its root), or None for a module outside it."""
    if module != INDUCTOR and not module.startswith(INDUCTOR + "."):
        return None
    inner = module[len(INDUCTOR) + 1:].split(".") if module != INDUCTOR else []
    return inner[0] if len(inner) > 1 or (inner and inner[0] in WINGS) else ""


def wing_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Each import, in words, of one wing of :data:`INDUCTOR` by another that :data:`WINGS` does not allow, and each
    of its modules in a wing :data:`WINGS` does not name."""
    found = []
    for a, targets in sorted(graph.items()):
        here = wing(a)
        if here is None:
            continue
        if here not in WINGS:
            found.append(f"{a} is in {INDUCTOR}.{here}, which tests/test_layout.py's WINGS does not name")
            continue
        found += [f"{a} ({here or 'root'}) imports {b} ({there or 'root'})" for b in sorted(targets)
                  if (there := wing(b)) is not None and there not in WINGS[here]]
    return found


def plant(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: text}`` under ``root`` (a planted tree for the checks' own tests); returns ``root``."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_run_downward_only() -> None:
    found = climbs(import_graph(parents=False))
    assert not found, "imports against the layer order of docs/architecture.md:\n" + "\n".join(found)


def test_cache_backends_import_nothing_of_precompile_but_its_errors_and_config() -> None:
    """The backends and their opener know URLs and backends only: a cache URL's trust options, the default cache and
    the signature check a tiered cache calls are precompile's (precompile/store/opening.py), never imported here."""
    graph = import_graph(parents=False)
    found = sorted(f"{a} imports {b}" for a, targets in graph.items() if a.split(".")[0] == "cache_backends"
                   for b in targets if b.split(".")[0] == "precompile" and b not in BACKENDS_MAY_IMPORT)
    assert not found, "cache_backends imports precompile beyond its errors and config:\n" + "\n".join(found)


def test_every_package_says_what_it_owns_and_may_import() -> None:
    missing = [name for name, path in modules().items() if path.name == "__init__.py" and name != "precompile"
               and "May import:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert not missing, f"packages whose docstring has no 'May import:' line: {missing}"


def test_lazy_api_lookups_are_the_known_ones() -> None:
    """The one exception to the order is deliberate: a new lazy lookup of a higher layer is a decision."""
    assert lazy_api_lookups() == LAZY_API


def test_files_stay_small() -> None:
    big = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) >= 400}
    assert not big, f"modules of 400 lines or more: {big}"


def test_every_folder_of_modules_is_a_package() -> None:
    """No namespace packages: a folder without ``__init__.py`` (one ignored by git, say) has no docstring and
    escapes the checks above."""
    folders = [d for root in ROOTS for d in [REPO / root, *(REPO / root).rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))]
    bare = sorted(str(d.relative_to(REPO)) for d in folders if not (d / "__init__.py").exists())
    assert not bare, f"folders of modules without __init__.py: {bare}"


def test_tests_mirror_the_packages_and_every_folder_is_collected(pytestconfig: pytest.Config) -> None:
    folders = [d.name for d in (REPO / "tests").iterdir() if d.is_dir() and d.name not in ("data", "__pycache__")]
    packages = {p.parent.name for root in ROOTS for p in (REPO / root).glob("*/__init__.py")} | {"cache_backends"}
    assert set(folders) <= packages, f"test folders that name no package: {sorted(set(folders) - packages)}"
    ignored = [f for f in folders if any(fnmatch(f, pattern) for pattern in pytestconfig.getini("norecursedirs"))]
    assert not ignored, f"test folders pytest does not collect (norecursedirs in pyproject.toml): {ignored}"


def test_the_root_keeps_the_api_and_at_most_eight_modules() -> None:
    root = sorted(p.name for p in (REPO / "precompile").glob("*.py"))
    assert len(root) <= 8, root
    assert {"__init__.py", "config.py", "errors.py"} <= set(root)


def test_inductor_keeps_at_most_eight_modules_at_its_top_and_its_wings_in_folders() -> None:
    top = REPO / "precompile" / "inductor"
    modules_at_top = sorted(p.name for p in top.glob("*.py"))
    assert len(modules_at_top) <= 8, modules_at_top
    assert {"__init__.py", "shim.py"} <= set(modules_at_top)
    folders = {d.name for d in top.iterdir() if (d / "__init__.py").exists()}
    assert folders == set(WINGS) - {""}, f"packages of {INDUCTOR} against the WINGS of tests/test_layout.py"


def test_inductor_wings_import_one_way() -> None:
    """The load side imports only itself and the root, never the build side: a fast load stays free of it."""
    found = wing_crossings(import_graph(parents=False))
    assert not found, f"imports across the wings of {INDUCTOR} (its README):\n" + "\n".join(found)


def test_the_wing_check_sees_a_load_module_import_the_build_side(tmp_path: Path) -> None:
    """Not vacuous: in a planted tree, a lazy import of the build side from the load side and a root module
    importing a wing are found, the build side importing the load side is not, and a module in a folder no wing
    names is in none."""
    plant(tmp_path, {
        "precompile/__init__.py": "",
        "precompile/inductor/__init__.py": "",
        "precompile/inductor/shim.py": "from precompile.inductor.load import runtime\n",
        "precompile/inductor/load/__init__.py": "",
        "precompile/inductor/load/runtime.py": "def f():\n    from precompile.inductor.build.runs import same\n",
        "precompile/inductor/build/__init__.py": "",
        "precompile/inductor/build/runs.py": "from precompile.inductor.load import runtime\n",
        "precompile/inductor/extra/__init__.py": "",
        "precompile/inductor/extra/thing.py": "",
    })
    assert wing_crossings(import_graph(parents=False, repo=tmp_path)) == [
        "precompile.inductor.extra.thing is in precompile.inductor.extra, which tests/test_layout.py's WINGS does "
        "not name",
        "precompile.inductor.load.runtime (load) imports precompile.inductor.build.runs (build)",
        "precompile.inductor.shim (root) imports precompile.inductor.load.runtime (load)"]


def test_the_checks_see_a_climb_and_a_circle(tmp_path: Path) -> None:
    """The checks are not vacuous: in a planted tree, a lazy import from the errors up to the command line and an
    ``import_module`` under ``if not TYPE_CHECKING`` are climbs, a package whose ``__init__`` imports a module that
    imports the package back is a circle, a lazy API lookup is seen, and a new package has no layer."""
    plant(tmp_path, {
        "precompile/__init__.py": "",
        "precompile/errors.py": "def f():\n    from precompile.cli import main\n",
        "precompile/cli/__init__.py": "from precompile.cli import browse\nmain = 1\n",
        "precompile/cli/browse.py": "from precompile.cli import main\n",
        "precompile/key/__init__.py": "",
        "precompile/key/plan.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import precompile.cli\n",
        "precompile/key/sdpa.py": "import importlib\nfrom typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n"
                                  "    importlib.import_module('precompile.store')\n",
        "precompile/store/__init__.py": "",
        "cache_backends/__init__.py": "import importlib\ndef __getattr__(name):\n"
                                      "    return importlib.import_module('precompile.cli')\n",
    })
    assert climbs(import_graph(parents=False, repo=tmp_path)) == [
        "precompile.errors (layer precompile.errors) imports precompile.cli (layer precompile.cli)",
        "precompile.key.sdpa (layer precompile.key) imports precompile.store (layer precompile.store)"]
    assert circles(import_graph(repo=tmp_path)) == [["precompile.cli", "precompile.cli.browse"]]
    assert lazy_api_lookups(tmp_path) == {("cache_backends", "precompile.cli")}
    with pytest.raises(AssertionError, match="in no layer"):
        layer("precompile.newpkg.thing")


def test_the_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
