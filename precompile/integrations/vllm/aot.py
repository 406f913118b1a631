"""vLLM's AOT artifact of the model's forward kept in precompile's cache: a warm or new machine traces nothing.

vLLM 0.32 (``VLLM_USE_AOT_COMPILE``, its default on torch >= 2.10) compiles the model's ``forward`` with
``torch.compile(...).aot_compile`` and saves the result - Dynamo's guarded bytecode plus the Dynamo graph and its
example inputs, pickled by torch (``AOTCompiledFunction.save_compiled_function``) - at
``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<vLLM hash>/rank_<r>_<dp>/model``.  A later start loads it
(``torch.compiler.load_compiled_function``), runs no Dynamo tracing, re-splits the graph and hands each piece to the
compiler, here :class:`~precompile.integrations.vllm.adaptor.PrecompileAdaptor`, whose keys decide the hits.  With
``VLLM_USE_MEGA_AOT_ARTIFACT=0`` (set by the platform for the backend ``"precompile"``: the mega artifact would
carry vLLM's own Inductor artifacts, which this adaptor replaces) that works on CPU and GPU alike.

That file is on one machine's disk.  This module keeps it in precompile's cache as a whole-function artifact
(``"kind": "function"``; its Dynamo part is vLLM's file, byte for byte), so that a new machine restores it before
vLLM looks: :func:`install` wraps vLLM's ``decorators._try_load_aot_compiled_fn`` (the one function of vLLM's
compile path that precompile wraps, and only in processes where the adaptor is in use) to

- before vLLM's load, when the file is absent: read the entry from the cache - signature, structure and digest
  checked by :func:`precompile.function.store.read`, exactly as for ``precompile.compile`` - and write it to the
  path vLLM asked for (atomically).  The cache never names a path: the path is vLLM's, the key is derived from it;
- when vLLM's load finds nothing (or fails and recompiles): after vLLM saves its new file, store it.

The key: vLLM's own hash directory and rank (vLLM's hash covers its config, its environment factors and the
forward's qualname and first line), the forward's source digest, vLLM's version, and precompile's environment
fingerprint (torch, Python, device).  vLLM checks the traced source files itself when it loads the file; a change
there is vLLM's recompile, which stores the new file over the old entry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from datetime import datetime, timezone
from typing import Any

from precompile import config
from precompile._version import __version__
from precompile.integrations.vllm import shim

log = logging.getLogger("precompile")

_HASH_DIR = re.compile(r"^[0-9a-f]{16,128}\Z")
_RANK_DIR = re.compile(r"^rank_\d{1,6}_\d{1,6}\Z")
_installed = False


def entry_name(path: str) -> str | None:
    """``"<vLLM hash>/rank_<r>_<dp>"`` of a vLLM AOT artifact path, or None if the path is not shaped like one."""
    parts = os.path.normpath(path).split(os.sep)
    if len(parts) < 5 or parts[-1] != "model" or parts[-4] != "torch_aot_compile":
        return None
    if not (_HASH_DIR.match(parts[-3]) and _RANK_DIR.match(parts[-2])):
        return None
    return f"{parts[-3]}/{parts[-2]}"


def install() -> bool:
    """Wrap vLLM's AOT load once per process (see the module docstring); True if the wrap is in place.

    A vLLM without ``vllm.compilation.decorators._try_load_aot_compiled_fn`` is left alone (logged): its starts
    then trace with Dynamo as before, and the adaptor still serves every piece."""
    global _installed
    if _installed:
        return True

    found = shim.aot_loader()
    if found is None:
        if shim.version() is not None:
            log.info("this vLLM has no _try_load_aot_compiled_fn; its AOT artifact stays on local disk")
        return False
    decorators, name = found
    original = getattr(decorators, name)

    def _try_load_aot_compiled_fn(model: Any, aot_compilation_path: str) -> Any:
        return load_through_cache(original, model, aot_compilation_path)

    _try_load_aot_compiled_fn.__wrapped__ = original  # type: ignore[attr-defined]
    _try_load_aot_compiled_fn.__doc__ = original.__doc__
    setattr(decorators, name, _try_load_aot_compiled_fn)
    _installed = True
    return True


def load_through_cache(original: Any, model: Any, path: str) -> Any:
    """vLLM's ``_try_load_aot_compiled_fn(model, path)`` with precompile's cache behind the file at ``path``.

    Never raises for a cache's sake: a cache that fails or holds nothing leaves vLLM's own behaviour."""
    cc = getattr(getattr(model, "vllm_config", None), "compilation_config", None)
    entry = entry_name(path)
    ours = getattr(cc, "backend", None) == "precompile"
    cache = _cache() if ours and entry else None
    if cache is None:
        if not ours:
            return original(model, path)
        from precompile.integrations.vllm.platform import loading_for_precompile

        with loading_for_precompile():  # the adaptor still compiles the pieces, uncached or from the cache
            return original(model, path)
    from precompile.metrics import safe_incr

    t0 = time.perf_counter()
    factors = aot_factors(model, entry)
    from precompile.function.key import function_key

    key = function_key(factors)
    stored = _read(cache, key)
    restored = False
    if stored is not None and not os.path.exists(path):
        restored = write_for_vllm(path, stored.dynamo, "vLLM's AOT artifact")
    local = stored is not None and (restored or _same_file(path, stored.manifest.parts["dynamo"]))
    pieces = _piece_map(stored, key) if local else None
    t1 = time.perf_counter()
    from precompile.integrations.vllm import direct
    from precompile.integrations.vllm.platform import loading_for_precompile

    with contextlib.ExitStack() as stack:
        stack.enter_context(loading_for_precompile())  # vLLM 0.25 asks for the pieces' compiler with no config set
        served = None
        if pieces is not None and direct.install():
            from precompile.store.opening import open_with_policy

            served = stack.enter_context(direct.pending(pieces, cache, open_with_policy(cache)[1]))
        fn = original(model, path)
    if fn is not None:
        if restored:
            safe_incr(cache, function_hits=1)
        from precompile.inductor.dynamo.pkg import frames_traced

        log.info("vLLM AOT artifact %s %s (key %s): precompile %.3f s, vLLM's load %.3f s (its pieces included); "
                 "Dynamo frames traced in this process: %d", entry,
                 "restored from the cache and loaded" if restored else "loaded from vLLM's dir", key[:12],
                 t1 - t0, time.perf_counter() - t1, frames_traced())
        if served is not None and served.outcome == "direct":
            _log_direct(served)
        elif local:  # vLLM split and keyed the pieces itself: the map of what it found, for the next start
            _add_piece_map(cache, stored, shim.compiled_function(fn), pieces)
        return fn
    safe_incr(cache, function_misses=1)
    log.info("no vLLM AOT artifact for %s (key %s): vLLM traces, and precompile stores what it saves",
             entry, key[:12])
    _publish_after_save(model, cache, key, factors, path)
    return None


def aot_factors(model: Any, entry: str) -> dict[str, Any]:
    """The key factors of vLLM's AOT artifact ``entry`` for ``model`` (see the module docstring)."""
    import vllm

    from precompile.manifest.function_manifest import KIND
    from precompile.function.key import _devices, function_identity
    from precompile.key import fingerprint

    return {"format": config.FORMAT_VERSION, "kind": KIND, "function": function_identity(model.forward),
            "vllm": {"version": vllm.__version__, "aot_entry": entry},
            "env": fingerprint.key_fields(fingerprint.environment(_devices([model]), full=False))}


