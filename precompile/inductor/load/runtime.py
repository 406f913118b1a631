"""The fast load path: Inductor's wrapper module run with light stand-ins, carried binaries loaded from memory.

The portable path (:mod:`precompile.inductor.load.portable`) rebuilds the callable the way ``CompiledArtifact.load``
does: it imports Inductor's compile-time modules (and with them Dynamo and sympy), probes the CPU's vector ISA
with gcc, looks up (or rebuilds) every C++ kernel and has Triton build its C launchers with gcc.  The fast path
runs Inductor's wrapper module itself, with its imports of compile-time modules replaced by the stand-ins of
:class:`FastRuntime`: every ``async_compile.cpp_pybinding(...)`` is bound to the ``.so`` the artifact carries,
every ``async_compile.triton(...)`` to the picked cubin its ``.launch`` blob carries, launched through torch's
static CUDA launcher (:mod:`precompile.inductor.load.cuda_runtime`), every multi-kernel to its sub-kernel picked at
build.  Binaries are loaded through memfd, never compiled; Triton is not imported.

The wrapper's ``call`` is the whole compiled graph for an inference graph: symbolic sizes arrive as int
arguments (``s0 = arg2_1``) and are passed on to the kernels and grids; writes into the caller's buffers (a KV
cache) happen inside it.  What Inductor's runtime wrapper adds around it, the callable returned by
:func:`load_fast` adds too: no autograd, and the 16-byte alignment copies of inputs Inductor assumed aligned,
with the writes to a copy put back into the caller's tensor (Inductor's ``align_inputs_from_check_idxs``).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch

from precompile.inductor import shim
from precompile.inductor.load import cuda_runtime
from precompile.inductor.load.memfd import memfd


class _LazyModule:
    """Stands in for ``import triton`` in a wrapper: imports the module only if an attribute is used."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


class _Namespace:
    def __init__(self, table: dict[str, Any]):
        self.__dict__.update(table)


