"""The ``precompile`` command line: warmup, ls, inspect, stats.

Tables go to stdout through rich; logs go to stderr through ``logging``.  ``--json`` prints one JSON object
(or array) instead of a table, for scripts and tests.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from typing import Any

import click

from precompile import config


def setup_logging(quiet: bool = False, verbose: bool = False) -> None:
    """Send the ``precompile`` logger to stderr at WARNING (quiet), INFO (default) or DEBUG (verbose);
    ``PRECOMPILE_LOG`` overrides the level."""
    level = config.log_level() or ("DEBUG" if verbose else "WARNING" if quiet else "INFO")
    logger = logging.getLogger("precompile")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _console():
    from rich.console import Console

    return Console(soft_wrap=False, width=max(100, __import__("shutil").get_terminal_size((140, 40)).columns))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("-q", "--quiet", is_flag=True, help="Warnings and errors only.")
def main(verbose: bool, quiet: bool) -> None:
    """precompile: compile PyTorch graphs once, load them fast and verified from a cache."""
    setup_logging(quiet=quiet, verbose=verbose)


_cache_option = click.option("--cache", "cache_url", default=None, metavar="URL",
                             help="Cache URL (default: $PRECOMPILE_CACHE, else the local cache under $XDG_CACHE_HOME).")


# ------------------------------------------------------------------------------------------------ warmup
@main.command()
@click.argument("recipes", nargs=-1, required=True)
@click.option("--shapes", default="1x16", show_default=True, help="Comma-separated BATCHxSEQ list.")
@click.option("--config", "config_text", default=None, help="Model config overrides: a JSON string or a JSON file.")
@_cache_option
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(1, 256), help="Parallel processes.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="CPU threads the C++ kernels are built for, a key factor (default: this machine's torch thread "
                   "count, what a serving process here uses).")
@click.option("--dtype", default=None, help="float32 (default), bfloat16 or float16.")
@click.option("--options", "options_json", default=None, help='Inductor options as JSON, e.g. \'{"max_autotune": true}\'.')
@click.option("--shard", default=None, metavar="I/N",
              help="Run shard I of N of the job list (default: $JOB_COMPLETION_INDEX/$JOB_COMPLETIONS if set).")
@click.option("--dry-run", is_flag=True, help="Print this shard's jobs and exit; nothing is compiled.")
@click.option("--json", "as_json", is_flag=True, help="Print the result rows as JSON instead of a table.")
def warmup(recipes: tuple[str, ...], shapes: str, config_text: str | None, cache_url: str | None, jobs: int,
           device: str, threads: int | None, dtype: str | None, options_json: str | None, shard: str | None, dry_run: bool,
           as_json: bool) -> None:
    """Compile RECIPES (minilm, llama, qwen2, gpt2, bert, or module:function) for every shape into a cache.

    Across machines, give each one a shard (--shard I/N, or a Kubernetes Indexed Job's index): the job list
    (recipes x shapes) is split the same way on every machine, and shards that share a Redis build each
    graph once."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cache_backends.registry import open_cache
    from precompile.errors import PrecompileError
    from precompile.warmup import make_jobs, parse_shard, run_jobs, select_shard, shard_from_env

    try:
        if options_json:
            json.loads(options_json)
        cache = open_cache(cache_url)
        # workers get the URL as given (cache.url hides a Redis password)
        job_list = make_jobs(recipes, shapes, config_text, cache_url or config.default_cache_url(), device, dtype,
                             options_json)
        part = parse_shard(shard) if shard is not None else shard_from_env()
    except (PrecompileError, ValueError) as err:
        raise click.UsageError(str(err)) from err
    total_jobs = len(job_list)
    if part is not None:
        job_list = select_shard(job_list, *part)
        logging.getLogger("precompile").info("shard %d/%d: %d of %d jobs", part[0], part[1], len(job_list),
                                             total_jobs)
    if dry_run:
        listing = [{"recipe": j.recipe, "shape": j.shape} for j in job_list]
        if as_json:
            click.echo(json.dumps({"shard": list(part) if part else None, "jobs": listing, "total_jobs": total_jobs}))
        else:
            for j in listing:
                click.echo(f"{j['recipe']} {j['shape']}")
        return
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    start = time.perf_counter()
    with Progress(TextColumn("[bold]warmup"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=_console_err(), disable=as_json) as progress:
        task = progress.add_task("", total=len(job_list))

        def on_done(job, got, error):
            if error is not None:
                failures.append(f"{job.recipe} {job.shape}: {type(error).__name__}: {error}")
                logging.getLogger("precompile").error("warmup of %s %s failed: %s", job.recipe, job.shape, error)
            else:
                rows.extend(got)
            progress.update(task, advance=1, description=f"{job.recipe} {job.shape}")

        run_jobs(job_list, jobs, on_done, threads=threads)
    wall = time.perf_counter() - start
    rows.sort(key=lambda r: (r["recipe"], r["shape"], r["graph"]))
    if as_json:
        click.echo(json.dumps({"rows": rows, "failures": failures, "wall_seconds": wall, "cache": cache.url,
                               "shard": list(part) if part else None}))
    else:
        from rich.table import Table

        title = f"warmup into {cache.url}" + (f", shard {part[0]}/{part[1]}" if part else "")
        table = Table(title=title)
        for col in ("recipe", "graph", "shape", "key", "hit/built", "seconds", "bytes", "kernels"):
            table.add_column(col, justify="right" if col in ("seconds", "bytes", "kernels", "graph") else "left")
        for r in rows:
            table.add_row(r["recipe"], str(r["graph"]), r["shape"], r["key"][:12], r["outcome"], f"{r['seconds']:.2f}",
                          human_bytes(r["bytes"]), str(r["kernels"]))
        con = _console()
        con.print(table)
        outcomes = Counter(r["outcome"] for r in rows)
        con.print(f"{len(rows)} graphs: {outcomes['built'] + outcomes['takeover']} built, {outcomes['hit']} hits, "
                  f"{outcomes['waited']} waited for another worker's build, {len(failures)} failed jobs, "
                  f"{wall:.1f} s wall")
    if failures:
        for f in failures:
            click.echo(f"FAILED {f}", err=True)
        sys.exit(1)


def _console_err():
    from rich.console import Console

    return Console(stderr=True)


# ---------------------------------------------------------------------------------------------------- ls
def _manifests(cache) -> list[tuple[str, dict[str, Any] | None]]:
    from cache_backends.base import MISS

    out = []
    for key, digest in sorted(cache.iter_refs()):
        raw = cache.get_blob(digest)
        out.append((key, None if raw is MISS else json.loads(raw)))
    return out


@main.command(name="ls")
@_cache_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def ls_cmd(cache_url: str | None, as_json: bool) -> None:
    """List the artifacts in a cache."""
    from cache_backends.registry import open_cache

    cache = open_cache(cache_url)
    items = []
    for key, m in _manifests(cache):
        if m is None:
            items.append({"key": key, "error": "manifest missing or corrupt"})
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
            "fast_off": m["build"].get("fast_off"),
        })
    if as_json:
        click.echo(json.dumps(items))
        return
    from rich.table import Table

    table = Table(title=f"{len(items)} artifacts in {cache.url}")
    for col in ("key", "inputs", "device", "engine", "kernels", "bytes", "build s", "options", "created"):
        table.add_column(col)
    for it in items:
        if "error" in it:
            table.add_row(it["key"][:16], f"[red]{it['error']}", "", "", "", "", "", "", "")
            continue
        engine = "fast" if it["engine"] == "fast" else f"[yellow]portable[/] ({(it['fast_off'] or '')[:40]})"
        table.add_row(it["key"][:16], " ".join(it["inputs"]), ",".join(it["devices"]), engine, str(it["kernels"]),
                      human_bytes(it["bytes"]), f"{it['build_seconds']:.1f}", json.dumps(it["options"]) if it["options"] else "",
                      (it["created"] or "")[:19])
    _console().print(table)


