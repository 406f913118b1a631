"""``precompile verify``: an fsck of a cache (every blob re-hashed, every ref checked), --fix to drop what is bad."""

from __future__ import annotations

import sys

import click

from precompile.cli.common import cache_option, console, echo_json, human_bytes, open_existing, progress_bar, table
from precompile.cli.group import main


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
