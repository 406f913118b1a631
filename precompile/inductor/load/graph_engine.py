"""The no-host-code engine: a GPU artifact's wrapper graph (data) run with its Triton kernels' cubins (data).

A load builds the callable from the stored wrapper graph (:mod:`precompile.manifest.wrapper.graph`: checked against
the allow-list; :mod:`precompile.manifest.wrapper.codegen`: code generated from it) and the kernels' ``.launch``
blobs (:mod:`precompile.inductor.load.cuda_runtime`: records checked, cubins to the CUDA driver).  Nothing the
artifact carries is executed, imported or dlopen'd host-side.  Like the fast path it imports neither Inductor,
Dynamo, Triton nor sympy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cache_backends.bounded import loads_json
from precompile.manifest.wrapper import codegen as wrapper_codegen
from precompile.manifest.wrapper import graph as wrapper_graph
from precompile.inductor.load import cuda_runtime, runtime

#: Largest stored wrapper graph read, bytes (a large model's is well under 1 MiB).
MAX_GRAPH_BYTES = 8 << 20
#: Largest launch blob (launch record + cubin) read, bytes (a Triton kernel's cubin is tens to hundreds of KiB).
MAX_LAUNCH_BYTES = 32 << 20


def load_graph(graph: bytes, launches: dict[int, bytes], *, inputs_to_check: list[int] = (),
               mutated: list[int] = ()) -> Callable[..., tuple[Any, ...]]:
    """``fn(*flat_inputs) -> tuple of outputs`` from a verified wrapper graph and its kernels' launch blobs.

    Args:
        graph: the wrapper graph's JSON (:func:`precompile.manifest.wrapper.graph.to_data`), digest already checked.
        launches: ``{kernel_idx: .launch blob}`` of the kernels its launch nodes name.
        inputs_to_check, mutated: as :func:`precompile.inductor.load.runtime.load_fast` (alignment copies).

    Raises:
        WrapperGraphError: the graph is larger than :data:`MAX_GRAPH_BYTES`, not JSON, or outside the format.
        ValueError: a launch blob is larger than :data:`MAX_LAUNCH_BYTES` or malformed
            (:func:`~precompile.inductor.load.cuda_runtime.read_launch`), or a launch node names a kernel without one.
    """
    if len(graph) > MAX_GRAPH_BYTES:
        raise wrapper_graph.WrapperGraphError(f"a wrapper graph of {len(graph)} bytes, more than {MAX_GRAPH_BYTES}")
    big = [i for i, blob in launches.items() if len(blob) > MAX_LAUNCH_BYTES]
    if big:
        raise ValueError(f"the launch blob of kernel {big[0]} is over {MAX_LAUNCH_BYTES} bytes")
    try:
        data = loads_json(graph, MAX_GRAPH_BYTES, "the wrapper graph")
    except ValueError as err:  # not JSON, or nested deeper than the JSON bound (InputLimitError)
        raise wrapper_graph.WrapperGraphError(f"the wrapper graph is not JSON (or nested too deep): {err}") from err
    wrapper_graph.check(data)
    named = {n["kwargs"]["kernel_idx"] for n in data["nodes"]
             if n["op"] == "call_function" and n["target"] == {"hop": wrapper_graph.TRITON_LAUNCH}}
    missing = named - set(launches)
    if missing:
        raise ValueError(f"the wrapper graph launches kernels {sorted(missing)} that carry no launch blob")
    kernels = {i: cuda_runtime.TritonKernel(*cuda_runtime.read_launch(blob, f"kernel {i}"), grid_launcher=False)
               for i, blob in launches.items() if i in named}
    fn = wrapper_codegen.build(data, cuda_runtime.GraphLaunch(kernels))
    single = _single_output(data)

    def call(flat: list[Any]) -> tuple[Any, ...]:
        out = fn(*flat)
        return (out,) if single else tuple(out)

    return runtime.wrap_call(call, inputs_to_check=list(inputs_to_check), mutated=list(mutated))


def _single_output(data: dict[str, Any]) -> bool:
    """Whether the graph returns one value rather than a list or tuple of them (the FX converter returns a
    single output unwrapped)."""
    args = data["nodes"][-1]["args"]
    out = args[0] if args else None
    return not (isinstance(out, list) or (isinstance(out, dict) and "$tuple" in out))
