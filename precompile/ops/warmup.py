"""``precompile warmup``: compile a model's graphs for a list of shapes into a cache, in parallel processes.

Each job is one (recipe, shape) pair.  Across machines the job list is split into shards (:func:`select_shard`):
``--shard I/N``, or a Kubernetes Indexed Job's ``JOB_COMPLETION_INDEX`` with the completion count in
``JOB_COMPLETIONS`` (:func:`shard_from_env`).  Shards that run at once into one Redis build each key once: a
graph two shards share is built under one lease (:mod:`precompile.store.coordination`).  A job builds the model,
captures its graphs with Dynamo through :class:`precompile.builder.capture.Backend` (the way vLLM does) and so loads or
builds each graph's artifact.  Jobs run in ``jobs`` spawned processes; results come back as plain dicts for the
summary table.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

log = logging.getLogger("precompile")


@dataclass(frozen=True)
class Job:
    """One unit of warmup work: compile ``recipe`` (with ``config``) at ``shape`` into ``cache``."""

    recipe: str
    shape: str
    config: str | None
    cache: str = field(repr=False)  # the URL as given (it opens the cache), secrets and all: never shown
    device: str = "cpu"
    dtype: str | None = None
    options_json: str | None = None


def run_job(job: Job, threads: int | None = None) -> list[dict[str, Any]]:
    """Run one job in this process; returns one row per captured graph (graph, key, outcome, seconds, bytes), and
    a last row for the whole-function artifact (``"graph": "function"``; its graphs are the rows before it).

    Raises:
        RecipeError: the recipe, config or shape is invalid.
        torch._dynamo.exc.BackendCompilerFailed: Inductor failed on a graph (Dynamo wraps backend errors).
    """
    import json

    import torch

    from precompile.function.compiled import CompiledFunction
    from precompile.recipes.catalog import get_recipe, parse_shapes

    if threads:
        torch.set_num_threads(threads)
    recipe = get_recipe(job.recipe, config=job.config, device=job.device, dtype=job.dtype)
    (shape,) = parse_shapes(job.shape)
    model = recipe.model()
    inputs = recipe.example_inputs(shape)
    options = json.loads(job.options_json) if job.options_json else None
    start = time.perf_counter()
    torch._dynamo.reset()
    fn = CompiledFunction(model, dynamic=False, options=options, cache=job.cache)
    with torch.no_grad():
        fn(*inputs)
    total = time.perf_counter() - start
    rows = []
    for r in fn.records:
        row = asdict(r)
        row["graph"] = row.pop("index")
        rows.append({"recipe": job.recipe, "shape": job.shape, **row, "job_seconds": total})
    rows.append({"recipe": job.recipe, "shape": job.shape, "graph": "function", "key": fn.key,
                 "outcome": fn.outcome, "seconds": fn.load_seconds, "compile_seconds": 0.0, "bytes": 0,
                 "kernels": 0, "graphs": len(fn.graphs), "job_seconds": total})
    return rows


def _run_job_in_worker(job: Job, threads: int) -> list[dict[str, Any]]:
    from precompile.config import setup_logging

    setup_logging(quiet=True)
    return run_job(job, threads)


def run_jobs(jobs: list[Job], n_procs: int, on_done: Callable[[Job, list[dict[str, Any]] | None, BaseException | None], None],
             threads: int | None = None) -> None:
    """Run ``jobs`` in ``n_procs`` spawned worker processes (in this process if ``n_procs`` is 1).

    ``on_done(job, rows, error)`` is called in this process as each job finishes.  Every worker compiles for
    ``threads`` CPU threads (default: this process's ``torch.get_num_threads()``, what a serving process on
    this machine uses), whatever ``n_procs`` is: Inductor builds its C++ kernels for the thread count, and the
    thread count is a key factor, so workers that compiled for fewer threads would store artifacts no serving
    process here looks up.
    """
    import torch

    threads = threads or torch.get_num_threads()
    if n_procs <= 1:
        for job in jobs:
            try:
                rows = run_job(job, threads)
            except Exception as err:  # noqa: BLE001 - reported per job in the summary
                on_done(job, None, err)
            else:
                on_done(job, rows, None)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n_procs, mp_context=ctx) as pool:
        futures = {pool.submit(_run_job_in_worker, job, threads): job for job in jobs}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                rows = fut.result()
            except Exception as err:  # noqa: BLE001 - reported per job in the summary
                on_done(job, None, err)
            else:
                on_done(job, rows, None)


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``.

    Raises:
        ValueError: not two integers ``I/N`` with ``N >= 1`` and ``0 <= I < N``.
    """
    try:
        i_text, n_text = text.strip().split("/")
        index, count = int(i_text), int(n_text)
    except ValueError:
        raise ValueError(f"a shard is INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/4; got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"a shard is INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/4; got {text!r}")
    return index, count


def shard_from_env(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """The shard of a Kubernetes Indexed Job: ``JOB_COMPLETION_INDEX`` (set by Kubernetes) and ``JOB_COMPLETIONS``
    (set it in the pod template to ``spec.completions``; see deploy/).  None when ``JOB_COMPLETION_INDEX`` is unset.

    Raises:
        ValueError: ``JOB_COMPLETION_INDEX`` is set but ``JOB_COMPLETIONS`` is not, or they do not form a shard.
    """
    env = os.environ if environ is None else environ
    index = env.get("JOB_COMPLETION_INDEX", "").strip()
    if not index:
        return None
    count = env.get("JOB_COMPLETIONS", "").strip()
    if not count:
        raise ValueError("JOB_COMPLETION_INDEX is set but JOB_COMPLETIONS is not: set JOB_COMPLETIONS to the Job's "
                         "spec.completions in the pod template, or pass --shard INDEX/COUNT")
    return parse_shard(f"{index}/{count}")


def select_shard(jobs: list[Job], index: int, count: int) -> list[Job]:
    """The jobs of shard ``index`` of ``count``: jobs sorted by their fields, then every ``count``-th from
    ``index``.  Deterministic and independent of the order recipes and shapes were given in, so every machine
    computes the same split; the shards are disjoint and together hold every job once."""
    ordered = sorted(jobs, key=lambda j: tuple("" if v is None else str(v) for v in asdict(j).values()))
    return ordered[index::count]


def make_jobs(recipes: Iterable[str], shapes: str, config: str | None, cache: str, device: str,
              dtype: str | None, options_json: str | None) -> list[Job]:
    """The job list: every recipe x every shape of ``shapes`` (``"1x16,4x32"``).

    Raises:
        RecipeError: ``shapes`` does not parse.
    """
    from precompile.recipes.catalog import parse_shapes

    parsed = parse_shapes(shapes)
    return [Job(r, str(s), config, cache, device, dtype, options_json) for r in recipes for s in parsed]
