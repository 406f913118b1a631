"""GEMM and convolution picks: which choice Inductor's ``max_autotune`` took for each tuned op, and what every
candidate measured.

Inductor's ``AlgorithmSelectorCache`` benchmarks the candidates of each tunable op (``mm``, ``addmm``, ``bmm``,
``convolution``...): the extern kernels (cuBLAS through ``extern_kernels.mm``...), its Triton templates (one per
config: block sizes, stages, warps), and subgraph choices such as ``decompose_k`` (the K dimension split into a
batched mm and a sum, from the seed PR notes).  After each benchmark it calls every registered feedback saver
(``torch._inductor.select_algorithm.add_feedback_saver``) with the timings; :func:`recording` registers one for
the length of a build.  With benchmark fusion (``benchmark_epilogue_fusion``), the op's node stays a
``MultiTemplateBuffer`` until the scheduler picks, by benchmarking fused kernels, the Triton template it keeps;
:func:`recording` also notes each such final pick.

A record, as the manifest stores it under ``autotune.tuned``::

    {"op": "mm", "inputs": ["32x16384 float32", "16384x64 float32"],
     "chosen": "decompose_k_mm_256_split", "by": "benchmark",            # or "benchmark fusion"
     "candidates": [{"choice": ..., "kind": "extern" | "triton template" | "decompose_k" | "subgraph" | ...,
                     "config": {...}, "ms": 0.0123 or None (failed)}, ...]}     # fastest first

Times are Inductor's benchmark times, milliseconds.  Candidates are capped at :data:`MAX_CANDIDATES` per op.
``chosen`` is the benchmark's pick, or the template benchmark fusion finalized; where the scheduler instead falls
back to an extern kernel for a ``MultiTemplateBuffer`` (a layout it cannot fuse), the record still names the
benchmark's pick.  One recording at a time per process (a lock): Inductor's selector and the patched methods are
process-wide.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from typing import Any, Iterator

from precompile.inductor import shim

log = logging.getLogger("precompile.inductor")

#: Most candidates kept per tuned op (fastest first); the rest are counted in ``"more"``.
MAX_CANDIDATES = 64

_DECOMPOSE_K = re.compile(r"decompose_k_\w*?_(\d+)_split")
_CONFIG_KEYS = ("tile_shape", "num_stages", "num_warps", "GROUP_M", "EVEN_K", "ALLOW_TF32", "allow_tf32",
                "USE_FAST_ACCUM", "kernel_call_name", "k_split")
_COUNTER = re.compile(r"_\d+$")
_LOCK = threading.RLock()


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Record every tuned op's candidates and pick while the body compiles (see the module docstring).

    Yields the list the records are appended to; it is complete when the body returns.  Where this torch offers
    no feedback saver the list stays empty (logged at debug).  Nothing here changes what Inductor picks.
    """
    with _LOCK:
        yield from _recording()


