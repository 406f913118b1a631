"""The one module that touches Inductor internals (version shim for torch 2.11 .. 2.13).

Everything precompile needs from Inductor goes through these functions:

- :func:`compile_graph`: run ``torch._inductor.standalone_compile`` in a fresh, private Inductor/Triton cache
  directory and harvest what it produced: the engine payload (Inductor's own cache entries, the portable
  reload path), the wrapper ("output code") modules, every kernel's source, the built binaries (``.so`` for
  C++ kernels; ``.cubin``/``.json`` launcher metadata for Triton kernels), autotune picks (``.best_config``
  files and template configs) and the input-alignment assumptions (``CompiledFxGraph.inputs_to_check``).
- :func:`load_engine`: rebuild a callable from an engine payload (what ``CompiledArtifact.load`` does),
  after placing the carried binaries where Inductor looks for them, so it needs no C++ rebuild.
- :func:`inductor_config_overrides`: normalize ``options`` for the key.

Upgrading torch should mean changing this file only.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("precompile.inductor")

@dataclass
class Kernel:
    """One generated kernel.

    Attributes:
        name: the name the wrapper binds it to (``cpp_fused_add_0``, ``triton_poi_fused_add_0``).
        lang: ``"cpp"`` or ``"triton"``.
        source: the kernel source text as Inductor generated it.
        binaries: ``{file name: bytes}`` built from it (``x.so``; ``x.cubin`` + ``x.json``...).
        config: the autotune pick for it (block sizes, num_warps, num_stages...), or None.
        relpaths: ``{file name: path relative to the Inductor cache dir}`` where Inductor stored each file.
    """

    name: str
    lang: str
    source: str
    binaries: dict[str, bytes] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    relpaths: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildResult:
    """What one Inductor compile produced.

    Attributes:
        compiled_fn: the live callable (flat list of inputs in, tuple of outputs out).
        engine_payload: bytes that :func:`load_engine` turns back into a callable.
        wrappers: ``{name: python source}`` of each wrapper module (``forward``, and ``backward`` if any).
        kernels: every generated kernel with its binaries.
        autotune: autotune picks not attached to one kernel (``{"file": config}``), e.g. GEMM choices.
        inputs_to_check: indices of inputs Inductor assumed 16-byte aligned and checks (clones if not) per call.
        mutated_inputs: indices of inputs the graph writes to.
        compile_seconds: wall time of the Inductor compile, seconds.
        cache_files: ``{relpath: size in bytes}`` of every file in the private cache dir (for inspection).
    """

    compiled_fn: Any
    engine_payload: bytes
    wrappers: dict[str, str]
    kernels: list[Kernel]
    autotune: dict[str, Any]
    inputs_to_check: list[int]
    mutated_inputs: list[int]
    compile_seconds: float
    cache_files: dict[str, int]


class NotSaveableError(RuntimeError):
    """Inductor compiled the graph but produced no cache entry to save (something in it is not cacheable)."""


# ------------------------------------------------------------------------------------------------ options


def inductor_config_overrides(options: dict[str, Any] | None) -> dict[str, Any]:
    """Normalized Inductor config patches for the artifact key.

    Entries equal to Inductor's default are dropped (``{"max_autotune": False}`` keys like ``{}``); nested
    dicts are flattened to dotted names.

    Raises:
        KeyError: an option is not an Inductor config name (the message lists close names).
        TypeError: a value is not JSON-representable (bool, int, float, str, None, list, dict).
    """
    from torch._inductor import config

    out: dict[str, Any] = {}
    for name, value in _flatten(options or {}).items():
        entry = config._config.get(name)
        if entry is None:
            import difflib

            close = difflib.get_close_matches(name, list(config._config), n=3)
            raise KeyError(f"{name!r} is not an Inductor config option" + (f"; did you mean {close}?" if close else ""))
        _check_jsonable(name, value)
        default = entry.default
        if _is_real_default(default) and value == default:
            continue
        out[name] = value
    return dict(sorted(out.items()))


def _flatten(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    from torch._inductor import config

    flat: dict[str, Any] = {}
    for k, v in options.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and name not in config._config:
            flat.update(_flatten(v, name + "."))
        else:
            flat[name] = v
    return flat


def _is_real_default(value: Any) -> bool:
    return type(value) is not object


def _check_jsonable(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"Inductor option {name!r} has value {value!r}, which cannot be stored in a key "
                        "(use bool, int, float, str, None, lists and dicts)") from err


# ------------------------------------------------------------------------------------------------ compile


@contextlib.contextmanager
def _private_cache_dir():
    """A fresh Inductor + Triton cache dir with in-memory code caches cleared, so the compile is complete
    (nothing reused from earlier compiles in this process or on this disk) and every product lands in it."""
    from torch._inductor.utils import clear_caches

    root = tempfile.mkdtemp(prefix="precompile-build-")
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = root
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    clear_caches()
    try:
        yield root
    finally:
        clear_caches()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], *, dynamic_shapes: str,
                  options: dict[str, Any] | None) -> BuildResult:
    """Compile ``gm`` with Inductor and harvest everything it produced.  See module docstring.

    Raises:
        NotSaveableError: Inductor produced no cache entry (e.g. the graph holds an uncacheable op).
        Exception: whatever Inductor raised while compiling (the caller wraps it in ``BuildError``).
    """
    with _private_cache_dir() as root:
        try:
            start = time.perf_counter()
            # torch's ``options`` are compile_fx keyword arguments; config patches go in ``config_patches``
            art = torch._inductor.standalone_compile(gm, example_inputs, dynamic_shapes=dynamic_shapes,
                                                     options={"config_patches": dict(options or {})})
            seconds = time.perf_counter() - start
            artifacts = getattr(art, "_artifacts", None)
            if artifacts is None:
                raise NotSaveableError("Inductor saved no cache artifacts for this graph")
            payload_bytes, cache_info = artifacts
            aot = list(cache_info.aot_autograd_artifacts)
            if len(aot) != 1:
                raise NotSaveableError(
                    f"expected one AOTAutograd cache entry, Inductor produced {len(aot)} ({cache_info}); "
                    "something in the graph is not cacheable")
            payload = pickle.dumps({"aot_key": aot[0], "cache_artifacts": payload_bytes}, protocol=4)
            result = _harvest(root, _read_fx_graphs(root))
            cache_files = {str(p.relative_to(root)): p.stat().st_size for p in Path(root).rglob("*") if p.is_file()}
            ks = result["kernels"]
            log.info("compiled in %.1f s: %d kernels (%d cpp, %d triton), %d with binaries, %d autotune picks, "
                     "%d files in the Inductor cache dir", seconds, len(ks), sum(k.lang == "cpp" for k in ks),
                     sum(k.lang == "triton" for k in ks), sum(bool(k.binaries) for k in ks),
                     sum(bool(k.config) for k in ks) + len(result["autotune"]), len(cache_files))
            log.debug("Inductor cache dir files: %s", sorted(cache_files))
        finally:
            # every product is in memory now; C++ kernels are loaded already, but Triton may still open files
            # of the live callable lazily: then the directory goes when the process ends
            if any(p.suffix in (".cubin", ".hsaco") for p in Path(root).rglob("*")):
                atexit.register(shutil.rmtree, root, ignore_errors=True)
            else:
                shutil.rmtree(root, ignore_errors=True)
    compiled = art._compiled_fn
    return BuildResult(compiled_fn=compiled, engine_payload=payload, cache_files=cache_files,
                       compile_seconds=seconds, **result)


def _read_fx_graphs(root: str) -> list[Any]:
    graphs = []
    for path in sorted(Path(root, "fxgraph").rglob("*")):
        if path.is_file():
            try:
                with open(path, "rb") as f:
                    graphs.append(pickle.load(f))
            except Exception as err:  # noqa: BLE001 - an unreadable entry only loses inspect detail
                log.debug("could not read Inductor FX graph cache entry %s: %s", path, err)
    return graphs


_CPP_KERNEL = re.compile(r"^(\w+) = async_compile\.cpp(?:_pybinding)?\((?:\[.*?\], )?r?'''(.*?)'''", re.S | re.M)
_TRITON_KERNEL = re.compile(r"^(\w+) = async_compile\.triton\('(\w+)', r?'''(.*?)'''", re.S | re.M)
_TEMPLATE_META = re.compile(r"@triton_heuristics\.template\((.*?)\)\n@triton\.jit", re.S)
_KV = re.compile(r"(\w+)\s*=\s*([-\w.]+)")


def _harvest(root: str, graphs: list[Any]) -> dict[str, Any]:
    rootp = Path(root)
    wrappers: dict[str, str] = {}
    for i, g in enumerate(graphs):
        source = getattr(g, "source_code", None)
        if source:
            aot_id = re.search(r"# AOT ID: \['(\w+)'\]", source)
            wrappers[aot_id.group(1) if aot_id else f"graph_{i}"] = source
    inputs_to_check = sorted({int(i) for g in graphs for i in (getattr(g, "inputs_to_check", None) or [])})
    mutated = sorted({int(i) for g in graphs for i in (getattr(g, "mutated_input_idxs", None) or [])})

    files = [p for p in rootp.rglob("*") if p.is_file() and "locks" not in p.parts and "fxgraph" not in p.parts
             and "aotautograd" not in p.parts]
    cpp_files = {p: p.read_text(errors="replace") for p in files if p.suffix == ".cpp"}
    kernels: list[Kernel] = []
    seen: set[str] = set()
    for source in wrappers.values():
        for name, text in _CPP_KERNEL.findall(source):
            if name in seen:
                continue
            seen.add(name)
            k = Kernel(name=name, lang="cpp", source=text)
            body = text.strip()
            for path, content in cpp_files.items():
                if body and body in content:
                    so = path.with_suffix(".so")
                    k.relpaths[path.name] = str(path.relative_to(rootp))
                    if so.exists():
                        k.binaries[so.name] = so.read_bytes()
                        k.relpaths[so.name] = str(so.relative_to(rootp))
                    break
            kernels.append(k)
        for name, kname, text in _TRITON_KERNEL.findall(source):
            if name in seen:
                continue
            seen.add(name)
            k = Kernel(name=name, lang="triton", source=text)
            k.config = _template_config(text)
            kernels.append(k)
    best_configs: dict[str, Any] = {}
    for p in files:
        if p.suffix == ".best_config":
            try:
                best_configs[str(p.relative_to(rootp))] = json.loads(p.read_text())
            except ValueError:
                continue
    picked_hashes = {c.get("triton_cache_hash"): (rel, c) for rel, c in best_configs.items()
                     if c.get("triton_cache_hash")}
    used = _attach_triton_binaries(rootp, kernels, picked_hashes)
    _attach_bundled_binaries(graphs, kernels)
    autotune = {rel: c for rel, c in best_configs.items() if rel not in used}
    return {"wrappers": wrappers, "kernels": kernels, "autotune": autotune,
            "inputs_to_check": inputs_to_check, "mutated_inputs": mutated}


def _template_config(source: str) -> dict[str, Any] | None:
    m = _TEMPLATE_META.search(source)
    if not m:
        return None
    cfg: dict[str, Any] = {"kind": "template"}
    for k, v in _KV.findall(m.group(1)):
        if k in ("num_stages", "num_warps"):
            cfg[k] = int(v)
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K", "ALLOW_TF32", "USE_FAST_ACCUM"):
        mm = re.search(rf"\b{k}\s*:\s*tl\.constexpr\s*=\s*([-\w.]+)", source)
        if mm:
            cfg[k] = mm.group(1)
    return cfg


def _attach_triton_binaries(root: Path, kernels: list[Kernel],
                            picked_hashes: dict[str, tuple[str, dict[str, Any]]]) -> set[str]:
    """Attach each Triton kernel's compiled files from the private Triton cache dir.

    Autotuning compiles one variant per candidate config, each in its own ``triton/<hash>/`` directory.  The
    variant named by a ``.best_config`` file (its ``triton_cache_hash``) is the pick; without one, a kernel
    with a single variant gets it, and a kernel with several keeps all of them under ``<hash>/<file>`` names.

    Returns:
        the ``.best_config`` paths that were attached to a kernel.
    """
    by_fn: dict[str, Kernel] = {}
    for k in kernels:
        if k.lang == "triton":
            m = re.search(r"def (\w+)\(", k.source)
            if m:
                by_fn[m.group(1)] = k
    used: set[str] = set()
    triton_dir = root / "triton"
    if not triton_dir.exists():
        return used
    variants: dict[str, list[tuple[str, dict[str, Any], dict[str, bytes]]]] = {}
    for meta_path in sorted(triton_dir.rglob("*.json")):
        if meta_path.name.startswith("__grp__"):
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:
            continue
        if meta.get("name") not in by_fn:
            continue
        files = {p.name: p.read_bytes() for p in sorted(meta_path.parent.iterdir())
                 if p.is_file() and p.suffix in (".cubin", ".json", ".hsaco", ".spv", ".ptx")}
        variants.setdefault(meta["name"], []).append((meta_path.parent.name, meta, files))
    for fn, found in variants.items():
        k = by_fn[fn]
        chosen = [v for v in found if v[0] in picked_hashes]
        if chosen:
            rel, cfg = picked_hashes[chosen[0][0]]
            used.add(rel)
            k.config = {**(k.config or {}), **cfg}
        chosen = chosen[:1] or found
        for thash, meta, files in chosen:
            for name, data in files.items():
                fname = name if len(chosen) == 1 else f"{thash}/{name}"
                k.binaries[fname] = data
                k.relpaths[fname] = f"triton/{thash}/{name}"
        if len(chosen) == 1:
            meta = chosen[0][1]
            k.config = {**{f: meta.get(f) for f in ("num_warps", "num_stages", "num_ctas", "maxnreg") if f in meta},
                        **(k.config or {})}
    return used


def _attach_bundled_binaries(graphs: list[Any], kernels: list[Kernel]) -> None:
    """Triton binaries from the FX graph cache entries' Triton bundle, for kernels not found on disk (e.g.
    compiled by a worker pool whose Triton cache dir was fixed before our private dir existed)."""
    by_fn: dict[str, Kernel] = {}
    for k in kernels:
        m = re.search(r"def (\w+)\(", k.source) if k.lang == "triton" else None
        if m and not k.binaries:
            by_fn[m.group(1)] = k
    if not by_fn:
        return
    for g in graphs:
        bundle = getattr(g, "_triton_bundle", None)
        for group in getattr(bundle, "kernel_artifacts", None) or []:
            for a in getattr(group, "artifacts", []):
                stem = a.filename.rsplit(".", 1)[0]
                k = by_fn.get(stem)
                if k is not None and not a.filename.startswith("__grp__"):
                    k.binaries[a.filename] = a.payload
                    k.relpaths[a.filename] = f"triton/{group.kernel_hash}/{a.filename}"


# --------------------------------------------------------------------------------------------------- load


def load_engine(payload: bytes, binaries: dict[str, bytes] | None = None) -> Any:
    """Rebuild the compiled callable from an engine payload: the portable path, as ``CompiledArtifact.load``.

    Args:
        payload: :attr:`BuildResult.engine_payload`.
        binaries: ``{relpath: bytes}`` of carried binaries to place into Inductor's cache dir first, so that
            Inductor finds them and skips rebuilding; a file that already exists is left alone.

    Returns:
        a callable taking a flat list/tuple of inputs and returning the outputs.

    Raises:
        ValueError: the payload does not unpickle into the expected form.
    """
    try:
        data = pickle.loads(payload)
        aot_key, cache_bytes = data["aot_key"], data["cache_artifacts"]
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"engine payload does not decode: {err}") from err
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    base = Path(cache_dir())
    for rel, data_bytes in (binaries or {}).items():
        target = base / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.incomplete")
        tmp.write_bytes(data_bytes)
        os.replace(tmp, target)
    torch.compiler.load_cache_artifacts(cache_bytes)
    from torch._inductor.standalone_compile import CacheCompiledArtifact

    art = CacheCompiledArtifact._load_impl(contextlib.nullcontext(), aot_key)
    return art._compiled_fn


# ------------------------------------------------------------------------------------------- fast path
#
# The portable path above rebuilds the callable the way ``CompiledArtifact.load`` does: it imports Inductor's
# compile-time modules, probes the CPU's vector ISA with gcc and looks up (or rebuilds) every C++ kernel.  The
# fast path runs Inductor's wrapper module itself, with its imports of compile-time modules replaced by light
# stand-ins and every ``async_compile.cpp_pybinding(...)`` bound to the ``.so`` the artifact carries (loaded
# from memory through memfd, never compiled).  It is only offered for graphs where the wrapper's ``call`` is
# the whole story: inference, no mutated inputs, tensor inputs only (so no symbolic sizes), every kernel C++
# with a carried binary; and it
# is validated at build time by comparing its outputs with the freshly compiled callable's, bit for bit.

_FAST_IMPORTS = {
    ("torch._inductor.hooks", "run_intermediate_hooks"): "run_intermediate_hooks",
    ("torch._inductor.utils", "maybe_profile"): "maybe_profile",
    ("torch._inductor.codegen.memory_planning", "_align"): "align",
    ("torch._inductor.async_compile", "AsyncCompile"): "AsyncCompile",
    ("torch._inductor.select_algorithm", "extern_kernels"): "extern_kernels",
}
_ALIGN_BYTES = 64  # torch._inductor.utils.ALIGN_BYTES
_OPEN_MEMFDS: list[int] = []


class _FastRuntime:
    """What the rewritten wrapper module imports instead of Inductor's compile-time modules."""

    def __init__(self, kernels: dict[str, bytes], extern: dict[str, Any]):
        self._kernels = kernels  # sha256 of kernel source -> .so bytes
        self.extern_kernels = _Namespace(extern)
        runtime = self

        class AsyncCompile:  # noqa: D401 - mirrors Inductor's name
            def cpp_pybinding(self, argtypes: Any, source: str, *args: Any, **kwargs: Any) -> Any:
                return runtime.load_cpp(source)

            def wait(self, scope: Any) -> None:
                return None

        self.AsyncCompile = AsyncCompile

    @staticmethod
    def run_intermediate_hooks(name: str, value: Any) -> None:
        return None

    @staticmethod
    @contextlib.contextmanager
    def maybe_profile(should_profile: bool, *args: Any, **kwargs: Any):
        yield

    @staticmethod
    def align(nbytes: int) -> int:
        return (nbytes + _ALIGN_BYTES - 1) & -_ALIGN_BYTES

    def load_cpp(self, source: str) -> Any:
        import hashlib
        import importlib.machinery
        import importlib.util
        import sys

        digest = hashlib.sha256(source.encode()).hexdigest()
        so = self._kernels.get(digest)
        if so is None:
            raise KeyError(f"no carried binary for C++ kernel source {digest[:12]}")
        name = f"precompile_k{digest[:24]}.kernel"
        module = sys.modules.get(name)
        if module is None:
            os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(
                torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)
            # The memfd stays open for the life of the process: dlopen() recognizes an already loaded library
            # by its path string, so a closed and reused /proc/self/fd/N would hand back another kernel.
            fd = os.memfd_create(f"pc-{digest[:16]}.so", getattr(os, "MFD_CLOEXEC", 0))
            _OPEN_MEMFDS.append(fd)
            view = memoryview(so)
            while view:
                view = view[os.write(fd, view):]
            loader = importlib.machinery.ExtensionFileLoader(name, f"/proc/self/fd/{fd}")
            spec = importlib.util.spec_from_loader(name, loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[name] = module
        return module.kernel


class _Namespace:
    def __init__(self, table: dict[str, Any]):
        self.__dict__.update(table)


def _rewrite_wrapper(source: str) -> str | None:
    """The wrapper source with its top-level imports of Inductor compile-time modules replaced by names bound
    from ``__pc`` (a :class:`_FastRuntime`), or None if it imports something else from ``torch._inductor``."""
    import ast

    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: dict[int, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._inductor"):
            repl = []
            for alias in node.names:
                attr = _FAST_IMPORTS.get((node.module, alias.name))
                if attr is None:
                    return None
                repl.append(f"{alias.asname or alias.name} = __pc.{attr}")
            if node.end_lineno != node.lineno:
                return None
            edits[node.lineno - 1] = "; ".join(repl) + "\n"
        elif isinstance(node, ast.Import) and any(a.name.startswith("torch._inductor") for a in node.names):
            return None
    for i, text in edits.items():
        lines[i] = text
    return "".join(lines)


def fast_plan(result: BuildResult, flat_inputs: list[Any]) -> dict[str, Any] | None:
    """Decide whether ``result`` can be loaded by the fast path, and validate it.

    Returns:
        ``{"wrapper": name, "extern": {name: "module:qualname"}}`` or None (then loads take the portable path).
        The fast callable is built from the in-memory products and its outputs on ``flat_inputs`` must equal
        the fresh callable's bit for bit; a mismatch or any failure means None, logged at debug level.
    """
    import hashlib

    if len(result.wrappers) != 1 or result.mutated_inputs:
        return None
    if any(k.lang != "cpp" or not any(f.endswith(".so") for f in k.binaries) for k in result.kernels):
        return None
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat_inputs):
        return None
    if any(not isinstance(x, torch.Tensor) for x in flat_inputs):
        return None
    (name, source), = result.wrappers.items()
    if re.search(r"async_compile\.(?!cpp_pybinding\(|wait\()\w+\(", source) or _rewrite_wrapper(source) is None:
        return None
    extern: dict[str, str] = {}
    for ename in sorted(set(re.findall(r"\bextern_kernels\.(\w+)", source))):
        from torch._inductor.select_algorithm import extern_kernels

        fn = getattr(extern_kernels, ename, None)
        ref = _importable_name(fn)
        if ref is None:
            log.debug("fast path off: extern kernel %s (%r) is not importable by name", ename, fn)
            return None
        extern[ename] = ref
    kernels = {hashlib.sha256(k.source.encode()).hexdigest(): next(b for f, b in k.binaries.items() if f.endswith(".so"))
               for k in result.kernels}
    try:
        fast = load_fast(source, extern, kernels, result.inputs_to_check)
        with torch.no_grad():
            want = result.compiled_fn(*flat_inputs)
            got = fast(*flat_inputs)
        want, got = list(want), list(got)
        same = len(want) == len(got) and all(
            type(a) is type(b) and (not isinstance(a, torch.Tensor) or (
                a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype and torch.equal(a, b)))
            for a, b in zip(want, got))
    except Exception as err:  # noqa: BLE001 - any failure only turns the fast path off
        log.debug("fast path off: validation failed: %s: %s", type(err).__name__, err)
        return None
    if not same:
        log.debug("fast path off: outputs differ from the freshly compiled callable")
        return None
    return {"wrapper": name, "extern": extern}


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


def load_fast(wrapper_source: str, extern: dict[str, str], kernels: dict[str, bytes],
              inputs_to_check: list[int]) -> Any:
    """Build a callable from a wrapper module's source and carried kernel binaries, compiling nothing.

    Args:
        wrapper_source: Inductor's output code.
        extern: ``{extern kernel name: "module:qualname"}`` for ``extern_kernels.<name>`` calls.
        kernels: ``{sha256 of a C++ kernel's source: its .so bytes}``.
        inputs_to_check: inputs Inductor assumed 16-byte aligned: misaligned ones are cloned first, as
            Inductor's own ``copy_misaligned_inputs`` does.

    Returns:
        ``fn(*flat_inputs) -> tuple of outputs``.

    Raises:
        ValueError: the wrapper imports Inductor modules the fast path does not stand in for.
        KeyError: a kernel has no carried binary.
        ImportError / OSError: a binary or an extern kernel failed to load.
    """
    import importlib

    src = _rewrite_wrapper(wrapper_source)
    if src is None:
        raise ValueError("the wrapper imports Inductor modules the fast path cannot stand in for")
    table = {}
    for ename, ref in extern.items():
        module, _, qual = ref.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        table[ename] = obj
    ns: dict[str, Any] = {"__name__": "precompile_wrapper", "__pc": _FastRuntime(kernels, table)}
    exec(compile(src, "<precompile wrapper>", "exec"), ns)  # noqa: S102 - Inductor's own generated code
    call = ns["call"]
    check = list(inputs_to_check)

    no_grad = torch.no_grad

    def run(*args: Any) -> Any:
        flat = list(args)
        for i in check:
            t = flat[i]
            if t.data_ptr() % 16:
                flat[i] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)
        # an inference graph: Inductor's runtime wrapper runs it without autograd too
        with no_grad():
            return call(flat)

    return run
