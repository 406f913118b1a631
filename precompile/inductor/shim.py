"""The version shim: every access to a private Inductor, AOTAutograd, ShapeEnv, launcher or dispatch API, one
function each (what ``precompile.inductor.dynamo`` patches in Dynamo is its own: README.md in this package).

precompile supports torch 2.11 (the GPU machine) through 2.13 (CI).  Where those versions differ, the difference
is handled here and nowhere else; the rest of ``precompile.inductor`` calls these functions.  A torch upgrade
starts by running the test suite and fixing what breaks in this file (see README.md in this package).

Functions that the load path uses (:func:`static_cuda_launcher`, :func:`launcher_function_handle`,
:func:`current_raw_stream`, :func:`set_pyobject_tensor_data_ptr`, :func:`tensor_guards_class`,
:func:`dispatch_mode_class`) import nothing from ``torch._inductor`` or ``torch._dynamo``: a fast load must not.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

#: Inductor's allocation alignment of planned buffers, bytes (``torch._inductor.utils.ALIGN_BYTES``).
ALIGN_BYTES = 64

#: What the fast path puts in place of each ``from torch._inductor... import name`` of a wrapper module:
#: ``(module, name) -> attribute of the fast runtime``.  A wrapper importing anything else is not run fast.
FAST_IMPORTS = {
    ("torch._inductor.hooks", "run_intermediate_hooks"): "run_intermediate_hooks",
    ("torch._inductor.utils", "maybe_profile"): "maybe_profile",
    ("torch._inductor.codegen.memory_planning", "_align"): "align",
    ("torch._inductor.async_compile", "AsyncCompile"): "AsyncCompile",
    ("torch._inductor.select_algorithm", "extern_kernels"): "extern_kernels",
    ("torch._inductor.runtime.triton_heuristics", "start_graph"): "noop",
    ("torch._inductor.runtime.triton_heuristics", "end_graph"): "noop",
}


# ------------------------------------------------------------------------------------------------ config
def config_entries() -> dict[str, Any]:
    """``{dotted name: config entry}`` of every Inductor config option (entries have a ``default``)."""
    from torch._inductor import config

    return config._config


def effective_config(patches: dict[str, Any]) -> dict[str, Any]:
    """Inductor's effective config with ``patches`` applied, as Inductor's own FX graph cache key sees it
    (``save_config_portable``: options that only name paths, thread pools or logging are left out), remembered per
    state of the config (:mod:`precompile.inductor.config_state`)."""
    from torch._inductor import config

    from precompile.inductor import config_state

    def compute() -> dict[str, Any]:
        with config.patch(patches):
            return config.save_config_portable()

    return config_state.remembered(config, patches, compute)


# ----------------------------------------------------------------------------------------------- compile
def clear_caches() -> None:
    """Forget Inductor's in-memory code caches, so that the next compile reads nothing built earlier."""
    from torch._inductor.utils import clear_caches as clear

    clear()


def tracing_fakes(example_inputs: list[Any]) -> list[Any]:
    """Inside a Dynamo backend: each real tensor of ``example_inputs`` as Dynamo's own fake of it.

    ``standalone_compile(dynamic_shapes="from_tracing_context")`` reuses Dynamo's fake mode but opens a new
    ``TracingContext``, which forgets how Dynamo fakified each input (its ``tensor_to_context``).  AOTAutograd
    then fakifies the real inputs afresh: every size of every parameter becomes a new symbol of Dynamo's shape
    environment, with no source, and Dynamo's guards for the frame fail to build (or a float Dynamo left
    unspecialized loses its value's symbol, and its ``.item()`` is a data-dependent error).  Fakified here with
    Dynamo's symbolic context and source, each input is the tensor Dynamo traced.  Outside a Dynamo backend, or for
    a tensor Dynamo did not fakify, the input is returned as it is.
    """
    context = torch._guards.TracingContext.try_get()
    if context is None or context.fake_mode is None:
        return list(example_inputs)
    out = []
    for x in example_inputs:
        symbolic = context.tensor_to_context.get(x) if isinstance(x, torch.Tensor) else None
        if symbolic is None:
            out.append(x)
            continue
        out.append(context.fake_mode.from_tensor(x, symbolic_context=symbolic, source=symbolic.tensor_source))
    return out