# ----------------------------------------------------------------------------------------------- inspect
def read_manifest(target: str, cache_url: str | None) -> tuple[dict[str, Any], str]:
    """The manifest dict of an artifact path or a key in a cache, and a description of where it came from.

    Raises:
        click.ClickException: nothing found under ``target``.
    """
    from pathlib import Path

    from cache_backends.base import MISS
    from cache_backends.registry import open_cache
    from precompile import formats
    from precompile.errors import ArtifactFormatError

    p = Path(target)
    try:
        if p.is_dir():
            manifest, _ = formats.read_unpacked(p)
            return manifest.to_dict(), str(p)
        if p.is_file():
            manifest, _ = formats.read_binary(p)
            return manifest.to_dict(), str(p)
    except ArtifactFormatError as err:
        raise click.ClickException(str(err)) from err
    cache = open_cache(cache_url)
    matches = [(k, d) for k, d in cache.iter_refs() if k.startswith(target)] if len(target) >= 6 else []
    if len(matches) != 1:
        raise click.ClickException(f"{target!r} is not an artifact path, nor a key (or unique key prefix of 6+ "
                                   f"characters) in {cache.url}" + (f"; {len(matches)} keys match" if matches else ""))
    key, digest = matches[0]
    raw = cache.get_blob(digest)
    if raw is MISS:
        raise click.ClickException(f"the manifest of {key} is missing or corrupt in {cache.url}")
    return json.loads(raw), f"{cache.url} ref {key}"


@main.command()
@click.argument("target")
@_cache_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(target: str, cache_url: str | None, as_json: bool) -> None:
    """Show an artifact (by path, key or key prefix): parts, kernels, autotune picks, alignment, env, key factors."""
    m, where = read_manifest(target, cache_url)
    if as_json:
        click.echo(json.dumps(m, indent=1, sort_keys=True))
        return
    from rich.table import Table

    con = _console()
    blobs = m["blobs"]
    con.print(f"[bold]artifact[/] {m['key']}  (from {where})")
    con.print(f"built {m['build'].get('created')} in {m['build'].get('seconds')} s by precompile "
              f"{m['build'].get('precompile')}; {len(blobs)} blobs, {human_bytes(sum(b['size'] for b in blobs.values()))}")
    from precompile.trust import describe

    con.print(describe(m), markup=False)
    fast = m["parts"].get("fast")
    if fast:
        con.print("load: [green]fast path[/] (carried binaries, nothing compiled)"
                  + (f"; writes to inputs {fast['mutated']}" if fast.get("mutated") else "")
                  + (f"; custom ops {[o['op'] for o in fast['ops']]}" if fast.get("ops") else ""))
    else:
        con.print(f"load: [yellow]portable path only[/] ({m['build'].get('fast_off') or 'no reason recorded'})")
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
@_cache_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (hits, misses, builds, hit_rate...).")
def stats(cache_url: str | None, as_json: bool) -> None:
    """Show a cache's counters: hits, misses, builds, puts, bytes read/written, errors, hit rate."""
    from cache_backends.registry import open_cache

    cache = open_cache(cache_url)
    s = cache.stats()
    if as_json:
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
    _console().print(table)


if __name__ == "__main__":  # pragma: no cover
    main()
