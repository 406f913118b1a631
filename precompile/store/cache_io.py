"""Artifacts in a cache: read verified (a damaged entry is a miss and is dropped), written blobs-then-ref."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from cache_backends.base import MISS, Cache
from cache_backends.bounded import MAX_MANIFEST_BYTES
from precompile import metrics
from precompile.artifact.manifest import Manifest, ManifestJSON, load_json
from precompile.errors import (ArtifactFormatError, ArtifactNotFoundError, CacheError, CacheReadOnlyError,
                               UnsafePathError)
from precompile.loader.engine import graph_part_bounds, start_primer
from precompile.metrics import safe_incr, warn_once
from precompile.store import refusals

if TYPE_CHECKING:  # pragma: no cover
    from precompile.artifact import trust
    from precompile.loader.artifact import Artifact

log = logging.getLogger("precompile")

#: Any of the three manifest kinds (graph artifact, whole function, record).
M = TypeVar("M", bound=ManifestJSON)


def load_from_cache(key: str, cache: str | Cache | None, *, bound: dict[int, torch.Tensor] | None = None,
                    check_env: bool = True, policy: trust.Policy | None = None) -> Artifact | None:
    """The artifact stored under ``key``, or None on a miss.

    Reads the ref and the manifest (at most :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES`), checks the manifest's
    signature when verify keys are configured
    (:func:`precompile.artifact.trust.policy`: an unsigned or badly signed entry is a miss, logged and counted under
    ``untrusted`` and ``untrusted_<reason>``, its ref left alone), then its structure and every name in it
    (:mod:`precompile.artifact.names`), then reads the blobs a load needs (engine payload, binaries; under
    ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` only the wrapper graph and its launch blobs, each within the graph engine's
    own bound: :func:`~precompile.loader.engine.graph_part_bounds`), all verified by
    the backend and none larger than the manifest records, and checks that the other parts exist (they are read,
    verified and bounded the same way, when used).  Nothing read is run
    here.  A ref whose manifest or blobs are verified missing or corrupt is a miss: the ref is dropped so the next
    build replaces it.  Cache failures (a server down or stalled) are misses too, logged once, counted under
    ``errors``, and never drop anything.  ``policy`` is the call's trust policy when the caller resolved it already
    (:func:`precompile.store.opening.policy_for`); by default the cache's (:func:`precompile.store.opening.open_with_policy`).
    An entry refused for what its manifest holds (its signature, its form, host code) is remembered, and a later
    lookup of the same ref is a miss without reading it again (:mod:`precompile.store.refusals`).

    Raises:
        EnvironmentMismatchError: only if ``check_env`` and the stored manifest's key fields differ from here
            (impossible for a key computed here, possible for a key copied from elsewhere).
        TrustConfigError: a configured signing or verify key cannot be read.
    """
    from precompile.store.opening import open_cache, open_with_policy

    if policy is None:
        c, policy = open_with_policy(cache)
    else:
        c = open_cache(cache)
    ctx = refusals.context(c, policy)
    digest: str | None = None  # the manifest's, once read: a drop deletes only a ref that still names it
    try:
        read = read_manifest_doc(c, key, policy, "cache entry")
        if read is None:
            return None
        digest, doc = read
        manifest = Manifest.from_dict(doc)
        del doc
        if manifest.key != key:
            refusals.remember(key, digest, ctx, "its manifest names another key", "damaged")
            drop_ref(c, key, f"its manifest names another key {manifest.key[:12]}", digest=digest)
            return None
        if policy.no_host_code and not manifest.parts.get("wrapper_graph"):
            refusals.remember(key, digest, ctx, "it carries host code", "host_code")
            log.info("cache entry %s carries host code (%s) and PRECOMPILE_REQUIRE_NO_HOST_CODE is set: a miss",
                     key[:12], manifest.build.get("host_code") or "a Python wrapper")
            safe_incr(c, host_code_refused=1)
            metrics.note_miss("host_code")
            return None
        no_host_code = policy.no_host_code
        # the replay, where asked for, runs while the blobs are read and checked (never for the graph engine)
        primer = None if no_host_code else start_primer(manifest)
        sizes = part_bounds(manifest)
        if no_host_code:  # the graph engine reads its graph and launch blobs, within its own bounds; nothing else
            graph_parts = graph_part_bounds(manifest)
            sizes.update(graph_parts)
            needed = list(graph_parts)
        else:
            needed = manifest.load_digests()
        got = c.get_blobs(needed, sizes)  # a part larger than its bound is refused before it is allocated: a miss
        lost = [d for d, v in got.items() if v is MISS]
        # parts a load does not read (sources, graph, wrappers) are read lazily; they must at least exist, or an
        # entry whose part was found corrupt (and dropped) on a lazy read would be served forever, never whole
        rest = [d for d in manifest.part_digests() if d not in got]
        lost += [d for d, ok in c.has_blobs(rest).items() if not ok]
        if lost:
            drop_ref(c, key, f"{len(lost)} of its parts are missing or corrupt", digest=digest)
            return None
    except UnsafePathError as err:  # planted or garbled: never used, counted with the refused entries
        refusals.remember(key, digest, ctx, str(err), "untrusted")
        refused_unsafe(c, "cache entry", key, err)
        return None
    except CacheError as err:  # an outage: nothing is remembered
        read_failed(c, "artifact", key, err)
        return None
    except ArtifactFormatError as err:
        refusals.remember(key, digest, ctx, str(err), "damaged")
        read_failed(c, "artifact", key, err)
        return None
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:  # a shape the checks let through
        refusals.remember(key, digest, ctx, "its manifest is malformed", "damaged")
        drop_ref(c, key, f"its manifest is malformed ({type(err).__name__}: {str(err)[:200]})", digest=digest)
        return None
    from precompile.key.fingerprint import check_environment
    from precompile.loader.artifact import Artifact

    if check_env:
        check_environment(manifest)

    def reader(digests: list[str]) -> dict[str, bytes]:
        try:
            found = c.get_blobs(digests, sizes)
        except CacheError as err:  # the part is then "not available": ArtifactNotFoundError from Artifact.blob
            log.warning("could not read %d part(s) of artifact %s from %s: %s", len(digests), key[:12], c.url, err)
            return {}
        return {d: v for d, v in found.items() if v is not MISS}

    try:
        art = Artifact(manifest, got, bound=bound, source="cache", blob_reader=reader, cache=c)
        art.primer = primer
        art.no_host_code = policy.no_host_code
        return art
    except ArtifactFormatError as err:  # a manifest whose digests check but whose specs or guards do not parse
        refusals.remember(key, digest, ctx, str(err), "damaged")
        drop_ref(c, key, str(err), digest=digest)
        return None
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:
        refusals.remember(key, digest, ctx, "its manifest is malformed", "damaged")
        drop_ref(c, key, f"its manifest is malformed ({type(err).__name__}: {str(err)[:200]})", digest=digest)
        return None


def part_bounds(manifest: Any) -> dict[str, int]:
    """``{digest: bytes}``: the size a (structurally checked) manifest records for each of its parts, the most a
    read of that part accepts (:meth:`cache_backends.base.Cache.get_blobs`)."""
    return {d: int(info["size"]) for d, info in manifest.blobs.items()}


def read_manifest_doc(cache: Cache, key: str, policy: Any, what: str, *,
                      max_bytes: int = MAX_MANIFEST_BYTES) -> tuple[str, Any] | None:
    """``(digest the ref names, the parsed manifest: any JSON)`` stored under ``key`` whose signature ``policy``
    accepts, or None on a miss:
    no ref (counted ``absent``), a manifest blob missing, corrupt or over ``max_bytes`` bytes (default
    :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES`: refused by the backend before it is allocated, counted
    ``over_limit``; the ref dropped, :func:`drop_ref`), a signature the policy refuses (counted ``untrusted``,
    the ref left alone), or a manifest this process refused before (:mod:`precompile.store.refusals`: not read
    again, nothing counted again).  The JSON is parsed with a depth bound (:func:`~precompile.artifact.manifest.load_json`).
    The first steps of every read of a cache entry (graph artifact, whole function, record); the caller checks the
    structure next.  ``what`` names the entry in messages (``"cache entry"``, ``"record"``...).

    Raises:
        ArtifactFormatError: the manifest blob is not JSON, or nested deeper than the JSON bound (the caller drops
            the ref).
        CacheError: the cache failed (the caller counts a miss and drops nothing).
    """
    from precompile.artifact import trust

    digest = cache.get_ref(key)
    if digest is MISS:
        metrics.note_miss("absent")
        return None
    ctx = refusals.context(cache, policy)
    earlier = refusals.recall(key, digest, ctx)
    if earlier is not None:  # refused before: the same bytes, refused again, without reading them again
        log.debug("%s %s in %s was refused earlier in this process (%s); a miss", what, key[:12], cache.url,
                  earlier[0])
        if earlier[1] is not None:
            metrics.note_miss(earlier[1])
        return None
    raw = cache.get_blob(digest, max_bytes)
    if raw is MISS:
        drop_ref(cache, key, f"its manifest blob is missing, corrupt or over {max_bytes} bytes", what, digest=digest)
        return None
    try:
        doc = load_json(raw)
    except ArtifactFormatError as err:
        refusals.remember(key, digest, ctx, str(err), "damaged")
        raise
    del raw
    verdict = policy.check(doc)
    if not verdict.ok:
        refusals.remember(key, digest, ctx, verdict.detail, "untrusted")
        safe_incr(cache, **trust.note_refused(verdict, f"{what} {key[:12]} in {cache.url}"))
        metrics.note_untrusted(verdict.status)
        return None
    return digest, doc


def drop_ref(cache: Cache, key: str, why: str, what: str = "cache entry", *, digest: str | None = None) -> None:
    """Drop the ref of a damaged entry (logged, counted as a ``damaged`` miss) so that the next writer replaces
    it; a cache that cannot delete leaves it (never raises), and the message says so: a read-only cache's entry
    stays a miss until a writer reads it (and drops it) or stores the key again.  With ``digest`` (the manifest
    digest found damaged), only a ref that still names it is deleted: a writer's newer ref stays, and so does a
    tiered cache's remote ref when the damage was in its local tier."""
    # corrupt blobs were already counted under ``errors`` by the backend that dropped them
    metrics.note_miss("damaged")
    unusable = f"{what} {key[:12]} in {cache.url} is unusable ({why})"
    try:
        cache.delete_ref(key, digest)
    except CacheReadOnlyError:
        log.warning("%s; a miss, left in place (read-only cache): a writer drops it when it reads it, or replaces "
                    "it when it stores this key", unusable)
    except CacheError as err:
        log.warning("%s; a miss, left in place: dropping it failed (%s)", unusable, err)
    else:
        log.warning("%s; dropping it so it is rebuilt", unusable)


def signed_for_store(cache: Cache, manifest: M, what: str) -> M | None:
    """``manifest`` signed with the signing key configured for ``cache`` (unchanged when there is none), or None
    when verify keys are configured and no signing key is: every reader here would refuse the unsigned entry
    (logged once).  The first step of every write (graph artifact, whole function, record); ``what`` names the
    entry in the message.

    Raises:
        TrustConfigError: a configured signing or verify key cannot be read.
    """
    from precompile.store.opening import open_with_policy

    policy = open_with_policy(cache)[1]
    manifest = policy.sign(manifest)  # type: ignore[arg-type]
    if policy.required and manifest.signature is None:
        warn_once(cache, f"not storing {what} {manifest.key[:12]} in {cache.url}: verify keys are configured and no "
                         "signing key (PRECOMPILE_SIGNING_KEY), so it would be refused as unsigned; builders sign",
                  kind="store unsigned")
        return None
    return manifest


def read_failed(cache: Cache, what: str, key: str, err: Exception) -> None:
    """A read of ``what`` ``key`` failed in the cache (``err``): a miss, logged once per cache and kind of error,
    counted under ``errors``; nothing is dropped."""
    warn_once(cache, f"cache {cache.url} failed while reading {what} {key[:12]}: {err}; treating it as a miss",
              kind=f"read {type(err).__name__}")
    safe_incr(cache, errors=1)
    metrics.note_miss("cache_error")


def write_failed(cache: Cache, what: str, key: str, err: Exception) -> None:
    """A write of ``what`` ``key`` failed (``err``): logged once per cache and kind of error, counted under
    ``errors``, never raised."""
    warn_once(cache, f"could not store {what} {key[:12]} in {cache.url}: {err}", kind=f"store {type(err).__name__}")
    safe_incr(cache, errors=1)


def refused_unsafe(cache: Cache, what: str, key: str, err: Exception) -> None:
    """An entry naming a path or import that fails :mod:`precompile.artifact.names` (planted or garbled): never
    used, logged, counted with the refused entries (``untrusted``, ``untrusted_unsafe_path``)."""
    log.warning("refusing %s %s in %s: %s; nothing of it was run", what, key[:12], cache.url, err)
    safe_incr(cache, untrusted=1, untrusted_unsafe_path=1)
    metrics.note_untrusted("unsafe_path")


def store(cache: Cache, art: Artifact) -> bool:
    """Write every blob of ``art``, then its manifest, then its ref (so no reader sees a partial artifact).

    With a signing key (``PRECOMPILE_SIGNING_KEY`` or the URL's ``signing_key=``) an unsigned manifest is signed
    first, and ``art.manifest`` becomes the signed one.  With verify keys and no signing key (a serving worker
    that built for itself) nothing is stored: every reader here would refuse the unsigned entry.

    Returns:
        True if stored; False if the cache refused (read-only, unavailable): logged once, counted, never
        raised.

    Raises:
        TrustConfigError: the configured signing key cannot be read.
    """
    signed = signed_for_store(cache, art.manifest, "artifact")
    if signed is None:
        return False
    art.manifest = signed
    try:
        # put_blob of a blob already there writes nothing but refreshes it, so a concurrent eviction's grace
        # period protects it until the ref below lands
        for digest, data in art.all_blobs().items():
            cache.put_blob(data, digest)
        cache.set_ref(art.key, cache.put_blob(art.manifest.to_json()))
        return True
    except (CacheError, ArtifactNotFoundError) as err:
        write_failed(cache, "artifact", art.key, err)
        return False


