"""The callable behind a stored artifact: the fast path where the manifest offers one, else the portable path.

The fast path (:func:`precompile.inductor.load.runtime.load_fast`) runs Inductor's wrapper with the carried binaries
and compiles nothing; the portable path (:func:`precompile.inductor.load.portable.load_engine`) reloads Inductor's
own cache entries.  The manifest records why an artifact offers no fast path (``build.fast_off``); a fast load
that fails falls back to the portable path with a warning.  Loads are counted in the artifact's cache
(``loads_fast``, ``loads_portable``), so ``precompile stats`` shows how a fleet loads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from precompile import config
from precompile.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from precompile.loader.artifact import Artifact

log = logging.getLogger("precompile")


def build_engine(art: Artifact) -> Callable[..., Any]:
    """The callable for ``art`` (flat inputs in, outputs out); sets ``art.engine_kind`` to ``"fast"``,
    ``"portable"`` or, with ``PRECOMPILE_REQUIRE_NO_HOST_CODE``, ``"graph"``, and counts the load in ``art.cache``.

    Raises:
        ConfigError: ``PRECOMPILE_ENGINE`` or ``PRECOMPILE_PRIME`` holds a value precompile does not accept.
        ArtifactNotFoundError: a part the load needs cannot be read.
        ValueError / ImportError / OSError: the portable path failed too (the artifact cannot run here).
        UntrustedArtifactError: ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` is set (``art.no_host_code``: the load's trust
            policy) and the artifact has no wrapper graph.
    """
    from precompile.metrics import safe_incr

    if art.no_host_code if art.no_host_code is not None else config.require_no_host_code():
        return _no_host_code(art)
    fast = art.manifest.parts.get("fast")
    if fast and config.engine_mode() == "auto":
        config.prime_mode()  # a bad setting is the user's error, never a silent fallback
        try:
            engine = _load_fast(art, fast)
            art.engine_kind = "fast"
            if art.cache is not None:
                safe_incr(art.cache, loads_fast=1)
            return engine
        except Exception as err:  # noqa: BLE001 - the portable path is the fallback for any failure
            art.primer = None  # its replay, if any, ends by itself; the portable engine does not wait for it
            log.warning("fast load of artifact %s failed (%s: %s); using the portable path", art.key[:12],
                        type(err).__name__, err)
    elif not fast:
        log.info("artifact %s loads through the portable path: %s", art.key[:12],
                 art.manifest.build.get("fast_off") or "it offers no fast path")
    from precompile.inductor.load import portable

    binaries: dict[str, bytes] = {}
    for k in art.manifest.kernels:
        for fname, digest in k["binaries"].items():
            rel = k.get("relpaths", {}).get(fname)
            if rel:
                binaries[rel] = art.blob(digest)
    engine = portable.load_engine(art.blob(art.manifest.parts["engine_payload"]), binaries)
    art.engine_kind = "portable"
    if art.cache is not None:
        safe_incr(art.cache, loads_portable=1)
    return engine


def _no_host_code(art: Artifact) -> Callable[..., Any]:
    """The engine of ``PRECOMPILE_REQUIRE_NO_HOST_CODE``: the wrapper graph with its kernels' launch blobs, no
    fallback (every other engine runs host code the artifact carries).

    Raises:
        UntrustedArtifactError: ``reason="host_code"``: the artifact has no wrapper graph (``build.host_code`` says
            why).
        WrapperGraphError / ValueError: the stored graph or a launch blob is refused.
    """
    from precompile.errors import UntrustedArtifactError
    from precompile.inductor.load.graph_engine import load_graph
    from precompile.metrics import safe_incr

    part = art.manifest.parts.get("wrapper_graph")
    if not part:
        raise UntrustedArtifactError(
            f"artifact {art.key[:12]} carries host code ({art.manifest.build.get('host_code') or 'a Python wrapper'})"
            " and PRECOMPILE_REQUIRE_NO_HOST_CODE is set; unset it to load this artifact, or build it for a GPU "
            "where Inductor's FX wrapper expresses the graph", reason="host_code")
    engine = load_graph(art.blob(part["graph"]), {int(i): art.blob(d) for i, d in part.get("kernels", {}).items()},
                        inputs_to_check=sorted(art._aligned_assumed),
                        mutated=art.manifest.build.get("mutated_inputs") or [])
    art.engine_kind = "graph"
    if art.cache is not None:
        safe_incr(art.cache, loads_graph=1)
    return engine


def graph_part_bounds(manifest: Any) -> dict[str, int]:
    """``{digest: bytes}``: the parts the engine of ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` reads (the wrapper graph and
    its kernels' launch blobs; no other part: they are host code), each bounded by the size a structurally
    checked manifest records and never more than the engine accepts
    (:data:`~precompile.inductor.load.graph_engine.MAX_GRAPH_BYTES` for the graph,
    :data:`~precompile.inductor.load.graph_engine.MAX_LAUNCH_BYTES` for a launch blob), so that a manifest recording
    gigabytes costs a read of at most that much.  ``{}`` when the manifest has no wrapper graph."""
    from precompile.inductor.load.graph_engine import MAX_GRAPH_BYTES, MAX_LAUNCH_BYTES

    part = manifest.parts.get("wrapper_graph") or {}
    out: dict[str, int] = {}
    if part:
        out[part["graph"]] = min(int(manifest.blobs[part["graph"]]["size"]), MAX_GRAPH_BYTES)
    for digest in part.get("kernels", {}).values():
        out[digest] = min(int(manifest.blobs[digest]["size"]), MAX_LAUNCH_BYTES)
    return out


def start_primer(manifest: Any) -> Any:
    """Start replaying the library calls ``manifest``'s fast path recorded (:mod:`precompile.inductor.load.prime`), as
    ``PRECOMPILE_PRIME`` asks, as soon as a load has verified the manifest, so that the replay runs while its blobs
    are read and its binaries loaded; the :class:`~precompile.inductor.load.prime.Primer`, or None (priming off, a bad
    setting, left for :func:`build_engine` to report, or nothing to replay).

    Raises:
        nothing.
    """
    fast = manifest.parts.get("fast")
    try:
        mode = config.prime_mode() if fast and config.engine_mode() == "auto" else "off"
    except ConfigError:
        return None
    if mode == "off":
        return None
    from precompile.inductor.load import prime

    return prime.start(fast.get("prime"), mode == "all")


def _load_fast(art: Artifact, fast: dict[str, Any]) -> Callable[..., Any]:
    from precompile.inductor.load.runtime import fast_binary, load_fast

    if art.primer is None:  # not started by the cache read (a file or directory load): started here
        art.primer = start_primer(art.manifest)
    primer = art.primer
    source = art.blob(fast["source"]).decode()
    kernels = {k["source"]: art.blob(k["binaries"][fast_binary(k["lang"], list(k["binaries"]))])
               for k in art.manifest.kernels}
    return load_fast(source, kernels, extern=fast.get("extern"), ops=fast.get("ops"),
                     multi_kernel=fast.get("multi_kernel"), inputs_to_check=sorted(art._aligned_assumed),
                     mutated=fast.get("mutated") or [], defers_alignment=bool(fast.get("defers_alignment")),
                     rewritten=True, primer=primer)
