"""``precompile diff``: why two keys differ, factor by factor, or why one key is not any of the stored artifacts nearest it."""

from __future__ import annotations

import json
from typing import Any

import click

from precompile.cli.common import cache_option, checked_source, clean, console, echo_json, lazy_opener, plain, table
from precompile.cli.group import main


def _value(v: Any) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return text if len(text) <= 70 else text[:67] + "..."


@main.command()
@click.argument("a")
@click.argument("b", required=False)
@cache_option
@click.option("-n", "--count", default=3, show_default=True, type=click.IntRange(1, 100),
              help="With one artifact: how many nearest stored artifacts to show.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def diff(a: str, b: str | None, cache_url: str | None, count: int, as_json: bool) -> None:
    """Compare the key factors of artifacts A and B (keys, unique key prefixes or artifact paths), showing only
    what differs: torch build, GPU, an input's dtype/shape/stride/alignment, an option, the ambient state, the
    graph (with its code diffed) and Inductor's config (entry by entry).

    With A alone: the stored artifacts nearest to A, and why each is not A (what a process that computed A's key
    would have missed)."""
    from rich.text import Text

    from precompile.manifest import trust
    from precompile.store.diff import compare, function_status, nearest
    from precompile.store.lookup import open_target, stored_manifests

    trust.policy()  # a wrong key setting fails before a path or a cache is read
    cache = lazy_opener(cache_url)
    left = checked_source(open_target(a, cache))
    if b is None:
        names = [str(p.get("name", "")) for p in left.manifest.get("placeholders") or []]
        near = nearest(left.manifest.get("factors") or {}, stored_manifests(cache()), exclude=left.key, names=names,
                       count=count)
        status = function_status(left.manifest)
        if as_json:
            echo_json({"key": left.key, "where": left.where, "status": status,
                       "nearest": [n.to_dict() for n in near]})
            return
        con = console()
        con.print(Text.assemble((left.key, "bold"), " (from ", plain(left.where), ")"))
        if status:
            con.print(plain(status))
        if not near:
            con.print("the cache holds no other artifact to compare with")
        for n in near:
            t = table(f"{n.key[:16]}: differs in {len(n.factors)} factor(s): {', '.join(n.factors)}",
                      ["factor", "what", left.key[:12], n.key[:12]])
            for c in n.changes:
                t.add_row(c.path, c.what, _value(c.a), _value(c.b))
            con.print(t)
        return
    comparison = compare(left, checked_source(open_target(b, cache)))
    if as_json:
        echo_json(comparison.to_dict())
        return
    con = console()
    if comparison.pick_changes:
        pt = table(f"{len(comparison.pick_changes)} tuned op(s) picked differently (GEMM, convolution)",
                   ["op", comparison.a[:12], comparison.b[:12]])
        for c in comparison.pick_changes:  # names and picks come from the manifests: text, never markup
            pt.add_row(Text(c.path.removeprefix("autotune.tuned ")), Text(_value(c.a)), Text(_value(c.b)))
        con.print(pt)
    if not comparison.changes:
        con.print(f"{left.key[:16]} and {comparison.b[:16]}: every key factor is the same")
        return
    t = table(f"{len(comparison.factors)} factor(s) differ: {', '.join(comparison.factors)}",
              ["factor", "what", comparison.a[:12], comparison.b[:12]])
    for c in comparison.changes:
        t.add_row(c.path, c.what, _value(c.a), _value(c.b))
    con.print(t)
    if comparison.config_changes:
        ct = table(f"Inductor config: {len(comparison.config_changes)} entries differ",
                   ["entry", comparison.a[:12], comparison.b[:12]])
        for c in comparison.config_changes:
            ct.add_row(c.path.removeprefix("inductor_config."), _value(c.a), _value(c.b))
        con.print(ct)
    if comparison.graph_diff:
        con.print(Text("graph code diff", style="bold"))
        click.echo(clean(comparison.graph_diff))
    if comparison.wrapper_diff:
        con.print(Text("wrapper graph diff (node by node)", style="bold"))
        click.echo(clean(comparison.wrapper_diff))
