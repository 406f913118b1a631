"""Graph artifacts in a cache: read verified (a damaged entry is a miss and is dropped), written blobs-then-ref,
through the one entry store (:mod:`precompile.store.entries`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from cache_backends.base import MISS, Cache
from precompile.manifest.manifest import Manifest
from precompile.errors import CacheError
from precompile.loader.engine import graph_part_bounds, start_primer
from precompile.store import entries

if TYPE_CHECKING:  # pragma: no cover
    from precompile.manifest import trust
    from precompile.loader.artifact import Artifact

log = logging.getLogger("precompile")

#: Graph artifacts: a manifest of a schema this precompile does not read is left to the one that wrote it.
GRAPH = entries.Kind("cache entry", "artifact", Manifest.from_dict, keep_unparsed=True)


def load_from_cache(key: str, cache: str | Cache | None, *, bound: dict[int, torch.Tensor] | None = None,
                    check_env: bool = True, policy: trust.Policy | None = None) -> Artifact | None:
    """The artifact stored under ``key``, or None on a miss.

    Reads the entry through :func:`precompile.store.entries.read_entry` (the ref; the manifest, at most
    :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES`; its signature where verify keys are configured: an unsigned
    or badly signed entry is a miss, logged and counted under ``untrusted`` and ``untrusted_<reason>``, its ref left
    alone; its structure and every name in it, :mod:`precompile.manifest.names`), then reads the blobs a load needs
    (engine payload, binaries; under ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` only the wrapper graph and its launch blobs,
    each within the graph engine's own bound: :func:`~precompile.loader.engine.graph_part_bounds`), all verified by
    the backend and none larger than the manifest records, and checks that the other parts exist (they are read,
    verified and bounded the same way, when used).  Nothing read is run here.  A ref whose manifest or blobs are
    verified missing or corrupt is a miss: the ref is dropped so the next build replaces it.  Cache failures (a
    server down or stalled) are misses too, logged once, counted under ``errors``, and never drop anything.
    ``policy`` is the call's trust policy when the caller resolved it already; by default ``cache``'s
    (:func:`precompile.store.opening.open_with_policy`).  An entry refused for what its manifest holds (its
    signature, its form, host code) is remembered, and a later lookup of the same ref is a miss without reading it
    again (:mod:`precompile.store.refusals`).

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
    no_host_code = policy.no_host_code

    def finish(entry: entries.Entry[Manifest]) -> Artifact:
        manifest = entry.manifest
        entries.check_key(manifest, key)
        if no_host_code and not manifest.parts.get("wrapper_graph"):
            raise entries.HostCode(manifest.build.get("host_code") or "a Python wrapper")
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
            raise entries.Damaged(f"{len(lost)} of its parts are missing or corrupt")
        from precompile.key.fingerprint import check_environment
        from precompile.loader.artifact import Artifact

        if check_env:
            check_environment(manifest)

        def reader(digests: list[str]) -> dict[str, bytes]:
            try:
                found = c.get_blobs(digests, sizes)
            except CacheError as err:  # the part is then "not available": ArtifactNotFoundError from Artifact.blob
                log.warning("could not read %d part(s) of artifact %s from %s: %s", len(digests), key[:12], c.url,
                            err)
                return {}
            return {d: v for d, v in found.items() if v is not MISS}

        # a manifest whose digests check but whose specs or guards do not parse: ArtifactFormatError, dropped
        art = Artifact(manifest, got, bound=bound, source="cache", blob_reader=reader, cache=c)
        art.primer = primer
        art.no_host_code = no_host_code
        return art

    return entries.read_entry(c, key, GRAPH, policy, finish)


def part_bounds(manifest: Any) -> dict[str, int]:
    """``{digest: bytes}``: the size a (structurally checked) manifest records for each of its parts, the most a
    read of that part accepts (:meth:`cache_backends.base.Cache.get_blobs`)."""
    return {d: int(info["size"]) for d, info in manifest.blobs.items()}


def store(cache: Cache, art: Artifact) -> bool:
    """Write every blob of ``art``, then its manifest, then its ref (so no reader sees a partial artifact), through
    :func:`precompile.store.entries.write_entry`.

    With a signing key (``PRECOMPILE_SIGNING_KEY`` or the URL's ``signing_key=``) an unsigned manifest is signed
    first, and ``art.manifest`` becomes the signed one.  With verify keys and no signing key (a serving worker
    that built for itself) nothing is stored: every reader here would refuse the unsigned entry.

    Returns:
        True if stored; False if the cache refused (read-only, unavailable): logged once, counted, never
        raised.

    Raises:
        TrustConfigError: the configured signing key cannot be read.
    """

    def parts(signed: Manifest) -> dict[str, bytes]:
        art.manifest = signed
        return art.all_blobs()

    return entries.write_entry(cache, art.manifest, GRAPH, parts=parts) is not None