def asks_dynamo_restart(err: BaseException) -> bool:
    """Whether ``err`` is Dynamo's request to trace the frame again (``RestartAnalysis``; e.g. AOTAutograd's
    ``TensorifyScalarRestartAnalysis`` for a float it specializes), which a backend must let through."""
    from torch._dynamo.exc import RestartAnalysis

    return isinstance(err, RestartAnalysis)


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: list[Any], dynamic_shapes: str,
                       config_patches: dict[str, Any]) -> tuple[Any, bytes | None, list[str]]:
    """Run ``torch._inductor.standalone_compile`` (inputs fakified as Dynamo did, see :func:`tracing_fakes`).

    Returns:
        ``(compiled callable, serialized cache artifacts or None, AOTAutograd cache keys)``; the callable takes
        the flat inputs as positional arguments.
    """
    # torch's ``options`` are compile_fx keyword arguments; config patches go in ``config_patches``
    if dynamic_shapes == "from_tracing_context":
        example_inputs = tracing_fakes(example_inputs)
    from torch._functorch import config as functorch_config

    # torch 2.11: the backward of a training graph compiled now, not at its first call; its AOTAutograd cache saves a
    # training graph's entry only once its backward is compiled, so without this a training graph had no entry to
    # store (2.12 and later store both without it)
    eager_backward = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 12)
    with functorch_config.patch(force_non_lazy_backward_lowering=eager_backward):
        art = torch._inductor.standalone_compile(gm, example_inputs, dynamic_shapes=dynamic_shapes,
                                                 options={"config_patches": dict(config_patches)})
    artifacts = getattr(art, "_artifacts", None)
    if artifacts is None:
        return art._compiled_fn, None, []
    payload, cache_info = artifacts
    return art._compiled_fn, payload, list(cache_info.aot_autograd_artifacts)


def load_cache_entries(aot_key: str, cache_bytes: bytes) -> Any:
    """The compiled callable of AOTAutograd cache entry ``aot_key`` after loading ``cache_bytes`` (what
    ``CompiledArtifact.load`` does)."""
    torch.compiler.load_cache_artifacts(cache_bytes)
    from torch._inductor.standalone_compile import CacheCompiledArtifact

    return CacheCompiledArtifact._load_impl(contextlib.nullcontext(), aot_key)._compiled_fn


def loaded_wrapper_modules() -> list[Any]:
    """Every wrapper ("output code") module Inductor loaded in this process, oldest first."""
    from torch._inductor.codecache import PyCodeCache

    mods = list(getattr(PyCodeCache, "modules", None) or [])
    return mods + list((getattr(PyCodeCache, "modules_no_attr", None) or {}).values())


def extern_kernel(name: str) -> Any:
    """The object a wrapper's ``extern_kernels.<name>`` refers to, or None."""
    from torch._inductor.select_algorithm import extern_kernels

    return getattr(extern_kernels, name, None)


