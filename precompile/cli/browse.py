"""``precompile ls``, ``inspect`` and ``stats``: what a cache holds and how it is used."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click

from precompile.cli.common import cache_option, console, human_bytes, open_existing, plain, table
from precompile.cli.group import main


# ---------------------------------------------------------------------------------------------------- ls
@main.command(name="ls")
@cache_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def ls_cmd(cache_url: str | None, as_json: bool) -> None:
    """List the artifacts in a cache.  An entry whose manifest is missing, damaged or malformed is listed as
    such, with why; the others are listed as usual."""
    from precompile.store.lookup import iter_entries

    cache = open_existing(cache_url)
    entries = (_item(e.key, e.manifest, e.problem) for e in iter_entries(cache))
    if as_json:
        _stream_json(entries)
        return
    items = list(entries)
    from rich.text import Text

    functions = sum(1 for it in items if it.get("kind") == "function")
    records = sum(1 for it in items if it.get("kind") == "record")
    bad = sum(1 for it in items if "error" in it)
    t = table(f"{len(items)} artifacts in {cache.url}: {len(items) - functions - records - bad} graph, "
              f"{functions} function" + (f", {records} records" if records else "") + (f", {bad} malformed" if bad else ""),
              ["key", "inputs", "device", "engine", "kernels", "bytes", "build s", "options", "created"],
              caption="bytes: each artifact's parts, uncompressed (artifacts share blobs; `stats` shows what is stored)")
    for it in items:
        if "error" in it:
            t.add_row(it["key"][:16], Text.assemble(("malformed", "red"), ": ", plain(it["error"], 160)), "", "", "",
                      "", "", "", "")
        elif it["kind"] == "record":
            t.add_row(it["key"][:16], Text.assemble(("record", "magenta"), " ", plain(f"{it['purpose']}: {it['about']}")),
                      "", "", "", "", "", "", str(it["created"] or "")[:19])
        elif it["kind"] == "function":
            t.add_row(it["key"][:16], Text.assemble(("function", "cyan"), " ", plain(it["function"])),
                      ",".join(it["devices"]), f"{it['graphs']} graphs", "", human_bytes(it["bytes"]),
                      _seconds(it["build_seconds"]), json.dumps(it["options"]) if it["options"] else "",
                      str(it["created"] or "")[:19])
        else:
            engine = Text("fast") if it["engine"] == "fast" else \
                Text.assemble(("portable", "yellow"), " (", plain(it["fast_off"] or "", 40), ")")
            if it["no_host_code"]:
                engine.append_text(Text.assemble(", ", ("no host code", "green")))
            t.add_row(it["key"][:16], " ".join(it["inputs"]), ",".join(it["devices"]), engine, str(it["kernels"]),
                      human_bytes(it["bytes"]), _seconds(it["build_seconds"]),
                      json.dumps(it["options"]) if it["options"] else "", str(it["created"] or "")[:19])
    console().print(t)


def _stream_json(items: Iterator[dict[str, Any]]) -> None:
    """Print ``items`` as one JSON array, the bytes ``json.dumps(list(items))`` and a newline would be, written
    as each item comes (a listing of 100,000 refs once held every manifest and then the whole text)."""
    out = click.get_text_stream("stdout")
    out.write("[")
    for i, item in enumerate(items):
        out.write((", " if i else "") + json.dumps(item))
    out.write("]\n")
    out.flush()


def _seconds(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _item(key: str, m: dict[str, Any] | None, problem: str | None) -> dict[str, Any]:
    """One ``ls`` entry: ``{"key", "error"}`` for a manifest that is missing, damaged or malformed (checked by
    :func:`precompile.store.lookup.problem` first), else its summary by kind."""
    if problem is not None or m is None:
        return {"key": key, "error": problem or "manifest missing or corrupt"}
    try:
        return _summary(key, m)
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a shape the checks let through: still data
        return {"key": key, "error": f"malformed manifest ({type(err).__name__}: {err})"}


def _summary(key: str, m: dict[str, Any]) -> dict[str, Any]:
    if m.get("kind") == "function":
        return _function_item(key, m)
    build, factors = m["build"], m["factors"]
    if m.get("kind") == "record":
        return {"key": key, "kind": "record", "purpose": str(m.get("purpose"))[:64],
                "about": str(factors.get("about", ""))[:80], "created": _text(build.get("created"))}
    user = [p for p in m["placeholders"] if p["kind"] == "user_input"]
    return {
        "key": key, "created": _text(build.get("created")), "build_seconds": build.get("seconds"),
        "bytes": sum(b["size"] for b in m["blobs"].values()), "kernels": len(m["kernels"]),
        "placeholders": len(m["placeholders"]),
        "devices": sorted({str(p["device"]) for p in m["placeholders"] if p.get("device")}),
        "inputs": [f"{_shape(p.get('shape'))}:{p.get('dtype', p.get('type'))}" for p in user],
        "options": factors.get("options", {}),
        "engine": "fast" if m["parts"].get("fast") else "portable",
        "fast_off": _text(build.get("fast_off")), "kind": "graph",
        "no_host_code": bool(m["parts"].get("wrapper_graph")), "host_code": _text(build.get("host_code")),
    }


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _shape(shape: Any) -> str:
    return "x".join(map(str, shape)) if isinstance(shape, list) else str(shape if shape is not None else "")


def _function_item(key: str, m: dict) -> dict:
    """An ``ls`` row of a whole-function artifact (its graphs are listed as their own rows)."""
    build, factors = m["build"], m["factors"]
    fn = factors.get("function")
    return {"key": key, "kind": "function",
            "function": _text(build.get("function") or (fn.get("qualname") if isinstance(fn, dict) else None)),
            "created": _text(build.get("created")), "build_seconds": build.get("seconds"),
            "bytes": sum(b["size"] for b in m["blobs"].values()), "graphs": len(m["graphs"]),
            "sources": len(m["sources"]), "devices": ["cuda"] if "gpu_capability" in m["env"] else ["cpu"],
            "options": factors.get("options") or {}}


# ----------------------------------------------------------------------------------------------- inspect
@main.command()
@click.argument("target")
@cache_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--wrapper", "show_wrapper", is_flag=True,
              help="Print the wrapper stored as data (a GPU artifact with no host code): its code and kernel table.")
def inspect(target: str, cache_url: str | None, as_json: bool, show_wrapper: bool) -> None:
    """Show an artifact (by path, key or key prefix): parts, kernels, autotune picks, alignment, env, key factors.
    A malformed manifest is shown as far as it can be, and the command then fails (exit status 1)."""
    from precompile.cli.inspect_view import show
    from precompile.store.opening import policy_for
    from precompile.store.lookup import open_target

    policy = policy_for(cache_url)  # the URL's keys judge a path too; a wrong key setting fails before any read
    source = open_target(target, lambda: open_existing(cache_url))
    if as_json:
        click.echo(json.dumps(source.manifest, indent=1, sort_keys=True))
    show(source, wrapper=show_wrapper, summary=not as_json, policy=policy)


# ------------------------------------------------------------------------------------------------- stats
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
