"""precompile.inductor reaches torch's private APIs through its shim only (its README, "Private APIs").

Every ``import`` and every ``torch.`` attribute chain of its modules is read with ``ast`` (the module walk of
tests/test_layout.py): a private name (``torch._inductor``, ``torch._C._...``, ``torch.utils._...``,
``torch.fx.experimental``) outside :data:`PRIVATE_TORCH` fails the test, so that a torch upgrade is fixed in one file
and the Dynamo wing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layout import REPO, modules, wing

#: The modules of ``precompile.inductor`` that reach torch's private APIs themselves: the shim, and the Dynamo wing,
#: which subclasses and patches Dynamo's own classes (its README lists what it uses).  Every other module goes
#: through the shim, so that a torch upgrade is fixed there.
PRIVATE_TORCH = ("precompile.inductor.shim", "precompile.inductor.dynamo")


def _private_torch(name: str) -> bool:
    """Whether dotted ``name`` is in torch's private API: a ``_``-prefixed part after ``torch`` (not a dunder such as
    ``torch.__version__``), or ``torch.fx.experimental``."""
    parts = name.split(".")
    return parts[0] == "torch" and (name.startswith("torch.fx.experimental") or any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:]))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of an attribute chain rooted at a plain name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def private_torch_uses(repo: Path = REPO) -> list[str]:
    """Each import of a private torch module and each private ``torch.`` attribute chain, in words, in the modules
    of ``precompile.inductor`` outside :data:`PRIVATE_TORCH`."""
    found = []
    for name, path in modules(repo).items():
        if wing(name) is None or any(name == p or name.startswith(p + ".") for p in PRIVATE_TORCH):
            continue
        seen: dict[int, str] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
                [d] if isinstance(node, ast.Attribute) and (d := _dotted(node)) else []
            for used in names:
                if _private_torch(used) and len(used) > len(seen.get(node.lineno, "")):
                    seen[node.lineno] = used  # the longest chain of a line: torch._C._x, not torch._C too
        found += [f"{name}:{line} uses {used}" for line, used in sorted(seen.items())]
    return found


def test_private_torch_apis_only_through_the_shim() -> None:
    found = private_torch_uses()
    assert not found, "private torch APIs outside precompile.inductor.shim (and its Dynamo wing):\n" + "\n".join(found)


def test_the_private_api_check_sees_an_import_and_an_attribute(tmp_path: Path) -> None:
    """Not vacuous: a lazy import of Inductor, a ``from torch.utils._x import`` and a ``torch._C`` attribute are
    found in a planted load module; ``torch.__version__`` and the shim's own imports are not."""
    for name, text in {
        "precompile/__init__.py": "",
        "precompile/inductor/__init__.py": "",
        "precompile/inductor/shim.py": "def f():\n    from torch._inductor import config\n",
        "precompile/inductor/load/__init__.py": "",
        "precompile/inductor/load/runtime.py": "import torch\nfrom torch.utils._python_dispatch import Mode\n"
                                               "v = torch.__version__\ns = torch._C._cuda_getCurrentRawStream\n"
                                               "def f():\n    import torch._inductor.config\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert private_torch_uses(tmp_path) == [
        "precompile.inductor.load.runtime:2 uses torch.utils._python_dispatch",
        "precompile.inductor.load.runtime:4 uses torch._C._cuda_getCurrentRawStream",
        "precompile.inductor.load.runtime:6 uses torch._inductor.config"]
