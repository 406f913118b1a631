"""``precompile verify`` and ``gc``: an fsck of a cache, and plan-then-execute eviction."""

from __future__ import annotations

import datetime
import sys

import click

from precompile.cli.common import cache_option, console, echo_json, human_bytes, open_existing, progress_bar, table
from precompile.cli.group import main


def _when(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


@main.command()
@cache_option
@click.option("--fix", is_flag=True, help="Drop what is bad: the plan is printed first, then carried out.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON summary.")
def verify(cache_url: str | None, fix: bool, as_json: bool) -> None:
    """Re-hash every blob and check every ref (its manifest, key, graph and parts) of a cache, tier by tier.

    Prints a table of the problems and a JSON summary; exits 1 if a problem was found (and not fixed).  Nothing
    is changed without --fix.  A dropped ref is a miss: the next compile or warmup rebuilds it."""
    from precompile.ops import verify as fsck

    cache = open_existing(cache_url)
    reports, fixes = [], []
    for tier in fsck.tiers(cache):
        with progress_bar(f"verify {tier.url}", disable=as_json) as progress:
            task = progress.add_task("", total=None)

            def step(done: int, total: int, what: str) -> None:
                progress.update(task, completed=done, total=total, description=what)

            report = fsck.verify(tier, step)
        reports.append(report)
        if not as_json:
            con = console()
            t = table(f"verify {tier.url}: {report.blobs_checked} blobs ({human_bytes(report.bytes_checked)} "
                      f"uncompressed) and {report.refs_checked} refs checked in {report.seconds:.1f} s",
                      ["problem", "name", "detail", "plan" if fix else "--fix would"])
            for p in report.problems:
                t.add_row(p.kind, p.name[:16], p.detail, p.action)
            con.print(t if report.problems else t.title + ": no problems")
        if fix and report.problems:
            result = fsck.fix(tier, report)
            fixes.append({"url": tier.url, **result.to_dict()})
            if not as_json:
                console().print(f"fixed {tier.url}: dropped {len(result.dropped_refs)} refs and "
                                f"{len(result.dropped_blobs)} blobs; kept {len(result.kept)} that changed since")
    ok = all(r.ok for r in reports)
    summary = {"ok": ok, "fixed": bool(fix and not ok), "tiers": [r.to_dict() for r in reports], "fixes": fixes}
    echo_json(summary)
    if not ok and not fix:
        sys.exit(1)


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
