"""Loading an artifact: from a ``.pc`` file, an unpacked directory, or a cache by key or unique key prefix.

A file or directory is read and every part checked against its digest (:mod:`precompile.manifest.formats`), its
manifest's signature checked where verify keys are configured (:mod:`precompile.manifest.trust`), and its environment
fingerprint compared with this process's; a key goes through :func:`precompile.store.cache_io.load_from_cache`.
The cache URL is read once (:func:`precompile.store.opening.parse`): its keys judge a path too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cache_backends.base import Cache
from precompile import metrics
from precompile.manifest.manifest import Manifest
from precompile.errors import ArtifactFormatError, ArtifactNotFoundError
from precompile.key.fingerprint import check_environment
from precompile.loader.artifact import Artifact
from precompile.store.lookup import is_key_prefix, resolve_key

if TYPE_CHECKING:  # pragma: no cover
    from precompile.manifest.trust import Policy


def load(path_or_key: str | os.PathLike[str], *, cache: str | Cache | None = None,
         weights: Mapping[str, torch.Tensor] | torch.nn.Module | None = None, warmup: bool = False) -> Artifact:
    """Load an artifact from a file, an unpacked directory, or a cache by key.

    Args:
        path_or_key: a path written by :meth:`Artifact.save` (format detected), or an artifact key (64 hex
            characters) or a unique key prefix (6 or more), as the command line takes, to look up in ``cache``.
        cache: cache URL or open cache for a key (default: ``$PRECOMPILE_CACHE`` / the local default).  Its
            ``verify_keys=`` and ``signing_key=`` apply to a path as well (the URL is then not opened).
        weights: optional weights to :meth:`Artifact.bind` (a module or ``{fqn: tensor}``).
        warmup: run :meth:`Artifact.warmup` before returning (counted in ``load_seconds``), so that the first
            real call costs about as much as any other.

    Returns:
        the artifact; its engine is built on the first call.

    Raises:
        ArtifactNotFoundError: no such file/directory, or the cache has no (intact) artifact for the key, or no
            key starts with the prefix (or the cache cannot be listed to find it).
        AmbiguousKeyError: several keys start with the prefix (the message lists them).
        CacheURLError: ``cache`` is not a valid cache URL (its trust options are read for a path too).
        ArtifactFormatError: the file is not a precompile artifact, is truncated, or a part fails its digest; or
            its manifest or a part is larger than its bound (:mod:`cache_backends.bounded`: the manifest cap, the
            size the manifest records), then chained to an :class:`~precompile.errors.InputLimitError`.
        NotRegularFileError: the path, or a file of an unpacked directory, is a FIFO, a device or a socket: refused
            without reading it (opening never blocks).
        UnsafePathError: (an ArtifactFormatError) a name in the manifest or ``index.json`` would be an unsafe path.
        UntrustedArtifactError: verify keys are configured (``PRECOMPILE_VERIFY_KEYS``, or ``verify_keys=`` of
            ``cache``'s URL, which protects a file or directory as it protects the cache) and the manifest is not
            signed by one of them; or ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` is set and the artifact carries host code.
        EnvironmentMismatchError: the artifact was built for another torch/CPU ISA/GPU.
        TrustConfigError: (a ConfigError) a configured key cannot be read, or a key setting names no key.
    """
    from precompile.store.opening import parse

    start = time.perf_counter()
    text = os.fspath(path_or_key)
    p = Path(text)
    # one policy for the whole call, whichever path it takes: keys in the cache URL protect a file too
    target = parse(cache)  # the URL read once: its keys now, the cache opened only for a key
    policy = target.policy()  # and a wrong key setting fails before anything is read
    if p.exists():
        art = _load_path(p, policy)
    elif is_key_prefix(text):
        from precompile.errors import CacheError
        from precompile.store.cache_io import load_from_cache

        c = target.open()
        try:
            key = resolve_key(c, text)
        except CacheError as err:
            raise ArtifactNotFoundError(f"cannot look key prefix {text!r} up in {c.url}: {err}") from err
        art = load_from_cache(key, c, policy=policy)
        if art is None:
            raise ArtifactNotFoundError(f"no intact artifact with key {key} in cache {c.url}")
    else:
        raise ArtifactNotFoundError(f"{text!r} is neither an existing artifact path nor an artifact key (64 hex "
                                    "characters) or key prefix (6 or more)")
    if weights is not None:
        art.bind(weights)
    art.engine  # build the callable now: load errors surface here, and load_seconds is the whole load
    if warmup:
        art.warmup()
    art.load_seconds = time.perf_counter() - start
    metrics.record_load(art, art.load_seconds)
    return art


def _load_path(p: Path, policy: Policy) -> Artifact:
    """The artifact saved at ``p`` (a ``.pc`` file or an unpacked directory), checked under ``policy`` before any
    part of it is read."""
    from precompile.manifest import formats, trust
    from precompile.errors import UntrustedArtifactError

    def refuse_untrusted(manifest: Manifest) -> None:  # before any part of the file is read
        verdict = policy.check(manifest.to_dict())
        if not verdict.ok:
            trust.note_refused(verdict, f"artifact {p}")
            metrics.count_untrusted(verdict.status)
            raise UntrustedArtifactError(f"artifact {p} is refused: {verdict.detail}; nothing of it was run. Load "
                                         "artifacts signed by a configured verify key (PRECOMPILE_VERIFY_KEYS or "
                                         "verify_keys= of the cache URL)", verdict.status, verdict.key_id)

    read = formats.read_unpacked if p.is_dir() else formats.read_binary
    manifest, blobs = read(p, refuse_untrusted)
    check_environment(manifest)
    try:
        art = Artifact(manifest, blobs, source=str(p))
        art.no_host_code = policy.no_host_code
        return art
    except ArtifactFormatError as err:
        raise ArtifactFormatError(f"artifact {p} has a manifest that does not load: {err}") from err
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:  # a shape the checks let through
        raise ArtifactFormatError(f"artifact {p} has a malformed manifest ({type(err).__name__}: "
                                  f"{str(err)[:200]})") from err
