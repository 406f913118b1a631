"""Decide at build whether an artifact can be loaded by the fast path, and prove it bit for bit."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import sys
from typing import Any

import torch

from precompile.inductor import shim
from precompile.inductor.build import runs
from precompile.inductor.build.products import BuildResult, Kernel
from precompile.inductor.load import externs, prime, runtime
from precompile.inductor.load.runtime import fast_binary

log = logging.getLogger("precompile.inductor")

#: Operator namespaces a plain ``import torch`` registers: calls into them need nothing imported at load.
_TORCH_NAMESPACES = frozenset({
    "aten", "prims", "inductor", "_quantized", "quantized", "higher_order", "_c10d_functional",
    "_c10d_functional_autograd", "c10d", "_dtensor", "profiler", "rngprims", "mkldnn", "mkl", "onednn",
    "quantized_decomposed", "_inductor_test", "_prims", "_refs", "symm_mem", "cuda", "_native_multi_head_attention",
})
_OP_CALL = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)\b")
_OTHER_ASYNC = re.compile(r"async_compile\.(?!cpp_pybinding\(|triton\(|wait\(|multi_kernel\(|size_hint_multi_kernel\()"
                          r"\w+\(")


def _has_launch_binary(k: Kernel) -> bool:
    return fast_binary(k.lang, list(k.binaries)) is not None


def kernel_binaries(kernels: list[Kernel]) -> dict[str, bytes]:
    """``{sha256 of a kernel's source: the binary a fast load binds it to}`` (:func:`fast_binary`)."""
    return {hashlib.sha256(k.source.encode()).hexdigest(): k.binaries[fast_binary(k.lang, list(k.binaries))]
            for k in kernels}


def fast_plan(result: BuildResult, run_inputs: list[Any] | None, more_inputs: list[list[Any]] = (), *,
              graph_outputs: tuple[int, bool] | None = None,
              unset: frozenset[int] = frozenset()) -> tuple[dict[str, Any] | None, str | None]:
    """Decide whether ``result`` can be loaded by the fast path, and validate it.

    Args:
        result: the compile.
        run_inputs: the example inputs with every size concrete, or None when they must not be run: then the
            plan rests on static checks alone (the wrapper's ``call`` returns as many values as the graph, and no
            output may alias an input, which Inductor's runtime wrapper would regenerate).
        more_inputs: more input sets to validate on (other sizes of a graph with symbolic shapes).
        graph_outputs: ``(number of outputs, whether one may alias an input)`` of the FX graph.
        unset: outputs the graph allocates and never writes (:func:`precompile.inductor.build.runs.unset_outputs`):
            compared by layout only.

    Returns:
        ``(plan, None)`` or ``(None, why the fast path is off)``.  ``plan`` is what a fast load needs besides
        the kernel binaries: ``{"wrapper": name, "source": the wrapper with its imports replaced, "extern":
        {name: "module:qualname"}, "ops": [{"op", "module"}], "multi_kernel": {name: pick}, "mutated": [...],
        "defers_alignment": bool, "prime": the library calls to replay at load (precompile.inductor.load.prime)}``.
        The fast callable is built from the in-memory products, and on every
        input set its outputs, and the inputs it writes to, must equal the freshly compiled callable's bit for
        bit; any difference or failure means no plan.
    """
    why = _static_reasons(result, run_inputs)
    if why is None and run_inputs is None:
        why = _unvalidated_reasons(result, graph_outputs)
    if why:
        return None, why
    (name, source), = result.wrappers.items()
    extern: dict[str, str] = {}
    for ename in sorted(set(re.findall(r"\bextern_kernels\.(\w+)", source))):
        fn = shim.extern_kernel(ename)
        ref = extern_ref(fn)
        if ref is None:
            return None, f"extern kernel {ename} ({fn!r}) is not importable by name"
        extern[ename] = ref
    ops = [{"op": f"{ns}::{op}", "module": _defining_module(ns, op)}
           for ns, op in sorted(set(_OP_CALL.findall(source))) if ns not in _TORCH_NAMESPACES]
    plan = {"wrapper": name, "source": runtime.rewrite_wrapper(source), "extern": extern, "ops": ops,
            "multi_kernel": dict(result.multi_kernel), "mutated": list(result.mutated_inputs),
            "defers_alignment": result.defers_alignment}
    if run_inputs is None:
        log.info("fast path offered without a validation run: the example inputs must not be run")
        return plan, None
    try:
        fast = runtime.load_fast(plan["source"], kernel_binaries(result.kernels), extern=extern, ops=ops,
                                 multi_kernel=plan["multi_kernel"], inputs_to_check=result.inputs_to_check,
                                 mutated=result.mutated_inputs, defers_alignment=result.defers_alignment,
                                 rewritten=True)
        for i, inputs in enumerate([run_inputs, *more_inputs]):
            # the example run also records the library calls a load may replay (precompile.inductor.load.prime)
            differs = _compare(result, fast, inputs, required=i == 0, library_calls=plan if i == 0 else None,
                               unset=unset)
            if differs:
                where = "on the example inputs" if i == 0 else f"on validation input set {i} (other sizes)"
                return None, f"{differs} {where}"
    except Exception as err:  # noqa: BLE001 - any failure only turns the fast path off
        return None, f"validation failed: {type(err).__name__}: {err}"
    return plan, None


def _static_reasons(result: BuildResult, run_inputs: list[Any]) -> str | None:
    if result.fast_off:
        return result.fast_off
    if len(result.wrappers) != 1:
        return f"{len(result.wrappers)} wrapper modules (a training graph: forward and backward)"
    missing = [k.name for k in result.kernels if not _has_launch_binary(k)]
    if missing:
        return f"no loadable binary for kernels {missing[:5]}"
    odd = [type(x).__name__ for x in run_inputs or () if not isinstance(x, (torch.Tensor, int, float, bool))]
    if odd:
        return f"inputs of type {sorted(set(odd))} (tensors and numbers are supported)"
    (_, source), = result.wrappers.items()
    other = _OTHER_ASYNC.search(source)
    if other:
        return f"the wrapper calls {other.group(0)}"
    if runtime.rewrite_wrapper(source) is None:
        return "the wrapper imports Inductor modules the fast path does not stand in for"
    return None


def _unvalidated_reasons(result: BuildResult, graph_outputs: tuple[int, bool] | None) -> str | None:
    """Why a plan that cannot be validated by a run is not offered, or None."""
    import ast

    if graph_outputs is None:
        return "the example inputs cannot be run and the graph's outputs are unknown"
    n_outputs, aliases = graph_outputs
    if aliases:
        return "an output may alias an input and the example inputs cannot be run to check the fast path"
    (_, source), = result.wrappers.items()
    calls = [f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef) and f.name == "call"]
    returns = [len(r.value.elts) for f in calls for r in ast.walk(f)
               if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)]
    if returns != [n_outputs]:
        return (f"the wrapper returns {returns} values where the graph has {n_outputs} outputs, and the example "
                "inputs cannot be run to check the fast path")
    return None


