"""The sources a whole-function artifact depends on: each function Dynamo inlined, by module and line span.

Dynamo records every code object it traced through (the function itself, its helpers, ``nn.Module.forward`` of
every layer, torch's own Python).  The artifact stores for each a ``{"module", "first", "last", "sha256"}`` record:
the sha256 of the lines ``first`` (1-based) up to ``last`` (exclusive) of the module's source, as torch's
``torch._dynamo.package`` hashes them (``_hash_sourcelines``).  :func:`changed` checks them here, so that a load of
an artifact traced through code that has since been edited is a miss that names the edit.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from collections.abc import Iterable
from typing import Any


def _current(module_name: str, first: int, last: int, import_missing: bool = True) -> str | None:
    module = sys.modules.get(module_name)
    if module is None and not import_missing:
        return NOT_IMPORTED
    if module is None:
        try:  # the manifest naming it was verified, and the name checked to be a dotted identifier
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - a module that is gone is a changed source
            return None
    try:
        lines = inspect.getsourcelines(module)[0]
    except (OSError, TypeError):
        return None
    return hashlib.sha256("".join(lines[first - 1:last - 1]).encode()).hexdigest()


#: What :func:`changed` says of a module this process has not imported, when asked not to import it.
NOT_IMPORTED = "not imported"


def changed(sources: Iterable[dict[str, Any]], import_missing: bool = True) -> str | None:
    """Why the recorded ``sources`` no longer match this process's, or None when every one still does.

    Args:
        import_missing: import a recorded module this process has not imported (a load: the manifest was
            verified); False (``precompile inspect`` of any cache's content) skips such modules instead, so that
            reading an entry runs no module's code.

    Returns:
        e.g. ``"source changed: mymodel lines 12-30 (sha256 3fa4... recorded, 91bc... here)"``, naming the first
        that differs; ``"source missing: ..."`` when the module or its source file cannot be read here;
        ``"not imported: ..."`` for a module skipped.
    """
    for s in sources:
        here = _current(s["module"], s["first"], s["last"], import_missing)
        if here == NOT_IMPORTED:
            return f"{NOT_IMPORTED}: {s['module']} is not imported here"
        span = f"{s['module']} lines {s['first']}-{s['last'] - 1}"
        if here is None:
            return f"source missing: {span} cannot be read here"
        if here != s["sha256"]:
            return f"source changed: {span} (sha256 {s['sha256'][:12]} recorded, {here[:12]} here)"
    return None