# ------------------------------------------------------------------------------------------ shapes, guards
def record_example_values(gm: torch.fx.GraphModule, inputs: list[Any]) -> None:
    """Give every node of ``gm`` (a graph rebuilt from JSON, which keeps no metadata) the fake ``example_value``
    Dynamo records, by propagating fake copies of ``inputs``: torch 2.13's AOTAutograd cache only stores a graph
    whose method calls are on nodes with one (``autograd_cache.check_node_safe``).

    Raises:
        whatever the graph raises when run on fake ``inputs`` (a graph that cannot run on them).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta.pop("val")


def fake_value(node: torch.fx.Node) -> Any:
    """The fake value (FakeTensor, SymInt, int) Dynamo or export recorded for an FX node, or None."""
    return node.meta.get("val", node.meta.get("example_value"))


def shape_env_of(values: list[Any]) -> Any:
    """The ShapeEnv behind the first symbolic size among ``values`` (fake tensors and SymInts), or None."""
    for v in values:
        sizes = [v] if isinstance(v, torch.SymInt) else (
            [*v.shape, *v.stride()] if isinstance(v, torch.Tensor) else [])
        for s in sizes:
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def symbol_ranges(shape_env: Any) -> dict[str, tuple[int | None, int | None]]:
    """``{symbol name: (lower, upper)}`` of every size symbol; None for an unbounded end."""
    import sympy
    from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

    def bound(x: Any) -> int | None:
        infinite = isinstance(x, (IntInfinity, NegativeIntInfinity)) or x in (sympy.oo, -sympy.oo)
        return None if infinite else int(x)

    return {str(sym): (bound(vr.lower), bound(vr.upper)) for sym, vr in shape_env.var_to_range.items()}


def symbol_hint(value: Any) -> int | None:
    """The example value (hint) of a SymInt, or None when it has none (an unbacked size)."""
    node = getattr(value, "node", None)
    hint = getattr(node, "hint", None)
    return int(hint) if hint is not None else None


def guards_expression(shape_env: Any, placeholders: list[Any]) -> str | None:
    """Every condition on the symbolic sizes of ``placeholders`` that the compiled code relies on, as one
    Python expression over ``L['t<i>']`` (the i-th placeholder's value), or None when there is none.

    This is ``ShapeEnv.produce_guards_expression``, what Inductor's FX graph cache checks before it reuses a
    graph: each dynamic dim equals its symbol's source, ranges (``2 <= L['t2']``), and the guards Dynamo and
    Inductor added while tracing and compiling, pruned to those over the placeholders' own symbols (a graph that
    is one piece of a larger one shares its ShapeEnv, as Inductor's ``get_pruned_guards`` does).  Static dims are
    left out: precompile checks them itself.
    """
    symbols: set[Any] = set()
    for v in placeholders:
        sizes = [v] if isinstance(v, torch.SymInt) else (
            [*v.shape, *v.stride(), v.storage_offset()] if isinstance(v, torch.Tensor) else [])
        for s in sizes:
            if isinstance(s, torch.SymInt):
                symbols |= s.node.expr.free_symbols
    guards = [g for g in shape_env.guards if g.expr.free_symbols <= symbols]
    return shape_env.produce_guards_expression(placeholders, guards=guards, ignore_static=True)


# -------------------------------------------------------------------------------------- Triton (build side)
def grid_expr(inductor_meta: dict[str, Any], config: Any) -> Any:
    """Inductor's launch-grid expressions for a kernel's picked config (``.prefix``, ``.x_grid`` ...)."""
    from torch._inductor.runtime.triton_heuristics import GridExpr

    return GridExpr.from_meta(inductor_meta, config)


def static_launch_description(binary: Any) -> Any:
    """Inductor's ``StaticallyLaunchedCudaKernel`` for a Triton ``CompiledKernel``.

    Raises:
        NotImplementedError: the static launcher cannot launch it.
    """
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel

    if not hasattr(binary, "_cubin_path"):
        binary._cubin_path = None
    return StaticallyLaunchedCudaKernel(binary)


def fx_wrapper_classes() -> tuple[type, type]:
    """``(WrapperFxCodegen, FxConverter)`` of Inductor's FX wrapper (``torch._inductor.codegen.wrapper_fxir``): the
    codegen whose ``compile_graph`` receives the wrapper graph, and the converter whose ``generate`` makes it.

    Raises:
        ImportError: this torch has no FX wrapper.
    """
    from torch._inductor.codegen import wrapper_fxir

    return wrapper_fxir.WrapperFxCodegen, wrapper_fxir.FxConverter


def compile_fx_wrapper(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any]) -> Any:
    """Inductor's ``compile_fx`` of ``gm`` under config ``options`` with its FX wrapper on (``fx_wrapper``), and
    neither the FX graph cache nor AOTAutograd's (an entry of another compile must not stand in for this one)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    with config.patch({**options, "fx_wrapper": True, "fx_graph_cache": False}), \
            functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs)


def triton_side_table_constants(constant_args_idx: int) -> Any:
    """The constant arguments a Triton launch node keeps in torch's kernel side table, by its index."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    return kernel_side_table.get_constant_args(constant_args_idx)


# ----------------------------------------------------------------------------------- autotune (build side)
def autotune_selector() -> Any:
    """Inductor's process-wide ``AlgorithmSelectorCache``, whose ``feedback_saver_fns`` it calls with the timings
    after each benchmark of a tunable op's candidates; None where this torch has no Inductor or no feedback savers."""
    try:
        from torch._inductor import select_algorithm
    except ImportError:  # pragma: no cover - a torch without Inductor
        return None
    get = getattr(select_algorithm, "get_algorithm_selector_cache", None)
    selector = get() if get is not None else None
    return selector if hasattr(selector, "feedback_saver_fns") else None


def autotune_selector_class() -> type | None:
    """Inductor's ``AlgorithmSelectorCache`` class (its ``lookup`` returns a tuned op's benchmark times), or None."""
    try:
        from torch._inductor import select_algorithm
    except ImportError:  # pragma: no cover - a torch without Inductor
        return None
    return getattr(select_algorithm, "AlgorithmSelectorCache", None)


def multi_template_buffer_class() -> type | None:
    """Inductor's ``ir.MultiTemplateBuffer`` (a tuned op's node until benchmark fusion picks a template), or None."""
    try:
        from torch._inductor import ir
    except ImportError:  # pragma: no cover - a torch without Inductor
        return None
    return getattr(ir, "MultiTemplateBuffer", None)


# ------------------------------------------------------------------------------------------- load side
def static_cuda_launcher() -> Any:
    """torch's static CUDA launcher (``_load_kernel``, ``_launch_kernel``): what Inductor launches cubins with."""
    return torch._C._StaticCudaLauncher


def current_raw_stream() -> Any:
    """``torch._C._cuda_getCurrentRawStream``: ``(device index) -> that device's current CUDA stream`` (an int),
    the stream Inductor's wrappers launch on."""
    return torch._C._cuda_getCurrentRawStream


def tensor_guards_class() -> type | None:
    """Dynamo's C++ ``TensorGuards`` (``torch._C._dynamo.guards``, built into torch's C extension: no Python module
    of Dynamo is imported), or None where this torch lacks it."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    return TensorGuards


def dispatch_mode_class() -> type:
    """torch's ``TorchDispatchMode`` (``torch.utils._python_dispatch``, loaded by ``import torch``): the base of a
    mode that sees every ATen call made under it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def launcher_function_handle(handles: tuple[Any, ...]) -> Any:
    """The CUfunction in what ``_StaticCudaLauncher._load_kernel`` returned: torch 2.11 returns
    ``(function, n_regs, n_spills)``, later versions put the module handle first."""
    return handles[-3]


def set_pyobject_tensor_data_ptr() -> None:
    """Tell Inductor's C++ kernel prelude where torch keeps a tensor's data pointer (read from the environment
    when a C++ kernel's module initializes, as Inductor's own loader does)."""
    os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(
        torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)


def abandon_pool_capture(device: int, pool: tuple[int, int]) -> bool:
    """Undo the caching allocator's part of a CUDA graph capture into ``pool`` that did not end.

    ``CUDAGraph::capture_begin`` makes the allocator route the capturing stream's allocations to ``pool`` and
    takes a reference to it; ``capture_end`` stops the routing only after ``cudaStreamEndCapture`` succeeds, and
    ``reset`` drops the reference only for a capture that ended (aten/src/ATen/cuda/CUDAGraph.cpp, torch
    2.11-2.13).  A capture that failed leaves both, and the next capture into the same pool then fails with
    "beginAllocateToPool: already recording to mempool_id".  This does what the two would have done
    (``endAllocateToPool``, ``releasePool``).

    Returns:
        True if the allocator was still recording to ``pool`` (and now is not); False if it was not (the
        capture's end got that far: nothing is undone).
    """
    try:
        torch._C._cuda_endAllocateToPool(device, pool)
    except RuntimeError:  # "not currently recording to mempool_id": capture_end had stopped it
        return False
    torch._C._cuda_releasePool(device, pool)
    return True


def custom_op_def(qualname: str) -> Any:
    """The ``torch.library.custom_op`` definition of operator ``qualname`` (``"ns::name"``), or None."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    return OPDEFS.get(qualname)


def config_patch(patches: dict[str, Any]) -> Any:
    """A context manager in which Inductor's config holds ``patches`` (any values, Python objects included)."""
    from torch._inductor import config

    return config.patch(patches)


def compile_uncached(gm: torch.fx.GraphModule, example_inputs: list[Any], config_patches: dict[str, Any] | None) -> Any:
    """Inductor's ``compile_fx``: what ``torch.compile``'s own backend does, for a graph precompile cannot cache."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=config_patches or None)
