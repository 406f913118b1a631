"""The phases of :mod:`tools.bench.load`, each run in its own fresh process (``tools/bench/load.py --phase ...``)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

from tools._common import sync


def _steady_ms(fn, args, device: str, calls: int) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(calls):
        sync(device)
        t = time.perf_counter()
        fn(*args)
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _paired_ms(a_fn, b_fn, args, device: str, calls: int) -> tuple[float, float]:
    """Median ms of ``a_fn`` and of ``b_fn`` called alternately in one process (A, B, A, B...), so that both
    see the same machine noise: the fair way to compare two callables' steady calls."""
    for _ in range(3):
        a_fn(*args)
        b_fn(*args)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for fn, out in ((a_fn, times[0]), (b_fn, times[1])):
            sync(device)
            t = time.perf_counter()
            fn(*args)
            sync(device)
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def _first(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    return out[0]


def _graph(a: argparse.Namespace):
    """The model's one Dynamo graph, its example inputs and the Inductor options, as every build phase uses."""
    from precompile.builder.capture import capture_graphs
    from precompile.recipes.catalog import get_recipe, parse_shapes

    recipe = get_recipe(a.model, config=a.config, device=a.device, dtype=a.dtype)
    (shape,) = parse_shapes(a.shape)
    graphs = capture_graphs(recipe.model(), recipe.example_inputs(shape))
    if len(graphs) != 1:
        raise SystemExit(f"{a.model} gives {len(graphs)} graphs; this benchmark times one")
    gm, ex = graphs[0]
    return gm, ex, json.loads(a.options) if a.options else {}


def phase_build(a: argparse.Namespace, work: Path) -> dict:
    import torch

    gm, ex, options = _graph(a)
    torch.save(ex, work / "inputs.pt")
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        t = time.perf_counter()
        tart = torch._inductor.standalone_compile(gm, ex, dynamic_shapes="from_example_inputs",
                                                  options={"config_patches": options})
        sync(a.device)
        torch_compile_s = time.perf_counter() - t
        tart.save(path=str(work / "torch.bin"), format="binary")
    with torch.no_grad():
        compiled_ms = _steady_ms(tart, ex, a.device, a.calls)
        ref = _first(tart(*ex)).detach().cpu()
    torch.save(ref, work / "ref.pt")
    return {"torch_compile_s": torch_compile_s, "compiled_call_ms": compiled_ms,
            "torch_artifact_bytes": (work / "torch.bin").stat().st_size}


def phase_build_ours(a: argparse.Namespace, work: Path) -> dict:
    """precompile's cold compile into a fresh local cache, in its own fresh process."""
    import torch

    import precompile

    gm, ex, options = _graph(a)
    if not (work / "inputs.pt").exists():  # run alone (--phase build-ours), e.g. for tools/profile/ttfo_probe.py
        torch.save(ex, work / "inputs.pt")
    url = "file://" + str(work / "cache")
    t = time.perf_counter()
    art = precompile.standalone_compile(gm, ex, options=options, cache=url)
    sync(a.device)
    seconds = time.perf_counter() - t
    with torch.no_grad():
        compiled_ms = _steady_ms(art, ex, a.device, a.calls)
        # the loaded callable (fast path: carried binaries) against the fresh compile, alternating in one process
        loaded = precompile.load(art.key, cache=url)
        fresh_ms, loaded_ms = _paired_ms(art, loaded, ex, a.device, max(a.calls, 100))
        torch.save(_first(art(*ex)).detach().cpu(), work / "ref_ours.pt")  # what precompile compiled (rewrites)
    signed = _signed_cache(work, url, art.key)
    return {**signed, "precompile_compile_s": seconds, "precompile_compiled_call_ms": compiled_ms, "key": art.key,
            "paired_fresh_ms": fresh_ms, "paired_loaded_ms": loaded_ms, "paired_engine": loaded.engine_kind,
            "cache": url, "artifact_bytes": art.manifest.total_bytes(), "kernels": len(art.manifest.kernels),
            "placeholders": len(art.manifest.placeholders)}


def _signed_cache(work: Path, url: str, key: str) -> dict:
    """A second cache holding the artifact with its manifest signed by a fresh key, and the median time of one
    signature check (canonical JSON of the manifest + Ed25519 verify), ms."""
    import precompile
    from cache_backends.registry import open_cache
    from precompile.manifest import trust
    from precompile.store.cache_io import store

    key_path = work / "signing.pem"
    key_path.unlink(missing_ok=True)  # a work dir used again: a fresh key
    public = trust.generate_key(key_path)
    art = precompile.load(key, cache=url)
    art.manifest = trust.Policy(signer=trust.load_signing_key(str(key_path))).sign(art.manifest)
    signed_url = "file://" + str(work / "cache-signed")
    store(open_cache(signed_url), art)
    verifier = trust.Policy(trust.parse_verify_keys(public))
    doc = json.loads(art.manifest.to_json())
    times = []
    for _ in range(50):
        t = time.perf_counter()
        assert verifier.check(doc).ok
        times.append((time.perf_counter() - t) * 1000)
    return {"signed_cache": signed_url, "verify_key": public, "verify_ms": statistics.median(times),
            "manifest_bytes": len(art.manifest.to_json())}


def phase_load(a: argparse.Namespace, work: Path, which: str, key: str, url: str) -> dict:
    """One fresh-process load (``torch``, ``ours``, ``ours-warm``): load, first call, second call (each synced),
    then steady calls.  ``import torch`` and reading the inputs are not timed."""
    import torch  # excluded from the load time

    ex = torch.load(work / "inputs.pt", weights_only=False)
    ref = torch.load(work / "ref.pt")
    sync(a.device)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _wait_for_go()
    t0 = time.perf_counter()
    if which == "torch":
        fn = torch._inductor.CompiledArtifact.load(path=str(work / "torch.bin"), format="binary")
    else:
        import precompile

        fn = precompile.load(key, cache=url)
        if which == "ours-warm":  # a worker binds its weights and warms up before taking traffic
            weights = {s["fqn"]: ex[i] for i, s in enumerate(fn.placeholders) if s["kind"] != "user_input"}
            fn.bind(weights).warmup()
    t1 = time.perf_counter()
    with torch.no_grad():
        out = fn(*ex)
        sync(a.device)
        t2 = time.perf_counter()
        fn(*ex)
        sync(a.device)
        t3 = time.perf_counter()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        steady = _steady_ms(fn, ex, a.device, a.calls)
    got = _first(out).detach().cpu()
    return {"load_s": t1 - t0, "engine": getattr(fn, "engine_kind", "torch"), "first_call_s": t2 - t1,
            "second_call_s": t3 - t2, "steady_call_ms": steady,
            "peak_extra_rss_mb": (rss1 - rss0) / 1024, "matches": bool(torch.equal(got, ref)),
            "matches_own": bool(torch.equal(got, torch.load(work / "ref_ours.pt"))) if which != "torch" else None,
            "max_abs_diff": float((got.float() - ref.float()).abs().max())}


def phase_eager(a: argparse.Namespace, work: Path) -> dict:
    """The model's first call in eager mode in a fresh process: building the model and moving it and its inputs
    to the device are not timed."""
    import torch

    from precompile.recipes.catalog import get_recipe, parse_shapes

    recipe = get_recipe(a.model, config=a.config, device=a.device, dtype=a.dtype)
    (shape,) = parse_shapes(a.shape)
    model, inputs = recipe.model(), recipe.example_inputs(shape)
    sync(a.device)
    with torch.no_grad():
        t = time.perf_counter()
        model(*inputs)
        sync(a.device)
        first = time.perf_counter() - t
        t = time.perf_counter()
        model(*inputs)
        sync(a.device)
    return {"first_call_s": first, "second_call_s": time.perf_counter() - t}


def _wait_for_go() -> None:
    """With ``BENCH_READY_DIR``/``BENCH_GO_FILE`` set (the N-at-once run): say ready, then wait for GO, so that
    the N loads start at the same moment, after every process has imported torch."""
    ready, go = os.environ.get("BENCH_READY_DIR"), os.environ.get("BENCH_GO_FILE")
    if not ready or not go:
        return
    Path(ready, str(os.getpid())).touch()
    deadline = time.monotonic() + 600
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("GO file never appeared")
        time.sleep(0.002)
