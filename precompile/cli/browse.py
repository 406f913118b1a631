"""``precompile ls``, ``inspect`` and ``stats``: what a cache holds and how it is used."""

from __future__ import annotations

import json

import click

from precompile.cli.common import cache_option, console, human_bytes, open_existing
from precompile.cli.group import main


# ---------------------------------------------------------------------------------------------------- ls
@main.command(name="ls")
@cache_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def ls_cmd(cache_url: str | None, as_json: bool) -> None:
    """List the artifacts in a cache."""
    from precompile.store.lookup import stored_manifests

    cache = open_existing(cache_url)
    items = []
    for key, m in stored_manifests(cache):
        if m is None:
            items.append({"key": key, "error": "manifest missing or corrupt"})
            continue
        if m.get("kind") == "function":
            items.append(_function_item(key, m))
            continue
        if m.get("kind") == "record":
            factors, build = m.get("factors"), m.get("build")
            items.append({"key": key, "kind": "record", "purpose": str(m.get("purpose"))[:64],
                          "about": str(factors.get("about", "") if isinstance(factors, dict) else "")[:80],
                          "created": str(build.get("created")) if isinstance(build, dict) else None})
            continue
        devices = sorted({p.get("device") for p in m["placeholders"] if p.get("device")})
        user = [p for p in m["placeholders"] if p["kind"] == "user_input"]
        items.append({
            "key": key, "created": m["build"].get("created"), "build_seconds": m["build"].get("seconds"),
            "bytes": sum(b["size"] for b in m["blobs"].values()), "kernels": len(m["kernels"]),
            "placeholders": len(m["placeholders"]), "devices": devices,
            "inputs": [f"{'x'.join(map(str, p.get('shape', [])))}:{p.get('dtype', p.get('type'))}" for p in user],
            "options": m["factors"].get("options", {}),
            "engine": "fast" if m["parts"].get("fast") else "portable",
            "fast_off": m["build"].get("fast_off"), "kind": "graph",
            "no_host_code": bool(m["parts"].get("wrapper_graph")), "host_code": m["build"].get("host_code"),
        })
    if as_json:
        click.echo(json.dumps(items))
        return
    from rich.table import Table

    functions = sum(1 for it in items if it.get("kind") == "function")
    records = sum(1 for it in items if it.get("kind") == "record")
    table = Table(title=f"{len(items)} artifacts in {cache.url}: {len(items) - functions - records} graph, "
                        f"{functions} function" + (f", {records} records" if records else ""),
                  caption="bytes: each artifact's parts, uncompressed (artifacts share blobs; `stats` shows what is "
                          "stored)")
    for col in ("key", "inputs", "device", "engine", "kernels", "bytes", "build s", "options", "created"):
        table.add_column(col)
    for it in items:
        if "error" in it:
            table.add_row(it["key"][:16], f"[red]{it['error']}", "", "", "", "", "", "", "")
            continue
        if it["kind"] == "record":
            from rich.markup import escape

            table.add_row(it["key"][:16], f"[magenta]record[/] {escape(it['purpose'])}: {escape(it['about'])}", "",
                          "", "", "", "", "", escape(str(it["created"] or "")[:19]))
            continue
        if it["kind"] == "function":
            table.add_row(it["key"][:16], f"[cyan]function[/] {it['function']}", ",".join(it["devices"]),
                          f"{it['graphs']} graphs", "", human_bytes(it["bytes"]), f"{it['build_seconds'] or 0:.1f}",
                          json.dumps(it["options"]) if it["options"] else "", (it["created"] or "")[:19])
            continue
        engine = "fast" if it["engine"] == "fast" else f"[yellow]portable[/] ({(it['fast_off'] or '')[:40]})"
        if it["no_host_code"]:
            engine += ", [green]no host code[/]"
        table.add_row(it["key"][:16], " ".join(it["inputs"]), ",".join(it["devices"]), engine, str(it["kernels"]),
                      human_bytes(it["bytes"]), f"{it['build_seconds']:.1f}", json.dumps(it["options"]) if it["options"] else "",
                      (it["created"] or "")[:19])
    console().print(table)


