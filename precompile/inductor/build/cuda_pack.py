"""Triton kernels packaged for the fast path: the picked cubin and how Inductor launches it, as data.

The fast path launches each Triton kernel's picked cubin through torch's own static CUDA launcher
(``torch._C._StaticCudaLauncher``, what Inductor itself uses for statically launchable kernels), so a load
needs neither Triton nor gcc.  The build records, per kernel, what Inductor's generated launcher does (its
parameters, the grid expressions for the picked config, the parameters that reach the cubin and their type
codes, num_warps, shared memory) and packs that record with the picked cubin into one blob,
``<kernel>.launch`` (:func:`precompile.inductor.load.cuda_runtime.pack_launch`): data, not a host binary, so a load
runs nothing host-side that the artifact carries for a Triton kernel.  Grids are expressions of the launcher's
parameters (``xnumel``...), checked to be plain arithmetic at load, so a graph with symbolic sizes gets the grid
of each call's sizes.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import torch

from precompile.inductor import shim
from precompile.inductor.build import runs
from precompile.inductor.build.products import Kernel
from precompile.inductor.load.cuda_runtime import LAUNCH, LAUNCH_FORMAT, pack_launch

log = logging.getLogger("precompile.inductor")

_MULTI_KERNEL = re.compile(r"^(\w+) = async_compile\.multi_kernel\(", re.M)


class NotFast(Exception):
    """Why a kernel cannot take the fast path (a reason for the log, never raised to callers)."""


def settle_triton_autotuning(compiled_fn: Any, run_inputs: list[Any] | None, graphs: list[Any],
                             mutated: list[int]) -> str | None:
    """Run a graph that has Triton kernels once, so that Inductor autotunes each kernel down to one launcher
    (and writes its ``.best_config``), and each multi-kernel picks its sub-kernel, while the private cache
    dir is still in place.  Inputs the graph writes to are copies (:func:`runs.inputs_for_run`).

    Returns:
        None, or why the fast path is off (the graph is not an inference graph, ``run_inputs`` is None because
        the inputs must not be run, or the run failed).
    """
    if not any("async_compile.triton(" in (getattr(g, "source_code", None) or "") for g in graphs):
        return None
    if len(graphs) != 1:
        return f"{len(graphs)} wrapper modules (a training graph: forward and backward)"
    if run_inputs is None:
        return ("the example inputs are stand-ins that must not be run, so its Triton kernels could not be "
                "autotuned down to the configs an artifact carries")
    try:
        with torch.no_grad():
            compiled_fn(*runs.inputs_for_run(run_inputs, mutated))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - only turns the fast path off
        return f"running the compiled graph once failed ({type(err).__name__}: {err})"
    return None


def _live_wrapper_module(names: list[str]) -> Any:
    """The loaded wrapper module that binds every name in ``names`` (Inductor's ``PyCodeCache``), or None."""
    for m in reversed(shim.loaded_wrapper_modules()):
        if hasattr(m, "call") and all(hasattr(m, n) for n in names):
            return m
    return None


def multi_kernel_picks(kernels: list[Kernel], wrapper: str) -> dict[str, int]:
    """``{multi-kernel name: picked sub-kernel index}`` of every ``async_compile.multi_kernel`` in ``wrapper``,
    read from the live module after :func:`settle_triton_autotuning` (Inductor benchmarks the sub-kernels on
    the first call and keeps the fastest).  Size-hint multi-kernels pick by each call's shapes, not here.

    Raises:
        NotFast: a multi-kernel has not picked.
    """
    names = _MULTI_KERNEL.findall(wrapper)
    if not names:
        return {}
    module = _live_wrapper_module([k.name for k in kernels if k.lang == "triton"] + names)
    if module is None:
        raise NotFast("the compiled wrapper module is not loaded")
    picks = {}
    for name in names:
        picked = getattr(getattr(module, name), "picked_kernel", None)
        if not isinstance(picked, int):
            raise NotFast(f"multi-kernel {name} has not picked a sub-kernel")
        picks[name] = picked
    return picks


def _triton_launch_record(kernel: Any, root: Path) -> tuple[dict[str, Any], bytes]:
    """``(record, cubin bytes)`` for one live ``CachingAutotuner`` that was autotuned to one launcher.

    Raises:
        NotFast: the kernel cannot be launched by the static launcher, or its launcher is not understood.
    """
    launchers = list(getattr(kernel, "launchers", None) or [])
    if len(launchers) != 1:
        raise NotFast(f"{len(launchers)} launchers after a run, not one picked config")
    launcher = launchers[0]
    scope = getattr(launcher, "__globals__", None) or {}
    cache_hash = getattr(launcher, "cache_hash", None)
    if getattr(launcher, "_is_static", False):
        static = getattr(scope.get("runner"), "__self__", None)
        if static is None or not isinstance(getattr(static, "arg_tys", None), str):
            raise NotFast("its static launcher is not understood")
        if type(static).__name__ != "StaticallyLaunchedCudaKernel":
            raise NotFast(f"launched by {type(static).__name__}, not the CUDA launcher")
        found = [p for p in (root / "triton").rglob(f"{static.name}.cubin") if p.parent.name == cache_hash]
        if not found:
            raise NotFast(f"the picked cubin triton/{cache_hash}/{static.name}.cubin is not in the cache dir")
        cubin = found[0].read_bytes()
    else:
        # Inductor launches it through Triton's own (gcc-built) launcher, e.g. because its cubin was not
        # where Inductor looked for it; the static launcher reads the same compiled kernel
        static, cubin = _static_from_compiled(scope.get("bin"))
    code = launcher.__code__
    params = list(code.co_varnames[:code.co_argcount])
    if params[-1:] != ["stream"] or code.co_flags & 0x0C:
        raise NotFast(f"launcher parameters {params} are not understood")
    params = params[:-1]
    constexprs = {int(i) for i in static.full_constexprs}
    passed = [a for i, a in enumerate(static.arg_names) if i not in constexprs]
    if len(passed) != len(static.arg_tys) or any(a not in params for a in passed):
        raise NotFast(f"cubin parameters {passed} ({static.arg_tys!r}) do not match launcher parameters {params}")
    grid = shim.grid_expr(kernel.inductor_meta, launcher.config)
    scratch = int(bool(getattr(static, "has_global_scratch", False))) + int(
        bool(getattr(static, "has_profile_scratch", False)))
    device = (getattr(kernel, "triton_meta", None) or {}).get("device", 0)
    device = getattr(device, "index", device)
    record = {
        "format": LAUNCH_FORMAT, "name": static.name, "device": int(device or 0), "params": params,
        "passed": passed, "arg_tys": static.arg_tys + "O" * scratch, "scratch": scratch,
        "grid": [*grid.prefix, f"grid_0 = {grid.x_grid}", f"grid_1 = {grid.y_grid}", f"grid_2 = {grid.z_grid}"],
        "num_warps": int(static.num_warps), "shared": int(static.shared), "triton_cache_hash": cache_hash,
    }
    return record, cubin


def _static_from_compiled(binary: Any) -> tuple[Any, bytes]:
    """Inductor's static-launch description of a Triton ``CompiledKernel`` and its cubin bytes.

    Raises:
        NotFast: the kernel needs what the static launcher does not do (scratch memory, launch attributes,
            clusters), or carries no cubin.
    """
    cubin = (getattr(binary, "asm", None) or {}).get("cubin")
    if not isinstance(cubin, bytes):
        raise NotFast("Triton's compiled kernel carries no cubin")
    meta = binary.metadata
    if getattr(meta, "launch_pdl", False) or getattr(meta, "launch_cooperative_grid", False):
        raise NotFast("it needs launch attributes (PDL or a cooperative grid)")
    try:
        return shim.static_launch_description(binary), cubin
    except NotImplementedError as err:
        raise NotFast(f"the static launcher cannot launch it: {err}") from err


def package_triton_kernels(root: str, kernels: list[Kernel]) -> str | None:
    """Give every Triton kernel a ``<name>.launch`` blob (see above).

    Returns:
        None (done, or there are no Triton kernels), or why the fast path is off; then no kernel gets one.
    """
    triton_kernels = [k for k in kernels if k.lang == "triton"]
    if not triton_kernels:
        return None
    module = _live_wrapper_module([k.name for k in triton_kernels])
    if module is None:
        return "the compiled wrapper module is not loaded"
    try:
        records = []
        for k in triton_kernels:
            records.append((k, *_triton_launch_record(getattr(module, k.name), Path(root))))
    except NotFast as err:
        return f"Triton kernel {k.name} cannot be launched without Inductor: {err}"
    except Exception as err:  # noqa: BLE001 - Inductor internals changed: only the fast path is lost
        return f"reading Triton kernel {k.name}'s launcher failed ({type(err).__name__}: {err})"
    start = time.perf_counter()
    try:
        packed = [pack_launch(record, cubin) for _, record, cubin in records]
    except ValueError as err:
        return str(err)
    for (k, record, _), blob in zip(records, packed):
        k.binaries[record["name"] + LAUNCH] = blob
    log.info("packaged %d Triton kernels for the fast path in %.3f s", len(packed), time.perf_counter() - start)
    return None


