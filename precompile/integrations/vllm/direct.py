"""vLLM's AOT load with its pieces handed over from the piece map: no re-split, no fake run, no per-piece key.

vLLM's load of its AOT artifact (``_try_load_aot_compiled_fn``, vLLM 0.25 and 0.32) is, for the compiled function
(``VllmSerializableFunction``): ``deserialize_compile_artifacts`` (unpickle the state and the whole Dynamo graph
with fake tensors for every node), then ``finalize_loading`` (a new ``VllmBackend`` splits the graph, runs it on
fake tensors, and asks the compiler for every piece and compile range, which keys each piece).  Where the
function artifact carries a piece map (:mod:`precompile.integrations.vllm.pieces`), :func:`pending` makes both
steps take the short way, the way vLLM's own "mega" AOT artifact loads
(``caching.reconstruct_serializable_fn_from_mega_artifact``), with precompile's artifacts as the runnables:

- deserialize: the state, the example inputs, but the Dynamo graph left serialized (it is only needed to split);
- finalize: after vLLM checked the traced source files, every distinct key of the map is loaded once
  (:func:`precompile.store.shared.load`: signature, digests, environment), its process-side key factors checked
  again (:func:`precompile.key.recheck.stale_factor`), and each piece becomes a ``PiecewiseBackend`` over its
  loaded runnables, wrapped for CUDA graphs as vLLM wraps it, stitched by the execution code vLLM saved.

Any mismatch - the map names other submodules than the execution code calls, a key is missing from the cache or
stale here, a range vLLM's config asks for is not in the map - takes vLLM's own path from the same bytes
(logged with the reason): the pieces are then keyed as on any start, and what is missing is built.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from precompile.integrations.vllm import shim
from precompile.integrations.vllm.pieces import PieceMap

log = logging.getLogger("precompile")


class Mismatch(Exception):
    """The piece map cannot serve this load (the message says why); vLLM's own path serves it."""


@dataclass
class Pending:
    """A load the piece map may serve: the map, the open cache and its trust policy, and what happened.

    Attributes:
        outcome: ``"direct"`` (served by the map), ``"fallback: <why>"``, or ``""`` (not reached: vLLM failed
            before finalizing, e.g. a changed source file).
        seconds: wall seconds of the direct build (loads included).
        keys: distinct artifact keys loaded.
        records: per piece and compile range: ``(submodule, (start, end), key, load seconds, engine kind)``; the
            load seconds are the key's first piece's (the others share its load).
    """

    pieces: PieceMap
    cache: Any
    policy: Any
    outcome: str = ""
    seconds: float = 0.0
    keys: int = 0
    records: list[tuple[str, tuple[int, int], str, float, str]] = field(default_factory=list)


_pending: contextvars.ContextVar[Pending | None] = contextvars.ContextVar("precompile_vllm_direct", default=None)
_installed = False


def install() -> bool:
    """Wrap ``VllmSerializableFunction.deserialize_compile_artifacts`` and ``finalize_loading`` once per process;
    outside :func:`pending` they are vLLM's own.  False where this vLLM has no such class."""
    global _installed
    if _installed:
        return True
    cls = shim.serializable_function_class()
    if cls is None or not callable(getattr(cls, "finalize_loading", None)):
        return False
    original_deserialize = cls.deserialize_compile_artifacts  # a bound classmethod
    original_finalize = cls.finalize_loading

    def deserialize_compile_artifacts(klass: Any, data: bytes) -> Any:
        p = _pending.get()
        if p is None:
            return original_deserialize(data)
        try:
            state, fake_mode = shim.function_state(data)
            fn = klass(**state, optimized_call=_not_finalized)
        except Exception as err:  # noqa: BLE001 - a state this vLLM saved otherwise: its own path
            p.outcome = f"fallback: the state did not load short ({type(err).__name__}: {err})"
            return original_deserialize(data)
        fn._fake_mode = fake_mode  # vLLM calls finalize_loading only while it is set
        fn._precompile_direct = (p, data)
        return fn

    def finalize_loading(self: Any, vllm_config: Any) -> None:
        direct = self.__dict__.pop("_precompile_direct", None)
        if direct is None:
            return original_finalize(self, vllm_config)
        p, data = direct
        t0 = time.perf_counter()
        try:
            build(self, vllm_config, p)
        except Mismatch as err:
            p.outcome = f"fallback: {err}"
            log.info("vLLM's pieces not from the piece map (%s); vLLM splits and keys them", err)
            fallback = original_deserialize(data)
            original_finalize(fallback, vllm_config)
            self.__dict__.update(fallback.__dict__)
            return None
        p.outcome, p.seconds = "direct", time.perf_counter() - t0
        self._fake_mode = None
        return None

    deserialize_compile_artifacts.__wrapped__ = original_deserialize  # type: ignore[attr-defined]
    finalize_loading.__wrapped__ = original_finalize  # type: ignore[attr-defined]
    cls.deserialize_compile_artifacts = classmethod(deserialize_compile_artifacts)
    cls.finalize_loading = finalize_loading
    _installed = True
    return True


