"""``precompile warmup``: compile recipes x shapes into a cache, in parallel processes, shardable."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from typing import Any

import click

from precompile import config
from precompile.cli.common import cache_option, console, human_bytes, open_for_write, progress_bar, table
from precompile.cli.group import main


def _usage_error(message: str) -> None:
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(2)


@main.command()
@click.argument("recipes", nargs=-1, required=True)
@click.option("--shapes", default="1x16", show_default=True, help="Comma-separated BATCHxSEQ list.")
@click.option("--config", "config_text", default=None, help="Model config overrides: a JSON string or a JSON file.")
@cache_option
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
    from precompile.ops.warmup import make_jobs, parse_shard, run_jobs, select_shard, shard_from_env

    if options_json:
        try:
            json.loads(options_json)
        except ValueError as err:
            _usage_error(f"--options is not JSON: {err}")
    try:
        job_list = make_jobs(recipes, shapes, config_text, cache_url or config.default_cache_url(), device, dtype,
                             options_json)
        part = parse_shard(shard) if shard is not None else shard_from_env()
    except ValueError as err:  # RecipeError, a bad shard
        _usage_error(str(err))
    cache = open_for_write(cache_url)  # workers get the URL as given (cache.url hides a Redis password)
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
    functions: list[dict[str, Any]] = []
    failures: list[str] = []
    start = time.perf_counter()
    with progress_bar("warmup", disable=as_json) as progress:
        task = progress.add_task("", total=len(job_list))
        live = progress.live.is_started and progress.console.is_terminal
        done = [0]

        def on_done(job, got, error):
            if error is not None:
                failures.append(f"{job.recipe} {job.shape}: {type(error).__name__}: {error}")
                logging.getLogger("precompile").error("warmup of %s %s failed: %s", job.recipe, job.shape, error)
            else:
                rows.extend(r for r in got if r["graph"] != "function")
                functions.extend(r for r in got if r["graph"] == "function")
            progress.update(task, advance=1, description=f"{job.recipe} {job.shape}")
            if not live and not as_json:  # no live bar (stderr is not a terminal): a line per job as it ends
                done[0] += 1
                graphs = ", ".join(f"{r['graph']} {r['outcome']} {r['seconds']:.1f} s"
                                   for r in (got or []) if r["graph"] != "function") or "no graphs"
                click.echo(f"warmup [{done[0]}/{len(job_list)}] {job.recipe} {job.shape}: "
                           f"{'FAILED' if error is not None else graphs} "
                           f"({time.perf_counter() - start:.0f} s elapsed)", err=True)

        run_jobs(job_list, jobs, on_done, threads=threads)
    wall = time.perf_counter() - start
    rows.sort(key=lambda r: (r["recipe"], r["shape"], r["graph"]))
    if as_json:
        click.echo(json.dumps({"rows": rows, "functions": functions, "failures": failures, "wall_seconds": wall, "cache": cache.url,
                               "shard": list(part) if part else None}))
    else:
        title = f"warmup into {cache.url}" + (f", shard {part[0]}/{part[1]}" if part else "")
        t = table(title, ["recipe", "graph", "shape", "key", "hit/built", "seconds", "bytes", "kernels"],
                  right=("seconds", "bytes", "kernels", "graph"))
        for r in rows:
            t.add_row(r["recipe"], str(r["graph"]), r["shape"], r["key"][:12], r["outcome"], f"{r['seconds']:.2f}",
                      human_bytes(r["bytes"]), str(r["kernels"]))
        con = console()
        con.print(t)
        outcomes = Counter(r["outcome"] for r in rows)
        built = [r for r in rows if r["outcome"] in ("built", "takeover")]
        con.print(f"{len(rows)} graphs: {len(built)} built, {outcomes['hit']} hits, "
                  f"{outcomes['waited']} waited for another worker's build, {len(failures)} failed jobs; "
                  f"{wall:.1f} s wall ({sum(r['seconds'] for r in built):.1f} s of builds summed over {jobs} "
                  f"process(es)); bytes are each artifact's parts, uncompressed")
        fo = Counter(r["outcome"] for r in functions)
        con.print(f"{len(functions)} whole-function artifacts: {fo['built'] + fo['takeover']} built, {fo['hit']} hits "
                  "(a hit traced nothing)")
    if failures:
        for f in failures:
            click.echo(f"FAILED {f}", err=True)
        sys.exit(1)
