"""``precompile explain``: why a key is or would be a miss in a cache: the closest stored artifact and the factors that differ."""

from __future__ import annotations

import json
from typing import Any

import click

from precompile.cli.common import cache_option, checked_source, clean, echo_json, lazy_opener
from precompile.cli.group import main


def _value(v: Any) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return text if len(text) <= 70 else text[:67] + "..."


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
    from precompile.manifest import trust
    from precompile.store.diff import explain_miss, nearest
    from precompile.store.lookup import open_target, stored_manifests

    trust.policy()  # a wrong key setting fails before a path or a cache is read
    cache = lazy_opener(cache_url)
    source = checked_source(open_target(target, lazy_opener(from_url) if from_url else cache))
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
