"""Typed errors of precompile.

Every error precompile raises on purpose derives from :class:`PrecompileError` and, where one fits, from a
built-in exception too, so callers may catch either (``except FileNotFoundError`` still works for a missing
artifact file).  Errors raised because of something else are chained with ``raise ... from err``.

This module imports nothing from torch or from the rest of the package, so the cache backends can use it
without import cycles.
"""

from __future__ import annotations


class PrecompileError(Exception):
    """Root of every error precompile raises on purpose."""


# --------------------------------------------------------------------------------------------------- cache
class CacheError(PrecompileError):
    """A cache backend failed.  Callers that compile or load treat it as a miss, never as a crash."""


class CacheURLError(CacheError, ValueError):
    """A cache URL could not be parsed or names a scheme no backend handles."""


class CacheUnavailableError(CacheError, ConnectionError):
    """The cache's storage could not be reached (server down, directory gone)."""


class CacheReadOnlyError(CacheError, PermissionError):
    """A write was attempted on a cache that is read-only (by configuration or by file permissions)."""


# -------------------------------------------------------------------------------------------------- config
class ConfigError(PrecompileError, ValueError):
    """An environment variable precompile reads (or a setting of the same kind: a key file, a cache URL's key
    option) holds a value it does not accept; the message names the setting, its value and what it accepts.
    The command line exits with status 2 for it."""


class TrustConfigError(ConfigError):
    """A signing or verify key setting (``PRECOMPILE_SIGNING_KEY``, ``PRECOMPILE_VERIFY_KEYS``, a key file, a cache
    URL's ``signing_key=`` / ``verify_keys=``) cannot be read, is not Ed25519, is not exactly one key a line, or
    names no key at all.  Raised at the setting's first use, before anything is read from a cache or a file:
    a key setting never fails open."""


# ------------------------------------------------------------------------------------------------ artifact
class ArtifactError(PrecompileError):
    """An artifact could not be built, saved, loaded or called."""


class ArtifactFormatError(ArtifactError, ValueError):
    """A file or directory given to :func:`precompile.load` is not a complete precompile artifact.

    Raised for a foreign file (wrong magic bytes), a truncated file, an unknown format version, a part whose
    bytes do not match the digest in the manifest, or a manifest that does not parse.
    """


class UnsafePathError(ArtifactFormatError):
    """A name read from an artifact would become a path it must not: absolute, with a ``..`` component, with a
    separator where a plain name is meant, empty, or with characters outside ``[A-Za-z0-9_.+-]``.

    Raised on load (manifest, ``index.json``, a binary's place under a directory) and on save, before anything is
    written.  ``field`` says where the name was (``"kernels[0].relpaths"``), ``name`` is the offending value.
    A :class:`ValueError` and an :class:`ArtifactFormatError` too: a cache entry holding one is a miss.
    """

    def __init__(self, message: str, field: str = "", name: object = None):
        super().__init__(message)
        self.field = field
        self.name = name


class NotAnArtifactPathError(ArtifactFormatError):
    """A path given as an artifact (or a bundle of them) names something no artifact can be read from: a FIFO, a
    device, a socket, a directory without ``manifest.json``, or a file that cannot be read (``/proc/self/mem``).  Nothing is read from
    a FIFO or a device.  The command line takes it as a mistake in what was asked (exit status 2)."""


class OutputPathError(PrecompileError, ValueError):
    """A path to write (``precompile export -o``, :meth:`precompile.Artifact.save`) names something other than a
    regular file or a new name: a directory, a device, a FIFO, a socket or a symlink.  Nothing is written and
    nothing there is replaced.  The command line takes it as a mistake in what was asked (exit status 2)."""


class UntrustedArtifactError(ArtifactError, PermissionError):
    """Verify keys are configured and an artifact file or directory is not signed by one of them.

    ``reason`` is one of ``"unsigned"``, ``"unknown_key"`` (signed by a key not configured here),
    ``"bad_signature"`` (the signature does not match the manifest: it was changed after signing),
    ``"malformed"`` (the signature record does not parse) or ``"host_code"`` (``PRECOMPILE_REQUIRE_NO_HOST_CODE``
    is set and the artifact carries host code: a Python wrapper, C++ kernels); ``key_id`` is the signer's key id,
    if any.  Nothing of the artifact ran.  From a cache the same cases are a miss counted under
    ``untrusted_<reason>`` (``host_code_refused`` for the last).
    """

    def __init__(self, message: str, reason: str = "", key_id: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.key_id = key_id


class ArtifactNotFoundError(ArtifactError, FileNotFoundError):
    """No artifact exists under the given path, or the cache holds no artifact for the given key."""


class AmbiguousKeyError(ArtifactError, LookupError):
    """A key prefix matches several artifacts in a cache.  ``matches`` lists the full keys (sorted)."""

    def __init__(self, message: str, matches: list[str] | None = None):
        super().__init__(message)
        self.matches = matches or []


class EnvironmentMismatchError(ArtifactError):
    """The artifact was built for another environment (torch build, GPU architecture, CPU ISA...).

    ``reasons`` lists the fingerprint fields that differ as ``(field, built_for, running_on)`` tuples.
    """

    def __init__(self, message: str, reasons: list[tuple[str, object, object]] | None = None):
        super().__init__(message)
        self.reasons = reasons or []


class UnserializableGraphError(ArtifactError, TypeError):
    """The FX graph holds something precompile cannot serialize (a lambda, an opaque object...).

    The message names the node and the value.  Nothing is written to any cache when this is raised.
    """


class InputMismatchError(ArtifactError, TypeError):
    """The inputs given to an artifact do not match its placeholders: count, shape, stride, dtype or device.

    The message names every placeholder concerned and what was expected.
    """


class BuildError(ArtifactError, RuntimeError):
    """Inductor failed to compile the graph.  The original exception is chained as ``__cause__``."""


class OptionsError(ArtifactError, ValueError):
    """``options`` holds a name that is not an Inductor config option, or a value a key cannot hold."""


class RecipeError(PrecompileError, ValueError):
    """A model recipe name, config or shape list given to ``precompile warmup`` is invalid."""


# ------------------------------------------------------------------------------------------- bounded input
class InputLimitError(PrecompileError, ValueError):
    """Untrusted input (a cache entry, an artifact file or part, a bundle) is larger, inflates further or nests
    deeper than the bound for what it is.  Raised before the input is allocated or parsed; a cache read that
    raises it is a miss (:mod:`cache_backends.bounded`)."""


class NotRegularFileError(PrecompileError, OSError):
    """A path read as a cache entry or an artifact file is a FIFO, device, directory or socket, not a regular
    file.  Nothing is read from it (opening never blocks); a cache read that raises it is a miss."""
