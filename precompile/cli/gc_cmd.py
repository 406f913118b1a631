"""``precompile gc``: plan-then-execute eviction by age and size (the plan: :mod:`precompile.ops.evict`)."""

from __future__ import annotations

import datetime

import click

from precompile.cli.common import cache_option, console, echo_json, human_bytes, open_existing, table
from precompile.cli.group import main


def _when(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


@main.command()
@cache_option
@click.option("--max-bytes", "max_bytes", default=None, metavar="SIZE",
              help="Keep at most SIZE bytes stored (10GiB, 500MB, 1048576): least recently used artifacts go first.")
@click.option("--older-than", "older_than", default=None, metavar="AGE",
              help="Drop artifacts not used for AGE (90s, 30m, 12h, 7d, 2w).")
@click.option("--grace", "grace", default="60s", show_default=True, metavar="AGE",
              help="Keep unreferenced blobs younger than AGE (a writer's blobs before its ref lands).")
@click.option("--dry-run", is_flag=True, help="Print the plan; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def gc(cache_url: str | None, max_bytes: str | None, older_than: str | None, grace: str, dry_run: bool,
       as_json: bool) -> None:
    """Evict artifacts by age and/or size, tier by tier: plan, print the table of what goes, then delete (refs
    first, then the blobs no remaining artifact uses)."""
    from precompile.ops import evict
    from precompile.ops.verify import tiers

    if max_bytes is None and older_than is None:
        click.echo("Error: gc needs --max-bytes SIZE or --older-than AGE", err=True)
        raise click.exceptions.Exit(2)
    try:
        cap = evict.parse_bytes(max_bytes) if max_bytes is not None else None
        age = evict.parse_duration(older_than) if older_than is not None else None
        grace_s = evict.parse_duration(grace)
    except ValueError as err:
        click.echo(f"Error: {err}", err=True)
        raise click.exceptions.Exit(2) from err
    cache = open_existing(cache_url)
    out = []
    for tier in tiers(cache):
        plan = evict.plan(tier, max_bytes=cap, older_than=age, grace_s=grace_s)
        entry = {"plan": plan.to_dict(), "dry_run": dry_run}
        if not as_json:
            con = console()
            t = table(f"gc {tier.url}{' (dry run)' if dry_run else ''}", ["artifact", "last used", "why"])
            for r in plan.refs:
                t.add_row(r.key, _when(r.last_used), plan.reasons[r.key])
            con.print(t)
            con.print(f"plan: {len(plan.refs)} artifacts ({plan.refs_kept} kept) and {len(plan.blobs)} blobs go; "
                      f"{human_bytes(plan.bytes_before)} -> {human_bytes(plan.bytes_after)} stored (compressed)")
        if not dry_run:
            result = evict.execute(tier, plan)
            entry["deleted"] = result.to_dict()
            if not as_json:
                console().print(f"deleted {len(result.refs)} artifacts and {len(result.blobs)} blobs "
                                f"({human_bytes(result.bytes_freed)}); kept {len(result.kept)} that changed since")
        out.append(entry)
    if as_json:
        echo_json({"tiers": out})
