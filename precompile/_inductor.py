"""The one module that touches Inductor internals (version shim for torch 2.11 .. 2.13).

Everything precompile needs from Inductor goes through these functions:

- :func:`compile_graph`: run ``torch._inductor.standalone_compile`` in a fresh, private Inductor/Triton cache
  directory and harvest what it produced: the engine payload (Inductor's own cache entries, the portable
  reload path), the wrapper ("output code") modules, every kernel's source, the built binaries (``.so`` for
  C++ kernels; ``.cubin``/``.json`` launcher metadata for Triton kernels), autotune picks (``.best_config``
  files and template configs) and the input-alignment assumptions (``CompiledFxGraph.inputs_to_check``).
- :func:`load_engine`: rebuild a callable from an engine payload (what ``CompiledArtifact.load`` does),
  after placing the carried binaries where Inductor looks for them, so it needs no C++ rebuild.
- :func:`fast_plan` / :func:`load_fast`: the fast load path: Inductor's wrapper module run with light stand-ins
  for its compile-time imports, C++ kernels bound to their carried ``.so``, Triton kernels to their picked cubin
  (carried in a ``.launch.so``) launched by torch's static CUDA launcher; validated bit for bit at build.
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
        fast_off: why the fast path cannot be offered, as found while compiling (e.g. a Triton kernel that
            Inductor does not launch statically), or None.
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
    fast_off: str | None = None


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
            graphs = _read_fx_graphs(root)
            settled = _settle_triton_autotuning(art._compiled_fn, example_inputs, graphs)
            result = _harvest(root, graphs)
            fast_off = settled or _package_triton_kernels(root, result["kernels"])
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
                       compile_seconds=seconds, fast_off=fast_off, **result)


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


# ------------------------------------------------------------------------------- Triton kernels, packaged
#
# The fast path launches each Triton kernel's picked cubin through torch's own static CUDA launcher
# (``torch._C._StaticCudaLauncher``, what Inductor itself uses for statically launchable kernels), so a load
# needs neither Triton nor gcc.  The build records, per kernel, what Inductor's generated launcher does (its
# parameters, the grid expressions for the picked config, the parameters that reach the cubin and their type
# codes, num_warps, shared memory) and packs that record with the picked cubin into one small shared object,
# ``<kernel>.launch.so`` (the cubin and the record as read-only data, the way AOTInductor embeds kernel
# binaries), so that each kernel travels as one loadable binary, as a C++ kernel's ``.so`` does.

_LAUNCH_FORMAT = 1
_LAUNCH_SO = ".launch.so"


class _NotFast(Exception):
    """Why a kernel cannot take the fast path (a reason for the log, never raised to callers)."""


def _settle_triton_autotuning(compiled_fn: Any, example_inputs: list[Any], graphs: list[Any]) -> str | None:
    """Run a graph that has Triton kernels once on the example inputs, so that Inductor autotunes each kernel
    down to one launcher (and writes its ``.best_config``) while the private cache dir is still in place.

    Returns:
        None, or why the fast path is off (the graph is not a plain inference graph, or the run failed).
    """
    if not any("async_compile.triton(" in (getattr(g, "source_code", None) or "") for g in graphs):
        return None
    if len(graphs) != 1:
        return f"{len(graphs)} wrapper modules (a training graph)"
    if getattr(graphs[0], "mutated_input_idxs", None):
        return "the graph mutates its inputs"
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return "an input requires grad"
    try:
        with torch.no_grad():
            compiled_fn(*example_inputs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - only turns the fast path off
        return f"running the compiled graph once failed ({type(err).__name__}: {err})"
    return None


def _live_wrapper_module(names: list[str]) -> Any:
    """The loaded wrapper module that binds every name in ``names`` (Inductor's ``PyCodeCache``), or None."""
    from torch._inductor.codecache import PyCodeCache

    mods = list(getattr(PyCodeCache, "modules", None) or [])
    mods += list((getattr(PyCodeCache, "modules_no_attr", None) or {}).values())
    for m in reversed(mods):
        if hasattr(m, "call") and all(hasattr(m, n) for n in names):
            return m
    return None


def _triton_launch_record(kernel: Any, root: Path) -> tuple[dict[str, Any], bytes]:
    """``(record, cubin bytes)`` for one live ``CachingAutotuner`` that was autotuned to one launcher.

    Raises:
        _NotFast: the kernel cannot be launched by the static launcher, or its launcher is not understood.
    """
    launchers = list(getattr(kernel, "launchers", None) or [])
    if len(launchers) != 1:
        raise _NotFast(f"{len(launchers)} launchers after a run, not one picked config")
    launcher = launchers[0]
    scope = getattr(launcher, "__globals__", None) or {}
    cache_hash = getattr(launcher, "cache_hash", None)
    if getattr(launcher, "_is_static", False):
        static = getattr(scope.get("runner"), "__self__", None)
        if static is None or not isinstance(getattr(static, "arg_tys", None), str):
            raise _NotFast("its static launcher is not understood")
        if type(static).__name__ != "StaticallyLaunchedCudaKernel":
            raise _NotFast(f"launched by {type(static).__name__}, not the CUDA launcher")
        found = [p for p in (root / "triton").rglob(f"{static.name}.cubin") if p.parent.name == cache_hash]
        if not found:
            raise _NotFast(f"the picked cubin triton/{cache_hash}/{static.name}.cubin is not in the cache dir")
        cubin = found[0].read_bytes()
    else:
        # Inductor launches it through Triton's own (gcc-built) launcher, e.g. because its cubin was not
        # where Inductor looked for it; the static launcher reads the same compiled kernel
        static, cubin = _static_from_compiled(scope.get("bin"))
    code = launcher.__code__
    params = list(code.co_varnames[:code.co_argcount])
    if params[-1:] != ["stream"] or code.co_flags & 0x0C:
        raise _NotFast(f"launcher parameters {params} are not understood")
    params = params[:-1]
    constexprs = {int(i) for i in static.full_constexprs}
    passed = [a for i, a in enumerate(static.arg_names) if i not in constexprs]
    if len(passed) != len(static.arg_tys) or any(a not in params for a in passed):
        raise _NotFast(f"cubin parameters {passed} ({static.arg_tys!r}) do not match launcher parameters {params}")
    from torch._inductor.runtime.triton_heuristics import GridExpr

    grid = GridExpr.from_meta(kernel.inductor_meta, launcher.config)
    scratch = int(bool(getattr(static, "has_global_scratch", False))) + int(
        bool(getattr(static, "has_profile_scratch", False)))
    device = (getattr(kernel, "triton_meta", None) or {}).get("device", 0)
    device = getattr(device, "index", device)
    record = {
        "format": _LAUNCH_FORMAT, "name": static.name, "device": int(device or 0), "params": params,
        "passed": passed, "arg_tys": static.arg_tys + "O" * scratch, "scratch": scratch,
        "grid": [*grid.prefix, f"grid_0 = {grid.x_grid}", f"grid_1 = {grid.y_grid}", f"grid_2 = {grid.z_grid}"],
        "num_warps": int(static.num_warps), "shared": int(static.shared), "triton_cache_hash": cache_hash,
    }
    return record, cubin


def _static_from_compiled(binary: Any) -> tuple[Any, bytes]:
    """Inductor's static-launch description of a Triton ``CompiledKernel`` and its cubin bytes.

    Raises:
        _NotFast: the kernel needs what the static launcher does not do (scratch memory, launch attributes,
            clusters), or carries no cubin.
    """
    cubin = (getattr(binary, "asm", None) or {}).get("cubin")
    if not isinstance(cubin, bytes):
        raise _NotFast("Triton's compiled kernel carries no cubin")
    meta = binary.metadata
    if getattr(meta, "launch_pdl", False) or getattr(meta, "launch_cooperative_grid", False):
        raise _NotFast("it needs launch attributes (PDL or a cooperative grid)")
    from torch._inductor.runtime.static_triton_launcher import (
        StaticallyLaunchedCudaKernel,  # the one place it is used: reads a compiled kernel's launch data
    )

    if not hasattr(binary, "_cubin_path"):
        binary._cubin_path = None
    try:
        return StaticallyLaunchedCudaKernel(binary), cubin
    except NotImplementedError as err:
        raise _NotFast(f"the static launcher cannot launch it: {err}") from err


_LAUNCH_SO_C = r"""/* precompile: Triton kernel %(name)s, its picked cubin and launch record (read-only data) */
__asm__(
    "\t.section .rodata\n"
    "\t.balign 128\n"
    "\t.globl pc_cubin\n"
    "pc_cubin:\n"
    "\t.incbin \"%(cubin)s\"\n"
    "\t.globl pc_cubin_end\n"
    "pc_cubin_end:\n"
    "\t.globl pc_record\n"
    "pc_record:\n"
    "\t.incbin \"%(record)s\"\n"
    "\t.byte 0\n"
    "\t.previous\n");
"""


def _build_launch_so(cc: str, tmp: str, record: dict[str, Any], cubin: bytes) -> bytes:
    """Link ``record`` (JSON) and ``cubin`` into a shared object: ``<name>.launch.so`` bytes.

    Raises:
        _NotFast: the compiler failed.
    """
    import subprocess

    d = Path(tempfile.mkdtemp(dir=tmp))
    (d / "k.cubin").write_bytes(cubin)
    (d / "k.json").write_text(json.dumps(record, sort_keys=True))
    (d / "k.c").write_text(_LAUNCH_SO_C % {"name": record["name"], "cubin": d / "k.cubin", "record": d / "k.json"})
    proc = subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", "-o", str(d / "k.so"), str(d / "k.c")],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise _NotFast(f"{cc} failed to package it: {proc.stderr.strip()[-500:]}")
    return (d / "k.so").read_bytes()


def _package_triton_kernels(root: str, kernels: list[Kernel]) -> str | None:
    """Give every Triton kernel a ``<name>.launch.so`` binary (see above).

    Returns:
        None (done, or there are no Triton kernels), or why the fast path is off; then no kernel gets one.
    """
    triton_kernels = [k for k in kernels if k.lang == "triton"]
    if not triton_kernels:
        return None
    module = _live_wrapper_module([k.name for k in triton_kernels])
    if module is None:
        return "the compiled wrapper module is not loaded"
    cc = shutil.which(os.environ.get("CC") or "gcc") or shutil.which("cc")
    if cc is None:
        return "no C compiler to package Triton kernels with"
    try:
        records = []
        for k in triton_kernels:
            records.append((k, *_triton_launch_record(getattr(module, k.name), Path(root))))
    except _NotFast as err:
        return f"Triton kernel {k.name} cannot be launched without Inductor: {err}"
    except Exception as err:  # noqa: BLE001 - Inductor internals changed: only the fast path is lost
        return f"reading Triton kernel {k.name}'s launcher failed ({type(err).__name__}: {err})"
    from concurrent.futures import ThreadPoolExecutor

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="precompile-pack-") as tmp, \
            ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        try:
            built = list(pool.map(lambda r: _build_launch_so(cc, tmp, r[1], r[2]), records))
        except _NotFast as err:
            return str(err)
    for (k, record, _), so in zip(records, built):
        k.binaries[record["name"] + _LAUNCH_SO] = so
    log.info("packaged %d Triton kernels for the fast path in %.2f s", len(built), time.perf_counter() - start)
    return None


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
# compile-time modules (and with them Dynamo and sympy), probes the CPU's vector ISA with gcc, looks up (or
# rebuilds) every C++ kernel and has Triton build its C launchers with gcc.  The fast path runs Inductor's
# wrapper module itself, with its imports of compile-time modules replaced by light stand-ins: every
# ``async_compile.cpp_pybinding(...)`` is bound to the ``.so`` the artifact carries, every
# ``async_compile.triton(...)`` to the picked cubin its ``.launch.so`` carries, launched through
# ``torch._C._StaticCudaLauncher`` (both loaded from memory through memfd, never compiled; Triton itself is
# not imported).  It is only offered for graphs where the wrapper's ``call`` is the whole story: inference, no
# mutated inputs, tensor inputs only (so no symbolic sizes), every kernel with a carried binary; and it is
# validated at build time by comparing its outputs with the freshly compiled callable's, bit for bit.

