"""``precompile rebuild``: recompile stored FX graphs for this machine's environment (a new torch or GPU)."""

from __future__ import annotations

import sys

import click

from precompile.cli.common import cache_option, console, echo_json, open_existing, table
from precompile.cli.group import main


@main.command()
@click.argument("keys", nargs=-1)
@cache_option
@click.option("--force", is_flag=True, help="Rebuild even artifacts built for this environment, or whose new key "
                                            "is stored already.")
@click.option("--max-bytes", "max_bytes", default=None, metavar="SIZE",
              help="Hold at most SIZE (4GiB, 500MB, 1048576) for one artifact's inputs, intermediates, outputs and "
                   "their copies, estimated on fake tensors before anything is allocated; more is refused.  Default: "
                   "PRECOMPILE_REBUILD_MAX_BYTES, else a quarter of this machine's memory, at most 4 GiB.")
@click.option("--max-flops", "max_flops", default=None, type=click.IntRange(min=1), metavar="N",
              help="Do at most N operations (floating-point operations plus elements read and written) in one run of "
                   "a graph, counted on fake tensors before it runs; more is refused.  Default: "
                   "PRECOMPILE_REBUILD_MAX_FLOPS, else 10**13.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rebuild(keys: tuple[str, ...], cache_url: str | None, force: bool, max_bytes: str | None, max_flops: int | None,
            as_json: bool) -> None:
    """Recompile stored artifacts for this machine from their stored graph, input specs, options and ambient
    state, without the model's code; store each under its new key.  Without KEYS: every artifact built for
    another environment.  Run it on one machine of the new kind before a fleet rolls out.

    Symbolic artifacts are refused (rebuild them by running the model: precompile warmup), and so is an artifact
    over --max-bytes or --max-flops.  Exits 1 if an artifact failed or was refused, 2 for a mistake in what was
    asked; an artifact's failure is a row with a one-line reason, never a traceback."""
    from precompile import config
    from precompile.ops import evict
    from precompile.ops.rebuild import rebuild_one, stale_keys
    from precompile.store.lookup import resolve_key

    try:
        budget = evict.parse_bytes(max_bytes) if max_bytes is not None else config.rebuild_max_bytes()
    except (ValueError, OverflowError) as err:
        click.echo(f"Error: --max-bytes: {err}", err=True)
        raise click.exceptions.Exit(2) from err
    if not 1 <= budget <= 1 << 62:
        click.echo("Error: --max-bytes must be from 1 byte to 2**62 bytes", err=True)
        raise click.exceptions.Exit(2)
    work = max_flops if max_flops is not None else config.rebuild_max_flops()
    cache = open_existing(cache_url)
    todo = [resolve_key(cache, k) for k in keys] if keys else stale_keys(cache)
    rows = []
    for key in todo:
        out = rebuild_one(cache, key, force=force, max_bytes=budget, max_flops=work)
        rows.append(out)
        if not as_json:
            click.echo(f"{key[:12]}: {out.outcome} ({out.seconds:.1f} s)", err=True)
    if as_json:
        echo_json({"cache": cache.url, "rows": [r.to_dict() for r in rows]})
    else:
        t = table(f"rebuild in {cache.url}: {len(rows)} artifacts", ["old key", "new key", "seconds", "outcome",
                                                                    "detail"], right=("seconds",))
        for r in rows:
            t.add_row(r.old_key[:16], (r.new_key or "-")[:16], f"{r.seconds:.1f}", r.outcome, r.detail)
        console().print(t)
    if any(r.outcome in ("failed", "refused") for r in rows):
        sys.exit(1)
