"""The ``precompile`` command line (``precompile`` console script, ``python -m precompile``).

Commands, one module each, named after it: ``<command>_cmd`` (``ls_cmd``, ``inspect_cmd``, ``stats_cmd``, ``diff_cmd``,
``explain_cmd``, ``verify_cmd``, ``gc_cmd``, ``export_cmd``, ``import_cmd``, ``rebuild_cmd``, ``warmup_cmd``); views they
share in ``*_view`` modules and ``common``.

Tables go to stdout through rich; logs and progress go to stderr.  ``--json`` prints one JSON object (or array)
instead of a table, for scripts and tests.  A mistake in what was asked (a malformed cache URL, an unknown
scheme, a bad option, a bad environment variable) is one line on stderr and exit status 2; a cache that cannot be
reached or an artifact that cannot be found or read is one line and exit status 1.

May import: anything of precompile but the public API module (it presents what :mod:`precompile.ops`,
:mod:`precompile.store` and the rest return; docs/architecture.md).  No package of precompile imports it.
"""

from __future__ import annotations

# each command module registers its commands on ``main`` (precompile.cli.group) when imported
from precompile.cli import (  # noqa: F401
    diff_cmd,
    explain_cmd,
    export_cmd,
    gc_cmd,
    import_cmd,
    inspect_cmd,
    ls_cmd,
    rebuild_cmd,
    stats_cmd,
    verify_cmd,
    warmup_cmd,
)
from precompile.cli.common import human_bytes
from precompile.cli.group import main
from precompile.config import setup_logging

__all__ = ["human_bytes", "main", "setup_logging"]