_FAST_IMPORTS = {
    ("torch._inductor.hooks", "run_intermediate_hooks"): "run_intermediate_hooks",
    ("torch._inductor.utils", "maybe_profile"): "maybe_profile",
    ("torch._inductor.codegen.memory_planning", "_align"): "align",
    ("torch._inductor.async_compile", "AsyncCompile"): "AsyncCompile",
    ("torch._inductor.select_algorithm", "extern_kernels"): "extern_kernels",
    ("torch._inductor.runtime.triton_heuristics", "start_graph"): "noop",
    ("torch._inductor.runtime.triton_heuristics", "end_graph"): "noop",
}
_ALIGN_BYTES = 64  # torch._inductor.utils.ALIGN_BYTES
_OPEN_MEMFDS: list[int] = []


def _memfd(data: bytes, label: str, keep: bool = True) -> tuple[int, str]:
    """``(fd, /proc/self/fd path)`` of an anonymous in-memory file holding ``data``.

    A ``keep`` fd stays open for the life of the process: dlopen() recognizes an already loaded library by its
    path string, so a closed and reused /proc/self/fd/N would hand back another library.
    """
    fd = os.memfd_create(label, getattr(os, "MFD_CLOEXEC", 0))
    if keep:
        _OPEN_MEMFDS.append(fd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return fd, f"/proc/self/fd/{fd}"


class _LazyModule:
    """Stands in for ``import triton`` in a wrapper: imports the module only if an attribute is used."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attr)


class _FastRuntime:
    """What the rewritten wrapper module imports instead of Inductor's compile-time modules."""

    def __init__(self, kernels: dict[str, bytes], extern: dict[str, Any]):
        self._kernels = kernels  # sha256 of kernel source -> .so bytes
        self.extern_kernels = _Namespace(extern)
        runtime = self

        class AsyncCompile:  # noqa: D401 - mirrors Inductor's name
            def cpp_pybinding(self, argtypes: Any, source: str, *args: Any, **kwargs: Any) -> Any:
                return runtime.load_cpp(source)

            def triton(self, kernel_name: str, source: str, *args: Any, **kwargs: Any) -> Any:
                return runtime.load_triton(source)

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
        return (nbytes + _ALIGN_BYTES - 1) & -_ALIGN_BYTES

    @staticmethod
    def lazy(name: str) -> _LazyModule:
        return _LazyModule(name)

    def _binary(self, source: str, lang: str) -> tuple[str, bytes]:
        import hashlib

        digest = hashlib.sha256(source.encode()).hexdigest()
        so = self._kernels.get(digest)
        if so is None:
            raise KeyError(f"no carried binary for {lang} kernel source {digest[:12]}")
        return digest, so

    def load_cpp(self, source: str) -> Any:
        import importlib.machinery
        import importlib.util
        import sys

        digest, so = self._binary(source, "C++")
        name = f"precompile_k{digest[:24]}.kernel"
        module = sys.modules.get(name)
        if module is None:
            os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(
                torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)
            _, path = _memfd(so, f"pc-{digest[:16]}.so")
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_loader(name, loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[name] = module
        return module.kernel

    def load_triton(self, source: str) -> Any:
        digest, so = self._binary(source, "Triton")
        return _TritonKernel(*_read_launch_so(so, digest))


class _Namespace:
    def __init__(self, table: dict[str, Any]):
        self.__dict__.update(table)


def _read_launch_so(so: bytes, digest: str) -> tuple[dict[str, Any], bytes]:
    """``(launch record, cubin bytes)`` from a ``<kernel>.launch.so`` (see :func:`_build_launch_so`).

    Raises:
        ValueError: the record is of another format, or names parameters that are not identifiers.
        OSError / AttributeError: the shared object does not load or lacks the symbols.
    """
    import ctypes

    _, path = _memfd(so, f"pc-{digest[:16]}.launch.so")
    lib = ctypes.CDLL(path)
    start = ctypes.addressof(ctypes.c_char.in_dll(lib, "pc_cubin"))
    end = ctypes.addressof(ctypes.c_char.in_dll(lib, "pc_cubin_end"))
    record = json.loads(ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "pc_record"))))
    if record.get("format") != _LAUNCH_FORMAT:
        raise ValueError(f"launch record format {record.get('format')!r}, this precompile reads {_LAUNCH_FORMAT}")
    if not all(isinstance(a, str) and a.isidentifier() for a in record["params"] + record["passed"]):
        raise ValueError("launch record names parameters that are not identifiers")
    return record, ctypes.string_at(start, end - start)


