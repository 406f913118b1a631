"""``precompile verify``: an fsck of a cache (local or Redis), and the plan that repairs it.

:func:`verify` re-hashes every blob (read without dropping anything) and checks every ref: that it holds a
digest, that its manifest is intact and parses, names the ref's key, that its factors hash to that key, that the
stored graph hashes to the graph factor, and that every part the manifest names is stored and intact.  Each
finding is a :class:`Problem` with the one action that repairs it: drop the ref (the artifact is then a miss and
is rebuilt by the next compile or warmup) or drop the blob.  :func:`fix` executes that plan, refs first.
A tiered cache is verified tier by tier (:func:`tiers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cache_backends.base import HEX64, Cache, StoredBlob, StoredRef, digest_bytes
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, loads_json

#: ``progress(done, total, what)`` after each blob or ref checked.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a cache.

    Attributes:
        kind: ``"bad blob"``, ``"garbled ref"``, ``"bad manifest"``, ``"mis-keyed ref"``, ``"bad key"``,
            ``"bad graph"`` or ``"bad part"``.
        name: the blob digest or the artifact key concerned.
        detail: what is wrong, in words.
        action: ``"drop blob"`` or ``"drop ref"``: what ``--fix`` does about it.
    """

    kind: str
    name: str
    detail: str
    action: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "detail": self.detail, "action": self.action}


@dataclass
class Report:
    """What :func:`verify` found in one cache (one tier).

    Attributes:
        url: the cache (tier) verified.
        blobs_checked / bytes_checked: blobs re-hashed, and their uncompressed bytes.
        refs_checked: refs whose manifest and parts were checked.
        problems: every finding, blobs first.
        seconds: wall time of the check.
        blobs / refs: what was listed, for :func:`fix`.
    """

    url: str
    blobs_checked: int = 0
    bytes_checked: int = 0
    refs_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0
    blobs: dict[str, StoredBlob] = field(default_factory=dict, repr=False)
    refs: dict[str, StoredRef] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "ok": self.ok, "blobs_checked": self.blobs_checked,
                "bytes_checked": self.bytes_checked, "refs_checked": self.refs_checked,
                "problems": [p.to_dict() for p in self.problems], "seconds": round(self.seconds, 3)}


def tiers(cache: Cache) -> list[Cache]:
    """The caches upkeep runs on: the tiers of a tiered cache, else the cache itself."""
    local, remote = getattr(cache, "local", None), getattr(cache, "remote", None)
    if isinstance(local, Cache) and isinstance(remote, Cache):
        return [*tiers(local), *tiers(remote)]
    return [cache]


def verify(cache: Cache, progress: Progress | None = None) -> Report:
    """Check every blob and every ref of ``cache`` (one tier); nothing is changed.

    Raises:
        NotImplementedError: the backend cannot list or check its entries (``supports_upkeep`` is False).
        CacheUnavailableError: the cache cannot be listed or read.
    """
    from precompile.key.graph import canonical_graph, canonical_json

    start = time.perf_counter()
    report = Report(cache.url)
    blobs = {b.digest: b for b in cache.list_blobs()}
    refs = {r.key: r for r in cache.list_refs()}
    report.blobs, report.refs = blobs, refs
    total = len(blobs) + len(refs)
    intact: dict[str, int] = {}
    for i, digest in enumerate(sorted(blobs), 1):
        size, why = cache.check_blob(digest)
        report.blobs_checked += 1
        if why is None:
            intact[digest] = size or 0
            report.bytes_checked += size or 0
        elif why != "missing":  # deleted since it was listed: nothing to report
            report.problems.append(Problem("bad blob", digest, why, "drop blob"))
        if progress:
            progress(i, total, f"blob {digest[:12]}")
    for i, key in enumerate(sorted(refs), len(blobs) + 1):
        why = _check_ref(cache, refs[key], intact, canonical_graph, canonical_json)
        report.refs_checked += 1
        if why is not None:
            report.problems.append(Problem(why[0], key, why[1], "drop ref"))
        if progress:
            progress(i, total, f"ref {key[:12]}")
    report.seconds = time.perf_counter() - start
    return report


