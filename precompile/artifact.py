"""The compiled artifact: a callable with a manifest, saved as one file or a readable directory, or cached.

File format (``format="binary"``, one file; see docs/format.md)::

    magic      8 bytes   b"\\x89PCART\\r\\n"
    version    u32 LE    artifact format version (precompile.config.FORMAT_VERSION)
    manifest   u64 LE length + manifest JSON bytes
    count      u32 LE    number of blobs
    blob * count:  32-byte raw sha256 of the uncompressed bytes, u64 LE length, zstd frame of that length
    end        8 bytes   b"PCARTEND"

The unpacked directory (``format="unpacked"``) holds ``manifest.json``, ``index.json`` (digest -> file) and each
part as a file a person opens directly: ``graph/code.py``, ``graph/graph.json``, ``inputs.json``,
``wrappers/*.py``, ``kernels/*.cpp|*.py``, ``binaries/<kernel>/*``, ``autotune.json``, ``alignment.json``,
``env.json``, ``engine/payload.bin``.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from cache_backends.base import MISS, Cache, digest_bytes
from precompile import config, fingerprint
from precompile.errors import (
    ArtifactFormatError,
    ArtifactNotFoundError,
    CacheError,
    EnvironmentMismatchError,
    InputMismatchError,
)
from precompile.manifest import Manifest

log = logging.getLogger("precompile")

MAGIC = b"\x89PCART\r\n"
END = b"PCARTEND"


class Artifact:
    """A compiled FX graph: call it like the graph, inspect its manifest, save or cache it.

    ``art(*inputs)`` takes the same inputs as the graph it was compiled from (for a ``torch.export`` module:
    the module's user arguments) and returns the same structure.  Placeholders that were tensor attributes of
    the module (lifted weights) are *bound*: they need not be passed.  After :func:`load`, such weights are
    not in the artifact (one artifact serves every checkpoint): bind them with :meth:`bind` first.

    Attributes:
        key: the artifact key (64 hex chars).
        manifest: the parsed :class:`~precompile.manifest.Manifest`.
        source: where it came from: ``"compiled"``, ``"cache"``, or the path it was loaded from.
        load_seconds: seconds the load took (0.0 for a fresh compile).
        outcome: how ``standalone_compile`` got it: ``"hit"``, ``"built"``, ``"waited"`` or ``"takeover"``
            (see :func:`precompile.coordination.get_or_build`).
        engine_kind: how the callable was made: ``"compiled"`` (fresh), ``"fast"`` (carried binaries, nothing
            compiled), ``"portable"`` (Inductor's cache entries), or None before the first use.
    """

    def __init__(self, manifest: Manifest, blobs: Mapping[str, bytes], *, engine: Callable[..., Any] | None = None,
                 bound: dict[int, torch.Tensor] | None = None, source: str = "compiled",
                 blob_reader: Callable[[list[str]], dict[str, bytes]] | None = None):
        self.manifest = manifest
        self.key = manifest.key
        self.source = source
        self.load_seconds = 0.0
        self.outcome = "hit" if source == "cache" else "built"
        self._blobs = dict(blobs)
        self._blob_reader = blob_reader
        self._engine = engine
        self._engine_lock = threading.Lock()
        self._bound: dict[int, torch.Tensor] = dict(bound or {})
        self._checks = [_InputCheck.from_spec(spec) for spec in manifest.placeholders]
        self._misaligned_warned: set[int] = set()
        self._aligned_assumed = {a["index"] for a in manifest.alignment if a.get("inductor_assumes_aligned")}
        calling = manifest.calling or {}
        self._in_spec = _load_spec(calling.get("in_spec"))
        self._out_spec = _load_spec(calling.get("out_spec"))
        self._outputs = calling.get("outputs")
        self.engine_kind: str | None = "compiled" if engine is not None else None

    # -------------------------------------------------------------------------------------------- calling
    @property
    def placeholders(self) -> list[dict[str, Any]]:
        """Input specs, one per placeholder, in call order (see :class:`Manifest`)."""
        return self.manifest.placeholders

    def bind(self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, strict: bool = True) -> Artifact:
        """Bind placeholders that have an FQN (parameters, buffers, lifted constants) to tensors by name.

        Args:
            weights: ``{fqn: tensor}`` (e.g. ``model.state_dict()``) or a module (its named parameters and
                buffers are used).
            strict: raise if a parameter/buffer/constant placeholder finds no tensor of that name.

        Returns:
            ``self``, for chaining.

        Raises:
            InputMismatchError: ``strict`` and names are missing, or a tensor's shape/dtype does not match its
                placeholder (the message lists each).
        """
        if isinstance(weights, torch.nn.Module):
            table = dict(weights.named_parameters(remove_duplicate=False))
            table.update(weights.named_buffers(remove_duplicate=False))
        else:
            table = dict(weights)
        missing, wrong = [], []
        for i, spec in enumerate(self.manifest.placeholders):
            fqn = spec.get("fqn")
            if spec["kind"] == "user_input" or not fqn:
                continue
            tensor = table.get(fqn)
            if tensor is None:
                missing.append(f"{spec['name']} ({spec['kind']} {fqn!r})")
                continue
            problem = self._checks[i].problem(tensor)
            if problem:
                wrong.append(f"{spec['name']} ({fqn!r}): {problem}")
                continue
            self._bound[i] = tensor
        if wrong or (strict and missing):
            lines = [f"  missing: {m}" for m in missing] + [f"  mismatched: {w}" for w in wrong]
            raise InputMismatchError("cannot bind weights to artifact %s:\n%s" % (self.key[:12], "\n".join(lines)))
        return self

    def _flat_inputs(self, args: tuple[Any, ...]) -> list[Any]:
        if self._in_spec is not None:
            from torch.utils import _pytree as pytree

            args = tuple(pytree.arg_tree_leaves(*args))
        n = len(self._checks)
        if len(args) == n:
            return list(args)
        free = [i for i in range(n) if i not in self._bound]
        if len(args) == len(free):
            flat: list[Any] = [None] * n
            for i, t in self._bound.items():
                flat[i] = t
            for i, a in zip(free, args):
                flat[i] = a
            return flat
        names = [self.manifest.placeholders[i]["name"] for i in free]
        missing = names[len(args):] if len(args) < len(free) else []
        unbound_w = [f"{s['name']} ({s['kind']} {s['fqn']!r})" for i, s in enumerate(self.manifest.placeholders)
                     if i in free and s["kind"] != "user_input"]
        msg = (f"artifact {self.key[:12]} takes {len(free)} input(s) "
               + (f"({n} placeholders, {len(self._bound)} bound)" if self._bound else f"({n} placeholders)")
               + f", got {len(args)}.")
        if missing:
            msg += f" Missing placeholders: {', '.join(missing[:12])}" + (" ..." if len(missing) > 12 else "") + "."
        else:
            msg += f" It takes: {', '.join(names[:12])}" + (" ..." if len(names) > 12 else "") + "."
        if unbound_w:
            msg += (f" {len(unbound_w)} of them are weights, e.g. {unbound_w[0]}: bind them with "
                    "art.bind(model) or art.bind(state_dict), or pass every placeholder in order.")
        raise InputMismatchError(msg)

    def check_inputs(self, flat: list[Any]) -> None:
        """Check each input against its placeholder's spec (type, dtype, shape, device type).

        Raises:
            InputMismatchError: naming every placeholder that does not match and what was expected.
        """
        problems = []
        for check, value in zip(self._checks, flat):
            p = check.problem(value)
            if p:
                problems.append(f"  {check.name}: {p}")
        if problems:
            raise InputMismatchError(f"inputs do not match artifact {self.key[:12]}:\n" + "\n".join(problems))

    def __call__(self, *args: Any) -> Any:
        flat = self._flat_inputs(args)
        self.check_inputs(flat)
        if self._aligned_assumed:
            self._note_misaligned(flat)
        out = self.engine(*flat)
        if self._out_spec is not None:
            from torch.utils import _pytree as pytree

            return pytree.tree_unflatten(list(out), self._out_spec)
        kind = self._outputs
        if kind == "tuple":
            return out if type(out) is tuple else tuple(out)
        if kind == "list":
            return out if type(out) is list else list(out)
        if kind == "single" and isinstance(out, (list, tuple)) and len(out) == 1:
            return out[0]
        return out

    def warmup(self) -> bool:
        """Run the compiled graph once on zero-filled user inputs, so that the libraries its kernels call (cuBLAS
        and cuDNN on a GPU, oneDNN on a CPU) set themselves up now instead of on the first real call.  Their
        set-up is most of a first call: 0.2 s against a 2 ms steady call for the GPU Llama of
        docs/benchmarks.md.  Bound placeholders (:meth:`bind`) are used as they are; each user input is a
        tensor of zeros with its recorded shape, stride, dtype and device (zeros are valid token ids and masks).

        Returns:
            True if it ran; False, with the reason logged at INFO and nothing run, when the graph writes to an
            input, a parameter or buffer is not bound, or an input's shape is symbolic.
        """
        why = ""
        if self.manifest.build.get("mutated_inputs"):
            why = "the graph writes to its inputs"
        flat: list[Any] = []
        for i, spec in enumerate(self.manifest.placeholders):
            if why:
                break
            if i in self._bound:
                flat.append(self._bound[i])
            elif spec["kind"] != "user_input":
                why = f"{spec['kind']} {spec.get('fqn')!r} is not bound"
            elif spec.get("type") == "tensor" and all(isinstance(d, int) for d in [*spec["shape"], *spec["stride"]]):
                dtype = getattr(torch, spec["dtype"])
                device = spec["device"]
                if device == "cuda":
                    device = torch.device("cuda", torch.cuda.current_device())
                flat.append(torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype, device=device).zero_())
            elif spec.get("type") in ("int", "float", "bool") and spec.get("value") is not None:
                flat.append(spec["value"])
            else:
                why = f"input {spec['name']} has no fixed shape or value"
        if why:
            log.info("no warm-up for artifact %s: %s", self.key[:12], why)
            return False
        with torch.no_grad():
            self.engine(*flat)
        return True

    def _note_misaligned(self, flat: list[Any]) -> None:
        for i in self._aligned_assumed:
            t = flat[i]
            if isinstance(t, torch.Tensor) and t.data_ptr() % 16 and i not in self._misaligned_warned:
                self._misaligned_warned.add(i)
                log.warning("input %s of artifact %s is not 16-byte aligned; Inductor assumed alignment and "
                            "copies it on every call (slow path). Pass an aligned tensor (e.g. .clone()).",
                            self.manifest.placeholders[i]["name"], self.key[:12])

    @property
    def engine(self) -> Callable[..., Any]:
        """The underlying compiled callable (built from the engine payload on first use)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = _build_engine(self)
        return self._engine

    # ------------------------------------------------------------------------------------------- blobs
    def blob(self, digest: str) -> bytes:
        """Bytes of one part by digest, reading them from where the artifact came from if not yet in memory.

        Raises:
            ArtifactNotFoundError: the part is not available (a cache entry lost it).
        """
        data = self._blobs.get(digest)
        if data is None and self._blob_reader is not None:
            self._blobs.update(self._blob_reader([digest]))
            data = self._blobs.get(digest)
        if data is None:
            raise ArtifactNotFoundError(f"part {digest[:12]} of artifact {self.key[:12]} is not available")
        return data

    def all_blobs(self) -> dict[str, bytes]:
        """Every part's bytes, ``{digest: bytes}``, reading missing ones.

        Raises:
            ArtifactNotFoundError: a part cannot be read.
        """
        missing = [d for d in self.manifest.blobs if d not in self._blobs]
        if missing and self._blob_reader is not None:
            self._blobs.update(self._blob_reader(missing))
        for d in self.manifest.blobs:
            self.blob(d)
        return {d: self._blobs[d] for d in self.manifest.blobs}

    # -------------------------------------------------------------------------------------------- saving
    def save(self, path: str | os.PathLike[str], format: str = "binary") -> Path:
        """Write the artifact to ``path``: one file (``"binary"``) or a readable directory (``"unpacked"``).

        The write is atomic: a temporary sibling is renamed into place, so a crash never leaves a partial
        artifact under ``path``.

        Returns:
            the path written.

        Raises:
            ValueError: ``format`` is neither ``"binary"`` nor ``"unpacked"``.
            ArtifactNotFoundError: a part of the artifact could not be read to write it.
            OSError: the file system refused the write.
        """
        path = Path(path)
        blobs = self.all_blobs()
        manifest = self.manifest.to_json()
        if format == "binary":
            _write_binary(path, manifest, blobs)
        elif format == "unpacked":
            _write_unpacked(path, self.manifest, manifest, blobs)
        else:
            raise ValueError(f"format must be 'binary' or 'unpacked', got {format!r}")
        return path

    def __repr__(self) -> str:
        return (f"<precompile.Artifact {self.key[:12]} {len(self.manifest.placeholders)} inputs, "
                f"{len(self.manifest.kernels)} kernels, from {self.source}>")


# ---------------------------------------------------------------------------------------------- checks
class _InputCheck:
    __slots__ = ("name", "is_tensor", "dtype", "shape", "stride", "device", "text")

    def __init__(self, name: str, is_tensor: bool, dtype: torch.dtype | None,
                 shape: tuple[int | None, ...] | None, device: str | None,
                 stride: tuple[int | None, ...] | None = None):
        self.name, self.is_tensor = name, is_tensor
        self.dtype, self.shape, self.device, self.stride = dtype, shape, device, stride
        dims = "x".join("?" if d is None else str(d) for d in (shape or ()))
        self.text = f"tensor[{dims}] {str(dtype).removeprefix('torch.')} on {device}" if is_tensor else "a number"

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> _InputCheck:
        if spec.get("type") != "tensor":
            return cls(spec["name"], False, None, None, None)
        shape = tuple(d if isinstance(d, int) else None for d in spec["shape"])
        stride = tuple(d if isinstance(d, int) else None for d in spec.get("stride") or ()) or None
        return cls(spec["name"], True, getattr(torch, spec["dtype"]), shape, spec["device"], stride)

    def problem(self, value: Any) -> str | None:
        if not self.is_tensor:
            return None if isinstance(value, (int, float, torch.SymInt)) else f"expected {self.text}, got {type(value).__name__}"
        if not isinstance(value, torch.Tensor):
            return f"expected {self.text}, got {type(value).__name__}"
        if value.dtype != self.dtype or value.device.type != self.device or value.dim() != len(self.shape) or any(
                e is not None and e != s for e, s in zip(self.shape, value.shape)):
            got = "x".join(map(str, value.shape))
            return f"expected {self.text}, got tensor[{got}] {str(value.dtype).removeprefix('torch.')} on {value.device.type}"
        if self.stride is not None and len(self.stride) == value.dim() and value.numel() and any(
                e is not None and n > 1 and e != s for e, s, n in zip(self.stride, value.stride(), value.shape)):
            # the compiled code indexes with the example's strides (Inductor asserts them; dims of size 1 are free)
            want = ", ".join("?" if e is None else str(e) for e in self.stride)
            return (f"expected {self.text} with stride ({want}), got stride {tuple(value.stride())} "
                    "(e.g. a transposed or sliced view); pass .contiguous() or a tensor laid out like the example")
        return None


def _load_spec(text: str | None):
    if not text:
        return None
    from torch.utils import _pytree as pytree

    return pytree.treespec_loads(text)


# ------------------------------------------------------------------------------------------ engine/load
def _build_engine(art: Artifact) -> Callable[..., Any]:
    from precompile import _inductor

    fast = art.manifest.parts.get("fast")
    if fast and config.engine_mode() == "auto":
        try:
            kernels = {k["source"]: art.blob(next(d for f, d in k["binaries"].items() if f.endswith(".so")))
                       for k in art.manifest.kernels}
            rewritten = "source" in fast  # artifacts built before it was stored rewrite the wrapper here
            wrapper = art.blob(fast["source"] if rewritten else art.manifest.parts["wrappers"][fast["wrapper"]])
            engine = _inductor.load_fast(wrapper.decode(), fast["extern"], kernels, sorted(art._aligned_assumed),
                                         rewritten=rewritten)
            art.engine_kind = "fast"
            return engine
        except Exception as err:  # noqa: BLE001 - the portable path is the fallback for any failure
            log.warning("fast load of artifact %s failed (%s: %s); using the portable path", art.key[:12],
                        type(err).__name__, err)
    art.engine_kind = "portable"
    binaries: dict[str, bytes] = {}
    for k in art.manifest.kernels:
        for fname, digest in k["binaries"].items():
            rel = k.get("relpaths", {}).get(fname)
            if rel:
                binaries[rel] = art.blob(digest)
    return _inductor.load_engine(art.blob(art.manifest.parts["engine_payload"]), binaries)


def check_environment(manifest: Manifest) -> None:
    """Raise if ``manifest`` was built for an environment whose binaries cannot run here.

    Raises:
        EnvironmentMismatchError: with ``reasons`` = the differing key fields.
    """
    devices = {p["device"] for p in manifest.placeholders if p.get("type") == "tensor"} or {"cpu"}
    here = fingerprint.environment(devices, full=False)
    diff = fingerprint.mismatches(manifest.env, here)
    if diff:
        why = "; ".join(f"{f}: built for {a!r}, running on {b!r}" for f, a, b in diff)
        raise EnvironmentMismatchError(f"artifact {manifest.key[:12]} was built for another environment ({why}); "
                                       "rebuild it here (precompile rebuild) or load it where it was built", diff)


def load(path_or_key: str | os.PathLike[str], *, cache: str | Cache | None = None,
         weights: Mapping[str, torch.Tensor] | torch.nn.Module | None = None, warmup: bool = False) -> Artifact:
    """Load an artifact from a file, an unpacked directory, or a cache by key.

    Args:
        path_or_key: a path written by :meth:`Artifact.save` (format detected), or a 64-hex artifact key to
            look up in ``cache``.
        cache: cache URL or open cache for a key (default: ``$PRECOMPILE_CACHE`` / the local default).
        weights: optional weights to :meth:`Artifact.bind` (a module or ``{fqn: tensor}``).
        warmup: run :meth:`Artifact.warmup` before returning (counted in ``load_seconds``), so that the first
            real call costs about as much as any other.

    Returns:
        the artifact; its engine is built on the first call.

    Raises:
        ArtifactNotFoundError: no such file/directory, or the cache has no (intact) artifact for the key.
        ArtifactFormatError: the file is not a precompile artifact, is truncated, or a part fails its digest.
        EnvironmentMismatchError: the artifact was built for another torch/CPU ISA/GPU.
    """
    start = time.perf_counter()
    text = os.fspath(path_or_key)
    p = Path(text)
    if p.exists():
        art = _load_path(p)
    elif _is_key(text):
        art = load_from_cache(text, cache)
        if art is None:
            raise ArtifactNotFoundError(f"no intact artifact with key {text} in cache {_cache_url(cache)}")
    else:
        raise ArtifactNotFoundError(f"{text!r} is neither an existing artifact path nor a 64-hex artifact key")
    if weights is not None:
        art.bind(weights)
    art.engine  # build the callable now: load errors surface here, and load_seconds is the whole load
    if warmup:
        art.warmup()
    art.load_seconds = time.perf_counter() - start
    return art


def _cache_url(cache: str | Cache | None) -> str:
    return cache.url if isinstance(cache, Cache) else (cache or config.default_cache_url())


def _is_key(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _load_path(p: Path) -> Artifact:
    if p.is_dir():
        manifest, blobs = _read_unpacked(p)
    else:
        manifest, blobs = _read_binary(p)
    check_environment(manifest)
    return Artifact(manifest, blobs, source=str(p))


def load_from_cache(key: str, cache: str | Cache | None, *, bound: dict[int, torch.Tensor] | None = None,
                    check_env: bool = True) -> Artifact | None:
    """The artifact stored under ``key``, or None on a miss.

    Reads the ref, the manifest and the blobs a load needs (engine payload, binaries), all verified by the
    backend, and checks that the other parts exist (they are read, and verified, when used).  A ref whose
    manifest or blobs are missing or corrupt is a miss: the ref is dropped so the next build replaces it.  Cache failures are misses too (logged once, counted under ``errors``).

    Raises:
        EnvironmentMismatchError: only if ``check_env`` and the stored manifest's key fields differ from here
            (impossible for a key computed here, possible for a key copied from elsewhere).
    """
    from cache_backends.registry import open_cache

    c = open_cache(cache)
    try:
        digest = c.get_ref(key)
        if digest is MISS:
            return None
        raw = c.get_blob(digest)
        if raw is MISS:
            _drop_ref(c, key, "its manifest blob is missing or corrupt")
            return None
        manifest = Manifest.from_json(raw)
        if manifest.key != key:
            _drop_ref(c, key, f"its manifest names another key {manifest.key[:12]}")
            return None
        needed = manifest.load_digests()
        got = c.get_blobs(needed)
        lost = [d for d, v in got.items() if v is MISS]
        # parts a load does not read (sources, graph, wrappers) are read lazily; they must at least exist, or an
        # entry whose part was found corrupt (and dropped) on a lazy read would be served forever, never whole
        rest = [d for d in manifest.part_digests() if d not in got]
        lost += [d for d, ok in c.has_blobs(rest).items() if not ok]
        if lost:
            _drop_ref(c, key, f"{len(lost)} of its parts are missing or corrupt")
            return None
    except (CacheError, ArtifactFormatError) as err:
        warn_once(c, f"cache {c.url} failed while reading artifact {key[:12]}: {err}; treating it as a miss",
                  kind=f"read {type(err).__name__}")
        _safe_incr(c, errors=1)
        return None
    if check_env:
        check_environment(manifest)

    def reader(digests: list[str]) -> dict[str, bytes]:
        found = c.get_blobs(digests)
        return {d: v for d, v in found.items() if v is not MISS}

    return Artifact(manifest, got, bound=bound, source="cache", blob_reader=reader)


def _drop_ref(cache: Cache, key: str, why: str) -> None:
    # corrupt blobs were already counted under ``errors`` by the backend that dropped them
    log.warning("cache entry %s in %s is unusable (%s); dropping it so it is rebuilt", key[:12], cache.url, why)
    try:
        cache.delete_ref(key)
    except CacheError:
        pass


def _safe_incr(cache: Cache, **counts: int) -> None:
    try:
        cache.incr(**counts)
    except Exception as err:  # noqa: BLE001 - counters must never fail a call
        log.debug("counter update failed on %s: %s", cache.url, err)


_warned: set[tuple[str, str]] = set()


def warn_once(cache: Cache, message: str, kind: str | None = None) -> None:
    """Log ``message`` as a warning once per cache URL and ``kind`` (default: the message's first 40 characters);
    repeats go to the debug level.  Give a ``kind`` for messages that name an artifact key, so that a cache that
    fails the same way for every key is reported once, not once per key."""
    tag = (cache.url, kind or message[:40])
    if tag not in _warned:
        _warned.add(tag)
        log.warning(message)
    else:
        log.debug(message)


def store(cache: Cache, art: Artifact) -> bool:
    """Write every blob of ``art``, then its manifest, then its ref (so no reader sees a partial artifact).

    Returns:
        True if stored; False if the cache refused (read-only, unavailable): logged once, counted, never
        raised.
    """
    try:
        # put_blob of a blob already there writes nothing but refreshes it, so a concurrent eviction's grace
        # period protects it until the ref below lands
        for digest, data in art.all_blobs().items():
            cache.put_blob(data, digest)
        cache.set_ref(art.key, cache.put_blob(art.manifest.to_json()))
        return True
    except (CacheError, ArtifactNotFoundError) as err:
        warn_once(cache, f"could not store artifact {art.key[:12]} in {cache.url}: {err}",
                  kind=f"store {type(err).__name__}")
        _safe_incr(cache, errors=1)
        return False


# ------------------------------------------------------------------------------------------ file formats
def _write_binary(path: Path, manifest: bytes, blobs: dict[str, bytes]) -> None:
    import zstandard

    comp = zstandard.ZstdCompressor(level=3)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.incomplete")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<I", config.FORMAT_VERSION))
        f.write(struct.pack("<Q", len(manifest)))
        f.write(manifest)
        f.write(struct.pack("<I", len(blobs)))
        for digest, data in blobs.items():
            z = comp.compress(data)
            f.write(bytes.fromhex(digest))
            f.write(struct.pack("<Q", len(z)))
            f.write(z)
        f.write(END)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_binary(path: Path) -> tuple[Manifest, dict[str, bytes]]:
    import zstandard

    data = path.read_bytes()
    if len(data) < len(MAGIC) and MAGIC.startswith(data):
        raise ArtifactFormatError(f"{path} is truncated: it has {len(data)} bytes, fewer than the artifact's "
                                  f"{len(MAGIC)}-byte header (an empty or cut-off copy); copy the artifact again")
    if not data.startswith(MAGIC):
        raise ArtifactFormatError(f"{path} is not a precompile artifact (it does not start with the artifact "
                                  "magic bytes); expected a file written by Artifact.save(format='binary')")
    view = memoryview(data)
    pos = len(MAGIC)

    def take(n: int, what: str) -> memoryview:
        nonlocal pos
        if pos + n > len(view):
            raise ArtifactFormatError(f"{path} is truncated: {what} needs {n} bytes at offset {pos}, the file has "
                                      f"{len(view)} bytes in all; copy the artifact again")
        out = view[pos:pos + n]
        pos += n
        return out

    (version,) = struct.unpack("<I", take(4, "the format version"))
    if version != config.FORMAT_VERSION:
        raise ArtifactFormatError(f"{path} has artifact format version {version}; this precompile reads "
                                  f"version {config.FORMAT_VERSION}")
    (mlen,) = struct.unpack("<Q", take(8, "the manifest length"))
    manifest = Manifest.from_json(bytes(take(mlen, "the manifest")))
    (count,) = struct.unpack("<I", take(4, "the blob count"))
    dctx = zstandard.ZstdDecompressor()
    blobs: dict[str, bytes] = {}
    for i in range(count):
        digest = bytes(take(32, f"blob {i}'s digest")).hex()
        (zlen,) = struct.unpack("<Q", take(8, f"blob {i}'s length"))
        frame = take(zlen, f"blob {digest[:12]}")
        try:
            raw = dctx.decompress(frame, max_output_size=1 << 34)
        except zstandard.ZstdError as err:
            raise ArtifactFormatError(f"{path}: blob {digest[:12]} does not decompress ({err})") from err
        if digest_bytes(raw) != digest:
            raise ArtifactFormatError(f"{path}: blob {digest[:12]} does not match its digest (the file is corrupt)")
        blobs[digest] = raw
    if bytes(take(len(END), "the end marker")) != END:
        raise ArtifactFormatError(f"{path} is corrupt: the end marker is missing")
    _check_complete(path, manifest, blobs)
    return manifest, blobs


def _check_complete(path: Path, manifest: Manifest, blobs: dict[str, bytes]) -> None:
    missing = [d for d in manifest.blobs if d not in blobs]
    if missing:
        raise ArtifactFormatError(f"{path} lacks {len(missing)} part(s) its manifest names "
                                  f"(e.g. {manifest.blobs[missing[0]].get('role')})")


def _unpacked_layout(manifest: Manifest) -> dict[str, str]:
    """``{digest: relative file path}`` for the unpacked directory."""
    paths: dict[str, str] = {}
    parts = manifest.parts
    paths[parts["fx_graph"]["code"]] = "graph/code.py"
    paths[parts["fx_graph"]["graph"]] = "graph/graph.json"
    paths[parts["engine_payload"]] = "engine/payload.bin"
    for name, d in parts.get("wrappers", {}).items():
        paths.setdefault(d, f"wrappers/{name}.py")
    if parts.get("fast") and "source" in parts["fast"]:
        paths.setdefault(parts["fast"]["source"], f"wrappers/{parts['fast']['wrapper']}.fast.py")
    for k in manifest.kernels:
        ext = "cpp" if k["lang"] == "cpp" else "py"
        paths.setdefault(k["source"], f"kernels/{k['name']}.{ext}")
        for fname, d in k["binaries"].items():
            paths.setdefault(d, f"binaries/{k['name']}/{fname}")
    for d, info in manifest.blobs.items():
        paths.setdefault(d, f"blobs/{d}")
    return paths


def _write_unpacked(path: Path, manifest: Manifest, raw_manifest: bytes, blobs: dict[str, bytes]) -> None:
    import shutil
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    layout = _unpacked_layout(manifest)
    for digest, rel in layout.items():
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[digest])
    extras = {
        "inputs.json": manifest.placeholders,
        "autotune.json": manifest.autotune,
        "alignment.json": manifest.alignment,
        "env.json": manifest.env,
        "index.json": layout,
    }
    for name, value in extras.items():
        (tmp / name).write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    (tmp / "manifest.json").write_bytes(raw_manifest)
    if path.exists():
        old = path.with_name(f".{path.name}.old.{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def _read_unpacked(path: Path) -> tuple[Manifest, dict[str, bytes]]:
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise ArtifactFormatError(f"{path} is a directory without manifest.json: not an unpacked precompile artifact")
    manifest = Manifest.from_json(mpath.read_bytes())
    try:
        layout = json.loads((path / "index.json").read_text())
    except (OSError, ValueError) as err:
        raise ArtifactFormatError(f"{path}/index.json is missing or invalid: {err}") from err
    blobs: dict[str, bytes] = {}
    for digest in manifest.blobs:
        rel = layout.get(digest)
        if rel is None:
            raise ArtifactFormatError(f"{path}/index.json does not list part {digest[:12]}")
        try:
            data = (path / rel).read_bytes()
        except OSError as err:
            raise ArtifactFormatError(f"{path}/{rel} is missing: {err}") from err
        if digest_bytes(data) != digest:
            raise ArtifactFormatError(f"{path}/{rel} was modified: its sha256 does not match the manifest")
        blobs[digest] = data
    return manifest, blobs