class _TritonKernel:
    """A Triton kernel's picked cubin, loaded into the current CUDA context and launched by torch's static
    launcher; ``run(*params, stream=...)`` as the wrapper calls Inductor's ``CachingAutotuner.run``."""

    def __init__(self, record: dict[str, Any], cubin: bytes):
        launcher = torch._C._StaticCudaLauncher
        torch.cuda.init()
        fd, path = _memfd(cubin, record["name"] + ".cubin", keep=False)
        try:
            # torch 2.11 returns (function, n_regs, n_spills); later versions put the module handle first
            self.handles = launcher._load_kernel(path, record["name"], record["shared"], record["device"])
        finally:
            os.close(fd)
        self.name = record["name"]
        self.run = _launcher_function(record, launcher._launch_kernel, self.handles[-3])


def _launcher_function(record: dict[str, Any], launch: Any, function: Any) -> Any:
    """``run(*params, stream)``: computes the grid for the picked config as Inductor's generated launcher does
    and calls ``launch(function, grid_0, grid_1, grid_2, num_warps, shared, arg_tys, args, stream)``."""
    passed = [*record["passed"], *["None"] * record["scratch"]]
    call = (f"    launch(function, grid_0, grid_1, grid_2, {int(record['num_warps'])}, {int(record['shared'])}, "
            f"{record['arg_tys']!r}, ({''.join(a + ', ' for a in passed)}), stream)")
    lines = [f"def run({', '.join([*record['params'], 'stream'])}):", *[f"    {line}" for line in record["grid"]], call]
    scope = {"launch": launch, "function": function}
    exec(compile("\n".join(lines), f"<precompile launcher {record['name']}>", "exec"), scope)  # noqa: S102
    return scope["run"]


