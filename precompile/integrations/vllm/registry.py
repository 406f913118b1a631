"""vLLM's model-registry facts kept in precompile's cache: a new machine skips vLLM's model inspection.

Before a vLLM start builds anything, its model registry inspects the model's class (``_ModelInfo``: is it a text
generation model, does it support pipeline parallelism, ...) in a subprocess that imports vLLM, torch and the model
module: about 8 s on a 2-core CPU.  vLLM keeps the answer at ``$VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json``,
keyed by the hash of the model module's source, on one machine's disk.  This module keeps the same JSON in
precompile's cache as a record (:mod:`precompile.store.record`, purpose ``vllm_modelinfo``), so that a new machine
of the fleet finds it there:

- before vLLM reads its file: if vLLM finds nothing, the record for the same class and module hash is read from
  the cache (signature, structure and bounds checked), its fields checked against vLLM's ``_ModelInfo`` (every
  name, and each value of its field's declared type; nothing is run), and written to the path vLLM reads, in
  vLLM's own format, atomically; then vLLM reads it as it reads its own.  The path is vLLM's, never the cache's;
- after vLLM writes a new file (its subprocess ran): the same JSON is stored as a record.

It is a ``vllm.general_plugins`` entry point (vLLM loads those early in every process), active where
:func:`precompile.config.vllm_registry_enabled` says so: by default where ``PRECOMPILE_CACHE`` names a cache.  It
also puts Triton's JIT cache behind precompile's (:mod:`precompile.integrations.triton_cache`), so that vLLM's own
Triton kernels are compiled once per fleet too.  A
vLLM without the functions it wraps is left alone.  A cache failure, or any failure of this module, leaves vLLM's
own behaviour: nothing it does raises into vLLM.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from datetime import datetime, timezone
from typing import Any

from precompile import config
from precompile._version import __version__

log = logging.getLogger("precompile")

PURPOSE = "vllm_modelinfo"
#: Bounds on a modelinfo's fields: far above vLLM's (two dozen booleans and short names).
MAX_FIELDS = 256
MAX_TEXT = 256
_installed = False


def register() -> None:
    """Entry point of group ``vllm.general_plugins``: wrap vLLM's model-registry cache once per process.

    Never raises (vLLM calls general plugins unguarded: a raising one would stop its start); it logs why it stays
    out."""
    try:
        _register()
    except Exception as err:  # noqa: BLE001 - a plugin must not stop vLLM
        log.warning("precompile's vLLM registry plugin is inactive: %s: %s", type(err).__name__, err)


def _register() -> None:
    global _installed
    if _installed:
        return
    from precompile.errors import ConfigError

    try:
        if not config.vllm_registry_enabled():
            return
    except ConfigError as err:
        log.warning("precompile's vLLM registry plugin is inactive: %s", err)
        return
    from precompile.integrations import triton_cache
    from precompile.integrations.vllm import shim

    triton_cache.install()  # vLLM's own Triton kernels (its model runner's, its sampler's) through the cache too
    _LazyRegisteredModel = shim.modelinfo_registry()
    if _LazyRegisteredModel is None:
        log.info("this vLLM's model registry has no modelinfo cache functions (or vLLM is not importable); "
                 "precompile leaves it alone")
        return
    load = _LazyRegisteredModel._load_modelinfo_from_cache
    save = _LazyRegisteredModel._save_modelinfo_to_cache

    def _load_modelinfo_from_cache(self: Any, module_hash: str) -> Any:
        mi = load(self, module_hash)
        if mi is None and _guarded(restore, self, module_hash):
            mi = load(self, module_hash)
        return mi

    def _save_modelinfo_to_cache(self: Any, mi: Any, module_hash: str) -> None:
        save(self, mi, module_hash)
        _guarded(publish, self, mi, module_hash)

    for name, fn, original in (("_load_modelinfo_from_cache", _load_modelinfo_from_cache, load),
                               ("_save_modelinfo_to_cache", _save_modelinfo_to_cache, save)):
        fn.__wrapped__ = original  # type: ignore[attr-defined]
        fn.__doc__ = original.__doc__
        setattr(_LazyRegisteredModel, name, fn)
    _installed = True


def _guarded(fn: Any, *args: Any) -> bool:
    """``fn(*args)``, or False (logged) if it raises: a cache's failure leaves vLLM's own behaviour."""
    try:
        return bool(fn(*args))
    except Exception as err:  # noqa: BLE001 - never into vLLM's model inspection
        log.warning("precompile's vLLM registry plugin failed (%s: %s); vLLM goes on without it",
                    type(err).__name__, err)
        return False


def factors(entry: Any, module_hash: str) -> dict[str, Any]:
    """The key factors of the record of ``entry`` (vLLM's ``_LazyRegisteredModel``) at ``module_hash``."""
    import vllm

    return {"format": config.FORMAT_VERSION, "kind": "record", "purpose": PURPOSE,
            "about": f"{entry.module_name}.{entry.class_name}", "module_hash": str(module_hash),
            "vllm": vllm.__version__}


def check_modelinfo(data: Any) -> dict[str, Any]:
    """``data`` if it is exactly a vLLM ``_ModelInfo``'s fields as vLLM's own cache file holds them: every field
    present and no other, each value of its declared type (a ``bool`` field a JSON boolean, a ``Literal`` field one
    of its values, a ``str`` field a short string, a ``tuple[str, ...]`` field a list of short strings, an ``Any``
    field - vLLM's ``Literal`` aliases at run time - a short name).  A field of any other declared type is
    refused, so a newer vLLM's modelinfo is inspected by vLLM itself.

    Raises:
        ValueError: it is not; the message says what is wrong.
    """
    import typing

    from precompile.integrations.vllm import shim

    _ModelInfo = shim.modelinfo_class()

    try:
        hints = typing.get_type_hints(_ModelInfo)
    except Exception as err:  # noqa: BLE001 - annotations that cannot be resolved: nothing can be checked
        raise ValueError(f"this vLLM's _ModelInfo annotations cannot be read ({err})") from err
    names = {f.name for f in dataclasses.fields(_ModelInfo)}
    if not isinstance(data, dict) or set(data) != names:
        unknown = sorted(map(str, set(data) - names))[:3] if isinstance(data, dict) else []
        raise ValueError(f"not the fields of this vLLM's _ModelInfo (unknown {unknown})" if unknown else
                         "not the fields of this vLLM's _ModelInfo (some are missing)")
    for name, value in data.items():
        if not _of_type(value, hints.get(name)):
            raise ValueError(f"field {name} holds {str(value)[:80]!r}, not a {hints.get(name)}")
    return data


def _of_type(value: Any, hint: Any) -> bool:
    import re
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:  # vLLM's Literal aliases are Any at run time (imported for type checkers only)
        return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", value) is not None
    if hint is bool:
        return isinstance(value, bool)
    if hint is str:
        return isinstance(value, str) and len(value) <= MAX_TEXT
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is tuple and args and args[-1] is Ellipsis and args[0] is str:
        return isinstance(value, list) and len(value) <= MAX_FIELDS and all(
            isinstance(v, str) and len(v) <= MAX_TEXT for v in value)
    return False


def restore(entry: Any, module_hash: str) -> bool:
    """Write the record of ``entry`` at ``module_hash`` where vLLM reads its modelinfo; False on a miss (logged)."""
    from precompile.errors import TrustConfigError
    from precompile.metrics import safe_incr
    from precompile.store import record

    cache = _cache()
    if cache is None:
        return False
    try:
        found = record.read(cache, record.record_key(factors(entry, module_hash)), PURPOSE)
        if found is None:
            safe_incr(cache, record_misses=1)
            return False
        modelinfo = check_modelinfo(found.data.get("modelinfo"))
        if found.data.get("hash") != module_hash:
            raise ValueError("it names another module hash")
    except TrustConfigError as err:
        log.warning("precompile cannot check vLLM's modelinfo record (%s); vLLM inspects the class itself", err)
        return False
    except ValueError as err:
        log.warning("the vLLM modelinfo record of %s.%s is unusable (%s); vLLM inspects the class itself",
                    entry.module_name, entry.class_name, err)
        return False
    except Exception as err:  # noqa: BLE001 - a cache failure leaves vLLM's own behaviour
        log.warning("precompile could not read vLLM's modelinfo record (%s: %s)", type(err).__name__, err)
        return False
    from precompile.integrations.vllm.aot import write_for_vllm

    path = os.path.join(entry._get_cache_dir(), entry._get_cache_filename())
    if not write_for_vllm(path, json.dumps({"hash": module_hash, "modelinfo": modelinfo}, indent=2).encode(),
                          "vLLM's modelinfo"):
        return False
    safe_incr(cache, record_hits=1)
    log.info("vLLM modelinfo of %s.%s restored from the cache (record %s)", entry.module_name, entry.class_name,
             found.key[:12])
    return True


def publish(entry: Any, mi: Any, module_hash: str) -> bool:
    """Store vLLM's modelinfo ``mi`` of ``entry`` as a record; False if it was not stored (logged)."""
    from precompile.metrics import safe_incr
    from precompile.store import record

    cache = _cache()
    if cache is None:
        return False
    try:
        data = {"hash": module_hash, "modelinfo": check_modelinfo(json.loads(json.dumps(dataclasses.asdict(mi))))}
        f = factors(entry, module_hash)
        stored = record.write(cache, record.RecordManifest(
            key=record.record_key(f), purpose=PURPOSE, factors=f, data=data,
            build={"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "precompile": __version__}))
    except Exception as err:  # noqa: BLE001 - a record that cannot be stored leaves vLLM's own behaviour
        log.warning("precompile could not store vLLM's modelinfo of %s.%s (%s: %s)", entry.module_name,
                    entry.class_name, type(err).__name__, err)
        return False
    if stored is not None:
        safe_incr(cache, record_writes=1)
        log.info("stored vLLM's modelinfo of %s.%s as record %s", entry.module_name, entry.class_name,
                 stored.key[:12])
    return stored is not None


def _cache() -> Any:
    from precompile.store.opening import open_cache

    try:
        return open_cache(None)
    except Exception as err:  # noqa: BLE001 - a bad URL, a missing client library: vLLM's own behaviour
        log.warning("precompile cache cannot be opened (%s); vLLM's modelinfo stays on local disk", err)
        return None
