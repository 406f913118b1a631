"""Triton's JIT cache behind precompile's cache: kernels a program compiles at run time, compiled once per fleet.

Not every Triton kernel a server runs comes out of Inductor (those travel inside precompile's artifacts).  vLLM's
own runtime kernels (its V2 model runner's input preparation, sampling...) are ``@triton.jit`` functions that
Triton compiles on first call and keeps in ``$TRITON_CACHE_DIR`` (``~/.triton/cache``), on one machine's disk: a
new machine with an empty directory compiles them again, about 20 s of a vLLM start on an H100 before its first
token.  ``PrecompileTritonCache`` is a Triton ``CacheManager`` (``TRITON_CACHE_MANAGER``, Triton 3.x) that
keeps Triton's files where Triton keeps them and, behind that directory, in precompile's cache:

- ``get_group`` (Triton asks for a compiled kernel's files by its metadata file, ``<name>.json``): the local
  directory first; where it holds nothing, the kernel's record (:mod:`precompile.store.record`, purpose
  ``triton_kernel``: the files' names, sizes and digests; signature and structure checked) and its blobs
  (digest-checked) are read from the cache, and the files are written to the local directory through Triton's
  own ``put`` (atomic), so Triton loads them as its own;
- ``put_group`` (Triton compiled a kernel): after Triton's own write, the files are stored as blobs and a record;
- ``get_file``/``put`` of a kernel launcher (``*.so``: Triton builds one per kernel signature with the host C
  compiler, about 0.25 s of gcc each) the same way, one file a record.  A launcher is host code: it is loaded by
  the process, so it is never restored under ``PRECOMPILE_REQUIRE_NO_HOST_CODE``, and with verify keys only a
  signed record is taken, as for every ``.so`` precompile carries.

The record's key is Triton's own cache key for the kernel (a hash of its source, constants, options, target
architecture and Triton's version, which already tells apart what could differ) with the metadata file's name,
Triton's version and precompile's environment fingerprint (GPU, CUDA, torch).  A name read from the cache becomes
a file name only if it is a plain file name with one of Triton's extensions (:data:`NAME`); every size is bounded
(:data:`MAX_FILE_BYTES`, :data:`MAX_FILES`).  Kernels Inductor generates (named ``triton_*``) are left out: they
travel inside precompile's artifacts, and an Inductor build compiles many configs it then drops.

Nothing here raises into Triton: a cache failure, a refused record or any error of this module leaves Triton's
own behaviour (it compiles), logged once.  Active where set in ``TRITON_CACHE_MANAGER``; precompile's vLLM plugin
(:mod:`precompile.integrations.vllm.registry`) sets it in processes whose ``PRECOMPILE_CACHE`` names a cache.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime, timezone
from typing import Any

from precompile import config
from precompile._version import __version__

log = logging.getLogger("precompile")

PURPOSE = "triton_kernel"
#: What ``TRITON_CACHE_MANAGER`` names to use this module.
MANAGER = "precompile.integrations.triton_cache:PrecompileTritonCache"
#: A file name of a kernel's group: a plain name and one of the extensions Triton writes.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,126}\.(json|cubin|ptx|ttir|ttgir|llir|source|hsaco|amdgcn|spv|"
                  r"asm|so|ll|bc|ttgir_sm)\Z", re.ASCII)
#: Triton's cache keys: base32 of a sha256 (its ``_base32``), or a hex digest.
TRITON_KEY = re.compile(r"[A-Za-z0-9]{16,128}\Z", re.ASCII)
MAX_FILES = 32
MAX_FILE_BYTES = 32 << 20
MAX_GROUP_BYTES = 64 << 20
_cache: list[Any] = []
_env: list[dict[str, Any]] = []
_warned: set[str] = set()


def _base() -> type:
    from triton.runtime.cache import FileCacheManager

    return FileCacheManager


def _manager_class() -> type:
    class PrecompileTritonCache(_base()):  # type: ignore[misc]
        """Triton's ``FileCacheManager`` with precompile's cache behind it (module docstring).

        Args:
            key: Triton's cache key of one kernel (a directory name under ``$TRITON_CACHE_DIR``).
            override, dump: Triton's; the override and dump directories are Triton's own, never shared.
        """

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            super().__init__(key, override=override, dump=dump)
            self._shared = not (override or dump)

        def get_group(self, filename: str) -> dict[str, str] | None:
            group = super().get_group(filename)
            if group is None and self._shared and filename.endswith(".json") and not filename.startswith("triton_"):
                if _guarded(restore, self, filename):
                    group = super().get_group(filename)
            return group

        def put_group(self, filename: str, group: dict[str, str]) -> str:
            path = super().put_group(filename, group)
            if self._shared and filename.endswith(".json") and not filename.startswith("triton_"):
                _guarded(publish, self, filename, group)
            return path

        def get_file(self, filename: str) -> str | None:
            path = super().get_file(filename)
            if path is None and self._shared and _launcher(filename):
                if _guarded(restore, self, filename):
                    path = super().get_file(filename)
            return path

        def put(self, data: Any, filename: str, binary: bool = True) -> str:
            path = super().put(data, filename, binary)
            if self._shared and _launcher(filename):
                _guarded(publish, self, filename, {filename: path})
            return path

    PrecompileTritonCache.__module__ = __name__
    PrecompileTritonCache.__qualname__ = "PrecompileTritonCache"
    return PrecompileTritonCache


def __getattr__(name: str) -> Any:
    """``PrecompileTritonCache``, made on first use (importing this module imports no Triton)."""
    if name != "PrecompileTritonCache":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = globals()[name] = _manager_class()
    return cls


def _launcher(filename: str) -> bool:
    """A kernel launcher Triton built with the host compiler (``__triton_launcher.cpython-312-....so``: one per
    kernel signature, about 0.25 s of gcc each on a new machine), where host code may be loaded.  A
    ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` that cannot be read counts as set (warned once): never an error into
    Triton."""
    if not (filename.endswith(".so") and NAME.match(filename)):
        return False
    try:
        return not config.require_no_host_code()
    except Exception as err:  # noqa: BLE001 - a bad setting refuses host code; Triton builds its own launcher
        _warn(f"precompile's Triton cache leaves launchers out: {err}")
        return False


def factors(key: str, filename: str) -> dict[str, Any]:
    """The key factors of the record of Triton's kernel ``key`` (metadata file ``filename``, or a launcher)."""
    import triton

    if not _env:
        import torch

        from precompile.key import fingerprint

        devices = {"cpu", "cuda"} if torch.cuda.is_available() else {"cpu"}
        _env.append(fingerprint.key_fields(fingerprint.environment(devices, full=False)))
    return {"format": config.FORMAT_VERSION, "kind": "record", "purpose": PURPOSE, "triton_key": key,
            "metadata": filename, "triton": triton.__version__, "env": _env[0]}


def restore(manager: Any, filename: str) -> bool:
    """Write the files of kernel ``manager.key`` from the cache into Triton's directory; False on a miss."""
    from precompile.metrics import safe_incr
    from precompile.store import record

    cache = _open()
    if cache is None or not TRITON_KEY.match(manager.key) or not NAME.match(filename):
        return False
    if filename.endswith(".so") and not _launcher(filename):
        return False  # host code, refused under PRECOMPILE_REQUIRE_NO_HOST_CODE
    found = record.read(cache, record.record_key(factors(manager.key, filename)), PURPOSE)
    if found is None:
        safe_incr(cache, record_misses=1)
        return False
    files = check_files(found.data, filename)
    blobs = cache.get_blobs([f["digest"] for f in files.values()],
                            {f["digest"]: f["size"] for f in files.values()})
    if any(not isinstance(blobs.get(f["digest"]), bytes) for f in files.values()):
        log.info("precompile: a blob of Triton kernel %s is missing from the cache; Triton compiles it", filename)
        return False
    group = {}
    for name, f in sorted(files.items()):  # through Triton's own writes: these are not published again
        group[name] = _base().put(manager, blobs[f["digest"]], name, binary=not name.endswith(".json"))
    if filename.endswith(".json"):
        _base().put_group(manager, filename, group)
    safe_incr(cache, record_hits=1)
    log.info("precompile: Triton %s %s restored from the cache (%d files)",
             "launcher" if filename.endswith(".so") else "kernel", filename, len(group))
    return True


def check_files(data: Any, filename: str) -> dict[str, dict[str, Any]]:
    """``data["files"]`` of a record if it is ``{name: {"digest": 64 hex, "size": bytes}}`` with plain names of
    Triton's extensions (:data:`NAME`), at most :data:`MAX_FILES`, each at most :data:`MAX_FILE_BYTES` and
    :data:`MAX_GROUP_BYTES` in all, and holding exactly what Triton asked for: for a launcher (``filename`` a
    ``.so``) that one file; for a kernel (``filename`` its ``<stem>.json``) files named ``<stem>.<ext>`` only, no
    ``.so`` among them, and a kernel binary (``.cubin``, ``.hsaco`` or ``.spv``), so that what is written is what
    Triton loads for that kernel and nothing else.

    Raises:
        ValueError: it is not; the message says what is wrong (never quoting the record's bytes).
    """
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES or filename not in files:
        raise ValueError("not a Triton kernel's file list")
    if filename.endswith(".so"):
        if len(files) != 1:
            raise ValueError("a launcher's record names other files")
    else:
        stem = filename[: -len(".json")]
        names = [n for n in files if isinstance(n, str)]
        if len(names) != len(files) or any(n.rsplit(".", 1)[0] != stem or n.endswith(".so") for n in names):
            raise ValueError(f"a kernel's record names files of another kernel or a shared object ({len(files)} "
                             "files)")
        if not any(n.endswith((".cubin", ".hsaco", ".spv")) for n in names):
            raise ValueError("a kernel's record has no kernel binary")
    total = 0
    for name, f in files.items():
        if not (isinstance(name, str) and NAME.match(name) and isinstance(f, dict) and set(f) == {"digest", "size"}
                and isinstance(f["digest"], str) and re.fullmatch(r"[0-9a-f]{64}", f["digest"])
                and isinstance(f["size"], int) and not isinstance(f["size"], bool)
                and 0 <= f["size"] <= MAX_FILE_BYTES):
            raise ValueError(f"file entry {len(name) if isinstance(name, str) else '?'} characters long is malformed")
        total += f["size"]
    if total > MAX_GROUP_BYTES:
        raise ValueError(f"the files add up to {total} bytes, over {MAX_GROUP_BYTES}")
    return files


def publish(manager: Any, filename: str, group: dict[str, str]) -> bool:
    """Store the files of a kernel Triton just compiled as blobs and a record; False if it was not stored."""
    from precompile.metrics import safe_incr
    from precompile.store import record

    cache = _open()
    if cache is None or not TRITON_KEY.match(manager.key) or not NAME.match(filename):
        return False
    files: dict[str, dict[str, Any]] = {}
    for name, path in sorted(group.items()):
        if not NAME.match(name) or os.path.dirname(os.path.abspath(path)) != os.path.abspath(manager.cache_dir):
            return False  # not a file of this kernel's own directory: not ours to share
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            return False
        files[name] = {"digest": cache.put_blob(data), "size": len(data)}
    f = factors(manager.key, filename)
    stored = record.write(cache, record.RecordManifest(
        key=record.record_key(f), purpose=PURPOSE, factors=f, data={"files": files},
        build={"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "precompile": __version__}))
    if stored is not None:
        safe_incr(cache, record_writes=1)
        log.info("precompile: stored Triton kernel %s (%d files) as record %s", filename, len(files), stored.key[:12])
    return stored is not None


def _open() -> Any:
    if not _cache:
        from precompile.store.opening import open_cache

        try:
            _cache.append(open_cache(None))
        except Exception as err:  # noqa: BLE001 - a bad URL, a missing client library: Triton's own cache only
            _warn(f"precompile cache cannot be opened ({type(err).__name__}: {err}); Triton's kernels stay local")
            _cache.append(None)
    return _cache[0]


def _guarded(fn: Any, *args: Any) -> bool:
    """``fn(*args)``, or False (logged once per kind) if it raises: Triton then does its own work."""
    try:
        return bool(fn(*args))
    except Exception as err:  # noqa: BLE001 - never into Triton's compile
        _warn(f"precompile's Triton cache failed ({type(err).__name__}: {err}); Triton compiles as usual")
        return False


def _warn(message: str) -> None:
    """Log ``message`` once per process (per text before its first parenthesis, which names the failure)."""
    kind = message.split("(")[0] + (message.split("(")[1].split(":")[0] if "(" in message else "")
    if kind not in _warned:
        _warned.add(kind)
        log.warning("%s", message)


def install() -> bool:
    """Make Triton use :class:`PrecompileTritonCache` in this process and those it starts (``TRITON_CACHE_MANAGER``),
    unless another manager is set there; True if it is in use."""
    current = os.environ.get("TRITON_CACHE_MANAGER")
    if current and current != MANAGER:
        log.info("precompile: TRITON_CACHE_MANAGER=%s is set; Triton's kernels stay out of precompile's cache", current)
        return False
    os.environ["TRITON_CACHE_MANAGER"] = MANAGER
    return True

