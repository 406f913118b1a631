"""What a compile will be, computed without compiling: the normalized graph, input specs, and the artifact key.

The key is the sha256 of the canonical JSON of its factors (DESIGN.md, "Keys"); :func:`prepare` computes them
and :class:`Plan` carries them to the build.  A cache hit needs nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cache_backends.base import digest_bytes
from precompile import config
from precompile.errors import InputMismatchError, OptionsError
from precompile.key import fingerprint, passes, sdpa
from precompile.key.ambient import ambient_state
from precompile.key.graph import NormalizedGraph, canonical_graph, canonical_json, graph_to_json, normalize_graph

DYNAMIC_SHAPES = ("from_example_inputs", "from_tracing_context", "from_graph")


@dataclass
class Plan:
    """A prepared compile.

    Attributes:
        key: the artifact key (64 hex).
        factors: what the key hashes (see :class:`~precompile.manifest.manifest.Manifest`).
        specs: one input spec per placeholder.
        graph_json: the serialized graph.
        options: normalized Inductor config patches.
        inductor_config: canonical JSON of Inductor's effective config (a part of the artifact).
        env: the fingerprint's key fields; devices: device types of the graph's tensors.
        symbols: the size symbols (:class:`precompile.inductor.shapes.Symbols`), or None for a static graph.
        fake_values: each placeholder's fake value (for the size guards after the compile).
        compile_inputs: what Inductor compiles for (SymInts kept for a symbolic graph).
        run_inputs: the inputs with every size concrete (what a build runs the compiled graph on).
        dynamic_shapes: the mode passed to Inductor.
        runnable: whether the example inputs may be run (see ``standalone_compile``).
        size_range: ``(lower, upper)`` the caller vouches for on every size symbol of the graph, or None.
        rewrites: how many nodes each rewrite changed before the key, by name (:mod:`precompile.key.passes`; and
            ``sdpa_fast_start``: SDPA calls compiled with flash attention ahead of cuDNN, :mod:`precompile.key.sdpa`).
        sdpa_order: the SDPA priority order the graph is compiled under (backend names), or None for torch's as
            it stands.
    """

    key: str
    factors: dict[str, Any]
    specs: list[dict[str, Any]]
    graph_json: dict[str, Any]
    options: dict[str, Any]
    inductor_config: bytes
    env: dict[str, Any]
    devices: set[str]
    symbols: Any
    fake_values: list[Any]
    compile_inputs: list[Any]
    run_inputs: list[Any]
    dynamic_shapes: str
    runnable: bool = True
    size_range: tuple[int, int | None] | None = None
    rewrites: dict[str, int] = field(default_factory=dict)
    sdpa_order: list[str] | None = None


def compute_key(factors: dict[str, Any]) -> str:
    """The artifact key: sha256 hex of the canonical JSON of ``factors``."""
    return digest_bytes(canonical_json(factors))


def concrete(value: Any, name: str) -> Any:
    """``value`` with a SymInt replaced by its example value.

    Raises:
        InputMismatchError: a SymInt without an example value (an unbacked size).
    """
    if isinstance(value, torch.SymInt):
        from precompile.inductor.shim import symbol_hint

        hint = symbol_hint(value)
        if hint is None:
            raise InputMismatchError(f"example input for placeholder {name!r} is a SymInt with no example value; "
                                     "pass an int")
        return hint
    return value


def input_specs(norm: NormalizedGraph, flat_inputs: Sequence[Any], symbols: Any,
                fake_values: list[Any]) -> list[dict[str, Any]]:
    """One spec per placeholder: name, kind, fqn, type; tensors: shape, stride, dtype, device, requires_grad,
    aligned; numbers: ``value`` (specialized) or ``size`` (an expression over size symbols).

    For a symbolic graph (``symbols`` given), sizes are read from the placeholders' fake values and written as
    ints or expressions over canonical symbols (``"s0"``, ``"16*s0"``); otherwise from the example inputs.
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
    for info, value, fake in zip(norm.placeholders, flat_inputs, fake_values):
        spec: dict[str, Any] = {"name": info.name, "kind": info.kind, "fqn": info.fqn}
        if isinstance(value, torch.Tensor):
            shape: list[Any] = list(value.shape)
            stride: list[Any] = list(value.stride())
            if symbols is not None and isinstance(fake, torch.Tensor):
                shape = [symbols.text(d) for d in fake.shape]
                stride = [symbols.text(d) for d in fake.stride()]
            spec.update({
                "type": "tensor", "shape": shape, "stride": stride,
                "dtype": str(value.dtype).removeprefix("torch."), "device": value.device.type,
                "requires_grad": bool(value.requires_grad), "aligned": value.data_ptr() % 16 == 0,
            })
            if value.device.type == "cuda":
                # Inductor compiles for one GPU (its wrapper and launch records name the device), so an artifact
                # built on cuda:1 is another artifact than cuda:0's.  Keyed on every GPU, cuda:0 included: a key
                # without it (before format 3's device index) may hold a tensor-parallel rank's cuda:1 build
                spec["device_index"] = int(value.device.index or 0)
        elif isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat)):
            kind = "bool" if isinstance(value, bool) else "float" if isinstance(value, (float, torch.SymFloat)) else "int"
            spec["type"] = kind
            sym = fake if isinstance(fake, torch.SymInt) else value if isinstance(value, torch.SymInt) else None
            size = symbols.text(sym) if symbols is not None and sym is not None else None
            if isinstance(size, str):
                spec.update({"size": size, "value": None})
            else:
                spec["value"] = concrete(value, info.name)
        else:
            raise InputMismatchError(f"example input for placeholder {info.name!r} is a {type(value).__name__}; "
                                     "inputs must be tensors or numbers")
        specs.append(spec)
    return specs


