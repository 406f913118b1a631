"""One entry store: every kind of cache entry (graph artifact, whole function, record) is read and written here.

An entry is a ref (its key) naming a manifest blob (JSON, signed where keys are configured) that names its parts
by digest.  :func:`read_entry` reads one, in the same order and under the same policy for every kind:

1. the ref (none: a miss counted ``absent``);
2. a ref this process refused before for the manifest it names is a miss without reading anything more
   (:mod:`precompile.store.refusals`);
3. the manifest, bounded before it is allocated (missing, corrupt or over the bound: a miss, the ref dropped);
4. its JSON (depth-bounded), then its signature under the call's policy (:class:`~precompile.manifest.trust.Policy`:
   refused, it is a miss counted under ``untrusted`` and ``untrusted_<reason>``, logged, its ref left alone);
5. its structure (the kind's :attr:`Kind.parse`), then whatever the kind checks and reads next (the caller's
   ``finish``: the key it names, host code, its parts).

What a manifest's bytes decide (a bad signature, a form that does not parse, another key, host code) is remembered,
so that a worker polling for another's build refuses a planted entry once.  A damaged entry is a miss and its ref is
dropped, so that the next build replaces it; a cache failure is a miss, logged once, counted under ``errors``, and
drops nothing.  Nothing read is run here.  :func:`write_entry` signs a manifest (or refuses to store it unsigned
where every reader would refuse it) and writes its parts, then the manifest, then the ref, so that no reader sees a
partial entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cache_backends.base import MISS, Cache
from cache_backends.bounded import MAX_MANIFEST_BYTES
from precompile import metrics
from precompile.manifest.manifest import ManifestJSON, load_json
from precompile.errors import (ArtifactFormatError, ArtifactNotFoundError, CacheError, CacheReadOnlyError, ConfigError,
                               UnsafePathError)
from precompile.metrics import safe_incr, warn_once
from precompile.store import refusals

if TYPE_CHECKING:  # pragma: no cover
    from precompile.manifest.trust import Policy

log = logging.getLogger("precompile")

#: A manifest of any of the three kinds.
M = TypeVar("M", bound=ManifestJSON)
T = TypeVar("T")

#: What a manifest of a shape the checks let through raises when it is used: "malformed".
MALFORMED = (KeyError, TypeError, AttributeError, ValueError, IndexError)


@dataclass(frozen=True)
class Kind(Generic[M]):
    """One kind of entry.

    Attributes:
        what: names an entry in messages about it (``"cache entry"``, ``"function artifact"``, ``"record"``).
        noun: names it in messages about a failed read or write (``"artifact"``...).
        parse: the manifest from its parsed JSON (any JSON value).  Raises :class:`ArtifactFormatError`
            (:class:`UnsafePathError` for a name that would be an unsafe path or import) when it is not one.
        max_bytes: the most a read of its manifest accepts, bytes.
        keep_unparsed: a manifest that is not JSON or does not parse is a read failure (counted under ``errors``,
            nothing dropped) rather than a damaged entry: an entry of a newer schema is left to the precompile that
            wrote it.
    """

    what: str
    noun: str
    parse: Callable[[Any], M]
    max_bytes: int = MAX_MANIFEST_BYTES
    keep_unparsed: bool = False


class Refused(Exception):
    """Raised by a ``finish``: the entry is a miss for what its manifest's bytes hold, remembered
    (:mod:`precompile.store.refusals`) and noted as miss reason ``reason``; its ref is dropped when ``drop`` (the
    reason logged) is given."""

    def __init__(self, why: str, reason: str, drop: str | None = None):
        super().__init__(why)
        self.why, self.reason, self.drop = why, reason, drop


class HostCode(Refused):
    """Raised by a ``finish``: the entry carries host code (``detail`` says which) and
    ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` is set: a miss, logged, counted under ``host_code_refused``, remembered."""

    def __init__(self, detail: str):
        super().__init__("it carries host code", "host_code")
        self.detail = detail


class Damaged(Exception):
    """Raised by a ``finish``: a part is missing or corrupt, or the entry is not what the caller asked for (the
    message says why): a miss, its ref dropped, not remembered (a part can come back)."""


def check_key(manifest: Any, key: str) -> None:
    """Raise :class:`Refused` (the ref dropped) unless ``manifest`` names ``key``, the key its ref is stored under."""
    if manifest.key != key:
        raise Refused("its manifest names another key", "damaged", f"its manifest names another key {manifest.key[:12]}")


@dataclass
class Entry(Generic[M]):
    """A verified entry: ``manifest`` (of its kind) and ``digest``, the manifest blob's (what its ref names)."""

    manifest: M
    digest: str


def read_entry(cache: Cache, key: str, kind: Kind[M], policy: Policy,
               finish: Callable[[Entry[M]], T]) -> T | None:
    """``finish(entry)`` for the entry stored under ``key`` whose manifest ``policy`` accepts, or None on a miss (see
    the module docstring).  ``finish`` checks and reads what the kind needs next; it may raise :class:`Refused`,
    :class:`HostCode` or :class:`Damaged`, and its :class:`ArtifactFormatError` drops the ref (an
    :class:`UnsafePathError` is refused as untrusted), as does an error of a manifest's unexpected shape
    (:data:`MALFORMED`).

    Raises:
        TrustConfigError / ConfigError: a key setting read on the way cannot be read.
        whatever ``finish`` raises besides those (e.g. EnvironmentMismatchError); cache failures never propagate.
    """
    ctx = refusals.context(cache, policy)
    digest: str | None = None
    parsed = False
    try:
        digest = cache.get_ref(key)
        if digest is MISS:
            metrics.note_miss("absent")
            return None
        earlier = refusals.recall(key, digest, ctx)
        if earlier is not None:  # refused before: the same bytes, refused again, without reading them again
            log.debug("%s %s in %s was refused earlier in this process (%s); a miss", kind.what, key[:12], cache.url,
                      earlier[0])
            if earlier[1] is not None:
                metrics.note_miss(earlier[1])
            return None
        raw = cache.get_blob(digest, kind.max_bytes)
        if raw is MISS:
            drop_ref(cache, key, f"its manifest blob is missing, corrupt or over {kind.max_bytes} bytes", kind.what,
                     digest=digest)
            return None
        doc = load_json(raw)
        del raw
        verdict = policy.check(doc)
        if not verdict.ok:
            from precompile.manifest import trust

            refusals.remember(key, digest, ctx, verdict.detail, "untrusted")
            safe_incr(cache, **trust.note_refused(verdict, f"{kind.what} {key[:12]} in {cache.url}"))
            metrics.note_untrusted(verdict.status)
            return None
        manifest = kind.parse(doc)
        del doc
        parsed = True
        return finish(Entry(manifest, digest))
    except HostCode as err:
        refusals.remember(key, digest, ctx, err.why, err.reason)
        log.info("%s %s carries host code (%s) and PRECOMPILE_REQUIRE_NO_HOST_CODE is set: a miss", kind.what,
                 key[:12], err.detail)
        safe_incr(cache, host_code_refused=1)
        metrics.note_miss("host_code")
    except Refused as err:
        refusals.remember(key, digest, ctx, err.why, err.reason)
        if err.drop is not None:
            drop_ref(cache, key, err.drop, kind.what, digest=digest)
    except Damaged as err:
        drop_ref(cache, key, str(err), kind.what, digest=digest)
    except UnsafePathError as err:  # planted or garbled: never used, counted with the refused entries
        refusals.remember(key, digest, ctx, str(err), "untrusted")
        refused_unsafe(cache, kind.what, key, err)
    except CacheError as err:  # an outage: nothing is remembered
        read_failed(cache, kind.noun, key, err)
    except ArtifactFormatError as err:
        refusals.remember(key, digest, ctx, str(err), "damaged")
        if kind.keep_unparsed and not parsed:
            read_failed(cache, kind.noun, key, err)
        else:
            drop_ref(cache, key, str(err), kind.what, digest=digest)
    except ConfigError:  # a key setting of this process (a ValueError too): never the entry's fault
        raise
    except MALFORMED as err:  # a shape the checks let through
        refusals.remember(key, digest, ctx, "its manifest is malformed", "damaged")
        drop_ref(cache, key, f"its manifest is malformed ({type(err).__name__}: {str(err)[:200]})", kind.what,
                 digest=digest)
    return None


def write_entry(cache: Cache, manifest: M, kind: Kind[M], *, policy: Policy | None = None,
                parts: Callable[[M], Mapping[str, bytes]] | None = None,
                before: Callable[[M], bool] | None = None, max_bytes: int | None = None) -> tuple[M, str] | None:
    """Store ``manifest`` under its key: signed with the policy's signing key (unchanged without one), its parts,
    then the manifest blob, then the ref.

    Args:
        policy: the call's trust policy (default: ``cache``'s, :func:`precompile.store.opening.open_with_policy`).
        parts: ``{digest: bytes}`` of the parts to write first, from the signed manifest.
        before: called with the signed manifest before anything is written; False writes nothing (returns None).
        max_bytes: the most the stored manifest may be (what a read accepts), bytes.

    Returns:
        ``(the signed manifest, its blob's digest)``; None when nothing was stored: verify keys are configured and
        no signing key (every reader here would refuse the unsigned entry; logged once), ``before`` said no, or the
        cache refused (read-only, unavailable: logged once, counted under ``errors``, never raised).

    Raises:
        TrustConfigError: a configured signing or verify key cannot be read.
        ValueError: the manifest holds a value JSON cannot carry, or is over ``max_bytes``.
    """
    if policy is None:
        from precompile.store.opening import open_with_policy

        policy = open_with_policy(cache)[1]
    signed = policy.sign(manifest)  # type: ignore[arg-type]
    if policy.required and signed.signature is None:
        warn_once(cache, f"not storing {kind.noun} {manifest.key[:12]} in {cache.url}: verify keys are configured and "
                         "no signing key (PRECOMPILE_SIGNING_KEY), so it would be refused as unsigned; builders sign",
                  kind="store unsigned")
        return None
    raw = signed.to_json()
    if max_bytes is not None and len(raw) > max_bytes:
        raise ValueError(f"the {kind.noun}'s manifest is {len(raw)} bytes, over {max_bytes}")
    try:
        if before is not None and not before(signed):
            return None
        # put_blob of a blob already there writes nothing but refreshes it, so a concurrent eviction's grace
        # period protects it until the ref below lands
        for digest, data in (parts(signed) if parts is not None else {}).items():
            cache.put_blob(data, digest)
        digest = cache.put_blob(raw)
        cache.set_ref(signed.key, digest)
        return signed, digest
    except (CacheError, ArtifactNotFoundError) as err:
        write_failed(cache, kind.noun, signed.key, err)
        return None


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
    """An entry naming a path or import that fails :mod:`precompile.manifest.names` (planted or garbled): never
    used, logged, counted with the refused entries (``untrusted``, ``untrusted_unsafe_path``)."""
    log.warning("refusing %s %s in %s: %s; nothing of it was run", what, key[:12], cache.url, err)
    safe_incr(cache, untrusted=1, untrusted_unsafe_path=1)
    metrics.note_untrusted("unsafe_path")