def _cache() -> Any:
    from precompile.store.opening import open_cache
    from precompile.errors import CacheError

    try:
        return open_cache(None)
    except CacheError as err:
        log.warning("precompile cache cannot be opened (%s); vLLM's AOT artifact stays on local disk", err)
        return None


def _read(cache: Any, key: str) -> Any:
    """The verified entry ``key`` (:class:`precompile.function.store.Stored`), or None on a miss or an entry
    stored as refused (it has no AOT artifact: an empty file would be vLLM's to fail on)."""
    from precompile.function import store

    stored = store.read(cache, key)
    if stored is None or stored.manifest.refused is not None or not stored.dynamo:
        return None
    return stored


def _same_file(path: str, digest: str) -> bool:
    """Whether the file vLLM will load at ``path`` is, byte for byte, the stored part ``digest`` (a file vLLM
    wrote itself may be another trace of the same key, whose pieces the stored map does not describe)."""
    from cache_backends.base import digest_bytes

    try:
        with open(path, "rb") as f:
            data = f.read(_max_bytes() + 1)
    except OSError:
        return False
    return digest_bytes(data) == digest


def _piece_map(stored: Any, key: str) -> Any:
    """The stored entry's piece map, or None where it has none or it is refused (logged)."""
    from precompile.errors import ArtifactFormatError
    from precompile.integrations.vllm.pieces import PieceMap

    if not stored.pieces:
        return None
    try:
        return PieceMap.from_json(stored.pieces)
    except ArtifactFormatError as err:
        log.warning("the piece map of vLLM AOT artifact %s is refused (%s); vLLM splits and keys the pieces",
                    key[:12], err)
        return None


def _log_direct(served: Any) -> None:
    for submod, rng, key, seconds, engine in served.records:
        log.info("precompile - %s range (%d, %d): hit in %.3f s (key %s, engine %s)", submod, rng[0], rng[1],
                 seconds, key[:12], engine)
    log.info("vLLM's %d pieces from precompile's piece map: %d artifacts loaded in %.3f s (no split, no fake run, "
             "no piece keyed)", len(served.pieces.pieces), served.keys, served.seconds)


