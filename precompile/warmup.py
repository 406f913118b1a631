"""``precompile warmup``: compile a model's graphs for a list of shapes into a cache, in parallel processes.

Each job is one (recipe, shape) pair.  A job builds the model, captures its graphs with Dynamo through
:class:`precompile.capture.Backend` (the way vLLM does) and so loads or builds each graph's artifact.  Jobs
run in ``jobs`` spawned processes; results come back as plain dicts for the summary table.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

log = logging.getLogger("precompile")


@dataclass(frozen=True)
class Job:
    """One unit of warmup work: compile ``recipe`` (with ``config``) at ``shape`` into ``cache``."""

    recipe: str
    shape: str
    config: str | None
    cache: str
    device: str = "cpu"
    dtype: str | None = None
    options_json: str | None = None


def run_job(job: Job, threads: int | None = None) -> list[dict[str, Any]]:
    """Run one job in this process; returns one row per captured graph (graph, key, outcome, seconds, bytes).

    Raises:
        RecipeError: the recipe, config or shape is invalid.
        torch._dynamo.exc.BackendCompilerFailed: Inductor failed on a graph (Dynamo wraps backend errors).
    """
    import json

    import torch

    from precompile.capture import Backend
    from precompile.models import get_recipe, parse_shapes

    if threads:
        torch.set_num_threads(threads)
    recipe = get_recipe(job.recipe, config=job.config, device=job.device, dtype=job.dtype)
    (shape,) = parse_shapes(job.shape)
    model = recipe.model()
    inputs = recipe.example_inputs(shape)
    options = json.loads(job.options_json) if job.options_json else None
    be = Backend(cache=job.cache, options=options)
    start = time.perf_counter()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=be, dynamic=False)(*inputs)
    total = time.perf_counter() - start
    rows = []
    for r in be.records:
        row = asdict(r)
        row["graph"] = row.pop("index")
        rows.append({"recipe": job.recipe, "shape": job.shape, **row, "job_seconds": total})
    return rows


def _run_job_in_worker(job: Job, threads: int) -> list[dict[str, Any]]:
    from precompile.cli import setup_logging

    setup_logging(quiet=True)
    return run_job(job, threads)


def run_jobs(jobs: list[Job], n_procs: int, on_done: Callable[[Job, list[dict[str, Any]] | None, BaseException | None], None]
             ) -> None:
    """Run ``jobs`` in ``n_procs`` spawned worker processes (in this process if ``n_procs`` is 1).

    ``on_done(job, rows, error)`` is called in this process as each job finishes.
    """
    threads = max(1, (os.cpu_count() or 1) // max(1, n_procs))
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


def make_jobs(recipes: Iterable[str], shapes: str, config: str | None, cache: str, device: str,
              dtype: str | None, options_json: str | None) -> list[Job]:
    """The job list: every recipe x every shape of ``shapes`` (``"1x16,4x32"``).

    Raises:
        RecipeError: ``shapes`` does not parse.
    """
    from precompile.models import parse_shapes

    parsed = parse_shapes(shapes)
    return [Job(r, str(s), config, cache, device, dtype, options_json) for r in recipes for s in parsed]
