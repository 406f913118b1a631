"""``precompile.compile``: ``torch.compile``'s shape, with the cache boundary at the whole function.

>>> fast = precompile.compile(model, cache="file:///var/cache/pc")   # doctest: +SKIP
>>> fast(x)                                                          # a warm process traces nothing

On its first call a compiled function computes its key without tracing (:mod:`precompile.function.key`) and
looks it up.  On a hit it checks the sources Dynamo traced through, loads each graph's artifact (the fast engine)
and installs Dynamo's stored output — guarded bytecode and resume functions — so that Dynamo's C eval frame runs
it: no frame is traced, no Inductor or Triton module imported.  On a miss it traces with Dynamo, compiles each
graph through the cache (:func:`precompile.standalone_compile`), and stores the function: one build per key across
a fleet (:func:`precompile.store.coordination.get_or_build`).  A later call that the stored guards refuse (a new size, a
new dtype) is traced as ``torch.compile`` would, counted as a miss (``function_retraces``), and the function is
stored again with the new entry beside the old ones.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch

from cache_backends.base import Cache, digest_bytes
from cache_backends.redaction import redact_url
from precompile import config, metrics
from precompile._version import __version__
from precompile.manifest.function_manifest import MAX_TEXT, FunctionManifest
from precompile.function import key as fkey
from precompile.function import modes, sources, store
from precompile.metrics import safe_incr

log = logging.getLogger("precompile")


class CompiledFunction:
    """A function or module compiled through precompile's cache (see the module docstring).

    Call it as the original.  Attributes, set by the first call:

    Attributes:
        key: the whole-function artifact key (64 hex).
        outcome: ``"hit"``, ``"built"``, ``"waited"`` or ``"takeover"``
            (:func:`precompile.store.coordination.get_or_build`); ``"traced"`` when the cache holds the function
            but not in a form this process can use (its builder could not store it whole, or it does not install
            here: :attr:`miss_reason`), so it is traced and its graphs loaded from the cache, nothing stored; or
            ``"uncached"`` with no cache.
        miss_reason: why no stored function was used, or why a call was traced after a hit: ``"its builder could
            not store it: ..."``, ``"stored, but does not install here: ..."``, ``"source changed: ..."``, ``"the
            stored guards refused a call"``; else None.
        not_stored: on a build, why the function could not be stored whole (stored as refused then), else None.
        load_seconds: wall seconds of the lookup and install on a hit, or of the first traced call on a miss.
        graphs: ``{compiled-graph name: graph artifact key}``.
        records: one :class:`precompile.builder.capture.GraphRecord` per graph compiled or loaded by this function.
        retraces: calls traced after the first because the stored guards refused them.
    """

    def __init__(self, fn: Callable[..., Any] | torch.nn.Module, *, dynamic: bool | None = None,
                 fullgraph: bool = False, options: dict[str, Any] | None = None,
                 cache: str | Cache | None = None, mode: str | None = None) -> None:
        self.original = fn
        self._target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        self._dynamic, self._fullgraph, self._mode = dynamic, fullgraph, mode
        self._options, self._cudagraphs = modes.resolve(mode, options)
        self._cache_arg = cache
        self._cache: Cache | None = None
        self._graph_backend: Any = None
        self._run: Callable[..., Any] | None = None
        self._package: Any = None
        self._factors: dict[str, Any] = {}
        self._frames: list[dict[str, Any]] = []
        self._uncacheable: list[str] = []
        self._first: tuple[Any] | None = None
        self._new_graphs = 0
        self.key: str | None = None
        self.outcome: str | None = None
        self.miss_reason: str | None = None
        self.load_seconds = 0.0
        self.graphs: dict[str, str] = {}
        self.records: list[Any] = []
        self.retraces = 0
        self.not_stored: str | None = None
        self._left_out: dict[str, list[str]] = {}
        self._seen_ref: Any = None  # the manifest digest this process loaded or stored under the key
        self._start_lock = threading.Lock()
        if not isinstance(fn, torch.nn.Module):
            functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------ calling
    @torch.compiler.disable
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # an outer torch.compile (transformers' generate compiles the forward itself on a GPU with a static
        # cache) does not trace into a compiled function: it calls it, as it calls any compiled region
        if self._run is None:
            with self._start_lock:  # one first call looks up or builds; the others wait for it
                if self._run is None:
                    self._start(args, kwargs)
                    if self._first is not None:  # the build's traced call was this call
                        out, self._first = self._first[0], None
                        return out
        seen = self._new_graphs
        traced = len(self._frames)
        out = self._run(*args, **kwargs)  # type: ignore[misc]
        if len(self._frames) != traced or self._new_graphs != seen:
            self._after_retrace()
        return out

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        from precompile.store.opening import open_cache
        from precompile.errors import CacheError, CacheURLError
        from precompile.store.coordination import get_or_build

        config.engine_mode()
        self._factors = fkey.function_factors(self._target, args, kwargs, dynamic=self._dynamic,
                                              fullgraph=self._fullgraph, options=self._options)
        self._factors["cudagraphs"] = self._cudagraphs  # mode="reduce-overhead": the same graphs, replayed
        self.key = fkey.function_key(self._factors)
        try:
            self._cache = open_cache(self._cache_arg)
        except CacheURLError:
            raise
        except CacheError as err:
            log.warning("cache %s cannot be opened (%s); compiling %s without it", redact_url(self._cache_arg), err,
                        self.key[:12])
        start = time.perf_counter()
        if self._cache is None:
            self._build(args, kwargs)
            self.outcome = "uncached"
        else:
            found, self.outcome = get_or_build(self._cache, self.key, self._load, lambda: self._build(args, kwargs),
                                               counters="function_")
            if found == _TRACE:  # stored, but not usable: its graphs still come from the cache
                self.outcome = "traced"
                self._build(args, kwargs, store=False)
            elif self.outcome == "hit":
                safe_incr(self._cache, function_hits=1)
        self.load_seconds = time.perf_counter() - start
        log.info("function %s %s: %s in %.3f s (%d graphs)", _name(self._target), self.key[:12], self.outcome,
                 self.load_seconds, len(self.graphs))

    # ----------------------------------------------------------------------------------------- a hit
    def _load(self) -> bool | str | None:
        """Install the stored function: True; None on a miss; :data:`_TRACE` when the stored entry says the function
        cannot be stored whole, or does not install here (the reason in :attr:`miss_reason`): traced then, nothing
        stored, so that every worker does not rebuild and rewrite the same key."""
        from precompile.inductor.dynamo import pkg as dynamo_pkg
        from precompile.store.cache_io import load_from_cache

        assert self._cache is not None and self.key is not None
        got = store.read(self._cache, self.key)
        if got is None:
            return None
        m = got.manifest
        if m.refused is not None:
            if m.build.get("precompile") != __version__:  # another precompile may store what this one could not
                self._miss(f"stored as refused by precompile {m.build.get('precompile')}: trying again", "refused_old")
                return None
            self._miss(f"its builder could not store it: {m.refused}", "function_unstorable")
            return _TRACE
        why = sources.changed(m.sources)
        if why is not None:
            return self._miss(why, "source_changed")
        from precompile.builder.capture import GraphRecord

        loaded: dict[str, Any] = {}
        records = []
        for name, gkey in m.graphs.items():
            started = time.perf_counter()
            art = load_from_cache(gkey, self._cache)
            if art is None:
                return self._miss(f"graph artifact {gkey[:12]} ({name}) is not in the cache", "graph_missing")
            try:
                art.engine  # build the callable now: a graph that does not load is a miss, not a failed call
            except Exception as err:  # noqa: BLE001 - a stored graph that does not load is rebuilt
                return self._miss(f"graph artifact {gkey[:12]} does not load ({type(err).__name__}: {err})", "load_failed")
            loaded[name] = modes.wrap(art, self._cudagraphs, name)
            safe_incr(self._cache, hits=1)  # a graph artifact read from the cache serves this lookup
            records.append(GraphRecord(index=len(records), key=gkey, outcome="hit",
                                       seconds=time.perf_counter() - started,
                                       compile_seconds=float(art.manifest.build.get("seconds", 0.0)),
                                       bytes=art.manifest.total_bytes(), kernels=len(art.manifest.kernels)))
        try:
            record = dynamo_pkg.restore(got.dynamo)
            missing = sorted(set(dynamo_pkg.backend_ids(record)) - set(m.graphs))
            if missing:
                raise ValueError(f"its bytecode calls graphs the manifest does not name: {missing[:3]}")
        except ValueError as err:  # a damaged entry: dropped, rebuilt
            store.drop(self._cache, self.key, str(err), got.digest)
            return None
        try:
            package = dynamo_pkg.install(_first_frame(self._target), record, loaded)
        except RuntimeError as err:  # sound, but not for this process: kept for the workers it serves
            self._miss(f"stored, but does not install here: {err}", "function_install_failed")
            return _TRACE
        self._left_out = dict(m.build.get("left_out") or {})
        self._seen_ref = got.digest
        self._package = package
        self.graphs = dict(m.graphs)
        self.records = records
        self._frames = list(m.frames)
        self._run = dynamo_pkg.optimize(self._called(), self._on_graph, package, dynamic=self._dynamic,
                                        fullgraph=self._fullgraph, guard_export=self._on_guards)
        return True

    def _miss(self, why: str, reason: str) -> None:
        self.miss_reason = why
        metrics.note_miss(reason)
        log.warning("function artifact %s of %s is not used: %s; tracing again", self.key[:12] if self.key else "?",
                    _name(self._target), why)
        return None

    # ---------------------------------------------------------------------------------------- a build
    def _graph_backend_for(self) -> Any:
        if self._graph_backend is None:
            from precompile.builder.capture import Backend

            self._graph_backend = Backend(cache=self._cache, options=self._options or None)
        return self._graph_backend

    def _on_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from precompile.inductor.dynamo import pkg as dynamo_pkg

        name = dynamo_pkg.backend_name(gm)
        backend = self._graph_backend_for()
        compiled = backend(gm, example_inputs)
        self.records = list(backend.records)
        wrapped = modes.wrap(compiled, self._cudagraphs, name)
        key = getattr(compiled, "key", None)
        if isinstance(key, str):
            self.graphs[name] = key
        else:  # the graph backend compiled it uncached: the function cannot be stored whole
            self._uncacheable.append(name)
        self._new_graphs += 1
        return wrapped

    def _called(self) -> Any:
        """What Dynamo runs: a module itself (its ``__call__``: forward pre-hooks and hooks run around the traced
        forward, as under ``torch.compile(module)``), else the function."""
        return self.original if isinstance(self.original, torch.nn.Module) else self._target

    def _on_guards(self, guards: Any) -> None:
        texts = sorted(f"{g.create_fn_name()} {g.name}"[:MAX_TEXT] for g in guards)
        self._frames.append({"code": f"frame {len(self._frames)}", "guards": texts})

    def _build(self, args: tuple[Any, ...], kwargs: dict[str, Any], store: bool = True) -> bool:
        from precompile.inductor.dynamo import pkg as dynamo_pkg

        if config.explain_misses():
            log.warning("function %s %s: %s", _name(self._target), (self.key or "")[:12],
                        self.miss_reason or self._nearest())
        self._package = dynamo_pkg.new_package(_first_frame(self._target))
        run = dynamo_pkg.optimize(self._called(), self._on_graph, self._package, dynamic=self._dynamic,
                                  fullgraph=self._fullgraph, guard_export=self._on_guards)
        start = time.perf_counter()
        traced = dynamo_pkg.frames_traced()
        # self._run is set once the build's call has returned: another thread's call must not skip the start lock
        # and trace into the package while this one traces (and is stored)
        self._first = (run(*args, **kwargs),)
        self._run = run
        self._build_seconds = time.perf_counter() - start
        self._build_frames = dynamo_pkg.frames_traced() - traced
        if self._cache is not None and store:
            safe_incr(self._cache, function_builds=1)
            self._store(first=True)
        return True

    def _nearest(self) -> str:
        """Why a key with no stored entry misses: the nearest stored function and what differs (diff)."""
        from precompile.store.diff import explain_miss
        from precompile.store.lookup import stored_manifests

        try:
            return explain_miss(self.key or "", self._factors, stored_manifests(self._cache)) if self._cache else \
                "no cache"
        except Exception as err:  # noqa: BLE001 - an explanation never fails the call
            return f"no stored artifact (the cache could not be compared: {err})"

    def _after_retrace(self) -> None:
        self.retraces += 1
        if self.outcome in ("hit", "waited", "takeover") and self.retraces == 1:
            self.miss_reason = "the stored guards refused a call" + (
                f" (or it ran a frame left out of the record: {sorted(self._left_out)[:2]})" if self._left_out else "")
        log.info("function %s: %s; traced it (%d graphs now)", _name(self._target),
                 self.miss_reason or "the stored guards refused a call", len(self.graphs))
        if self._cache is not None:
            metrics.note_miss("guard_failed")
            safe_incr(self._cache, function_misses=1, function_retraces=1)
            if self.outcome != "traced" and not self._left_out:  # a left-out frame is traced in every process
                self._store(first=False)

    def _store(self, first: bool) -> None:
        """Store the function (after its build, or after a retrace added an entry).  A function that cannot be
        stored whole is stored as refused, with the reason, after its first build only (never over a stored one)."""
        from precompile.inductor.dynamo import check as dynamo_check
        from precompile.inductor.dynamo import pkg as dynamo_pkg
        from precompile.key import fingerprint

        assert self._cache is not None and self.key is not None
        devices = {"cpu", "cuda"} if "gpu_capability" in self._factors["env"] else {"cpu"}
        build = {"seconds": round(getattr(self, "_build_seconds", 0.0), 3),
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "precompile": __version__, "torch": torch.__version__,
                 "frames_traced": getattr(self, "_build_frames", 0), "retraces": self.retraces,
                 "function": _name(self._target)}
        if self._uncacheable:  # maybe a passing failure (Inductor out of memory): not stored, never refused
            log.warning("function %s is not stored: its graphs %s could not be cached", _name(self._target),
                        self._uncacheable[:3])
            return
        try:
            dumped = dynamo_pkg.dump(self._package)
            dynamo_check.check_installable(dumped.data)
            part = digest_bytes(dumped.data)
            manifest = FunctionManifest(
                key=self.key, factors=self._factors, parts={"dynamo": part}, graphs=dict(sorted(self.graphs.items())),
                sources=dumped.sources, frames=self._frames, env=fingerprint.environment(devices, full=True),
                blobs={part: {"size": len(dumped.data), "role": "dynamo"}},
                build={**build, "codes": dumped.codes, "left_out": dumped.left_out})
            # a reader checks every bound of a manifest (names, lengths): one it would refuse is never stored, or
            # every worker would find it untrusted and build and rewrite the key again
            FunctionManifest.from_dict(manifest.to_dict())
        except Exception as err:  # noqa: BLE001 - a function that cannot be stored still runs, traced
            self.not_stored = str(err)[:MAX_TEXT]
            log.warning("function %s is not stored: %s", _name(self._target), self.not_stored)
            if first:
                store.write_refused(self._cache, self.key, self._factors, fingerprint.environment(devices, full=True),
                                    {**build, "refused": self.not_stored})
            return
        if dumped.left_out:
            log.info("function %s: frames %s are left out of the stored function and traced at run time: %s",
                     _name(self._target), sorted(dumped.left_out), dumped.left_out)
        written = store.write(self._cache, manifest, dumped.data, over=None if first else self._seen_ref)
        if written is not None:
            self._seen_ref = written
            log.info("stored function %s as %s (%d graphs, %d sources)", _name(self._target), self.key[:12],
                     len(self.graphs), len(dumped.sources))


#: What :meth:`CompiledFunction._load` returns for a stored entry this process runs traced.
_TRACE = "trace"


def _first_frame(fn: Any) -> Any:
    """The function whose frame Dynamo traces first when ``fn`` is called: ``fn``, or the function of a
    ``functools.partial`` (accelerate's hooks replace ``module.forward`` with a partial of their own wrapper)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _name(fn: Any) -> str:
    target = getattr(fn, "__func__", fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"


def compile(model_or_fn: Callable[..., Any] | torch.nn.Module | None = None, *, dynamic: bool | None = None,  # noqa: A001
            fullgraph: bool = False, options: dict[str, Any] | None = None,
            cache: str | Cache | None = None, mode: str | None = None) -> Any:
    """Compile a function or module through precompile's cache, at the function level: ``torch.compile``'s shape.

    Usable as ``precompile.compile(model)``, ``@precompile.compile`` and ``@precompile.compile(cache=...)``.

    Args:
        model_or_fn: a function, a bound method, or an ``nn.Module`` (called as a module: its forward pre-hooks
            and hooks run around the compiled ``forward``, as under ``torch.compile(module)``); None gives a
            decorator.
        dynamic: as ``torch.compile``'s: None (automatic dynamic shapes: static first, symbolic on a recompile),
            True (sizes symbolic from the start) or False (every size specialized, and part of the key).
        fullgraph: as ``torch.compile``'s: a graph break is an error.
        options: Inductor config patches (JSON values), e.g. ``{"max_autotune": True}``.
        cache: a cache URL or open cache (None: ``$PRECOMPILE_CACHE`` or the local default).
        mode: as ``torch.compile``'s: None or ``"default"``, ``"reduce-overhead"`` (CUDA graphs replayed on a GPU),
            ``"max-autotune"`` or ``"max-autotune-no-cudagraphs"`` (:mod:`precompile.function.modes`); not with
            ``options`` (as torch.compile).

    Returns:
        a :class:`CompiledFunction` (or a decorator making one).  Its first call looks the function up, then
        runs it: on a hit nothing is traced; on a miss Dynamo traces it and the result is stored.

    Raises:
        CacheURLError: (on the first call) ``cache`` is not a valid cache URL.
        ConfigError: (on the first call) a ``PRECOMPILE_*`` variable holds a bad value.
        TypeError: (on the first call) ``options`` holds a value JSON cannot carry.
        ValueError: ``mode`` is not one of torch.compile's modes, or ``mode`` and ``options`` are both given.
        Whatever ``torch.compile`` raises for the function (a graph break under ``fullgraph=True``, say).
    """
    def make(fn: Callable[..., Any] | torch.nn.Module) -> CompiledFunction:
        return CompiledFunction(fn, dynamic=dynamic, fullgraph=fullgraph, options=options, cache=cache, mode=mode)

    return make if model_or_fn is None else make(model_or_fn)