@contextlib.contextmanager
def pending(pieces: PieceMap, cache: Any, policy: Any) -> Iterator[Pending]:
    """While the block runs vLLM's AOT load, its compiled function is built from ``pieces`` where they serve."""
    p = Pending(pieces, cache, policy)
    token = _pending.set(p)
    try:
        yield p
    finally:
        _pending.reset(token)


def _not_finalized(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("vLLM's compiled function was called before finalize_loading")


def build(fn: Any, vllm_config: Any, p: Pending) -> None:
    """Make ``fn`` (a ``VllmSerializableFunction`` from the short deserialize) callable from the piece map.

    Raises:
        Mismatch: the map cannot serve this function here (see the module docstring); ``fn`` is left unchanged.
    """
    import torch

    from precompile import config
    from precompile.errors import EnvironmentMismatchError
    from precompile.key.recheck import stale_factor
    from precompile.metrics import safe_incr
    from precompile.store import shared

    pm = p.pieces
    if fn.prefix != pm.prefix or bool(fn.is_encoder) != pm.is_encoder:
        raise Mismatch(f"the map is for {pm.prefix!r}, the function is {fn.prefix!r}")
    if pm.rewrites != config.rewrites_enabled():
        raise Mismatch("PRECOMPILE_REWRITES differs from the start that made the map")
    code, names = fn.execution_code, fn.submod_names
    if not isinstance(code, str) or not isinstance(names, list):
        raise Mismatch("vLLM saved no execution code")
    called = {name for i, name in enumerate(names) if f"__vllm_submods__[{i}]" in code}
    if called != {piece.submod for piece in pm.pieces}:
        raise Mismatch(f"the execution code calls {len(called)} pieces, the map has {len(pm.pieces)}")
    loaded: dict[str, Any] = {}
    for key in pm.keys():
        try:
            art = shared.load(key, p.cache, p.policy, check_env=True)
        except EnvironmentMismatchError as err:
            raise Mismatch(str(err)) from err
        if art is None:
            raise Mismatch(f"piece artifact {key[:12]} is not in the cache")
        why = stale_factor(art.manifest.factors, art.manifest.placeholders)
        if why is not None:
            raise Mismatch(f"piece artifact {key[:12]} was keyed with another {why}")
        loaded[key] = art
    rt = shim.piecewise_runtime()
    cc = vllm_config.compilation_config
    backend = rt.VllmBackend(vllm_config, fn.prefix, fn.is_encoder)
    used: set[str] = set()
    callables: dict[str, Any] = {}
    total = len(pm.pieces)
    for piece in pm.pieces:
        runnables = {}
        for start, end, key in piece.ranges:
            art = loaded[key] if key not in used else loaded[key].sibling()  # each piece its own checks
            used.add(key)
            runnables[str(rt.Range(start=start, end=end))] = art
            p.records.append((piece.submod, (start, end), key, art.load_seconds or 0.0, art.engine_kind or "-"))
        try:
            pw = rt.PiecewiseBackend(graph=None, vllm_config=vllm_config, piecewise_compile_index=piece.index,
                                     total_piecewise_compiles=total, sym_shape_indices=list(piece.sym_shape_indices),
                                     vllm_backend=backend, returns_tuple=piece.returns_tuple,
                                     compiled_runnables=runnables, submod_name=piece.submod)
        except AssertionError as err:  # a compile range vLLM's config asks for that the map lacks
            raise Mismatch(f"piece {piece.submod}: {err}") from err
        callables[piece.submod] = rt.wrap_with_cudagraph_if_needed(pw, vllm_config, cc, piece.index == 0,
                                                                   piece.index == total - 1)
    call = rt.compile_execution_fn(code, callables, names, fn.consts)
    if cc.cudagraph_copy_inputs:
        indices = list(fn.sym_tensor_indices or [])
        buffers = [torch.empty_like(fn.example_inputs[i], device=vllm_config.device_config.device) for i in indices]
        call = rt.make_copy_and_call(indices, buffers, call)
    p.keys = len(loaded)
    safe_incr(p.cache, hits=len(p.records))  # one per piece and compile range, as when each is keyed
    fn.optimized_call = call
    fn.vllm_backend = None
