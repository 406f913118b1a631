"""Read what an Inductor compile left in its cache directory: wrappers, kernel sources, binaries, picks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from precompile.inductor.build.products import Kernel

CPP_KERNEL = re.compile(r"^(\w+) = async_compile\.cpp(?:_pybinding)?\((?:\[.*?\], )?r?'''(.*?)'''", re.S | re.M)
TRITON_KERNEL = re.compile(r"^(\w+) = async_compile\.triton\('(\w+)', r?'''(.*?)'''", re.S | re.M)
_TEMPLATE_META = re.compile(r"@triton_heuristics\.template\((.*?)\)\n@triton\.jit", re.S)
_KV = re.compile(r"(\w+)\s*=\s*([-\w.]+)")


def graph_facts(graphs: list[Any]) -> dict[str, Any]:
    """What the compiled graphs (Inductor's ``CompiledFxGraph`` cache entries) say about their inputs.

    Returns:
        ``{"wrappers": {name: source}, "inputs_to_check": [...], "mutated_inputs": [...],
        "defers_alignment": bool}``: the wrapper ("output code") modules by AOT id; the inputs Inductor assumed
        16-byte aligned; the inputs the graph writes to; and whether the wrapper itself copies its misaligned
        inputs that it does not write to (torch 2.13 does, 2.11 leaves every copy to its caller).
    """
    wrappers: dict[str, str] = {}
    for i, g in enumerate(graphs):
        source = getattr(g, "source_code", None)
        if source:
            aot_id = re.search(r"# AOT ID: \['(\w+)'\]", source)
            wrappers[aot_id.group(1) if aot_id else f"graph_{i}"] = source
    return {
        "wrappers": wrappers,
        "inputs_to_check": sorted({int(i) for g in graphs for i in (getattr(g, "inputs_to_check", None) or [])}),
        "mutated_inputs": sorted({int(i) for g in graphs for i in (getattr(g, "mutated_input_idxs", None) or [])}),
        "defers_alignment": any(bool(getattr(g, "_defers_input_alignment", False)) for g in graphs),
    }


def harvest(root: str, graphs: list[Any]) -> dict[str, Any]:
    """Kernels (sources, binaries, picks) and autotune picks of one compile.

    Returns:
        ``{"kernels": [Kernel, ...], "autotune": {best_config path: config}, "benchmark_leftovers": n}``: the
        picks not attached to a kernel, and how many ``.best_config`` files belonged to kernels that only a
        benchmark compiled (candidates of benchmark fusion, kernels of a ``decompose_k`` subgraph; none is in
        the wrapper, so none is a pick).
    """
    rootp = Path(root)
    wrappers = graph_facts(graphs)["wrappers"]

    files = [p for p in rootp.rglob("*") if p.is_file() and "locks" not in p.parts and "fxgraph" not in p.parts
             and "aotautograd" not in p.parts]
    cpp_files = {p: p.read_text(errors="replace") for p in files if p.suffix == ".cpp"}
    kernels: list[Kernel] = []
    seen: set[str] = set()
    triton_names: set[str] = set()  # the kernel names the wrapper hands async_compile.triton
    for source in wrappers.values():
        for name, text in CPP_KERNEL.findall(source):
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
        for name, kname, text in TRITON_KERNEL.findall(source):
            triton_names.add(kname)
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
    # a config whose compiled variant is a kernel the wrapper does not call was a benchmark's (a candidate of
    # benchmark fusion, a decompose_k subgraph's kernel...): not a pick
    compiled = _compiled_kernel_names(rootp)
    in_wrapper = triton_names | {f for k in kernels if k.lang == "triton" for f in re.findall(r"def (\w+)\(", k.source)}
    autotune, leftovers = {}, 0
    for rel, c in best_configs.items():
        if rel in used:
            continue
        name = compiled.get(c.get("triton_cache_hash"))
        if name is not None and name not in in_wrapper:
            leftovers += 1
        else:
            autotune[rel] = c
    return {"kernels": kernels, "autotune": autotune, "benchmark_leftovers": leftovers}


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


def _compiled_kernel_names(root: Path) -> dict[str, str]:
    """``{Triton cache hash (directory name): kernel function name}`` of every kernel Triton compiled here."""
    names: dict[str, str] = {}
    for meta_path in (root / "triton").rglob("*.json") if (root / "triton").exists() else ():
        if not meta_path.name.startswith("__grp__"):
            try:
                names[meta_path.parent.name] = str(json.loads(meta_path.read_text()).get("name"))
            except (ValueError, AttributeError):
                continue
    return names


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


