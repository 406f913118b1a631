"""``precompile.standalone_compile``: FX graph + example inputs -> content-hashed, cached artifact."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import torch

from cache_backends.base import Cache, digest_bytes
from cache_backends.redaction import redact_url
from precompile import config, metrics
from precompile._version import __version__
from precompile.errors import BuildError, CacheError, CacheURLError, PrecompileError
from precompile.key import fingerprint, sdpa, symbolic
from precompile.key.graph import NormalizedGraph, canonical_json, readable_code
from precompile.key.plan import DYNAMIC_SHAPES, Plan, compute_key, input_specs, prepare  # noqa: F401 - re-exported
from precompile.loader.artifact import Artifact
from precompile.manifest.manifest import Manifest
from precompile.metrics import safe_incr
from precompile.store import shared
from precompile.store.cache_io import store
from precompile.store.coordination import get_or_build

log = logging.getLogger("precompile")


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                       dynamic_shapes: str = "from_example_inputs", options: dict[str, Any] | None = None,
                       cache: str | Cache | None = None, key_extra: dict[str, Any] | None = None,
                       runnable: bool = True, size_range: tuple[int, int | None] | None = None,
                       before_build: Callable[[], None] | None = None) -> Artifact:
    """Compile an FX graph with Inductor into a content-hashed :class:`~precompile.loader.artifact.Artifact`.

    Args:
        gm: a ``GraphModule`` from Dynamo (a ``torch.compile`` backend's graph, parameters lifted as inputs),
            ``make_fx``, or ``torch.export(...).module()``.  Not modified.
        example_inputs: what ``gm`` is called with: tensors (any dtype/device) and ints.
        dynamic_shapes: as ``torch._inductor.standalone_compile``: ``"from_example_inputs"`` specializes on
            the example shapes; ``"from_graph"`` keeps the graph's symbolic shapes; ``"from_tracing_context"``
            uses the ambient tracing context's (inside a ``torch.compile`` backend).  A symbolic artifact
            serves every size its guards allow (each symbol's range, and what the compile assumed), checked on
            every call.
        The ambient state that changes what Inductor produces (grad mode, autocast, deterministic algorithms,
        default dtype, matmul precision: :mod:`precompile.key.ambient`) is read now and is part of the key.
        options: Inductor config patches, as ``torch.compile(options=...)``, e.g. ``{"max_autotune": True}``.
        cache: a cache URL or open cache.  Given, this is get-or-build: a hit loads the stored artifact and
            runs no Inductor compile; a miss compiles and stores.  With a cache that has build leases (Redis,
            or tiered in front of Redis), one worker of a fleet compiles a key while the others wait for it
            (:func:`precompile.store.coordination.get_or_build`; ``art.outcome`` says which happened).  Cache failures
            only cost the cache: the call then compiles here.
        key_extra: more key factors, JSON values, from a caller whose compile depends on something the graph,
            inputs and options do not show (an integration's own graph passes, a compile range); stored as the
            ``extra`` factor.
        runnable: the example inputs may be run.  False when they are stand-ins that must not be (an
            integration that only has fake tensors, a graph taking process-specific handles such as vLLM's
            oneDNN pointers): the build then runs nothing, and the fast path is offered only where it needs no
            run (no Triton kernel to autotune) after static checks, recorded as ``build.validated = False``.
        size_range: ``(lower, upper)`` sizes the caller vouches the graph is valid for, on every size symbol of a
            graph with symbolic sizes (upper None: unbounded).  It replaces the symbols' ranges in the key and in
            the guards checked on every call.  vLLM's compile range is one (every dynamic dim of its pieces is
            ``num_tokens``): Dynamo's 0/1 specialization starts a dynamic size at 2, and vLLM runs its graphs at
            1 token all the same.
        before_build: called once, before Inductor runs, where this call compiles (a miss, or no cache).  A
            caller whose example inputs are costly to fill (an integration making stand-ins for fake tensors) can
            pass unfilled tensors of the right layout and fill them here: a hit needs only their layout.

    Returns:
        a callable artifact: ``art(*example_inputs)`` returns what ``gm(*example_inputs)`` returns.

    Raises:
        ValueError: bad ``dynamic_shapes``, or a ``size_range`` for a graph without symbolic sizes;
            OptionsError: bad ``options``.
        CacheURLError: ``cache`` is not a valid cache URL (a typo never silently costs the cache).
        ConfigError: a ``PRECOMPILE_*`` environment variable holds a bad value.
        UnserializableGraphError: a node holds something an artifact cannot store (nothing is written).
        InputMismatchError: example inputs do not line up with the graph's placeholders.
        BuildError: Inductor failed; its exception is chained.
    """
    from precompile.store.opening import open_cache, open_with_policy

    config.engine_mode()  # a bad PRECOMPILE_ENGINE is the caller's error, not a failed load to rebuild over
    explain = config.explain_misses()
    norm, plan = prepare(gm, example_inputs, dynamic_shapes=dynamic_shapes, options=options, key_extra=key_extra,
                         runnable=runnable, size_range=size_range)
    key = plan.key
    c = None
    if cache is not None:
        try:
            c = open_cache(cache)
        except CacheURLError:
            raise
        except CacheError as err:  # e.g. a Redis Cluster down at start: an outage, not a typo
            log.warning("cache %s cannot be opened (%s); compiling without it", redact_url(cache), err)
    if c is None:
        if before_build is not None:
            before_build()
        return build(norm, plan)

    policy = open_with_policy(c)[1]  # the cache's URL keys and the environment's (one read of its URL)

    def load_stored() -> Artifact | None:
        # one read and load per key per process (pieces of one key share it); the key was computed here, from
        # this environment: no need to compare fingerprints again
        return shared.load(key, c, policy, bound=norm.bound, check_env=False)

    def build_and_store() -> Artifact:
        if explain:
            _explain_miss(c, plan)
        if before_build is not None:
            before_build()
        art = build(norm, plan)
        safe_incr(c, builds=1)
        started = time.perf_counter()
        if store(c, art):
            log.info("stored %s in %s (%d bytes) in %.2f s", key[:12], c.url, art.manifest.total_bytes(),
                     time.perf_counter() - started)
        shared.remember(art, policy, c)  # later pieces of this key in this process use it, without reading it back
        return art

    started, remote_errors = time.perf_counter(), getattr(c, "remote_errors", 0)
    metrics.take_miss_reason()
    art, outcome = get_or_build(c, key, load_stored, build_and_store)
    if outcome == "hit":
        safe_incr(c, hits=1)
    art.outcome = outcome
    metrics.record_lookup(outcome, art, time.perf_counter() - started, metrics.take_miss_reason(),
                          getattr(c, "remote_errors", 0) - remote_errors)
    return art


def _explain_miss(cache: Cache, plan: Plan) -> None:
    """Log the stored artifact closest to ``plan``'s key and what differs (``PRECOMPILE_EXPLAIN=1``)."""
    from precompile.store.diff import explain_miss
    from precompile.store.lookup import stored_manifests

    try:
        names = [s["name"] for s in plan.specs]
        log.warning("%s", explain_miss(plan.key, plan.factors, stored_manifests(cache), names))
    except CacheError as err:
        log.warning("cannot explain the miss of %s: %s", plan.key[:12], err)


def build(norm: NormalizedGraph, plan: Plan) -> Artifact:
    """Run Inductor on a prepared graph and assemble the artifact (manifest + blobs).  See :func:`prepare`.

    Raises:
        BuildError: Inductor failed or produced nothing that can be stored, or the size guards of a symbolic
            graph cannot be written down (then nothing could check its calls).
    """
    from precompile.inductor import shim
    from precompile.inductor.build import compile as inductor_compile
    from precompile.inductor.build.fast_plan import fast_plan
    from precompile.inductor.build.products import NotSaveableError

    log.info("compiling %s (%d placeholders)", plan.key[:12], len(plan.specs))
    started = time.perf_counter()
    try:
        with sdpa.priority(plan.sdpa_order):
            result = inductor_compile.compile_graph(norm.gm, plan.compile_inputs,
                                                    plan.run_inputs if plan.runnable else None,
                                                    dynamic_shapes=plan.dynamic_shapes, options=plan.options)
    except NotSaveableError as err:
        raise BuildError(f"Inductor compiled the graph but it cannot be stored: {err}") from err
    except PrecompileError:
        raise
    except Exception as err:
        if shim.asks_dynamo_restart(err):
            raise  # Dynamo traces the frame again (a float to specialize) and hands us another graph
        raise BuildError(f"Inductor failed to compile the graph: {type(err).__name__}: {err}") from err
    shapes, more_inputs = symbolic.shapes_after_compile(plan)
    if not plan.runnable:
        more_inputs = []

    blobs: dict[str, bytes] = {}
    roles: dict[str, dict[str, Any]] = {}

    def put(data: bytes, role: str) -> str:
        d = digest_bytes(data)
        blobs[d] = data
        roles.setdefault(d, {"size": len(data), "role": role})
        return d

    parts: dict[str, Any] = {
        "fx_graph": {"code": put(readable_code(norm.gm).encode(), "fx graph code"),
                     "graph": put(canonical_json(plan.graph_json), "fx graph (serialized)")},
        "engine_payload": put(result.engine_payload, "engine payload (Inductor cache entries)"),
        "inductor_config": put(plan.inductor_config, "Inductor's effective config"),
        "wrappers": {name: put(src.encode(), f"wrapper {name}") for name, src in result.wrappers.items()},
    }
    kernels = []
    for k in result.kernels:
        kernels.append({
            "name": k.name, "lang": k.lang,
            "source": put(k.source.encode(), f"kernel source {k.name}"),
            "binaries": {f: put(b, f"kernel binary {k.name}/{f}") for f, b in sorted(k.binaries.items())},
            "relpaths": {f: r for f, r in sorted(k.relpaths.items()) if f in k.binaries},
            "config": k.config,
        })
    alignment = []
    for i, spec in enumerate(plan.specs):
        if spec.get("type") != "tensor":
            continue
        assumed = i in result.inputs_to_check
        alignment.append({"index": i, "name": spec["name"], "aligned_at_build": spec["aligned"],
                          "inductor_assumes_aligned": assumed,
                          "at_run_time": ("checked; copied if misaligned" + (
                              ", and the graph's writes copied back" if i in result.mutated_inputs else ""))
                          if assumed else "no assumption"})
    from precompile.inductor.build.runs import unset_outputs

    unset = unset_outputs(norm.gm)
    phases = {"inductor": result.compile_seconds, **result.phase_seconds}
    t = time.perf_counter()
    fast, fast_off = fast_plan(result, plan.run_inputs if plan.runnable else None, more_inputs,
                               graph_outputs=_output_aliases(norm.gm), unset=unset)
    phases["fast plan"] = time.perf_counter() - t
    if fast is not None:  # the wrapper as the fast path runs it, imports replaced: loads skip the rewrite
        fast["source"] = put(fast["source"].encode(), "fast wrapper (imports replaced)")
    else:
        log.info("artifact %s loads through the portable path only: %s", plan.key[:12], fast_off)
    parts["fast"] = fast
    no_fast = (fast_off or "not offered") if fast is None else None
    t = time.perf_counter()
    parts["wrapper_graph"], host_code = _wrapper_graph(norm, plan, result, shapes, put, no_fast, unset)
    phases["wrapper graph"] = time.perf_counter() - t
    total = time.perf_counter() - started
    log.info("built %s in %.2f s: %s, the rest %.2f s", plan.key[:12], total,
             ", ".join(f"{name} {sec:.2f} s" for name, sec in phases.items()), total - sum(phases.values()))
    manifest = Manifest(
        key=plan.key, factors=plan.factors, placeholders=plan.specs, parts=parts, kernels=kernels,
        autotune={"kernels": {k["name"]: k["config"] for k in kernels if k["config"]}, "other": result.autotune,
                  "multi_kernel": result.multi_kernel, "tuned": result.tuned,
                  "benchmark_leftovers": result.benchmark_leftovers},
        alignment=alignment, env=fingerprint.environment(plan.devices), blobs=roles,
        build={"seconds": round(result.compile_seconds, 3), "created": datetime.now(timezone.utc).isoformat(),
               "precompile": __version__, "mutated_inputs": result.mutated_inputs,
               "inductor_files": len(result.cache_files), "fast_off": fast_off,
               "validated": bool(fast) and plan.runnable, "rewrites": plan.rewrites, "host_code": host_code},
        calling={"in_spec": norm.in_spec, "out_spec": norm.out_spec, "outputs": _output_kind(norm.gm)},
        shapes=shapes,
    )
    return Artifact(manifest, blobs, engine=result.compiled_fn, bound=norm.bound, source="compiled")


def _wrapper_graph(norm: NormalizedGraph, plan: Plan, result: Any, shapes: dict[str, Any], put: Any,
                   no_fast: str | None, unset: frozenset[int] = frozenset()) -> tuple[dict[str, Any] | None, str | None]:
    """``(parts.wrapper_graph, build.host_code)``: a CUDA graph's wrapper as data with its kernels' launch blobs,
    validated (:func:`precompile.inductor.build.fx_wrapper.build_wrapper_graph`), and None; or None and why the
    artifact needs host code (the Python wrapper) to run.  Tried only where the fast path is offered (an
    inference graph, validated): ``no_fast`` is why it is not, else None."""
    if not any(str(d).startswith("cuda") for d in plan.devices):
        return None, "a CPU graph: its kernels are C++ shared objects"
    if no_fast is not None:
        return None, f"no fast path ({no_fast})"
    if shapes.get("symbols"):
        return None, "symbolic sizes: Inductor's FX wrapper does not express them (torch 2.11)"
    if not plan.runnable:
        return None, "its inputs cannot be run at build, so a wrapper graph could not be validated"
    from precompile.inductor.build.fx_wrapper import build_wrapper_graph

    with sdpa.priority(plan.sdpa_order):  # the attention backend the artifact's own compile used
        got = build_wrapper_graph(norm.gm, plan.compile_inputs, plan.run_inputs, plan.options, result.compiled_fn,
                                  inputs_to_check=result.inputs_to_check, mutated=result.mutated_inputs,
                                  cache_dir=result.cache_dir, tuned=result.tuned, unset=unset)
    if isinstance(got, str):
        log.info("artifact %s keeps its Python wrapper: %s", plan.key[:12], got)
        return None, got
    data, blobs = got
    return {"graph": put(data, "wrapper graph (data)"),
            "kernels": {str(i): put(b, f"wrapper graph kernel {i} (.launch)") for i, b in sorted(blobs.items())}}, None


def _output_aliases(gm: torch.fx.GraphModule) -> tuple[int, bool]:
    """``(number of outputs, whether one may alias an input)`` of the graph, from its fake values (an output
    sharing storage with a placeholder's fake value, or without a fake value at all, may)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from precompile.inductor import shapes

    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    storages = {StorageWeakRef(v.untyped_storage()) for v in shapes.fake_values(gm) if isinstance(v, torch.Tensor)}
    aliases = False
    for v in values:
        fake = v.meta.get("val", v.meta.get("example_value")) if isinstance(v, torch.fx.Node) else None
        if isinstance(v, torch.fx.Node) and not isinstance(fake, torch.Tensor):
            aliases = aliases or not isinstance(fake, (int, float, torch.SymInt))
        elif isinstance(fake, torch.Tensor) and StorageWeakRef(fake.untyped_storage()) in storages:
            aliases = True
    return len(values), aliases


def _output_kind(gm: torch.fx.GraphModule) -> str:
    """``"tuple"``, ``"list"`` or ``"single"``: what the graph's output node returns."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = out.args[0]
    return "tuple" if isinstance(value, tuple) else "list" if isinstance(value, list) else "single"
