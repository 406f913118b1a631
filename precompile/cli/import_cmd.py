"""``precompile import``: a bundle file checked whole, then its artifacts stored (:mod:`precompile.ops.bundle`)."""

from __future__ import annotations

import click

from precompile.cli.common import (
    cache_option,
    console,
    echo_json,
    open_for_write,
    progress_bar,
    table,
)
from precompile.cli.group import main


@main.command(name="import")
@click.argument("bundle")  # a directory, a FIFO, a device: refused by the bundle reader, in one line (exit 2)
@cache_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def import_cmd(bundle: str, cache_url: str | None, as_json: bool) -> None:
    """Check bundle file BUNDLE whole (checksum, every blob's digest, every artifact complete), then write its
    blobs and refs into the cache.  A bundle that fails a check is refused and nothing is written."""
    from precompile.ops.bundle import check_bundle, check_trusted, import_bundle

    try:
        # a bundle that fails a check is refused before the cache is even opened (and leaves no progress bar)
        with progress_bar("check", disable=as_json, transient=True) as progress:
            task = progress.add_task("", total=None)
            checked = check_bundle(bundle, lambda i, n: progress.update(task, completed=i, total=n))
        cache = open_for_write(cache_url)
        check_trusted(checked, cache)
        with progress_bar("import", disable=as_json) as progress:
            task = progress.add_task("", total=None)
            refs, written = import_bundle(checked, cache, lambda i, n: progress.update(task, completed=i, total=n))
    except FileNotFoundError as err:
        click.echo(f"Error: no bundle at {bundle}: {err.strerror}", err=True)
        raise click.exceptions.Exit(1) from err
    if as_json:
        echo_json({"cache": cache.url, "blobs": written, "refs": [vars(r) for r in refs]})
        return
    t = table(f"imported {bundle} into {cache.url}: {written} blobs", ["key", "outcome"])
    for r in refs:
        t.add_row(r.key, r.outcome)
    console().print(t)
