"""``precompile inspect``: one artifact, by path, key or key prefix."""

from __future__ import annotations

import json

import click

from precompile.cli.common import cache_option, open_existing
from precompile.cli.group import main


@main.command()
@click.argument("target")
@cache_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--wrapper", "show_wrapper", is_flag=True,
              help="Print the wrapper stored as data (a GPU artifact with no host code): its code and kernel table.")
def inspect(target: str, cache_url: str | None, as_json: bool, show_wrapper: bool) -> None:
    """Show an artifact (by path, key or key prefix): parts, kernels, autotune picks, alignment, env, key factors.
    A malformed manifest is shown as far as it can be, and the command then fails (exit status 1)."""
    from precompile.cli.inspect_view import show
    from precompile.store.lookup import open_target
    from precompile.store.opening import policy_for

    policy = policy_for(cache_url)  # the URL's keys judge a path too; a wrong key setting fails before any read
    source = open_target(target, lambda: open_existing(cache_url))
    if as_json:
        click.echo(json.dumps(source.manifest, indent=1, sort_keys=True))
    show(source, wrapper=show_wrapper, summary=not as_json, policy=policy)