def _recording() -> Iterator[list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    # (record, {id(choice): name}, the choices): the choices are held until the body returns, so that no id is
    # reused by another object while a finalized caller is matched to its record
    live: list[tuple[dict[str, Any], dict[int, str], list[Any]]] = []
    finalized: list[int] = []
    selector = shim.autotune_selector()
    if selector is None:
        log.debug("this torch has no autotune feedback savers: GEMM picks are not recorded")
        yield records
        return

    def saver(timings: dict[Any, float], name: str, input_nodes: list[Any], choices: list[Any], *_rest: Any) -> None:
        try:
            record, ids = _record(timings, name, input_nodes, choices)
        except Exception as err:  # noqa: BLE001 - a pick we cannot describe must not fail the build
            log.debug("could not record the autotune pick of %s: %s", name, err)
            return
        records.append(record)
        live.append((record, ids, [*choices, *timings]))

    mtb = shim.multi_template_buffer_class()
    originals = {}
    for attr in ("finalize_as_triton_caller", "finalize_as_triton_callers"):
        fn = getattr(mtb, attr, None)
        if fn is not None:
            originals[attr] = fn

    def _one(self: Any, caller: Any) -> Any:
        finalized.append(id(caller))
        return originals["finalize_as_triton_caller"](self, caller)

    def _many(self: Any, callers: dict[Any, Any]) -> Any:
        # the caller without a hint override is the one the buffer renders by default
        default = callers.get(None, next(iter(callers.values()), None))
        if default is not None:
            finalized.append(id(default))
        return originals["finalize_as_triton_callers"](self, callers)

    selector.feedback_saver_fns.append(saver)
    if "finalize_as_triton_caller" in originals:
        mtb.finalize_as_triton_caller = _one
    if "finalize_as_triton_callers" in originals:
        mtb.finalize_as_triton_callers = _many
    try:
        yield records
    finally:
        with contextlib.suppress(ValueError):
            selector.feedback_saver_fns.remove(saver)
        for attr, fn in originals.items():
            setattr(mtb, attr, fn)
        for record, ids, _choices in live:
            fused = [ids[i] for i in finalized if i in ids]
            if fused and fused[-1] != record["chosen"]:
                record["chosen"], record["by"] = fused[-1], "benchmark fusion"


def _record(timings: dict[Any, float], name: str, input_nodes: list[Any],
            choices: list[Any]) -> tuple[dict[str, Any], dict[int, str]]:
    """One tuned op's record and ``{id(choice): choice name}`` of its candidates."""
    cands = []
    ids: dict[int, str] = {}
    for choice in dict.fromkeys([*choices, *timings]):
        ms = timings.get(choice)
        ok = isinstance(ms, (int, float)) and math.isfinite(ms)
        cname = str(getattr(choice, "name", type(choice).__name__))
        ids[id(choice)] = cname
        cands.append({"choice": cname, "kind": _kind(choice, cname), "config": _config(choice, cname),
                      "ms": round(float(ms), 6) if ok else None})
    cands.sort(key=lambda c: (c["ms"] is None, c["ms"] or 0.0))
    timed = [c for c in cands if c["ms"] is not None]
    record = {"op": str(name), "inputs": [_describe(n) for n in input_nodes],
              "chosen": timed[0]["choice"] if timed else None, "by": "benchmark",
              "candidates": cands[:MAX_CANDIDATES]}
    if len(cands) > MAX_CANDIDATES:
        record["more"] = len(cands) - MAX_CANDIDATES
    return record, ids


def _kind(choice: Any, name: str) -> str:
    backend = ""
    with contextlib.suppress(Exception):
        backend = str((choice.info_dict() or {}).get("backend", ""))
    if _DECOMPOSE_K.search(name):
        return "decompose_k"
    if backend == "extern" or type(choice).__name__ == "ExternKernelCaller":
        return "extern"
    if backend == "subgraph":
        return "subgraph"
    if "Triton" in type(choice).__name__ or backend.lower() == "triton":
        return "triton template"
    return backend.lower() or type(choice).__name__


def _config(choice: Any, name: str) -> dict[str, Any]:
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        info = dict(choice.info_dict() or {})
    cfg = {k: _plain(info[k]) for k in _CONFIG_KEYS if k in info}
    m = _DECOMPOSE_K.search(name)
    if m:
        cfg["k_split"] = int(m.group(1))
    elif "Triton" in type(choice).__name__:  # which template: triton_mm, triton_persistent_tma_mm, ...
        cfg["template"] = _COUNTER.sub("", name)
    return cfg


def _describe(node: Any) -> str:
    """``"32x16384 float32"`` (symbolic sizes as their expressions), or the node's type where that fails."""
    try:
        size = "x".join(str(s) for s in node.get_size())
        dtype = str(node.get_dtype()).removeprefix("torch.")
        return f"{size} {dtype}"
    except Exception:  # noqa: BLE001
        return type(node).__name__


def _plain(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


@contextlib.contextmanager
def replaying(tuned: list[dict[str, Any]]) -> Iterator[None]:
    """Make a second compile of a graph take the picks its first compile's benchmarks made.

    While the body compiles, a tuned op whose candidates are those of a record of ``tuned`` (the same op name and
    the same candidates by kind and config, records taken in compile order) gets that record's times instead of
    a new benchmark, so it picks what the first compile picked; any other op is benchmarked as usual.  Benchmark
    times of near-equal candidates differ from run to run, so without this a second compile may pick another
    (equally fast, numerically different) kernel.  One recording or replay at a time per process (the lock of
    :func:`recording`).
    """
    with _LOCK:
        cls = shim.autotune_selector_class()
        fallback = getattr(cls, "lookup", None)
        if fallback is None or not tuned:
            yield
            return
        queues: dict[str, list[dict[str, Any]]] = {}
        for record in tuned:
            queues.setdefault(str(record.get("op")), []).append(record)

        bound: dict[tuple[str, ...], dict[str, Any]] = {}  # (op, Inductor's inputs key, hint) -> its record

        def lookup(self: Any, choices: list[Any], op: str, inputs: str, benchmark: Any, *args: Any,
                   **kwargs: Any) -> Any:
            hint = args[0] if args else kwargs.get("hint_override")
            times = _replayed(queues.get(op) or [], choices, bound, (str(op), str(inputs), str(hint)))
            if times is None:
                return fallback(self, choices, op, inputs, benchmark, *args, **kwargs)
            log.debug("autotune of %s: replayed the first compile's benchmark of %d candidates", op, len(times))
            return times

        own = cls.__dict__.get("lookup")
        cls.lookup = lookup
        try:
            yield
        finally:
            if own is None:
                del cls.lookup
            else:
                cls.lookup = own


def _key(kind: str, config: dict[str, Any]) -> tuple[str, str]:
    return kind, repr(sorted(config.items()))


def _replayed(queue: list[dict[str, Any]], choices: list[Any], bound: dict[tuple[str, ...], dict[str, Any]],
              site: tuple[str, ...]) -> dict[Any, float] | None:
    """``{choice: ms}`` from the record of the tuned op at ``site`` (op name, Inductor's key of its inputs, size
    hint), or
    None.  A site meets its record once: the first record of ``queue`` (compile order) not bound to another site
    whose candidates hold every one of ``choices`` and its pick among them (Inductor asks for a subset of what
    its feedback names: the extern fallback may be left out).  Later lookups of the site (a multi-template's
    timings) get the same record."""
    keys = {}
    for choice in choices:
        name = str(getattr(choice, "name", type(choice).__name__))
        keys[choice] = _key(_kind(choice, name), _config(choice, name))
    if len(set(keys.values())) != len(keys):
        return None
    taken = [id(r) for r in bound.values()]
    mine = bound.get(site)
    for record in ([mine] if mine is not None else [r for r in queue if id(r) not in taken]):
        cands = record.get("candidates") or []
        if record.get("more"):
            continue
        times = {_key(c["kind"], c["config"]): c["ms"] for c in cands}
        chosen = next((_key(c["kind"], c["config"]) for c in cands if c["choice"] == record.get("chosen")), None)
        if not set(keys.values()) <= set(times) or chosen not in keys.values():
            continue
        bound[site] = record
        return {choice: (math.inf if times[k] is None else float(times[k])) for choice, k in keys.items()}
    return None
