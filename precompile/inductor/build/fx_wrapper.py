"""Inductor's FX wrapper: the host side of a compiled graph as an FX graph (seed ``wrapper_fxir.py``).

With ``config.fx_wrapper``, Inductor's ``WrapperFxCodegen`` converts its wrapper IR into a ``GraphModule``
(``FxConverter``): buffers from ``torch.empty_strided``, views from ``torch.as_strided``, library calls as ATen
``.out`` overloads, Triton kernels as ``triton_kernel_wrapper_mutation`` nodes over a kernel side table.
:func:`wrapper_graph` compiles a graph that way and returns that ``GraphModule``;
:mod:`precompile.manifest.wrapper.graph` stores it as data.

What Inductor's converter lacks (found on torch 2.11 and 2.13): C++ kernels (a CPU graph with any fused kernel),
subgraphs, and, on 2.11, symbolic sizes (``vr must not be None``), user Triton kernels and Triton GEMM templates
(``RecursionError``).  Such a graph raises :class:`NotExpressible` with Inductor's reason.  The FX wrapper has no
cache support in Inductor (``supports_caching = False``), so this compile is separate from the one whose cache
entries an artifact carries.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch

from precompile.inductor import shim

_LOCK = threading.Lock()


class NotExpressible(Exception):
    """Inductor's FX wrapper cannot express this graph (the message says why)."""


def wrapper_graph(gm: torch.fx.GraphModule, example_inputs: list[Any],
                  options: dict[str, Any] | None = None) -> tuple[torch.fx.GraphModule, Any, dict[int, Any]]:
    """Compile ``gm`` with Inductor's FX wrapper.

    Args:
        gm: the graph (as :func:`precompile.standalone_compile` normalizes it).
        example_inputs: its example inputs (real tensors; SymInts where the graph is symbolic).
        options: Inductor config patches, besides ``fx_wrapper``.

    Returns:
        ``(wrapper graph, compiled callable, kernels)``: the ``GraphModule`` the converter produced, what Inductor
        returned for ``gm`` (the same graph, run by FX), and ``{kernel_idx: CachingAutotuner}`` of the Triton
        kernels its launch nodes name (:func:`launch_records` turns them into cubins and launch records).

    Raises:
        NotExpressible: the converter refused or failed on the graph, or produced none.
    """
    codegen, converter = shim.fx_wrapper_classes()
    captured: list[torch.fx.GraphModule] = []
    converters: list[Any] = []
    original = codegen.compile_graph
    generate = converter.generate

    def capture(self: Any, graph: torch.fx.GraphModule) -> Any:
        captured.append(graph)
        return original(self, graph)

    def capture_converter(self: Any) -> Any:
        converters.append(self)
        return generate(self)

    with _LOCK:
        codegen.compile_graph = capture
        converter.generate = capture_converter
        try:
            # with no FX graph or AOTAutograd cache: an entry of the Python wrapper's compile must not stand in
            # for this one (the autotune picks in the cache dir are what it may reuse); compile_fx rewrites the
            # graph it gets: a copy
            with torch.no_grad():
                compiled = shim.compile_fx_wrapper(copy.deepcopy(gm), example_inputs, options or {})
        except Exception as err:  # noqa: BLE001 - any converter failure means "not expressible", with its reason
            cause = err.__cause__ or err
            raise NotExpressible(f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}") from err
        finally:
            codegen.compile_graph = original
            converter.generate = generate
    if len(captured) != 1 or len(converters) != 1:
        raise NotExpressible(f"Inductor's FX wrapper produced {len(captured)} wrapper graphs, not one")
    kernels = {k.wrapped.kernel_idx: k.tuner for k in converters[0].kernels.values()}
    return captured[0], compiled, kernels


def launch_records(kernels: dict[int, Any]) -> dict[int, tuple[dict[str, Any], bytes]]:
    """``{kernel_idx: (launch record, cubin)}`` for the Triton kernels of a wrapper graph.

    The FX converter launches each kernel with its first compiled config (``compile_results[0]``; it tunes
    nothing unless ``triton.autotune_at_compile_time``) and passes every argument by name, grid included, so a
    record names the arguments in signature order (``params``), those that reach the cubin (``passed``), their
    type codes and the launch constants; its ``grid`` is empty (each launch node carries its grid).

    Raises:
        NotExpressible: a kernel has no compiled config, or the static launcher cannot launch it.
    """
    from precompile.inductor.build.cuda_pack import NotFast, _static_from_compiled
    from precompile.inductor.load.cuda_runtime import LAUNCH_FORMAT

    out = {}
    for idx, tuner in kernels.items():
        results = list(getattr(tuner, "compile_results", None) or [])
        binary = getattr(results[0], "kernel", None) if results else None
        if binary is None:
            raise NotExpressible(f"Triton kernel {idx} has no compiled config")
        try:
            static, cubin = _static_from_compiled(binary)
        except NotFast as err:
            raise NotExpressible(f"Triton kernel {static_name(binary)}: {err}") from err
        constexprs = {int(i) for i in static.full_constexprs}
        names = list(static.arg_names)
        scratch = int(bool(getattr(static, "has_global_scratch", False))) + int(
            bool(getattr(static, "has_profile_scratch", False)))
        device = (getattr(tuner, "triton_meta", None) or {}).get("device", 0)
        out[int(idx)] = ({
            "format": LAUNCH_FORMAT, "name": static.name, "device": int(getattr(device, "index", device) or 0),
            "params": names, "passed": [a for i, a in enumerate(names) if i not in constexprs],
            "arg_tys": static.arg_tys + "O" * scratch, "scratch": scratch, "grid": [],
            "num_warps": int(static.num_warps), "shared": int(static.shared)}, cubin)
    return out


