"""The ``precompile`` command line (``precompile`` console script, ``python -m precompile``).

Commands, one module per group: warmup (``warmup_cmd``); ls, inspect, stats (``browse``); diff, explain
(``diff_cmd``); verify, gc (``upkeep``); export, import (``bundle_cmd``); rebuild (``rebuild_cmd``).

Tables go to stdout through rich; logs and progress go to stderr.  ``--json`` prints one JSON object (or array)
instead of a table, for scripts and tests.  A mistake in what was asked (a malformed cache URL, an unknown
scheme, a bad option, a bad environment variable) is one line on stderr and exit status 2; a cache that cannot be
reached or an artifact that cannot be found or read is one line and exit status 1.

May import: anything of precompile but the public API module (it presents what :mod:`precompile.ops`,
:mod:`precompile.store` and the rest return; docs/architecture.md).  No package of precompile imports it.
"""

from __future__ import annotations

# each command module registers its commands on ``main`` (precompile.cli.group) when imported
from precompile.cli import browse, bundle_cmd, diff_cmd, rebuild_cmd, upkeep, warmup_cmd  # noqa: F401
from precompile.cli.common import human_bytes
from precompile.cli.group import main
from precompile.config import setup_logging

__all__ = ["human_bytes", "main", "setup_logging"]
