"""Opening a cache for precompile: a URL's trust options read once, the backend opened, the call's trust policy.

:mod:`cache_backends` opens URLs and knows nothing of signatures.  A precompile cache URL may carry, on any tier,
two options of its own (:mod:`precompile.manifest.trust`): ``verify_keys=`` (comma-separated ``ed25519:<hex>``
public keys or key files) and ``signing_key=`` (a private key's path).  This module is the one place that reads
them: :func:`parse` splits them off each tier (and checks the keys they name), the rest of the URL goes to
:func:`cache_backends.registry.open_cache`, and the options are remembered for the cache opened, so that a call
handed that cache later resolves the same policy (:func:`open_with_policy`).  A tiered cache uses its tiers' keys
together (the near tier's signing key first) and gets the signature check as its backfill hook
(:attr:`cache_backends.tiered.TieredCache.refuses`).  The cache's printed URL (``cache.url``) keeps each tier's
trust options, so that it opens the same cache, with the same keys, again.

No URL given means ``$PRECOMPILE_CACHE`` (read through :mod:`precompile.config`), else the local default; an error
in a URL taken from the environment names ``PRECOMPILE_CACHE``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cache_backends.base import Cache
from cache_backends.redaction import redact_url, redacting
from precompile import config
from precompile.errors import CacheURLError, TrustConfigError

if TYPE_CHECKING:  # pragma: no cover
    from precompile.manifest.trust import Policy

__all__ = ["TRUST_OPTIONS", "Target", "open_cache", "open_with_policy", "parse", "policy_for", "refused_by_trust"]

#: Query options of any cache URL that are precompile's, not the backend's: keys of signed artifacts.
TRUST_OPTIONS = ("verify_keys", "signing_key")

#: The trust options of each cache opened here (its tiers' together for a tiered cache): ``(verify keys, signer)``.
_opened: weakref.WeakKeyDictionary[Cache, tuple[tuple[str, ...], str | None]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Target:
    """A cache named for one call, its URL read once.

    Attributes:
        spec: what :func:`cache_backends.registry.open_cache` opens: the URL (or two) without the trust options, or
            an open cache.
        tiers: each tier's trust options as given (``{option: text}``; one per tier, empty for an open cache).
        verify_keys: every tier's ``verify_keys=`` entries, near tier first.
        signing_key: the near tier's ``signing_key=``, else the far tier's, else None.
        from_env: the URL is ``$PRECOMPILE_CACHE``'s.
    """

    spec: str | Sequence[str] | Cache
    tiers: tuple[dict[str, str], ...] = ()
    verify_keys: tuple[str, ...] = ()
    signing_key: str | None = None
    from_env: bool = False

    def policy(self) -> Policy:
        """The call's trust policy: the environment's settings plus this cache's keys
        (:func:`precompile.manifest.trust.resolve`).

        Raises:
            TrustConfigError: a key setting cannot be read or names no key.
            ConfigError: ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` holds a value precompile does not accept.
        """
        from precompile.manifest import trust

        return trust.resolve(self.verify_keys, self.signing_key)

    def open(self, create: bool = True) -> Cache:
        """The cache (opened now, unless it was handed in open), its trust options remembered and shown in its URL.

        Raises:
            CacheURLError: as :func:`cache_backends.registry.open_cache` (naming ``PRECOMPILE_CACHE`` where the URL
                came from it).
            CacheUnavailableError: as :func:`cache_backends.registry.open_cache`.
        """
        from cache_backends.registry import open_cache as open_backend
        from cache_backends.tiered import TieredCache

        if isinstance(self.spec, Cache):
            cache = self.spec
        else:
            try:
                cache = open_backend(self.spec, create=create)
            except CacheURLError as err:
                if self.from_env:
                    raise CacheURLError(f"PRECOMPILE_CACHE: {err}") from err
                raise
            tiers = [cache.local, cache.remote] if isinstance(cache, TieredCache) else [cache]
            for tier, options in zip(tiers, self.tiers):
                if options:
                    tier.url += ("&" if "?" in tier.url else "?") + urlencode(options)
                    _opened[tier] = _keys([options])
            if isinstance(cache, TieredCache):
                cache.url = f"{cache.local.url}|{cache.remote.url}"
            _opened[cache] = (self.verify_keys, self.signing_key)
        if isinstance(cache, TieredCache) and cache.refuses is None:
            cache.refuses = refused_by_trust
        return cache


def parse(url: str | Cache | Sequence[str] | None = None) -> Target:
    """Read a cache URL's trust options once: nothing is opened, no server contacted, no directory made.

    Args:
        url: a cache URL, two joined by ``|`` or in a list (as :func:`cache_backends.registry.open_cache` takes),
            an open cache (its options are those it was opened with here, none if it was opened elsewhere), or None
            for ``$PRECOMPILE_CACHE``, else the local default (``$XDG_CACHE_HOME/precompile``).

    Raises:
        CacheURLError: ``url`` is not a string or a list, a query is malformed, or a trust option is given twice in
            one tier.
        TrustConfigError: a trust option names a key that cannot be read, or names none (``verify_keys=``,
            ``verify_keys=,``, ``signing_key=``, a key file that is empty): a key option never turns checking off.
    """
    if isinstance(url, Cache):
        keys, signer = _opened.get(url, ((), None))
        return Target(url, (), keys, signer)
    from_env = False
    if url is None:
        env = config.cache_url_from_env()
        from_env = env is not None
        url = env or config.default_cache_url()
    try:
        with redacting(url):  # a key's error quoting the option's raw text too
            split = _split_all(url)
    except (CacheURLError, TrustConfigError) as err:
        if from_env:
            raise type(err)(f"PRECOMPILE_CACHE: {err}") from err
        raise
    tiers = tuple(options for _, options in split)
    keys, signer = _keys(tiers)
    spec: str | list[str] = "|".join(t for t, _ in split) if isinstance(url, str) else [t for t, _ in split]
    return Target(spec if any(tiers) else url, tiers, keys, signer, from_env)


def open_with_policy(url: str | Cache | Sequence[str] | None = None, *,
                     create: bool = True) -> tuple[Cache, Policy]:
    """The cache ``url`` names (see :func:`parse`), opened, and the trust policy of a call that works with it: the
    environment's settings plus its URL's keys (every tier's).  Its URL is read once.

    Args:
        create: False for commands that read or tidy a cache (nothing is created; see
            :func:`cache_backends.registry.open_cache`).

    Raises:
        CacheURLError: the URL is malformed, relative, names a scheme no backend handles, or has a bad option.
        TrustConfigError: a key setting (the URL's or the environment's) cannot be read or names no key.
        ConfigError: ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` holds a value precompile does not accept.
        CacheUnavailableError: ``create`` is False and a local cache directory does not exist; or a Redis Cluster
            cannot be reached to be opened.
    """
    target = parse(url)
    cache = target.open(create)
    return cache, target.policy()


def open_cache(url: str | Cache | Sequence[str] | None = None, *, create: bool = True) -> Cache:
    """``precompile.open_cache``: the cache ``url`` names, opened (see :func:`parse` for ``url``), its trust options
    remembered for every later call handed it.  The environment's key settings are read when a call uses it.

    Raises:
        CacheURLError / TrustConfigError / CacheUnavailableError: as :func:`open_with_policy` (a URL's keys only).
    """
    return parse(url).open(create)


def policy_for(url: str | Cache | Sequence[str] | None = None) -> Policy:
    """The trust policy of one call that holds ``url`` (see :func:`parse`) without opening it, whatever path the call
    then takes (a file, an unpacked directory, a bundle, a cache entry).

    Raises:
        CacheURLError / TrustConfigError / ConfigError: as :func:`open_with_policy`.
    """
    return parse(url).policy()


def refused_by_trust(cache: Cache, manifest: bytes) -> bool:
    """Whether the policy of ``cache`` (its URL's keys and ``PRECOMPILE_VERIFY_KEYS``) refuses a stored manifest:
    True only when a verify key is configured and the manifest's signature does not check under it (it is parsed
    only then).  The hook a tiered cache calls before it backfills a remote entry
    (:attr:`cache_backends.tiered.TieredCache.refuses`).

    Raises:
        TrustConfigError: a configured key cannot be read.
        ValueError: a key is configured and ``manifest`` is not JSON, or is over the manifest cap or the JSON depth
            bound (``InputLimitError``).
    """
    from cache_backends.bounded import MAX_MANIFEST_BYTES, loads_json

    policy = parse(cache).policy()
    return policy.required and not policy.check(loads_json(manifest, MAX_MANIFEST_BYTES, "manifest")).ok


def _split_all(url: str | Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """:func:`_split` of each tier of ``url`` (two joined by ``|``, or a list; a tier that is not a string is left
    to the backend's opener, which refuses it).

    Raises:
        CacheURLError: ``url`` is not a string or a list; or as :func:`_split`.
        TrustConfigError: as :func:`_split`.
    """
    if isinstance(url, str):
        return [_split(t) for t in url.split("|")]
    if isinstance(url, (list, tuple)):
        return [_split(t) if isinstance(t, str) else (t, {}) for t in url]
    raise CacheURLError(f"a cache URL must be a non-empty string such as 'file:///var/cache/precompile', "
                        f"got {redact_url(url)!r}")


def _keys(tiers: Sequence[dict[str, str]]) -> tuple[tuple[str, ...], str | None]:
    """``(verify keys, signing key)`` of the tiers' options together: every tier's keys, the first signer."""
    keys = tuple(k.strip() for options in tiers for k in options.get("verify_keys", "").split(",") if k.strip())
    signers = [options["signing_key"].strip() for options in tiers if options.get("signing_key", "").strip()]
    return keys, signers[0] if signers else None


def _split(url: str) -> tuple[str, dict[str, str]]:
    """``(url without the trust options, {option: value})`` of one tier; the keys are read now, so a bad one fails
    here.

    Raises:
        CacheURLError: the query is malformed or an option is given twice.
        TrustConfigError: an option names a key that cannot be read, or names none.
    """
    try:
        parts = urlsplit(url)
    except ValueError as err:  # "Invalid IPv6 URL"
        raise CacheURLError(f"malformed cache URL {redact_url(url)!r}: {err}") from None
    if not any(name in parts.query for name in TRUST_OPTIONS):
        return url, {}
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError as err:
        raise CacheURLError(f"malformed query in cache URL {redact_url(url)!r}: {err}") from err
    options: dict[str, str] = {}
    for name, value in query:
        if name in TRUST_OPTIONS:
            if name in options:
                raise CacheURLError(f"option {name!r} given twice in cache URL {redact_url(url)!r}")
            options[name] = value
    from precompile.manifest import trust

    # named in errors without its secrets; a bare path as the file:// URL it stands for
    where = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    where = redact_url(where if "://" in url else "file://" + where.strip())
    if "verify_keys" in options:
        trust.parse_verify_keys(options["verify_keys"], f"verify_keys= of cache URL {where}")
    if "signing_key" in options:
        try:
            trust.load_signing_key(options["signing_key"])
        except TrustConfigError as err:
            raise TrustConfigError(f"signing_key= of cache URL {where}: {err}") from err
    rest = urlencode([(n, v) for n, v in query if n not in TRUST_OPTIONS])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), options
