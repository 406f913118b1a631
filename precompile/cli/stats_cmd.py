"""``precompile stats``: a cache's counters, as a table, JSON or the Prometheus text format."""

from __future__ import annotations

import json

import click

from precompile.cli.common import cache_option, console, human_bytes, open_existing, table
from precompile.cli.group import main


@main.command()
@cache_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table",
              show_default=True, help="prometheus: the text exposition format (a textfile collector, a sidecar).")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json: one JSON object.")
def stats(cache_url: str | None, fmt: str, as_json: bool) -> None:
    """Show a cache's counters (kept by the cache since it was created; fleet-wide for Redis): hits, misses,
    builds, puts, bytes read/written, errors, hit rate, bytes stored."""
    cache = open_existing(cache_url)
    if fmt == "prometheus":
        from precompile.metrics import cache_exposition

        click.echo(cache_exposition(cache).decode(), nl=False)
        return
    s = cache.stats()
    if as_json or fmt == "json":
        click.echo(json.dumps(s, sort_keys=True))
        return
    from rich.text import Text

    tiers = s.pop("tiers", [])
    t = table(f"stats of {cache.url}" + (" (this machine's counters; each tier's below)" if tiers else ""),
              ["counter", "value"], right=("value",))
    for tier in [s, *tiers]:
        if tier is not s:
            t.add_section()
            t.add_row(Text(str(tier.get("backend", "tier")), style="bold"), str(tier.get("url", "")))
        for k, v in tier.items():  # counter names and values may come from a shared server: plain text
            if k in ("url",) or (tier is not s and k == "backend"):
                continue
            if k == "hit_rate" and isinstance(v, float):
                v = f"{100 * v:.1f}%"
            elif (str(k).startswith("bytes") or k == "max_bytes") and isinstance(v, int):
                v = f"{human_bytes(v)} ({v})"
            t.add_row(str(k), str(v))
    console().print(t)
