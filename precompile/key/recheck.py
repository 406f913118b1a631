"""Whether a stored graph artifact's key still holds here, for a caller that has its key but not its graph.

A key (:mod:`precompile.key.plan`) hashes two kinds of factor: what comes from the graph and its example inputs
(the canonical graph, the input specs, the symbols, the calling convention, the caller's ``key_extra``), and what
comes from the process it is keyed in (precompile's format, the Inductor options and the effective Inductor
config they give here, the ambient state, the environment's key fields).  A caller that recorded a graph's key
earlier - vLLM's piece map (:mod:`precompile.integrations.vllm.pieces`), where the function artifact's own key fixes
the graphs - may load that key without the graph, and must not load it where the process-side factors changed.
:func:`stale_factor` recomputes those from the stored manifest's own factors (signed with it) and names the first
that differs.  A key with a factor this cannot recompute (the SDPA priority, which depends on the graph's
attention calls) is reported stale: the caller then keys the graph as usual.
"""

from __future__ import annotations

from typing import Any

from precompile import config


def stale_factor(factors: dict[str, Any], placeholders: list[dict[str, Any]]) -> str | None:
    """The first process-side key factor of a stored artifact that differs here, or None if all hold.

    Args:
        factors: the stored manifest's ``factors`` (verified with it).
        placeholders: the stored manifest's ``placeholders`` (their devices decide the environment's fields).

    Returns:
        ``"format"``, ``"env.<field>"``, ``"inductor_config"``, ``"ambient.<field>"`` or ``"ambient.sdpa (not
        rechecked)"``; None when every such factor is what keying the graph here would give.
    """
    from cache_backends.base import digest_bytes
    from precompile.inductor import options as inductor_options
    from precompile.key import fingerprint
    from precompile.key.ambient import ambient_state
    from precompile.key.graph import canonical_json

    if factors.get("format") != config.FORMAT_VERSION:
        return "format"
    devices = {p.get("device") for p in placeholders if p.get("type") == "tensor"} - {None} or {"cpu"}
    here = fingerprint.key_fields(fingerprint.environment(devices, full=False))
    stored_env = factors.get("env")
    if not isinstance(stored_env, dict):
        return "env"
    for name in sorted(set(here) | set(stored_env)):
        if here.get(name) != stored_env.get(name):
            return f"env.{name}"
    options = factors.get("options")
    if not isinstance(options, dict):
        return "options"
    try:
        effective = inductor_options.effective_config(options)
    except (KeyError, TypeError):  # an option this torch does not have
        return "options"
    if digest_bytes(canonical_json(effective)) != factors.get("inductor_config"):
        return "inductor_config"
    ambient = factors.get("ambient")
    if not isinstance(ambient, dict):
        return "ambient"
    if "sdpa" in ambient:
        return "ambient.sdpa (not rechecked)"
    # the plan leaves the thread count out where Inductor's C++ kernels do not depend on it; the effective config
    # that decides that matched above, so the stored factor's absence says the same
    now = ambient_state(devices, cpp_threads_fixed="cpu_threads" not in ambient)
    for name in sorted(set(now) | set(ambient)):
        if now.get(name) != ambient.get(name):
            return f"ambient.{name}"
    return None
