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
| ``PRECOMPILE_VLLM_PLATFORM`` | ``0`` (or false/no/off) keeps precompile's vLLM platform plugin inactive, ``1`` (or true/yes/on) lets it take part (see ``precompile.integrations.vllm.platform``) | ``1`` |
| ``PRECOMPILE_PRIME`` | whether a fast load replays the graph's library calls (cuBLAS, cuDNN, attention) in background threads, started once the manifest is verified, that the first call waits for (see ``precompile.inductor.load.prime``): ``off``, ``on`` (GPU graphs) or ``all`` (CPU graphs too) | ``on`` |
| ``PRECOMPILE_REWRITES`` | ``on``: choices for a short first call, made before the key: exact graph rewrites (``precompile.key.passes``: a GPU matmul with an inner dimension of 1 becomes a multiply, so that a first call loads no cuBLAS kernel for it) and, for CUDA graphs, flash and memory-efficient attention ahead of cuDNN's (``precompile.key.sdpa``: no per-process cuDNN plan build); ``off`` compiles the graph as given under torch's own choices, for bits equal to torch's own compile of it | ``on`` |
| ``PRECOMPILE_EXPLAIN`` | ``1``: on a miss, ``standalone_compile`` logs the closest stored artifact and the factors that differ (reads every stored manifest: for debugging) | ``0`` |
| ``PRECOMPILE_SIGNING_KEY`` | builders: path of the Ed25519 private key (PEM) every stored or saved manifest is signed with; its public key is trusted too | unset: nothing signed (set but blank: an error) |
| ``PRECOMPILE_METRICS_PORT`` | TCP port (1-65535) on which a process serves its Prometheus metrics (``/metrics``, all interfaces), from its first recorded lookup or load (:func:`precompile.metrics.serve_configured`) | unset: no endpoint |
| ``PRECOMPILE_GRAPH_OP_NAMESPACES`` | comma-separated operator namespaces a stored FX graph may call besides ``aten``, ``prims`` and the custom-op namespaces registered in the process (e.g. ``_c10d_functional``); see ``precompile.manifest.graph_allow`` | unset: none |
| ``PRECOMPILE_REBUILD_MAX_BYTES`` | bytes ``precompile rebuild`` may hold for one artifact's inputs, intermediates, outputs and their copies, estimated before anything is allocated (``precompile.ops.rebuild_bounds``); more is the outcome ``refused`` | a quarter of this machine's memory (its cgroup's limit where lower), at most 4 GiB |
| ``PRECOMPILE_REBUILD_MAX_FLOPS`` | work one run of a rebuilt graph may do, counted on fake tensors before it runs: floating-point operations (``torch.utils.flop_counter``) plus every element an operator reads or writes; more is ``refused`` | 10**13 |
| ``PRECOMPILE_VERIFY_KEYS`` | serving workers: comma-separated Ed25519 public keys (``ed25519:<64 hex>``, or files of them / PEM); set, only artifacts signed by one of them load | unset: nothing checked (set, it must name a key: ``""``, ``","`` or an empty key file is an error) |

The ``precompile`` logger's handler and level are set here too (:func:`setup_logging`), for the command line,
warmup's workers and the vLLM adaptor.

A variable that holds a value precompile does not accept is a :class:`~precompile.errors.ConfigError` naming the
variable, never a silent default.

The keys are parsed once per distinct value (:mod:`precompile.manifest.trust`); a cache URL may add its own
(``verify_keys=``, ``signing_key=``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from precompile.errors import ConfigError, TrustConfigError

#: Version of the artifact format (manifest schema, container layout).  Part of every artifact key.
FORMAT_VERSION = 3

#: Default size cap of a local cache directory, in bytes.
DEFAULT_LOCAL_MAX_BYTES = 20 * 1024**3


def default_cache_dir() -> Path:
    """The embedded default cache directory: ``$XDG_CACHE_HOME/precompile``, else ``~/.cache/precompile``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "precompile"


def cache_url_from_env() -> str | None:
    """``$PRECOMPILE_CACHE`` (stripped), or None when it is unset or blank."""
    return os.environ.get("PRECOMPILE_CACHE", "").strip() or None


def default_cache_url() -> str:
    """``$PRECOMPILE_CACHE`` if set and non-empty, else ``file://`` + :func:`default_cache_dir`."""
    return cache_url_from_env() or "file://" + str(default_cache_dir())


def local_max_bytes() -> int:
    """Size cap of a local cache in bytes, from ``PRECOMPILE_CACHE_MAX_BYTES`` (default 20 GiB).

    Raises:
        ConfigError: the variable is set but is not a positive integer.
    """
    raw = os.environ.get("PRECOMPILE_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_LOCAL_MAX_BYTES
    value = _int_within(raw, 1, None)
    if value is None:
        raise ConfigError(f"PRECOMPILE_CACHE_MAX_BYTES must be a positive integer number of bytes, got {raw!r}")
    return value


def _int_within(raw: str, low: int, high: int | None) -> int | None:
    """``raw`` as an integer from ``low`` to ``high`` (inclusive; None: no upper bound), else None."""
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if low <= value and (high is None or value <= high) else None


#: Upper bound of the default of ``PRECOMPILE_REBUILD_MAX_BYTES``.
REBUILD_MAX_BYTES_CAP = 4 << 30
#: Default of ``PRECOMPILE_REBUILD_MAX_FLOPS``: 10 TFLOP, one decoder layer of a 70B Llama over 4096 tokens
#: (2 x 0.86e9 weights x 4096 tokens = 7.0e12, attention 0.5e12), or a whole 1B model over as many tokens.
DEFAULT_REBUILD_MAX_FLOPS = 10**13


def rebuild_max_bytes() -> int:
    """Bytes a rebuild may hold for one artifact (inputs, intermediates, outputs and the copies it compares), from
    ``PRECOMPILE_REBUILD_MAX_BYTES``; default: a quarter of this machine's memory (of its cgroup's ``memory.max``,
    where that is lower), at most :data:`REBUILD_MAX_BYTES_CAP`.

    Raises:
        ConfigError: the variable is set but is not an integer from 1 to 2**62.
    """
    raw = os.environ.get("PRECOMPILE_REBUILD_MAX_BYTES", "").strip()
    if not raw:
        return min(REBUILD_MAX_BYTES_CAP, _memory_bytes() // 4)
    value = _int_within(raw, 1, 1 << 62)
    if value is None:
        raise ConfigError(f"PRECOMPILE_REBUILD_MAX_BYTES must be a positive integer number of bytes, got {raw!r:.80}")
    return value


def rebuild_max_flops() -> int:
    """Work one run of a rebuilt graph may do (floating-point operations plus elements read and written), from
    ``PRECOMPILE_REBUILD_MAX_FLOPS``; default :data:`DEFAULT_REBUILD_MAX_FLOPS`.

    Raises:
        ConfigError: the variable is set but is not an integer from 1 to 2**62.
    """
    raw = os.environ.get("PRECOMPILE_REBUILD_MAX_FLOPS", "").strip()
    if not raw:
        return DEFAULT_REBUILD_MAX_FLOPS
    value = _int_within(raw, 1, 1 << 62)
    if value is None:
        raise ConfigError(f"PRECOMPILE_REBUILD_MAX_FLOPS must be a positive integer, got {raw!r:.80}")
    return value


def _memory_bytes() -> int:
    """This machine's physical memory in bytes (``sysconf``), or its cgroup v2 limit (``memory.max``) where lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read(64).strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() and int(limit) > 0 else total


#: Level names ``PRECOMPILE_LOG`` accepts (case-insensitive).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level() -> str | None:
    """Level name from ``PRECOMPILE_LOG`` (upper case), or None when unset or empty.

    Raises:
        ConfigError: the variable names no logging level.
    """
    raw = os.environ.get("PRECOMPILE_LOG", "").strip()
    if not raw:
        return None
    level = raw.upper()
    if level == "WARN":
        level = "WARNING"
    if level not in LOG_LEVELS or not isinstance(logging.getLevelName(level), int):
        raise ConfigError(f"PRECOMPILE_LOG must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return level


def explain_misses() -> bool:
    """``PRECOMPILE_EXPLAIN``: whether a miss in ``standalone_compile`` logs the closest stored artifact.

    Raises:
        ConfigError: the variable holds something other than 1/0/true/false/yes/no/on/off.
    """
    raw = os.environ.get("PRECOMPILE_EXPLAIN", "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"PRECOMPILE_EXPLAIN must be 1 or 0 (true/false), got {os.environ['PRECOMPILE_EXPLAIN']!r}")


def engine_mode() -> str:
    """``"auto"`` or ``"portable"`` from ``PRECOMPILE_ENGINE``.

    Raises:
        ConfigError: the variable holds another value.
    """
    mode = (os.environ.get("PRECOMPILE_ENGINE") or "auto").strip().lower()
    if mode not in ("auto", "portable"):
        raise ConfigError(f"PRECOMPILE_ENGINE must be 'auto' or 'portable', got {mode!r}")
    return mode


def require_no_host_code() -> bool:
    """``PRECOMPILE_REQUIRE_NO_HOST_CODE``: True for ``1``/``true``/``yes``/``on``, False when unset, empty or
    ``0``/``false``/``no``/``off``.  When True a worker loads only artifacts whose wrapper is stored as data
    (``parts.wrapper_graph``; docs/format.md, "Trust"): from a cache anything else is a miss counted under
    ``host_code_refused``; from a file or directory it is an ``UntrustedArtifactError(reason="host_code")``.

    Raises:
        ConfigError: the variable holds another value.
    """
    value = (os.environ.get("PRECOMPILE_REQUIRE_NO_HOST_CODE") or "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"PRECOMPILE_REQUIRE_NO_HOST_CODE must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")


def vllm_platform_enabled() -> bool:
    """``PRECOMPILE_VLLM_PLATFORM``: False for ``0``/``false``/``no``/``off`` (precompile's vLLM platform plugin then
    stays inactive), True for ``1``/``true``/``yes``/``on`` or when unset or empty.

    Raises:
        ConfigError: the variable holds another value.
    """
    raw = os.environ.get("PRECOMPILE_VLLM_PLATFORM", "").strip()
    if raw.lower() in ("", "1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"PRECOMPILE_VLLM_PLATFORM must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}")


def vllm_registry_enabled() -> bool:
    """``PRECOMPILE_VLLM_REGISTRY``: whether vLLM's model-registry facts travel through precompile's cache
    (:mod:`precompile.integrations.vllm.registry`).  ``1``/``true``/``yes``/``on``: yes; ``0``/``false``/``no``/
    ``off``: no; unset or empty: yes when ``PRECOMPILE_CACHE`` names a cache (a fleet's), no for the local default
    (vLLM keeps the same facts on the same disk).

    Raises:
        ConfigError: the variable holds another value.
    """
    raw = os.environ.get("PRECOMPILE_VLLM_REGISTRY", "").strip()
    if raw == "":
        return bool(os.environ.get("PRECOMPILE_CACHE", "").strip())
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"PRECOMPILE_VLLM_REGISTRY must be 1 or 0 (true/false, yes/no, on/off), got {raw!r}")


def metrics_port() -> int | None:
    """``PRECOMPILE_METRICS_PORT``: the TCP port on which this process serves its Prometheus metrics
    (:func:`precompile.metrics.serve_configured`); None when the variable is unset or empty (the default: no
    endpoint).

    Raises:
        ConfigError: the variable is not an integer from 1 to 65535.
    """
    raw = os.environ.get("PRECOMPILE_METRICS_PORT", "").strip()
    if not raw:
        return None
    port = _int_within(raw, 1, 65535)
    if port is None:
        raise ConfigError(f"PRECOMPILE_METRICS_PORT must be a TCP port number from 1 to 65535 (or unset, for no "
                          f"metrics endpoint), got {raw!r}")
    return port


def graph_op_namespaces() -> frozenset[str]:
    """``PRECOMPILE_GRAPH_OP_NAMESPACES``: operator namespaces a stored FX graph may call besides ``aten``,
    ``prims`` and the custom-op namespaces registered in this process (:mod:`precompile.manifest.graph_allow`);
    empty when unset.

    Raises:
        ConfigError: an entry is not an identifier (``_c10d_functional``, ``quantized``).
    """
    raw = os.environ.get("PRECOMPILE_GRAPH_OP_NAMESPACES") or ""
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    bad = sorted(n for n in names if not (n.isascii() and n.isidentifier()) or n.startswith("__"))
    if bad:
        raise ConfigError("PRECOMPILE_GRAPH_OP_NAMESPACES must list operator namespaces (identifiers, comma-"
                          f"separated), got {bad[0]!r:.80}")
    return names


def signing_key_path() -> str | None:
    """Path of the Ed25519 private key (PEM) manifests are signed with, from ``PRECOMPILE_SIGNING_KEY``; None when
    the variable is unset.

    Raises:
        TrustConfigError: the variable is set but empty or blank (a builder that meant to sign would silently
            store unsigned manifests).
    """
    raw = os.environ.get("PRECOMPILE_SIGNING_KEY")
    if raw is None:
        return None
    if not raw.strip():
        raise TrustConfigError(f"PRECOMPILE_SIGNING_KEY is set to {raw!r}: give the path of an Ed25519 private key "
                               "(PEM), or unset it to sign nothing")
    return raw.strip()


def verify_keys_text() -> str | None:
    """``PRECOMPILE_VERIFY_KEYS`` as given (comma-separated keys or key files), or None when it is unset; parsed by
    :func:`precompile.manifest.trust.parse_verify_keys`, for which a value that is set but names no key (``""``,
    ``","``) is an error."""
    return os.environ.get("PRECOMPILE_VERIFY_KEYS")


def prime_mode() -> str:
    """``"off"``, ``"on"`` (the default: GPU graphs are primed; measured to shorten a GPU load + first call, see
    docs/benchmarks.md) or ``"all"`` (CPU graphs too), from ``PRECOMPILE_PRIME`` (see
    :mod:`precompile.inductor.load.prime`).

    Raises:
        ConfigError: the variable holds another value.
    """
    raw = (os.environ.get("PRECOMPILE_PRIME") or "on").strip().lower()
    mode = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(raw, raw)
    if mode not in ("off", "on", "all"):
        raise ConfigError(f"PRECOMPILE_PRIME must be off, on or all, got {raw!r}")
    return mode


def rewrites_enabled() -> bool:
    """Whether :mod:`precompile.key.passes` rewrites graphs, and CUDA graphs are compiled with flash attention ahead of
    cuDNN's (:mod:`precompile.key.sdpa`), before the key, from ``PRECOMPILE_REWRITES`` (``on``, the
    default, or ``off``).  The key describes the graph compiled either way, so the setting needs no key factor.

    Raises:
        ConfigError: the variable holds another value.
    """
    raw = (os.environ.get("PRECOMPILE_REWRITES") or "on").strip().lower()
    mode = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(raw, raw)
    if mode not in ("on", "off"):
        raise ConfigError(f"PRECOMPILE_REWRITES must be on or off, got {raw!r}")
    return mode == "on"


def setup_logging(quiet: bool = False, verbose: bool = False) -> None:
    """Send the ``precompile`` logger to stderr at WARNING (quiet), INFO (default) or DEBUG (verbose);
    ``PRECOMPILE_LOG`` overrides the level.

    Raises:
        ConfigError: ``PRECOMPILE_LOG`` names no level.
    """
    level = log_level() or ("DEBUG" if verbose else "WARNING" if quiet else "INFO")
    logger = logging.getLogger("precompile")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
