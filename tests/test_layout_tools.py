"""The layout of ``tools/``: the main job at the door, the rest in wings, no import circle (imports inside functions
count), and nothing of the packages imports it.  The import walk is tests/test_layout.py's."""

from __future__ import annotations

from pathlib import Path

from test_layout import REPO, ROOTS, TOOL_WINGS, circles, import_graph, plant


def test_tools_import_without_circles_and_nothing_imports_them() -> None:
    found = circles(import_graph(roots=("tools",)))
    assert not found, "import circles in tools/: " + "; ".join(" <-> ".join(c) for c in found)
    graph = import_graph(parents=False, roots=(*ROOTS, "tools"))
    into = [f"{a} imports {b}" for a, targets in sorted(graph.items()) if a.split(".")[0] in ROOTS
            for b in sorted(targets) if b.split(".")[0] == "tools"]
    assert not into, "the packages import tools/: " + "; ".join(into)


def test_tools_keep_their_wings_and_at_most_six_entries() -> None:
    """Besides its wings, ``tools/`` holds the main job (the README's first command runs it by this path), its
    package file and a few more: at most six entries, none of them a folder."""
    entries = sorted(p.name for p in (REPO / "tools").iterdir() if p.name not in TOOL_WINGS | {"__pycache__"})
    assert len(entries) <= 6, f"tools/ holds more than six entries besides its wings: {entries}"
    assert {"__init__.py", "main_job.py"} <= set(entries), entries
    folders = [e for e in entries if (REPO / "tools" / e).is_dir()]
    assert not folders, f"folders of tools/ that are no wing of TOOL_WINGS: {folders}"


def test_the_tools_check_sees_a_circle_a_lazy_import_breaks(tmp_path: Path) -> None:
    """Two case modules that import each other, one of them inside a function (which runs after both are
    loaded, and so "breaks" the circle at import time): still a circle."""
    plant(tmp_path, {
        "tools/__init__.py": "",
        "tools/cases/__init__.py": "",
        "tools/cases/libs.py": "from tools.cases.vision import MAKERS\n",
        "tools/cases/vision.py": "def make():\n    from tools.cases.libs import Setup\n",
    })
    assert circles(import_graph(repo=tmp_path, roots=("tools",))) == [["tools.cases.libs", "tools.cases.vision"]]
