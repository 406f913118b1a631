"""``precompile diff`` and ``explain``: why two keys differ, and why a key misses (the stored artifacts nearest it)."""

from __future__ import annotations

import json
from typing import Any

import click

from precompile.cli.common import cache_option, clean, console, echo_json, open_existing, plain, table
from precompile.cli.group import main
from precompile.errors import ArtifactFormatError


def _value(v: Any) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return text if len(text) <= 70 else text[:67] + "..."


def _checked(source: Any) -> Any:
    """``source`` (a :class:`precompile.store.lookup.Source`) if its manifest is well formed.

    Raises:
        ArtifactFormatError: it is malformed (``inspect`` shows what it holds).
    """
    if source.problem is not None:
        raise ArtifactFormatError(f"artifact {source.key} ({source.where}) is malformed: {source.problem}; "
                                  "precompile inspect shows what it holds")
    return source


def _opener(cache_url: str | None):
    opened: list[Any] = []

    def get():
        if not opened:
            opened.append(open_existing(cache_url))
        return opened[0]

    return get


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

    from precompile.artifact import trust
    from precompile.store.diff import compare, function_status, nearest
    from precompile.store.lookup import open_target, stored_manifests

    trust.policy()  # a wrong key setting fails before a path or a cache is read
    cache = _opener(cache_url)
    left = _checked(open_target(a, cache))
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
    comparison = compare(left, _checked(open_target(b, cache)))
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


@main.command()
@click.argument("target")
@cache_option
@click.option("--from", "from_url", default=None, metavar="URL",
              help="The cache TARGET is stored in, e.g. the local cache of the pod that missed (default: --cache).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def explain(target: str, cache_url: str | None, from_url: str | None, as_json: bool) -> None:
    """Say why TARGET (a key or unique key prefix, in --from or the cache, or an artifact file from another
    machine) is or would be a miss in the cache: whether its key is stored there and, if not, the closest stored
    artifact and the factors that differ.  PRECOMPILE_EXPLAIN=1 makes every miss of standalone_compile log the
    same line."""
    from precompile.artifact import trust
    from precompile.store.diff import explain_miss, nearest
    from precompile.store.lookup import open_target, stored_manifests

    trust.policy()  # a wrong key setting fails before a path or a cache is read
    cache = _opener(cache_url)
    source = _checked(open_target(target, _opener(from_url) if from_url else cache))
    stored = stored_manifests(cache())
    hit = any(k == source.key and m is not None for k, m in stored)
    names = [str(p.get("name", "")) for p in source.manifest.get("placeholders") or []]
    factors = source.manifest.get("factors") or {}
    near = nearest(factors, stored, exclude=source.key, names=names, count=1)
    if hit:
        line = f"hit {source.key[:12]}: the cache {cache().url} stores this key"
    else:
        line = explain_miss(source.key, factors, stored, names)
    if as_json:
        echo_json({"key": source.key, "stored": hit, "explanation": line,
                   "closest": near[0].to_dict() if near else None})
        return
    click.echo(clean(line))
