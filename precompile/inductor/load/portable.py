"""The portable load path: Inductor's own cache entries, reloaded the way ``CompiledArtifact.load`` does.

It is the fallback when an artifact offers no fast path (the manifest says why) or a fast load fails.  It
imports Inductor (and with it Dynamo and sympy), probes the CPU's vector ISA, and rebuilds what it does not
find in Inductor's cache dir: the carried binaries are placed there first, so that it rebuilds nothing.

Inductor reuses any file it finds in its cache dir (a ``.so`` whose name it expects, a wrapper module) without a
check, so a load never uses the machine-wide one (``/tmp/torchinductor_<user>``): each load gets a fresh private
directory (mode 0700, under one per-process directory removed at exit), holding only what this artifact carries
and what Inductor writes while loading it.  A binary left behind by an earlier load, poisoned or not, is never
read back.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from precompile.manifest import names
from precompile.inductor import shim

_LOCK = threading.Lock()
_ROOT: list[Path] = []


def _private_root() -> Path:
    """This process's directory of private Inductor cache dirs (created once, mode 0700, removed at exit)."""
    if not _ROOT:
        root = Path(tempfile.mkdtemp(prefix=f"precompile-portable-{os.getpid()}-"))
        atexit.register(shutil.rmtree, root, True)
        _ROOT.append(root)
    return _ROOT[0]


@contextmanager
def _load_cache_dir():
    """Point Inductor's cache dir (``TORCHINDUCTOR_CACHE_DIR``, read by Inductor on every use) at a fresh private
    directory for the duration of a load.  Loads are serialized by a lock; a compile running at the same time in
    another thread of this process writes into the private directory too, which only costs it its cache.

    Not :func:`precompile.inductor.build.compile._build_cache_dir`, which also moves Triton's cache dir and clears
    Inductor's in-memory code caches, before and after: a load does neither."""
    with _LOCK:
        old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        private = tempfile.mkdtemp(prefix="load-", dir=_private_root())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = private
        try:
            yield Path(private)
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def load_engine(payload: bytes, binaries: dict[str, bytes] | None = None) -> Any:
    """Rebuild the compiled callable from an engine payload: the portable path, as ``CompiledArtifact.load``.

    The caller has checked the payload's and binaries' digests (and, with verify keys configured, the manifest's
    signature) before calling: the payload is a pickle.

    Args:
        payload: ``BuildResult.engine_payload``.
        binaries: ``{relpath: bytes}`` of carried binaries to place into the load's private Inductor cache dir
            first (see the module docstring), so that Inductor finds them and skips rebuilding.

    Returns:
        a callable taking a flat list/tuple of inputs and returning the outputs.

    Raises:
        UnsafePathError: a relpath is absolute, holds ``..`` or is otherwise not a plain relative path (checked
            before anything is unpickled or written).
        ValueError: the payload does not unpickle into the expected form.
    """
    for rel in binaries or {}:
        names.relative_path(rel, "kernels[].relpaths")
    try:
        data = pickle.loads(payload)
        aot_key, cache_bytes = data["aot_key"], data["cache_artifacts"]
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"engine payload does not decode: {err}") from err
    with _load_cache_dir() as base:
        for rel, data_bytes in (binaries or {}).items():
            target = names.inside(base, rel, "kernels[].relpaths")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data_bytes)
        return shim.load_cache_entries(aot_key, cache_bytes)