class FastRuntime:
    """What the rewritten wrapper module imports instead of Inductor's compile-time modules (``__pc``)."""

    def __init__(self, kernels: dict[str, bytes], extern: dict[str, Any], multi_kernel: dict[str, int]):
        self._kernels = kernels  # sha256 of kernel source -> .so bytes
        self.extern_kernels = _Namespace(extern)
        runtime = self

        class AsyncCompile:  # noqa: D401 - mirrors Inductor's name
            def cpp_pybinding(self, argtypes: Any, source: str, *args: Any, **kwargs: Any) -> Any:
                return runtime.load_cpp(source)

            def triton(self, kernel_name: str, source: str, *args: Any, **kwargs: Any) -> Any:
                return runtime.load_triton(source)

            def multi_kernel(self, name: str, kernels: list[Any], arg_index: dict[int, list[slice]]) -> Any:
                if name not in multi_kernel:
                    raise KeyError(f"no build-time pick for multi-kernel {name}")
                return cuda_runtime.MultiKernel(name, kernels, arg_index, multi_kernel[name])

            def size_hint_multi_kernel(self, name: str, kernels: dict[Any, Any],
                                       arg_index: dict[int, list[slice]]) -> Any:
                return cuda_runtime.SizeHintMultiKernel(name, kernels, arg_index)

            def wait(self, scope: Any) -> None:
                return None

        self.AsyncCompile = AsyncCompile

    @staticmethod
    def run_intermediate_hooks(name: str, value: Any) -> None:
        return None

    @staticmethod
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    @contextlib.contextmanager
    def maybe_profile(should_profile: bool, *args: Any, **kwargs: Any):
        yield

    @staticmethod
    def align(nbytes: int) -> int:
        return (nbytes + shim.ALIGN_BYTES - 1) & -shim.ALIGN_BYTES

    @staticmethod
    def lazy(name: str) -> _LazyModule:
        return _LazyModule(name)

    def _binary(self, source: str, lang: str) -> tuple[str, bytes]:
        digest = hashlib.sha256(source.encode()).hexdigest()
        so = self._kernels.get(digest)
        if so is None:
            raise KeyError(f"no carried binary for {lang} kernel source {digest[:12]}")
        return digest, so

    def load_cpp(self, source: str) -> Any:
        digest, so = self._binary(source, "C++")
        # named by the binary's own digest, not its source's: a module loaded from another artifact's binary for
        # the same source (a poisoned one, say) is never reused for this one
        name = f"precompile_k{hashlib.sha256(so).hexdigest()[:32]}.kernel"
        module = sys.modules.get(name)
        if module is None:
            shim.set_pyobject_tensor_data_ptr()
            _, path = memfd(so, f"pc-{digest[:16]}.so")
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_loader(name, loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[name] = module
        return module.kernel

    def load_triton(self, source: str) -> Any:
        digest, so = self._binary(source, "Triton")
        return cuda_runtime.TritonKernel(*cuda_runtime.read_launch(so, digest))


def fast_binary(lang: str, files: list[str]) -> str | None:
    """Of a kernel's binary file names, the one a fast load binds it to: a C++ kernel's ``.so``, a Triton
    kernel's ``<name>.launch`` blob (data: launch record and cubin); None if it has none (or a Triton kernel
    several)."""
    if lang == "cpp":
        return next((f for f in sorted(files) if f.endswith(".so")), None)
    if lang == "triton":
        launch = [f for f in files if f.endswith(cuda_runtime.LAUNCH)]
        return launch[0] if len(launch) == 1 else None
    return None


def rewrite_wrapper(source: str) -> str | None:
    """The wrapper source with its top-level imports of Inductor compile-time modules replaced by names bound
    from ``__pc`` (a :class:`FastRuntime`) and ``import triton...`` by lazy stand-ins, or None if it imports
    something else from ``torch._inductor``."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: dict[int, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._inductor"):
            repl = []
            for alias in node.names:
                attr = shim.FAST_IMPORTS.get((node.module, alias.name))
                if attr is None:
                    return None
                repl.append(f"{alias.asname or alias.name} = __pc.{attr}")
        elif isinstance(node, ast.Import) and any(a.name.startswith("torch._inductor") for a in node.names):
            return None
        elif isinstance(node, ast.Import) and all(a.name == "triton" or a.name.startswith("triton.")
                                                  for a in node.names):
            repl = [f"{a.asname} = __pc.lazy({a.name!r})" if a.asname else "triton = __pc.lazy('triton')"
                    for a in node.names]
        else:
            continue
        if node.end_lineno != node.lineno:
            return None
        edits[node.lineno - 1] = "; ".join(repl) + "\n"
    for i, text in edits.items():
        lines[i] = text
    return "".join(lines)


#: ``{former module name: its module now}`` for the stand-ins fast plans name: an artifact built before
#: precompile.inductor was split into wings (2026-11-27) names ``precompile.inductor.externs:bias_addmm``.
FORMER_NAMES = {"precompile.inductor.externs": "precompile.inductor.load.externs"}


def resolve(ref: str) -> Any:
    """The object named ``"module:qualname"`` (a module of :data:`FORMER_NAMES` by its name now).

    Raises:
        ImportError / AttributeError: it does not exist here.
    """
    module, _, qual = ref.partition(":")
    module = FORMER_NAMES.get(module, module)
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def require_ops(ops: list[dict[str, Any]]) -> None:
    """Make sure every custom operator the wrapper calls is registered, importing the module that defines it
    (recorded at build) when it is not.

    Raises:
        ImportError: an operator is still not registered; the message names it and the module to import.
    """
    for entry in ops:
        ns, _, name = entry["op"].partition("::")
        if _op_registered(ns, name):
            continue
        module = entry.get("module")
        if module:
            importlib.import_module(module)
        if not _op_registered(ns, name):
            raise ImportError(f"the graph calls custom operator {entry['op']}, which is not registered in this "
                              f"process; import the library that defines it"
                              + (f" ({module})" if module else "") + " before loading")


def _op_registered(ns: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def clone_preserve_strides(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in fresh (aligned) memory with the same size and strides (Inductor's function)."""
    needed = 0 if 0 in t.size() else sum((n - 1) * s for n, s in zip(t.size(), t.stride())) + 1
    return torch.as_strided(torch.as_strided(t, (needed,), (1,)).clone(), t.size(), t.stride())


def load_fast(source: str, kernels: dict[str, bytes], *, extern: dict[str, str] | None = None,
              ops: list[dict[str, Any]] | None = None, multi_kernel: dict[str, int] | None = None,
              inputs_to_check: list[int] = (), mutated: list[int] = (), defers_alignment: bool = False,
              rewritten: bool = False, primer: Any = None) -> Any:
    """Build a callable from a wrapper module's source and carried kernel binaries, compiling nothing.

    Args:
        source: Inductor's output code, or :func:`rewrite_wrapper`'s output of it if ``rewritten`` (what an
            artifact stores, so a load does not parse the wrapper: about 0.1 s for a small Llama's).
        kernels: ``{sha256 of a kernel's source: its binary}`` (a C++ kernel's ``.so``, a Triton kernel's
            ``.launch`` blob).
        extern: ``{extern kernel name: "module:qualname"}`` for ``extern_kernels.<name>`` calls.
        ops: custom operators the wrapper calls, ``[{"op": "ns::name", "module": defining module or None}]``.
        multi_kernel: ``{multi-kernel name: picked sub-kernel index}``.
        inputs_to_check: inputs Inductor assumed 16-byte aligned; a misaligned one is copied to aligned memory
            for the call (unless ``defers_alignment`` and the graph does not write to it: then the wrapper
            copies it itself), and the graph's writes to a copy are copied back.
        mutated: inputs the graph writes to.
        defers_alignment: the wrapper copies its own misaligned read-only inputs (torch 2.13).
        primer: a :class:`precompile.inductor.load.prime.Primer` setting libraries up; the first call waits for it.

    Returns:
        ``fn(*flat_inputs) -> tuple of outputs``, run without autograd (an inference graph).

    Raises:
        ValueError: the wrapper imports Inductor modules the fast path does not stand in for.
        KeyError: a kernel has no carried binary, or a multi-kernel no pick.
        ImportError / OSError: a binary, an extern kernel or a custom operator failed to load.
    """
    src = source if rewritten else rewrite_wrapper(source)
    if src is None:
        raise ValueError("the wrapper imports Inductor modules the fast path cannot stand in for")
    require_ops(list(ops or []))
    table = {name: resolve(ref) for name, ref in (extern or {}).items()}
    ns: dict[str, Any] = {"__name__": "precompile_wrapper", "__pc": FastRuntime(kernels, table, dict(multi_kernel or {}))}
    exec(compile(src, "<precompile wrapper>", "exec"), ns)  # noqa: S102 - Inductor's own generated code
    return wrap_call(ns["call"], inputs_to_check=inputs_to_check, mutated=mutated,
                     defers_alignment=defers_alignment, primer=primer)


def wrap_call(call: Callable[[list[Any]], Any], *, inputs_to_check: list[int] = (), mutated: list[int] = (),
              defers_alignment: bool = False, primer: Any = None) -> Any:
    """``fn(*flat_inputs)`` around a compiled ``call(list of inputs)``: without autograd, with each input
    Inductor assumed 16-byte aligned copied to aligned memory when it is not (the graph's writes to such a copy
    copied back), and, with a ``primer``, the first call waiting for it (see :func:`load_fast` for the args)."""
    written = set(mutated)
    check = [i for i in inputs_to_check if not defers_alignment or i in written]
    no_grad, grad_on = torch.no_grad, torch.is_grad_enabled
    pending = {"primer": primer}

    def first_call(*args: Any) -> Any:
        waiting = pending["primer"]
        if waiting is not None:  # every early caller waits for the replay (join is thread-safe), later ones not
            waiting.wait()
            pending["primer"] = None
        return (run_aligned if check else run)(*args)

    def run(*args: Any) -> Any:
        if not grad_on():  # a server's calls run under no_grad or inference_mode: no context to enter
            return call(list(args))
        with no_grad():
            return call(list(args))

    def run_aligned(*args: Any) -> Any:
        flat = list(args)
        back = []
        for i in check:
            t = flat[i]
            if t.data_ptr() % 16:
                flat[i] = clone_preserve_strides(t)
                if i in written:
                    back.append((t, flat[i]))
        if not back and not grad_on():
            return call(flat)
        with no_grad():
            out = call(flat)
            for original, copy in back:
                original.copy_(copy)
        return out

    if primer is not None:
        return first_call  # waits for the primer, then calls the plain function
    return run_aligned if check else run