def static_name(binary: Any) -> str:
    """A compiled Triton kernel's name, for messages."""
    return str(getattr(getattr(binary, "metadata", None), "name", "?"))


def stored_graph(graph: torch.fx.GraphModule) -> bytes | str:
    """The wrapper graph's JSON as an artifact stores it, or why it cannot be stored: a target outside the
    allow-list (an extern kernel Inductor calls that :mod:`precompile.manifest.wrapper.ops` does not list, such as
    ``aten::topk``), or arguments outside the format; the message names the node."""
    import json

    from precompile.manifest.wrapper import graph as wg

    try:
        return json.dumps(wg.to_data(graph), sort_keys=True).encode()
    except wg.WrapperGraphError as err:
        return f"the wrapper graph is outside the allow-list: {' '.join(str(err).split())[:300]}"


def build_wrapper_graph(gm: torch.fx.GraphModule, compile_inputs: list[Any], run_inputs: list[Any],
                        options: dict[str, Any] | None, reference: Any, *, inputs_to_check: list[int],
                        mutated: list[int], cache_dir: str | None = None,
                        tuned: list[dict[str, Any]] | None = None,
                        unset: frozenset[int] = frozenset()) -> tuple[bytes, dict[int, bytes]] | str:
    """A GPU graph's wrapper as data, validated: ``(wrapper graph JSON, {kernel_idx: .launch blob})``, or why
    the artifact keeps the Python wrapper.

    The graph is compiled again with Inductor's FX wrapper, stored as data, loaded
    exactly as a worker would load it (:func:`precompile.inductor.load.graph_engine.load_graph`) and run on copies of
    ``run_inputs``; its outputs and the inputs it writes to must equal ``reference``'s (the fresh compile whose
    artifact this is) bit for bit.

    Args:
        compile_inputs: what Inductor compiles for; run_inputs: the same with concrete sizes.
        reference: the fresh compile's callable (flat inputs in, outputs out).
        cache_dir: the reference compile's private cache dir (:attr:`BuildResult.cache_dir`), compiled in again,
            so that Inductor's on-disk autotune results of the first compile (``.best_config`` files, its local
            autotune cache) are where this compile looks; whether a kernel finds its entry depends on Inductor's
            cache key for it (not verified per kernel).  None: a fresh dir.  The FX converter launches a kernel's
            first compiled config: where that is not the reference's pick, the bit-equality check keeps the
            Python wrapper.
        tuned: the reference compile's GEMM/convolution benchmark records (:attr:`BuildResult.tuned`), replayed
            so that each tuned op takes the reference's pick (:func:`precompile.inductor.build.picks.replaying`).
        unset: outputs the graph never writes (:func:`precompile.inductor.build.runs.unset_outputs`): layout only.
    """
    from precompile.inductor.build import picks, runs
    from precompile.inductor.build.compile import _build_cache_dir
    from precompile.inductor.load import graph_engine
    from precompile.inductor.load.cuda_runtime import pack_launch

    try:
        with _build_cache_dir(cache_dir), picks.replaying(tuned or []):
            graph, _, kernels = wrapper_graph(gm, compile_inputs, options)
        launches = [n for n in graph.graph.nodes if n.op == "call_function" and "triton_kernel" in str(n.target)]
        if any(shim.triton_side_table_constants(n.kwargs["constant_args_idx"]) for n in launches):
            return "a Triton launch carries side-table constants, which the wrapper graph does not store"
        data = stored_graph(graph)
        if isinstance(data, str):
            return data
        blobs = {i: pack_launch(record, cubin) for i, (record, cubin) in launch_records(kernels).items()}
        fn = graph_engine.load_graph(data, blobs, inputs_to_check=inputs_to_check, mutated=mutated)
    except NotExpressible as err:
        return f"Inductor's FX wrapper cannot express it: {err}"
    except Exception as err:  # noqa: BLE001 - anything else only loses the no-host-code form
        return f"the wrapper graph failed to build or load ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
    a, b = runs.inputs_for_run(run_inputs, set(mutated)), runs.inputs_for_run(run_inputs, set(mutated))
    try:
        with torch.no_grad():
            got, want = fn(*a), reference(*b)
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        return f"the wrapper graph failed on the example inputs ({type(err).__name__}: {str(err)[:200]})"
    why = runs.same_values(list(got), list(want), unset) or runs.same_values(
        [a[i] for i in mutated], [b[i] for i in mutated])
    if why:
        return f"the wrapper graph's results differ from the fresh compile's ({why}): its kernels' configs are not " \
               "the ones the Python wrapper picked"
    return data, blobs
