"""Compile an FX graph with Inductor in a private cache directory and harvest everything it produced."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from precompile.inductor import shim
from precompile.inductor.build import cuda_pack, harvest, picks
from precompile.inductor.build.products import BuildResult, NotSaveableError

log = logging.getLogger("precompile.inductor")


@contextlib.contextmanager
def _build_cache_dir(reuse: str | None = None):
    """A fresh Inductor + Triton cache dir with in-memory code caches cleared, so the compile is complete
    (nothing reused from earlier compiles in this process or on this disk) and every product lands in it.

    Not :func:`precompile.inductor.load.portable._load_cache_dir`, which serializes loads under one per-process
    directory and leaves Triton's cache dir and the in-memory caches alone.

    Args:
        reuse: an earlier compile's dir (:attr:`BuildResult.cache_dir`) to compile in again, so that a second
            compile of the same graph looks where the first one's on-disk autotune results are (``.best_config``
            files, the local autotune cache); None for a fresh dir."""
    root = reuse or tempfile.mkdtemp(prefix="precompile-build-")
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = root
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    shim.clear_caches()
    try:
        yield root
    finally:
        shim.clear_caches()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _lap_clock(phases: dict[str, float]):
    """``lap(name)``: adds the seconds since the previous lap (or since this call) to ``phases[name]``."""
    last = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - last[0]
        last[0] = now

    return lap


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], run_inputs: list[Any] | None, *,
                  dynamic_shapes: str, options: dict[str, Any] | None) -> BuildResult:
    """Compile ``gm`` with Inductor and harvest everything it produced (see :class:`BuildResult`).

    Args:
        gm: the normalized graph.
        example_inputs: what Inductor compiles for (tensors, ints or SymInts, as the graph's caller gave them).
        run_inputs: the same inputs with every size concrete (SymInts replaced by their example values): what
            a graph with Triton kernels is run on once, on copies of the inputs it writes to, so that each
            kernel's autotuning settles on the config the artifact carries; None when the inputs must not be
            run (then a graph with Triton kernels offers no fast path).
        dynamic_shapes: as ``torch._inductor.standalone_compile``.
        options: normalized Inductor config patches.

    Raises:
        NotSaveableError: Inductor produced no cache entry (e.g. the graph holds an uncacheable op).
        Exception: whatever Inductor raised while compiling (the caller wraps it in ``BuildError``).
    """
    with _build_cache_dir() as root:
        try:
            start = time.perf_counter()
            with picks.recording() as tuned:
                compiled, payload_bytes, aot = shim.standalone_compile(gm, example_inputs, dynamic_shapes,
                                                                       options or {})
            seconds = time.perf_counter() - start
            if payload_bytes is None:
                raise NotSaveableError("Inductor saved no cache artifacts for this graph")
            if len(aot) != 1:
                raise NotSaveableError(f"expected one AOTAutograd cache entry, Inductor produced {len(aot)}; "
                                       "something in the graph is not cacheable")
            payload = pickle.dumps({"aot_key": aot[0], "cache_artifacts": payload_bytes}, protocol=4)
            phases: dict[str, float] = {}
            lap = _lap_clock(phases)
            graphs = _read_fx_graphs(root)
            facts = harvest.graph_facts(graphs)
            lap("harvest")
            settled = cuda_pack.settle_triton_autotuning(compiled, run_inputs, graphs, facts["mutated_inputs"])
            lap("settle")
            products = harvest.harvest(root, graphs)
            lap("harvest")
            fast_off = settled or cuda_pack.package_triton_kernels(root, products["kernels"])
            multi_kernel: dict[str, int] = {}
            if fast_off is None:
                try:
                    multi_kernel = cuda_pack.multi_kernel_picks(products["kernels"], "".join(facts["wrappers"].values()))
                except cuda_pack.NotFast as err:
                    fast_off = str(err)
            lap("package")
            cache_files = {str(p.relative_to(root)): p.stat().st_size for p in Path(root).rglob("*") if p.is_file()}
            ks = products["kernels"]
            log.info("compiled in %.1f s: %d kernels (%d cpp, %d triton), %d with binaries, %d autotune picks, "
                     "%d files in the Inductor cache dir", seconds, len(ks), sum(k.lang == "cpp" for k in ks),
                     sum(k.lang == "triton" for k in ks), sum(bool(k.binaries) for k in ks),
                     sum(bool(k.config) for k in ks) + len(products["autotune"]) + len(tuned), len(cache_files))
            log.debug("Inductor cache dir files: %s", sorted(cache_files))
        finally:
            # every product is in memory now; C++ kernels are loaded already, but Triton may still open files
            # of the live callable lazily: then the directory goes when the process ends
            kept: str | None = None
            if any(p.suffix in (".cubin", ".hsaco") for p in Path(root).rglob("*")):
                atexit.register(shutil.rmtree, root, ignore_errors=True)
                kept = root
            else:
                shutil.rmtree(root, ignore_errors=True)
    return BuildResult(compiled_fn=compiled, engine_payload=payload, cache_files=cache_files, compile_seconds=seconds,
                       fast_off=fast_off, multi_kernel=multi_kernel, tuned=tuned, cache_dir=kept, phase_seconds=phases,
                       **facts, **products)


def _read_fx_graphs(root: str) -> list[Any]:
    """Inductor's FX graph cache entries (``CompiledFxGraph``) written during this compile, unpickled.

    They come from the private directory this process just created and filled, never from a cache or an
    artifact, so unpickling them trusts nothing from outside.
    """
    graphs = []
    for path in sorted(Path(root, "fxgraph").rglob("*")):
        if path.is_file():
            try:
                with open(path, "rb") as f:
                    graphs.append(pickle.load(f))
            except Exception as err:  # noqa: BLE001 - an unreadable entry only loses inspect detail
                log.debug("could not read Inductor FX graph cache entry %s: %s", path, err)
    return graphs