def _key_inputs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    drop = ("name", "fqn")
    return [{k: v for k, v in s.items() if k not in drop} for s in specs]


def prepare(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, dynamic_shapes: str,
            options: dict[str, Any] | None, key_extra: dict[str, Any] | None = None,
            runnable: bool = True, size_range: tuple[int, int | None] | None = None) -> tuple[NormalizedGraph, Plan]:
    """Normalize the graph and compute everything the key needs, without compiling.

    Raises:
        ValueError: ``size_range`` is given for a graph without symbolic sizes, or is not a range.
        TypeError: ``key_extra`` holds a value JSON cannot.
        ValueError: ``dynamic_shapes`` is not one of the three accepted values.
        OptionsError: ``options`` names no Inductor option or holds a value a key cannot store.
        ConfigError: ``PRECOMPILE_REWRITES`` holds a value precompile does not accept.
        UnserializableGraphError: the graph holds a part that cannot be serialized (named in the message).
        InputMismatchError: example inputs do not line up with the placeholders.
    """
    if dynamic_shapes not in DYNAMIC_SHAPES:
        raise ValueError(f"dynamic_shapes must be one of {DYNAMIC_SHAPES}, got {dynamic_shapes!r}")
    from precompile.inductor import options as inductor_options
    from precompile.inductor import shapes

    try:
        opts = inductor_options.with_workarounds(inductor_options.inductor_config_overrides(options))
        effective = inductor_options.effective_config(opts)
    except (KeyError, TypeError) as err:
        raise OptionsError(str(err.args[0]) if err.args else str(err)) from err
    norm, flat = normalize_graph(gm, list(example_inputs))
    # made before the key, so that the key describes the graph that compiles
    rewrite = config.rewrites_enabled()
    outer = passes.outer_products_as_mul(norm.gm) if rewrite else 0
    graph_json = graph_to_json(norm.gm)
    fakes = shapes.fake_values(norm.gm)
    symbols = shapes.symbols_of(fakes) if dynamic_shapes != "from_example_inputs" else None
    specs = input_specs(norm, flat, symbols, fakes)
    ranges = dict(symbols.ranges) if symbols else {}
    if size_range is not None:
        lo, hi = size_range
        if symbols is None:
            raise ValueError(f"size_range applies to a graph with symbolic sizes; this one has none (with "
                             f"dynamic_shapes={dynamic_shapes!r})")
        if not (isinstance(lo, int) and lo >= 0 and (hi is None or (isinstance(hi, int) and hi >= lo))):
            raise ValueError(f"size_range must be (lower, upper) with 0 <= lower <= upper, got {size_range!r}")
        ranges = {name: [lo, hi] for name in symbols.ranges}
    run_inputs = [concrete(x, s["name"]) for x, s in zip(flat, specs)]
    devices = {s["device"] for s in specs if s.get("type") == "tensor"} or {"cpu"}
    attention = sdpa.sdpa_calls(norm.gm)
    torch_order = sdpa.settled_order() if attention and "cuda" in devices else None
    sdpa_order = sdpa.fast_start_order(torch_order) if torch_order and rewrite else torch_order
    rewrites = {"outer_products_as_mul": outer, "sdpa_fast_start": attention if sdpa_order != torch_order else 0}
    env = fingerprint.environment(devices, full=False)  # key fields only; the build records the rest
    inductor_config = canonical_json(effective)
    threads_fixed = int(effective.get("cpp.threads", -1) or -1) >= 1 or bool(effective.get("cpp.dynamic_threads"))
    factors = {
        "format": config.FORMAT_VERSION,
        "graph": digest_bytes(canonical_json(canonical_graph(graph_json))),
        "inputs": _key_inputs(specs),
        "symbols": {name: ranges[name] for name in sorted(ranges)},
        "options": opts,
        "inductor_config": digest_bytes(inductor_config),
        "ambient": ambient_state(devices, threads_fixed, bool(attention), sdpa_order),
        "env": fingerprint.key_fields(env),
        "dynamic_shapes": "symbolic" if symbols else "static",
        "calling": [norm.in_spec, norm.out_spec],
        "extra": _jsonable_extra(key_extra),
    }
    plan = Plan(key=compute_key(factors), factors=factors, specs=specs, graph_json=graph_json, options=opts,
                inductor_config=inductor_config, env=env, devices=devices, symbols=symbols, fake_values=fakes,
                compile_inputs=flat if symbols else run_inputs, run_inputs=run_inputs,
                dynamic_shapes=dynamic_shapes, runnable=runnable, size_range=size_range,
                rewrites={name: n for name, n in rewrites.items() if n}, sdpa_order=sdpa_order)
    return norm, plan


def _jsonable_extra(extra: dict[str, Any] | None) -> dict[str, Any]:
    try:
        canonical_json(extra or {})
    except (TypeError, ValueError) as err:
        raise TypeError(f"key_extra must hold JSON values (str, int, float, bool, None, lists, dicts): {err}") from err
    return dict(extra or {})
