"""The portable load path: Inductor's own cache entries, reloaded the way ``CompiledArtifact.load`` does.

It is the fallback when an artifact offers no fast path (the manifest says why) or a fast load fails.  It
imports Inductor (and with it Dynamo and sympy), probes the CPU's vector ISA, and rebuilds what it does not
find in Inductor's cache dir: the carried binaries are placed there first, so that it rebuilds nothing.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from precompile.inductor import shim


def load_engine(payload: bytes, binaries: dict[str, bytes] | None = None) -> Any:
    """Rebuild the compiled callable from an engine payload: the portable path, as ``CompiledArtifact.load``.

    Args:
        payload: ``BuildResult.engine_payload``.
        binaries: ``{relpath: bytes}`` of carried binaries to place into Inductor's cache dir first, so that
            Inductor finds them and skips rebuilding; a file that already exists is left alone.

    Returns:
        a callable taking a flat list/tuple of inputs and returning the outputs.

    Raises:
        ValueError: the payload does not unpickle into the expected form.
    """
    try:
        data = pickle.loads(payload)
        aot_key, cache_bytes = data["aot_key"], data["cache_artifacts"]
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"engine payload does not decode: {err}") from err
    base = Path(shim.cache_dir())
    for rel, data_bytes in (binaries or {}).items():
        target = base / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.incomplete")
        tmp.write_bytes(data_bytes)
        os.replace(tmp, target)
    return shim.load_cache_entries(aot_key, cache_bytes)


