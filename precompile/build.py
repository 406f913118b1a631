"""``precompile.standalone_compile``: FX graph + example inputs -> content-hashed, cached artifact."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import torch

from cache_backends.base import Cache, digest_bytes
from precompile import __version__, config, fingerprint
from precompile.artifact import Artifact, _safe_incr, load_from_cache, store, warn_once
from precompile.coordination import get_or_build
from precompile.errors import BuildError, CacheError, InputMismatchError, OptionsError, PrecompileError
from precompile.graph import NormalizedGraph, canonical_graph, canonical_json, graph_to_json, normalize_graph, readable_code
from precompile.manifest import Manifest

log = logging.getLogger("precompile")

DYNAMIC_SHAPES = ("from_example_inputs", "from_tracing_context", "from_graph")


def input_specs(norm: NormalizedGraph, flat_inputs: Sequence[Any], dynamic_shapes: str) -> list[dict[str, Any]]:
    """One spec per placeholder: name, kind, fqn, type, shape, stride, dtype, device, requires_grad, aligned.

    Shapes are ints, or strings naming a symbol (``"s0"``) for dims the graph keeps dynamic (only with
    ``dynamic_shapes`` ``"from_graph"``/``"from_tracing_context"``, read from the placeholder's fake value).
    ``aligned`` is whether the example tensor's data pointer is a multiple of 16 bytes.

    Raises:
        InputMismatchError: the number of example inputs differs from the number of placeholders, or an input
            is neither a tensor nor a number.
    """
    nodes = [n for n in norm.gm.graph.nodes if n.op == "placeholder"]
    if len(flat_inputs) != len(nodes):
        raise InputMismatchError(f"the graph has {len(nodes)} placeholders but {len(flat_inputs)} example inputs "
                                 f"were given; placeholders: {', '.join(n.name for n in nodes[:12])}")
    specs = []
    for node, info, value in zip(nodes, norm.placeholders, flat_inputs):
        spec: dict[str, Any] = {"name": info.name, "kind": info.kind, "fqn": info.fqn}
        if isinstance(value, torch.Tensor):
            shape: list[Any] = list(value.shape)
            stride: list[Any] = list(value.stride())
            if dynamic_shapes != "from_example_inputs":
                fake = node.meta.get("val", node.meta.get("example_value"))
                if isinstance(fake, torch.Tensor):
                    shape = [int(d) if isinstance(d, int) else str(d) for d in fake.shape]
                    stride = [int(d) if isinstance(d, int) else str(d) for d in fake.stride()]
            spec.update({
                "type": "tensor", "shape": shape, "stride": stride,
                "dtype": str(value.dtype).removeprefix("torch."), "device": value.device.type,
                "requires_grad": bool(value.requires_grad), "aligned": value.data_ptr() % 16 == 0,
            })
        elif isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat)):
            spec.update({"type": type(value).__name__.lower().removeprefix("sym"),
                         "value": value if dynamic_shapes == "from_example_inputs" and isinstance(value, (int, float))
                         else None})
        else:
            raise InputMismatchError(f"example input for placeholder {info.name!r} is a {type(value).__name__}; "
                                     "inputs must be tensors or numbers")
        specs.append(spec)
    return specs


def _key_inputs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    drop = ("name", "fqn")
    return [{k: v for k, v in s.items() if k not in drop} for s in specs]


def compute_key(factors: dict[str, Any]) -> str:
    """The artifact key: sha256 hex of the canonical JSON of ``factors``."""
    return digest_bytes(canonical_json(factors))


def prepare(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, dynamic_shapes: str,
            options: dict[str, Any] | None) -> tuple[NormalizedGraph, list[Any], dict[str, Any]]:
    """Normalize the graph and compute everything the key needs, without compiling.

    Returns:
        ``(normalized, flat_inputs, plan)``; ``plan`` holds ``key``, ``factors``, ``specs``, ``graph_json``,
        ``options`` (normalized), ``env`` (the fingerprint's key fields) and ``devices``.

    Raises:
        ValueError: ``dynamic_shapes`` is not one of the three accepted values.
        OptionsError: ``options`` names no Inductor option or holds a value a key cannot store.
        UnserializableGraphError: the graph holds a part that cannot be serialized (named in the message).
        InputMismatchError: example inputs do not line up with the placeholders.
    """
    if dynamic_shapes not in DYNAMIC_SHAPES:
        raise ValueError(f"dynamic_shapes must be one of {DYNAMIC_SHAPES}, got {dynamic_shapes!r}")
    from precompile import _inductor

    try:
        opts = _inductor.inductor_config_overrides(options)
    except (KeyError, TypeError) as err:
        raise OptionsError(str(err.args[0]) if err.args else str(err)) from err
    norm, flat = normalize_graph(gm, list(example_inputs))
    graph_json = graph_to_json(norm.gm)
    specs = input_specs(norm, flat, dynamic_shapes)
    devices = {s["device"] for s in specs if s.get("type") == "tensor"} or {"cpu"}
    env = fingerprint.environment(devices, full=False)  # key fields only; build() records the rest
    factors = {
        "format": config.FORMAT_VERSION,
        "graph": digest_bytes(canonical_json(canonical_graph(graph_json))),
        "inputs": _key_inputs(specs),
        "options": opts,
        "env": fingerprint.key_fields(env),
        "dynamic_shapes": dynamic_shapes,
        "calling": [norm.in_spec, norm.out_spec],
    }
    plan = {"key": compute_key(factors), "factors": factors, "specs": specs, "graph_json": graph_json,
            "options": opts, "env": env, "devices": devices}
    return norm, flat, plan


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                       dynamic_shapes: str = "from_example_inputs", options: dict[str, Any] | None = None,
                       cache: str | Cache | None = None) -> Artifact:
    """Compile an FX graph with Inductor into a content-hashed :class:`~precompile.artifact.Artifact`.

    Args:
        gm: a ``GraphModule`` from Dynamo (a ``torch.compile`` backend's graph, parameters lifted as inputs),
            ``make_fx``, or ``torch.export(...).module()``.  Not modified.
        example_inputs: what ``gm`` is called with: tensors (any dtype/device) and ints.
        dynamic_shapes: as ``torch._inductor.standalone_compile``: ``"from_example_inputs"`` specializes on
            the example shapes; ``"from_graph"`` keeps the graph's symbolic shapes; ``"from_tracing_context"``
            uses the ambient tracing context's (inside a ``torch.compile`` backend).
        options: Inductor config patches, as ``torch.compile(options=...)``, e.g. ``{"max_autotune": True}``.
        cache: a cache URL or open cache.  Given, this is get-or-build: a hit loads the stored artifact and
            runs no Inductor compile; a miss compiles and stores.  With a cache that has build leases (Redis,
            or tiered in front of Redis), one worker of a fleet compiles a key while the others wait for it
            (:func:`precompile.coordination.get_or_build`; ``art.outcome`` says which happened).  Cache failures
            only cost the cache: the call then compiles here.

    Returns:
        a callable artifact: ``art(*example_inputs)`` returns what ``gm(*example_inputs)`` returns.

    Raises:
        ValueError: bad ``dynamic_shapes``; OptionsError: bad ``options``.
        UnserializableGraphError: a node holds something an artifact cannot store (nothing is written).
        InputMismatchError: example inputs do not line up with the graph's placeholders.
        BuildError: Inductor failed; its exception is chained.
    """
    from cache_backends.registry import open_cache

    config.engine_mode()  # a bad PRECOMPILE_ENGINE is the caller's error, not a failed load to rebuild over
    norm, flat, plan = prepare(gm, example_inputs, dynamic_shapes=dynamic_shapes, options=options)
    key = plan["key"]
    c = None
    if cache is not None:
        try:
            c = open_cache(cache)
        except CacheError as err:
            log.warning("cache %s cannot be opened (%s); compiling without it", cache, err)
    if c is None:
        return build(norm, flat, plan, dynamic_shapes=dynamic_shapes)

    def load_stored() -> Artifact | None:
        start = time.perf_counter()
        # the key was computed here, from this environment: no need to compare fingerprints again
        art = load_from_cache(key, c, bound=norm.bound, check_env=False)
        if art is None:
            return None
        try:
            art.engine  # build the callable now, so the load time is honest and failures are a miss
        except Exception as err:  # noqa: BLE001 - a stored artifact that does not load is rebuilt
            warn_once(c, f"artifact {key[:12]} from {c.url} failed to load ({type(err).__name__}: {err}); "
                         "rebuilding it", kind="engine load")
            _safe_incr(c, errors=1)
            return None
        art.load_seconds = time.perf_counter() - start
        log.info("cache hit %s (%s) in %.3f s", key[:12], c.url, art.load_seconds)
        return art

    def build_and_store() -> Artifact:
        art = build(norm, flat, plan, dynamic_shapes=dynamic_shapes)
        _safe_incr(c, builds=1)
        if store(c, art):
            log.info("stored %s in %s (%d bytes)", key[:12], c.url, art.manifest.total_bytes())
        return art

    art, outcome = get_or_build(c, key, load_stored, build_and_store)
    if outcome == "hit":
        _safe_incr(c, hits=1)
    art.outcome = outcome
    return art


def build(norm: NormalizedGraph, flat: list[Any], plan: dict[str, Any], *, dynamic_shapes: str) -> Artifact:
    """Run Inductor on a prepared graph and assemble the artifact (manifest + blobs).  See :func:`prepare`.

    Raises:
        BuildError: Inductor failed or produced nothing that can be stored.
    """
    from precompile import _inductor

    log.info("compiling %s (%d placeholders)", plan["key"][:12], len(plan["specs"]))
    try:
        result = _inductor.compile_graph(norm.gm, flat, dynamic_shapes=dynamic_shapes, options=plan["options"])
    except _inductor.NotSaveableError as err:
        raise BuildError(f"Inductor compiled the graph but it cannot be stored: {err}") from err
    except PrecompileError:
        raise
    except Exception as err:
        raise BuildError(f"Inductor failed to compile the graph: {type(err).__name__}: {err}") from err

    blobs: dict[str, bytes] = {}
    roles: dict[str, dict[str, Any]] = {}

    def put(data: bytes, role: str) -> str:
        d = digest_bytes(data)
        blobs[d] = data
        roles.setdefault(d, {"size": len(data), "role": role})
        return d

    graph_text = canonical_json(plan["graph_json"])
    parts: dict[str, Any] = {
        "fx_graph": {"code": put(readable_code(norm.gm).encode(), "fx graph code"),
                     "graph": put(graph_text, "fx graph (serialized)")},
        "engine_payload": put(result.engine_payload, "engine payload (Inductor cache entries)"),
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
    for i, spec in enumerate(plan["specs"]):
        if spec.get("type") != "tensor":
            continue
        assumed = i in result.inputs_to_check
        alignment.append({"index": i, "name": spec["name"], "aligned_at_build": spec["aligned"],
                          "inductor_assumes_aligned": assumed,
                          "at_run_time": "checked; cloned if misaligned" if assumed else "no assumption"})
    manifest = Manifest(
        key=plan["key"], factors=plan["factors"], placeholders=plan["specs"], parts=parts, kernels=kernels,
        autotune={"kernels": {k["name"]: k["config"] for k in kernels if k["config"]}, "other": result.autotune},
        alignment=alignment, env=fingerprint.environment(plan["devices"]), blobs=roles,
        build={"seconds": round(result.compile_seconds, 3), "created": datetime.now(timezone.utc).isoformat(),
               "precompile": __version__, "mutated_inputs": result.mutated_inputs,
               "inductor_files": len(result.cache_files)},
        calling={"in_spec": norm.in_spec, "out_spec": norm.out_spec, "outputs": _output_kind(norm.gm)},
    )
    engine = result.compiled_fn
    fast = _inductor.fast_plan(result, flat)
    if fast is not None:  # the wrapper as the fast path runs it, imports replaced: loads skip the rewrite
        fast["source"] = put(fast["source"].encode(), "fast wrapper (imports replaced)")
    manifest.parts["fast"] = fast
    if manifest.parts["fast"] is None:
        log.info("artifact %s loads through the portable path only", plan["key"][:12])
    return Artifact(manifest, blobs, engine=engine, bound=norm.bound, source="compiled")


def _output_kind(gm: torch.fx.GraphModule) -> str:
    """``"tuple"``, ``"list"`` or ``"single"``: what the graph's output node returns."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = out.args[0]
    return "tuple" if isinstance(value, tuple) else "list" if isinstance(value, list) else "single"
