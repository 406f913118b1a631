"""``precompile export``: artifacts written as one verified bundle file (:mod:`precompile.ops.bundle`)."""

from __future__ import annotations

import click

from precompile.cli.common import (
    cache_option,
    console,
    echo_json,
    human_bytes,
    open_existing,
    table,
)
from precompile.cli.group import main


@main.command(name="export")
@click.argument("keys", nargs=-1)
@cache_option
@click.option("-o", "--output", required=True, metavar="FILE", help="The bundle file to write.")
@click.option("--all", "export_all", is_flag=True, help="Export every artifact of the cache.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def export_cmd(keys: tuple[str, ...], cache_url: str | None, output: str, export_all: bool, as_json: bool) -> None:
    """Write artifacts KEYS (keys or unique key prefixes) into one bundle file: every blob each ref reaches, with
    a checksum.  `precompile import FILE` loads it into another cache (an air-gapped cluster)."""
    from precompile.ops.bundle import export
    from precompile.store.lookup import resolve_key

    if not keys and not export_all:
        click.echo("Error: give KEY... or --all", err=True)
        raise click.exceptions.Exit(2)
    cache = open_existing(cache_url)
    full = sorted({k for k, _ in cache.iter_refs()}) if export_all else [resolve_key(cache, k) for k in keys]
    try:
        done = export(cache, full, output)
    except FileNotFoundError as err:
        click.echo(f"Error: {err}", err=True)
        raise click.exceptions.Exit(1) from err
    if as_json:
        echo_json(done.to_dict())
        return
    t = table(f"exported {len(done.refs)} artifacts, {done.blobs} blobs, {human_bytes(done.bytes)} to {done.path}",
              ["key", "manifest"])
    for r in done.refs:
        t.add_row(r["key"], r["digest"][:16])
    console().print(t)
