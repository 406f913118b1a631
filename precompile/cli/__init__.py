"""The ``precompile`` command line (``precompile`` console script, ``python -m precompile``).

Commands, one module per group: warmup (``warmup_cmd``); ls, inspect, stats (``browse``); diff, explain
(``diff_cmd``); verify, gc (``upkeep``); export, import (``bundle_cmd``); rebuild (``rebuild_cmd``).

Tables go to stdout through rich; logs and progress go to stderr.  ``--json`` prints one JSON object (or array)
instead of a table, for scripts and tests.  A mistake in what was asked (a malformed cache URL, an unknown
scheme, a bad option, a bad environment variable) is one line on stderr and exit status 2; a cache that cannot be
reached or an artifact that cannot be found or read is one line and exit status 1.
"""

from __future__ import annotations

import click

from precompile.cli.common import human_bytes, setup_logging
from precompile.errors import CacheURLError, ConfigError, PrecompileError, RecipeError

__all__ = ["human_bytes", "main", "setup_logging"]


class _Main(click.Group):
    """The command group; turns precompile's typed errors into one line and an exit status."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (CacheURLError, ConfigError, RecipeError) as err:
            _fail(err, 2)
        except PrecompileError as err:
            _fail(err, 1)


def _fail(err: Exception, code: int) -> None:
    text = " ".join(str(err).split("\n")) or type(err).__name__
    click.echo(f"Error: {text}", err=True)
    raise click.exceptions.Exit(code)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("-q", "--quiet", is_flag=True, help="Warnings and errors only.")
def main(verbose: bool, quiet: bool) -> None:
    """precompile: compile PyTorch graphs once, load them fast and verified from a cache."""
    setup_logging(quiet=quiet, verbose=verbose)


# the commands register themselves on ``main``
from precompile.cli import browse, bundle_cmd, diff_cmd, rebuild_cmd, upkeep, warmup_cmd  # noqa: E402,F401