def _compare(result: BuildResult, fast: Any, inputs: list[Any], required: bool,
             library_calls: dict[str, Any] | None = None, unset: frozenset[int] = frozenset()) -> str | None:
    """Run the fresh callable and the fast one on their own copies of what the graph writes to; None if outputs
    and written inputs are equal bit for bit, else what differs.  An input set that is not ``required`` (made
    up at other sizes) and that the fresh callable itself rejects is skipped.  With ``library_calls`` (a plan),
    the fast run's library calls are recorded into its ``"prime"``."""
    mutated = result.mutated_inputs
    fresh_inputs = runs.inputs_for_run(inputs, mutated)
    fast_inputs = runs.inputs_for_run(inputs, mutated)
    with torch.no_grad():
        try:
            want = _as_list(result.compiled_fn(*fresh_inputs))
        except Exception as err:  # noqa: BLE001
            if required:
                raise
            log.debug("the fresh compile rejects the validation inputs at other sizes (%s); skipped", err)
            return None
        with prime.recording() if library_calls is not None else contextlib.nullcontext() as calls:
            got = _as_list(fast(*fast_inputs))
        if library_calls is not None:
            library_calls["prime"] = calls
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    why = runs.same_values(want, got, unset)
    if why:
        return f"outputs differ from the freshly compiled callable ({why})"
    for i in mutated:
        why = runs.same_values(fresh_inputs[i], fast_inputs[i])
        if why:
            return f"input {i}, which the graph writes to, differs from the freshly compiled callable's ({why})"
    return None


def _as_list(out: Any) -> list[Any]:
    """A callable's outputs as a list: Inductor's callable returns a graph's single output unwrapped, the
    wrapper's ``call`` a tuple of one."""
    return list(out) if isinstance(out, (list, tuple)) else [out]


def extern_ref(fn: Any) -> str | None:
    """The ``"module:qualname"`` a fast load resolves extern kernel ``fn`` by: its stand-in's where
    :data:`precompile.inductor.load.externs.STAND_INS` has one (never Inductor's own module on the load path), else its
    own; None when it cannot be imported by name."""
    ref = _importable_name(fn)
    return externs.STAND_INS.get(ref, ref) if ref is not None else None


def _importable_name(fn: Any) -> str | None:
    import importlib

    module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if not module or not name:
        return None
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{name}" if obj is fn else None


def _defining_module(ns: str, op: str) -> str | None:
    """The importable module that registers custom operator ``ns::op``: the module of a ``torch.library``
    ``custom_op``'s function, or an imported C++ extension module named after the namespace (``vllm._C`` for
    ``torch.ops._C``).  None when it is not known (then a load needs the caller to have registered it)."""
    opdef = shim.custom_op_def(f"{ns}::{op}")
    module = getattr(getattr(opdef, "_init_fn", None), "__module__", None)
    if module and module != "__main__":
        return module
    for name, mod in list(sys.modules.items()):
        if name.rsplit(".", 1)[-1] == ns and not name.startswith("torch") and \
                str(getattr(mod, "__file__", "") or "").endswith((".so", ".pyd")):
            return name
    return None