def _check_ref(cache: Cache, ref: StoredRef, intact: dict[str, int], canonical_graph: Callable[..., Any],
               canonical_json: Callable[[Any], bytes]) -> tuple[str, str] | None:
    """``(kind, detail)`` of what is wrong with one ref, or None."""
    from precompile.manifest.manifest import Manifest
    from precompile.errors import ArtifactFormatError

    if not HEX64.match(ref.digest):  # its size and digest, never its text (stored bytes are never quoted)
        if not ref.digest:
            return "garbled ref", "holds no digest (it is empty, or not a regular file: never read)"
        return "garbled ref", (f"holds {len(ref.digest)} characters (sha256 "
                               f"{digest_bytes(ref.digest.encode('utf-8', 'replace'))[:16]}), not a digest")
    if ref.digest not in intact:
        return "bad manifest", f"its manifest blob {ref.digest[:12]} is missing or damaged"
    raw = _read(cache, ref.digest, MAX_MANIFEST_BYTES)
    if raw is None:
        return "bad manifest", f"its manifest blob {ref.digest[:12]} is missing or damaged"
    try:
        from precompile.manifest.function_manifest import FunctionManifest, is_function_doc
        from precompile.manifest.manifest import load_json
        from precompile.manifest.record_manifest import RecordManifest, is_record_doc

        doc = load_json(raw)
        if is_function_doc(doc):
            manifest = FunctionManifest.from_dict(doc)  # type: ignore[assignment]
        elif is_record_doc(doc):
            manifest = RecordManifest.from_dict(doc)  # type: ignore[assignment]
        else:
            manifest = Manifest.from_dict(doc)
    except ArtifactFormatError as err:
        return "bad manifest", str(err)
    if manifest.key != ref.key:
        return "mis-keyed ref", f"its manifest is artifact {manifest.key[:12]}, not this key"
    try:
        if digest_bytes(canonical_json(manifest.factors)) != ref.key:
            return "bad key", "the manifest's factors do not hash to its key"
    except (TypeError, ValueError) as err:
        return "bad key", f"the manifest's factors cannot be encoded: {err}"
    lost = [d for d in manifest.blobs if d not in intact]
    if lost:
        role = (manifest.blobs.get(lost[0]) or {}).get("role", "a part")
        return "bad part", f"{len(lost)} of its {len(manifest.blobs)} parts are missing or damaged (e.g. {role})"
    # a whole-function artifact names its graphs by key: they are refs of their own, checked as such
    parts = getattr(manifest, "parts", None)  # a record has none
    graph = (parts.get("fx_graph") or {}).get("graph") if isinstance(parts, dict) else None
    if isinstance(graph, str):
        size = int((manifest.blobs.get(graph) or {}).get("size", MAX_BLOB_BYTES))
        data = _read(cache, graph, size)
        try:
            ok = data is not None and digest_bytes(canonical_json(canonical_graph(loads_json(data, size, "graph")))) \
                == manifest.factors.get("graph")
        except (ValueError, KeyError, TypeError, AttributeError):  # InputLimitError (too deep) is a ValueError
            ok = False
        if not ok:
            return "bad graph", "the stored FX graph does not hash to the key's graph factor"
    return None


def _read(cache: Cache, digest: str, max_bytes: int) -> bytes | None:
    """Blob ``digest``, at most ``max_bytes`` bytes of it, or None (missing, damaged or larger)."""
    from cache_backends.base import MISS

    got = cache.get_blob(digest, max_bytes)
    return None if got is MISS else got  # type: ignore[return-value]


@dataclass
class FixResult:
    """What :func:`fix` did: names dropped, and those left because they changed since the check."""

    dropped_refs: list[str] = field(default_factory=list)
    dropped_blobs: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {"dropped_refs": self.dropped_refs, "dropped_blobs": self.dropped_blobs, "kept": self.kept}


def fix(cache: Cache, report: Report) -> FixResult:
    """Execute the plan of ``report``: drop every bad ref, then every bad blob.  A ref read or replaced, or a
    blob written, since the check is kept (listed in ``kept``).

    Raises:
        CacheReadOnlyError: the cache is read-only.
        CacheUnavailableError: the cache cannot be reached.
    """
    out = FixResult()
    for p in report.problems:
        if p.action == "drop ref":
            (out.dropped_refs if cache.drop_ref(report.refs[p.name]) else out.kept).append(p.name)
    for p in report.problems:
        if p.action == "drop blob":
            (out.dropped_blobs if cache.drop_blob(report.blobs[p.name]) else out.kept).append(p.name)
    return out