def _rewrite_wrapper(source: str) -> str | None:
    """The wrapper source with its top-level imports of Inductor compile-time modules replaced by names bound
    from ``__pc`` (a :class:`_FastRuntime`) and ``import triton...`` by lazy stand-ins, or None if it imports
    something else from ``torch._inductor``."""
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


def _has_launch_binary(k: Kernel) -> bool:
    if k.lang == "cpp":
        return any(f.endswith(".so") for f in k.binaries)
    if k.lang == "triton":
        so = [f for f in k.binaries if f.endswith(".so")]
        return len(so) == 1 and so[0].endswith(_LAUNCH_SO)
    return False


def fast_plan(result: BuildResult, flat_inputs: list[Any]) -> dict[str, Any] | None:
    """Decide whether ``result`` can be loaded by the fast path, and validate it.

    Returns:
        ``{"wrapper": name, "extern": {name: "module:qualname"}, "source": the wrapper with its imports replaced
        (what a fast load runs, so a load does not parse the wrapper again)}`` or None (then loads take the
        portable path).
        The fast callable is built from the in-memory products and its outputs on ``flat_inputs`` must equal
        the fresh callable's bit for bit; a mismatch or any failure means None, with the reason logged.
    """
    import hashlib

    def off(reason: str) -> None:
        log.info("fast path off: %s", reason)

    if result.fast_off:
        return off(result.fast_off)
    if len(result.wrappers) != 1:
        return off(f"{len(result.wrappers)} wrapper modules (a training graph)")
    if result.mutated_inputs:
        return off("the graph mutates its inputs")
    missing = [k.name for k in result.kernels if not _has_launch_binary(k)]
    if missing:
        return off(f"no loadable binary for kernels {missing[:5]}")
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat_inputs):
        return off("an input requires grad")
    if any(not isinstance(x, torch.Tensor) for x in flat_inputs):
        return off("an input is not a tensor")
    (name, source), = result.wrappers.items()
    other = re.search(r"async_compile\.(?!cpp_pybinding\(|triton\(|wait\()\w+\(", source)
    if other:
        return off(f"the wrapper calls {other.group(0)}")
    if _rewrite_wrapper(source) is None:
        return off("the wrapper imports Inductor modules the fast path does not stand in for")
    extern: dict[str, str] = {}
    for ename in sorted(set(re.findall(r"\bextern_kernels\.(\w+)", source))):
        from torch._inductor.select_algorithm import extern_kernels

        fn = getattr(extern_kernels, ename, None)
        ref = _importable_name(fn)
        if ref is None:
            return off(f"extern kernel {ename} ({fn!r}) is not importable by name")
        extern[ename] = ref
    kernels = {hashlib.sha256(k.source.encode()).hexdigest(): next(b for f, b in sorted(k.binaries.items())
                                                                    if f.endswith(".so"))
               for k in result.kernels}
    try:
        fast = load_fast(source, extern, kernels, result.inputs_to_check)
        with torch.no_grad():
            want = result.compiled_fn(*flat_inputs)
            got = fast(*flat_inputs)
        want, got = list(want), list(got)
        same = len(want) == len(got) and all(
            type(a) is type(b) and (not isinstance(a, torch.Tensor) or (
                a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device
                and torch.equal(a, b)))
            for a, b in zip(want, got))
    except Exception as err:  # noqa: BLE001 - any failure only turns the fast path off
        return off(f"validation failed: {type(err).__name__}: {err}")
    if not same:
        return off("outputs differ from the freshly compiled callable")
    return {"wrapper": name, "extern": extern, "source": _rewrite_wrapper(source)}


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
              inputs_to_check: list[int], *, rewritten: bool = False) -> Any:
    """Build a callable from a wrapper module's source and carried kernel binaries, compiling nothing.

    Args:
        wrapper_source: Inductor's output code.
        extern: ``{extern kernel name: "module:qualname"}`` for ``extern_kernels.<name>`` calls.
        kernels: ``{sha256 of a C++ kernel's source: its .so bytes}``.
        inputs_to_check: inputs Inductor assumed 16-byte aligned: misaligned ones are cloned first, as
            Inductor's own ``copy_misaligned_inputs`` does.
        rewritten: ``wrapper_source`` is already :func:`_rewrite_wrapper`'s output (``fast_plan``'s ``source``,
            stored at build), so it is not parsed again (about 0.1 s for a small Llama's wrapper).

    Returns:
        ``fn(*flat_inputs) -> tuple of outputs``.

    Raises:
        ValueError: the wrapper imports Inductor modules the fast path does not stand in for.
        KeyError: a kernel has no carried binary.
        ImportError / OSError: a binary or an extern kernel failed to load.
    """
    import importlib

    src = wrapper_source if rewritten else _rewrite_wrapper(wrapper_source)
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
