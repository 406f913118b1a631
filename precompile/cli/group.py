"""The ``precompile`` command group: the options every command takes, and precompile's typed errors turned into
one line on stderr and an exit status (2: a mistake in what was asked, a bad key setting or a path that cannot be
an artifact among them; 1: a cache or artifact that failed).
Each command module registers itself on :func:`main`; :mod:`precompile.cli` imports them all."""

from __future__ import annotations

import contextlib
import sys

import click

from precompile.config import setup_logging
from precompile.errors import (CacheURLError, ConfigError, NotAnArtifactPathError, OutputPathError, PrecompileError,
                               RecipeError)


class _Main(click.Group):
    """The command group; turns precompile's typed errors into one line and an exit status."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (CacheURLError, ConfigError, RecipeError, NotAnArtifactPathError, OutputPathError) as err:
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
    _escape_unencodable()


def _escape_unencodable() -> None:
    """Text stdout's encoding cannot hold (stored text under an ASCII or Latin-1 locale) is written escaped
    (``\\xe9``), as Python writes stderr, instead of failing the command with UnicodeEncodeError."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)  # not a text stream under click's test runner
    if reconfigure is not None:
        with contextlib.suppress(ValueError, OSError):
            reconfigure(errors="backslashreplace")