def _add_piece_map(cache: Any, stored: Any, compiled_fn: Any, had: Any) -> None:
    """Store ``stored`` again with the piece map of ``compiled_fn`` (loaded through vLLM's own path), where it
    has none or another one; only while the key still names the entry read (another worker's write wins)."""
    from precompile.integrations.vllm.pieces import record

    pieces, why = record(compiled_fn)
    if pieces is None:
        log.info("no piece map for vLLM AOT artifact %s: %s", stored.manifest.key[:12], why)
        return
    if had == pieces:
        return
    _write(cache, stored.manifest, stored.dynamo, pieces, over=stored.digest)


def write_for_vllm(path: str, data: bytes, what: str) -> bool:
    """Write verified ``data`` to ``path``, a file vLLM reads (a path vLLM computed, never one from the cache),
    atomically (a temp file, then :func:`os.replace`); False (logged) if it cannot be written: vLLM then does the
    work itself."""
    tmp = f"{path}.{os.getpid()}.precompile.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as err:
        log.warning("cannot write %s to %s (%s); vLLM does the work itself", what, path, err)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def _publish_after_save(model: Any, cache: Any, key: str, factors: dict[str, Any], path: str) -> None:
    """Make ``model.save_aot_compiled_function`` (vLLM's, called once its AOT compile is done) also store the
    file it writes under ``key``, with the piece map of what it compiled."""
    save = getattr(model, "save_aot_compiled_function", None)
    if not callable(save):
        return
    started = time.time()

    def save_aot_compiled_function() -> None:
        save()
        try:
            if os.path.getmtime(path) + 1 < started:
                return  # not written by this save (vLLM logged why)
            with open(path, "rb") as f:
                data = f.read(_max_bytes() + 1)
        except OSError:
            return
        from precompile.integrations.vllm.pieces import record

        pieces, why = record(shim.compiled_function(getattr(model, "aot_compiled_fn", None)))
        if pieces is None:
            log.info("no piece map for vLLM AOT artifact %s: %s", key[:12], why)
        publish(cache, key, factors, data, seconds=time.time() - started, name=_name(model), pieces=pieces)

    object.__setattr__(model, "save_aot_compiled_function", save_aot_compiled_function)


def publish(cache: Any, key: str, factors: dict[str, Any], data: bytes, *, seconds: float, name: str,
            pieces: Any = None) -> bool:
    """Store vLLM's AOT file ``data`` as the whole-function artifact ``key``, with the piece map ``pieces``
    (:class:`~precompile.integrations.vllm.pieces.PieceMap`) where given; False if too large or refused."""
    import torch

    from cache_backends.base import digest_bytes
    from precompile.key import fingerprint
    from precompile.manifest.function_manifest import FunctionManifest
    from precompile.metrics import safe_incr

    if len(data) > _max_bytes():
        log.warning("vLLM's AOT artifact for %s is over %d bytes; not stored", name, _max_bytes())
        return False
    part = digest_bytes(data)
    devices = {"cpu", "cuda"} if "gpu_capability" in factors["env"] else {"cpu"}
    manifest = FunctionManifest(
        key=key, factors=factors, parts={"dynamo": part}, graphs={}, sources=[], frames=[],
        env=fingerprint.environment(devices, full=True), blobs={part: {"size": len(data), "role": "vllm aot"}},
        build={"seconds": round(seconds, 3), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "precompile": __version__, "torch": torch.__version__, "function": name,
               "vllm_aot": factors["vllm"]["aot_entry"]})
    if not _write(cache, manifest, data, pieces):
        return False
    safe_incr(cache, function_builds=1)
    log.info("stored vLLM's AOT artifact for %s as %s (%d bytes)", name, key[:12], len(data))
    return True


def _write(cache: Any, manifest: Any, data: bytes, pieces: Any, over: str | None = None) -> bool:
    """Write ``manifest`` (its ``dynamo`` part ``data``) with the piece map ``pieces`` as its ``pieces`` part
    (replacing any it had), or without one where None."""
    import dataclasses

    from cache_backends.base import digest_bytes
    from precompile.function import store

    raw = pieces.to_json() if pieces is not None else b""
    parts = {"dynamo": manifest.parts["dynamo"]}
    blobs = {parts["dynamo"]: manifest.blobs[parts["dynamo"]]}
    if pieces is not None:
        parts["pieces"] = digest_bytes(raw)
        blobs[parts["pieces"]] = {"size": len(raw), "role": "vllm pieces"}
    manifest = dataclasses.replace(manifest, parts=parts, blobs=blobs, signature=None)
    if store.write(cache, manifest, data, over=over, pieces=raw) is None:
        return False
    if pieces is not None:
        log.info("stored the piece map of vLLM AOT artifact %s: %d pieces, %d artifacts", manifest.key[:12],
                 len(pieces.pieces), len(pieces.keys()))
    return True


def _max_bytes() -> int:
    from precompile.function.store import MAX_DYNAMO_BYTES

    return MAX_DYNAMO_BYTES


def _name(model: Any) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}.forward"