def _function_item(key: str, m: dict) -> dict:
    """An ``ls`` row of a whole-function artifact (its graphs are listed as their own rows)."""
    build, factors = m.get("build") or {}, m.get("factors") or {}
    return {"key": key, "kind": "function", "function": build.get("function") or
            (factors.get("function") or {}).get("qualname"), "created": build.get("created"),
            "build_seconds": build.get("seconds"), "bytes": sum(b.get("size", 0) for b in (m.get("blobs") or {}).values()),
            "graphs": len(m.get("graphs") or {}), "sources": len(m.get("sources") or []),
            "devices": ["cuda"] if "gpu_capability" in (factors.get("env") or {}) else ["cpu"],
            "options": factors.get("options") or {}}


# ----------------------------------------------------------------------------------------------- inspect
@main.command()
@click.argument("target")
@cache_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("--wrapper", "show_wrapper", is_flag=True,
              help="Print the wrapper stored as data (a GPU artifact with no host code): its code and kernel table.")
def inspect(target: str, cache_url: str | None, as_json: bool, show_wrapper: bool) -> None:
    """Show an artifact (by path, key or key prefix): parts, kernels, autotune picks, alignment, env, key factors."""
    from precompile.store.lookup import open_target

    source = open_target(target, lambda: open_existing(cache_url))
    m, where = source.manifest, source.where
    if as_json:
        click.echo(json.dumps(m, indent=1, sort_keys=True))
        return
    if show_wrapper:
        from precompile.cli.wrapper_view import show_wrapper_graph

        show_wrapper_graph(source, m)
        return
    if m.get("kind") == "function":
        from precompile.cli.function_view import show_function

        show_function(m, where)
        return
    if m.get("kind") == "record":
        from precompile.artifact.trust import describe

        console().print(f"record {m.get('key')} (from {where}): {m.get('purpose')}, written "
                        f"{(m.get('build') or {}).get('created')}", markup=False)
        console().print(describe(m), markup=False)
        click.echo(json.dumps({"factors": m.get("factors"), "data": m.get("data")}, indent=1, sort_keys=True))
        return
    from rich.table import Table

    con = console()
    blobs = m["blobs"]
    con.print(f"[bold]artifact[/] {m['key']}  (from {where})")
    con.print(f"built {m['build'].get('created')} in {m['build'].get('seconds')} s by precompile "
              f"{m['build'].get('precompile')}; {len(blobs)} blobs, {human_bytes(sum(b['size'] for b in blobs.values()))}")
    from precompile.artifact.trust import describe

    con.print(describe(m), markup=False)
    fast = m["parts"].get("fast")
    if fast:
        con.print("load: [green]fast path[/] (carried binaries, nothing compiled)"
                  + (f"; writes to inputs {fast['mutated']}" if fast.get("mutated") else "")
                  + (f"; custom ops {[o['op'] for o in fast['ops']]}" if fast.get("ops") else ""))
    else:
        con.print(f"load: [yellow]portable path only[/] ({m['build'].get('fast_off') or 'no reason recorded'})")
    if m["parts"].get("wrapper_graph"):
        con.print(f"host code: [green]none[/] (wrapper stored as data, {len(m['parts']['wrapper_graph']['kernels'])} "
                  "kernels as cubins; inspect --wrapper prints it)")
    else:
        con.print(f"host code: {m['build'].get('host_code') or 'a Python wrapper'}", markup=False)
    rewrites = m["build"].get("rewrites")
    if rewrites:  # exact rewrites made before the key (precompile.key.passes)
        con.print("graph rewrites before the key: " + ", ".join(f"{name} x{n}" for name, n in rewrites.items()))
    shapes = m.get("shapes") or {}
    if shapes.get("symbols"):
        con.print("symbolic sizes: " + ", ".join(
            f"{n} in [{s['range'][0]}, {'inf' if s['range'][1] is None else s['range'][1]}] (example {s.get('hint')})"
            for n, s in shapes["symbols"].items()) + f"; guards: {shapes.get('guards')}")
    at = Table(title="ambient state (key factors)")
    at.add_column("setting")
    at.add_column("value")
    for k, v in (m["factors"].get("ambient") or {}).items():
        at.add_row(k, json.dumps(v))
    con.print(at)

    parts = Table(title="parts")
    for col in ("part", "digest", "size"):
        parts.add_column(col)
    for name, d in m["parts"]["fx_graph"].items():
        parts.add_row(f"fx_graph.{name}", d[:16], human_bytes(blobs[d]["size"]))
    parts.add_row("engine_payload", m["parts"]["engine_payload"][:16], human_bytes(blobs[m["parts"]["engine_payload"]]["size"]))
    for name, d in m["parts"].get("wrappers", {}).items():
        parts.add_row(f"wrapper {name}", d[:16], human_bytes(blobs[d]["size"]))
    con.print(parts)

    kt = Table(title=f"kernels ({len(m['kernels'])})")
    for col in ("kernel", "lang", "source", "binaries", "autotune pick"):
        kt.add_column(col)
    for k in m["kernels"]:
        bins = ", ".join(f"{f} ({human_bytes(blobs[d]['size'])})" for f, d in k["binaries"].items()) or "-"
        kt.add_row(k["name"], k["lang"], human_bytes(blobs[k["source"]]["size"]), bins,
                   json.dumps(k["config"], sort_keys=True) if k.get("config") else "-")
    con.print(kt)
    if m["autotune"].get("other"):
        con.print("other autotune picks:", json.dumps(m["autotune"]["other"], sort_keys=True))
    if m["autotune"].get("multi_kernel"):
        con.print("multi-kernel picks (sub-kernel index):", json.dumps(m["autotune"]["multi_kernel"], sort_keys=True))
    from precompile.cli.picks_view import show_tuned

    show_tuned(m["autotune"].get("tuned"), m["autotune"].get("benchmark_leftovers", 0))

    it = Table(title="inputs and alignment")
    for col in ("#", "placeholder", "kind", "fqn", "shape", "dtype", "device", "aligned", "inductor assumes"):
        it.add_column(col)
    align = {a["index"]: a for a in m["alignment"]}
    for i, p in enumerate(m["placeholders"]):
        a = align.get(i, {})
        it.add_row(str(i), p["name"], p["kind"], p.get("fqn") or "", "x".join(map(str, p.get("shape", []))),
                   p.get("dtype", p.get("type", "")), p.get("device", ""), str(a.get("aligned_at_build", "")),
                   a.get("at_run_time", ""))
    con.print(it)

    et = Table(title="environment (key fields marked *)")
    et.add_column("field")
    et.add_column("value")
    keyf = m["factors"]["env"]
    for k, v in m["env"].items():
        et.add_row(("* " if k in keyf else "  ") + k, str(v))
    con.print(et)

    ft = Table(title="key factors")
    ft.add_column("factor")
    ft.add_column("value")
    for k, v in m["factors"].items():
        if k == "ambient":
            continue  # its own table above
        text = json.dumps(v, sort_keys=True)
        ft.add_row(k, text if len(text) < 160 else text[:157] + "...")
    con.print(ft)


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
    from rich.table import Table

    table = Table(title=f"stats of {cache.url}")
    table.add_column("counter")
    table.add_column("value", justify="right")
    tiers = s.pop("tiers", [])
    if tiers:
        table.title = f"stats of {cache.url} (this machine's counters; each tier's below)"
    for tier in [s, *tiers]:
        if tier is not s:
            table.add_section()
            table.add_row(f"[bold]{tier.get('backend', 'tier')}", str(tier.get("url", "")))
        for k, v in tier.items():
            if k in ("url",) or (tier is not s and k == "backend"):
                continue
            if k == "hit_rate" and isinstance(v, float):
                v = f"{100 * v:.1f}%"
            elif (k.startswith("bytes") or k == "max_bytes") and isinstance(v, int):
                v = f"{human_bytes(v)} ({v})"
            table.add_row(k, str(v))
    console().print(table)
