"""``precompile gc``: plan-then-execute eviction by age or size, for local and Redis caches.

:func:`plan` decides, without changing anything, which refs go (every ref not used for ``older_than`` seconds,
then the least recently used until what the remaining refs keep alive fits ``max_bytes``) and which blobs go
(every blob no remaining ref keeps alive, except unreferenced blobs younger than ``grace_s``: a writer's fresh
blobs whose ref has not landed yet).  :func:`execute` carries the plan out, refs first, then blobs: a ref read or
replaced since the plan stays, and a blob some ref names by then stays (as in the Hugging Face hub cache's
``delete_revisions``: the plan is what ``--dry-run`` shows, the execution deletes exactly that, minus what
changed in between).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from cache_backends.base import HEX64, MISS, Cache, StoredBlob, StoredRef
from cache_backends.bounded import MAX_MANIFEST_BYTES

#: Default seconds an unreferenced blob is kept (as :data:`cache_backends.local.cache.DEFAULT_GRACE_S`).
DEFAULT_GRACE_S = 60.0

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZES = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20, "mb": 1000**2,
          "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3, "t": 1 << 40, "tib": 1 << 40, "tb": 1000**4}


def parse_duration(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` or ``"3600"`` -> seconds.

    Raises:
        ValueError: not a non-negative number with an optional unit s/m/h/d/w.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if not m:
        raise ValueError(f"a duration is a number with an optional unit s, m, h, d or w (e.g. 7d), got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_bytes(text: str) -> int:
    """``"10GiB"``, ``"500MB"``, ``"1048576"`` -> bytes (k/m/g/t alone are binary).

    Raises:
        ValueError: not a non-negative size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in _SIZES:
        raise ValueError(f"a size is a number of bytes with an optional unit (KiB, MiB, GiB, MB, GB...), got {text!r}")
    return int(float(m.group(1)) * _SIZES[m.group(2)])


@dataclass
class Plan:
    """What :func:`execute` will delete from one cache (tier).

    Attributes:
        url: the cache.
        refs: refs to drop, least recently used first, with ``reasons[key]`` (``"older than ..."`` or
            ``"over max bytes"``).
        blobs: blobs to delete.
        bytes_before / bytes_after: bytes stored (compressed) now, and after the plan is carried out.
        keeps: ``{key: digests it keeps alive}`` of every ref (for the table's "frees" column).
    """

    url: str
    refs: list[StoredRef] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    blobs: list[StoredBlob] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    refs_kept: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "refs": [{"key": r.key, "last_used": r.last_used, "reason": self.reasons[r.key]}
                                          for r in self.refs],
                "blobs": [{"digest": b.digest, "stored_bytes": b.stored_bytes} for b in self.blobs],
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "bytes_freed": self.bytes_before - self.bytes_after, "refs_kept": self.refs_kept}


def _keeps(cache: Cache, digest: str, memo: dict[str, frozenset[str]]) -> frozenset[str]:
    """Digests a ref's target keeps alive: itself and every 64-hex string in it (a manifest names its parts,
    a signature envelope its manifest), conservatively (cache_backends.local.cache.manifest_blob_digests)."""
    from cache_backends.local.cache import manifest_blob_digests

    if digest not in memo:
        raw = cache.get_blob(digest, MAX_MANIFEST_BYTES)  # a ref's target is a manifest
        names = {digest}
        if raw is not MISS:
            try:
                names.update(d for d in manifest_blob_digests(raw) if HEX64.match(d))  # type: ignore[arg-type]
            except (ValueError, UnicodeDecodeError):
                pass
        memo[digest] = frozenset(names)
    return memo[digest]


def plan(cache: Cache, *, max_bytes: int | None = None, older_than: float | None = None,
         grace_s: float = DEFAULT_GRACE_S, now: float | None = None) -> Plan:
    """Plan an eviction of one cache (tier); nothing is changed.

    Args:
        max_bytes: bytes (compressed, as stored) the cache may hold afterwards; refs are dropped least recently
            used first until what the rest keep alive fits.
        older_than: seconds; every ref not used for longer is dropped.  A ref whose last use the backend cannot
            tell is never dropped by age.
        grace_s: seconds; unreferenced blobs younger than this are kept.

    Raises:
        ValueError: neither ``max_bytes`` nor ``older_than`` is given.
        NotImplementedError: the backend cannot list its entries.
        CacheUnavailableError: the cache cannot be listed or read.
    """
    if max_bytes is None and older_than is None:
        raise ValueError("gc needs max_bytes or older_than")
    now = time.time() if now is None else now
    out = Plan(cache.url)
    blobs = {b.digest: b for b in cache.list_blobs()}
    refs = sorted((r for r in cache.list_refs() if HEX64.match(r.digest)),
                  key=lambda r: (r.last_used if r.last_used is not None else float("inf"), r.key))
    memo: dict[str, frozenset[str]] = {}
    keeps = {r.key: _keeps(cache, r.digest, memo) for r in refs}
    count: dict[str, int] = {}
    for names in keeps.values():
        for d in names:
            count[d] = count.get(d, 0) + 1
    size = {d: b.stored_bytes for d, b in blobs.items()}
    out.bytes_before = sum(size.values())
    young_orphans = {d for d, b in blobs.items() if d not in count and b.last_used is not None
                     and grace_s > 0 and now - b.last_used < grace_s}
    live = sum(size[d] for d in count if d in size) + sum(size[d] for d in young_orphans)

    def drop(ref: StoredRef, reason: str) -> None:
        nonlocal live
        out.refs.append(ref)
        out.reasons[ref.key] = reason
        for d in keeps[ref.key]:
            count[d] -= 1
            if count[d] == 0:
                del count[d]
                live -= size.get(d, 0)

    for ref in refs:
        if older_than is not None and ref.last_used is not None and now - ref.last_used > older_than:
            drop(ref, f"unused for {_age(now - ref.last_used)}")
    for ref in refs:
        if max_bytes is None or live <= max_bytes:
            break
        if ref.key not in out.reasons:
            drop(ref, "over max bytes")
    out.blobs = [b for d, b in sorted(blobs.items()) if d not in count and d not in young_orphans]
    out.bytes_after = out.bytes_before - sum(b.stored_bytes for b in out.blobs)
    out.refs_kept = len(refs) - len(out.refs)
    return out


def _age(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{seconds:.0f}s"


@dataclass
class Result:
    """What :func:`execute` deleted, and what it kept because it changed since the plan."""

    url: str
    refs: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    kept: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "refs": self.refs, "blobs": self.blobs, "bytes_freed": self.bytes_freed,
                "kept": self.kept}


def execute(cache: Cache, planned: Plan) -> Result:
    """Carry out ``planned``: drop its refs (unless read or replaced since), then delete its blobs that no ref
    on the cache keeps alive now (unless written again since, where the backend can tell).

    Raises:
        CacheReadOnlyError: the cache is read-only.
        CacheUnavailableError: the cache cannot be reached.
    """
    out = Result(cache.url)
    for ref in planned.refs:
        (out.refs if cache.drop_ref(ref) else out.kept).append(ref.key)
    memo: dict[str, frozenset[str]] = {}
    alive: set[str] = set()
    for ref in cache.list_refs():
        if HEX64.match(ref.digest):
            alive |= _keeps(cache, ref.digest, memo)
    for blob in planned.blobs:
        if blob.digest not in alive and cache.drop_blob(blob):
            out.blobs.append(blob.digest)
            out.bytes_freed += blob.stored_bytes
        else:
            out.kept.append(blob.digest)
    return out
