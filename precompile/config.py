"""Every environment variable and default precompile reads, in one place.

Values are read when a function here is called (not at import), so tests and tools can point them at a
temporary directory by setting the environment before the call.

| variable | meaning | default |
|---|---|---|
| ``PRECOMPILE_CACHE`` | cache URL used when none is given | ``file://$XDG_CACHE_HOME/precompile`` |
| ``XDG_CACHE_HOME`` | base of the default local cache | ``~/.cache`` |
| ``PRECOMPILE_CACHE_MAX_BYTES`` | size cap of a local cache, bytes (LRU eviction above it) | 20 GiB |
| ``PRECOMPILE_LOG`` | log level of the ``precompile`` logger (``INFO``, ``DEBUG``...) | unset: inherit |
| ``PRECOMPILE_ENGINE`` | ``auto`` (fast path where the artifact offers one) or ``portable`` (always rebuild through Inductor's cache entries) | ``auto`` |
| ``PRECOMPILE_SIGNING_KEY`` | builders: path of the Ed25519 private key (PEM) every stored or saved manifest is signed with; its public key is trusted too | unset: nothing signed |
| ``PRECOMPILE_VERIFY_KEYS`` | serving workers: comma-separated Ed25519 public keys (``ed25519:<64 hex>``, or files of them / PEM); set, only artifacts signed by one of them load | unset: nothing checked |

The keys are parsed once per distinct value (:mod:`precompile.trust`); a cache URL may add its own
(``verify_keys=``, ``signing_key=``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Version of the artifact format (manifest schema, container layout).  Part of every artifact key.
FORMAT_VERSION = 2

#: Default size cap of a local cache directory, in bytes.
DEFAULT_LOCAL_MAX_BYTES = 20 * 1024**3


def default_cache_dir() -> Path:
    """The embedded default cache directory: ``$XDG_CACHE_HOME/precompile``, else ``~/.cache/precompile``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "precompile"


def default_cache_url() -> str:
    """``$PRECOMPILE_CACHE`` if set and non-empty, else ``file://`` + :func:`default_cache_dir`."""
    url = os.environ.get("PRECOMPILE_CACHE", "").strip()
    return url or "file://" + str(default_cache_dir())


def local_max_bytes() -> int:
    """Size cap of a local cache in bytes, from ``PRECOMPILE_CACHE_MAX_BYTES`` (default 20 GiB).

    Raises:
        ValueError: the variable is set but is not a positive integer.
    """
    raw = os.environ.get("PRECOMPILE_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_LOCAL_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise ValueError(f"PRECOMPILE_CACHE_MAX_BYTES must be a positive integer number of bytes, got {raw!r}")
    return value


def log_level() -> str | None:
    """Level name from ``PRECOMPILE_LOG``, or None when unset."""
    return os.environ.get("PRECOMPILE_LOG") or None


def engine_mode() -> str:
    """``"auto"`` or ``"portable"`` from ``PRECOMPILE_ENGINE``.

    Raises:
        ValueError: the variable holds another value.
    """
    mode = (os.environ.get("PRECOMPILE_ENGINE") or "auto").strip().lower()
    if mode not in ("auto", "portable"):
        raise ValueError(f"PRECOMPILE_ENGINE must be 'auto' or 'portable', got {mode!r}")
    return mode


def signing_key_path() -> str | None:
    """Path of the Ed25519 private key (PEM) manifests are signed with, from ``PRECOMPILE_SIGNING_KEY``."""
    return os.environ.get("PRECOMPILE_SIGNING_KEY", "").strip() or None


def verify_keys_text() -> str:
    """``PRECOMPILE_VERIFY_KEYS`` as given (comma-separated keys or key files; empty when unset); parsed by
    :func:`precompile.trust.parse_verify_keys`."""
    return os.environ.get("PRECOMPILE_VERIFY_KEYS", "").strip()
