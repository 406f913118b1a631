"""``torch.compile``'s ``mode=`` for :func:`precompile.compile`, with torch's meanings.

| mode | Inductor options | CUDA graphs |
|---|---|---|
| ``None``, ``"default"`` | none | no |
| ``"reduce-overhead"`` | none | yes |
| ``"max-autotune"`` | ``max_autotune``, ``coordinate_descent_tuning`` | yes |
| ``"max-autotune-no-cudagraphs"`` | ``max_autotune``, ``coordinate_descent_tuning`` | no |

The table is torch's (``torch._inductor.list_mode_options``, 2.11-2.13; a test holds it to torch's), copied so that
a warm start computes its key without importing Inductor.  ``triton.cudagraphs`` is not handed to Inductor: the
graphs precompile loads run from its own engine, so precompile records and replays the CUDA graphs itself
(:class:`precompile.loader.cudagraphs.CudaGraphRunner`), on GPU inputs only (on a CPU, as under ``torch.compile``,
the mode changes nothing).  As in ``torch.compile``, ``mode`` and ``options`` cannot both be given.  torch 2.13's
``"lite"`` mode (Inductor falling back to ATen by default) is not offered: its options do not exist in 2.11.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: torch.compile's modes: the Inductor options each sets (``triton.cudagraphs`` included, as torch lists it).
MODES: dict[str, dict[str, bool]] = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True, "coordinate_descent_tuning": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
}


def resolve(mode: str | None, options: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """``(Inductor options, whether to replay CUDA graphs)`` for ``mode`` and the user's ``options``.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES` (or None), or ``mode`` and ``options`` are both given
            (torch.compile refuses that too).
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode={mode!r} is not a torch.compile mode precompile offers; use one of {', '.join(MODES)}")
    if mode is not None and options is not None:
        raise ValueError("give mode= or options=, not both (as torch.compile): a mode is a set of Inductor options, "
                         f"listed in precompile.function.modes.MODES; for {mode!r} pass them in options instead")
    merged = {**MODES[mode or "default"], **(options or {})}
    cudagraphs = bool(merged.pop("triton.cudagraphs", False))
    return merged, cudagraphs


def wrap(graph: Callable[..., Any], cudagraphs: bool, name: str) -> Callable[..., Any]:
    """``graph`` (a loaded or built graph artifact) replayed from CUDA graphs when ``cudagraphs``; else itself."""
    if not cudagraphs:
        return graph
    from precompile.loader.cudagraphs import CudaGraphRunner

    manifest = getattr(graph, "manifest", None)
    if manifest is None:  # compiled uncached: which inputs it writes is not known, and a replay would lose them
        return graph
    return CudaGraphRunner(graph, manifest.build.get("mutated_inputs") or [], name)
