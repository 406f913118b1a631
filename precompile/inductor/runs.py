"""Running a freshly compiled graph at build time without touching the caller's tensors.

A build runs the compiled graph to settle Triton autotuning and to validate the fast path against it.  A graph
may write to its inputs (a KV cache, a counter), so every such run works on copies of the inputs the graph
writes to, laid out like the originals (same shape, stride, dtype, device, 16-byte alignment or not), and the
caller's example inputs come out of a build exactly as they went in.
"""

from __future__ import annotations

from typing import Any

import torch


def clone_like(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same shape, strides, dtype and device whose data pointer is 16-byte aligned
    exactly when ``t``'s is (a misaligned original gets a copy at the same offset from an aligned block)."""
    offset = (t.data_ptr() % 16) // t.element_size() if t.element_size() and t.data_ptr() % 16 else 0
    needed = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) if t.numel() else 0
    base = torch.empty(needed + offset, dtype=t.dtype, device=t.device)
    out = base.as_strided(t.shape, t.stride(), offset)
    if t.numel():
        out.copy_(t)
    return out


def inputs_for_run(inputs: list[Any], mutated: list[int] | set[int]) -> list[Any]:
    """``inputs`` with every tensor the graph writes to (``mutated`` indices) replaced by :func:`clone_like`."""
    return [clone_like(x) if i in mutated and isinstance(x, torch.Tensor) else x for i, x in enumerate(inputs)]


def same_values(a: Any, b: Any) -> str | None:
    """None if ``a`` and ``b`` are equal bit for bit (tensors: shape, stride, dtype, device, values; other values:
    ``==``), else what differs."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{type(a).__name__} vs {type(b).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return f"{tuple(a.shape)} {a.dtype} {a.device} vs {tuple(b.shape)} {b.dtype} {b.device}"
        if a.numel() > 1 and a.stride() != b.stride():
            return f"strides {a.stride()} vs {b.stride()}"
        if not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                          and torch.equal(a.nan_to_num(), b.nan_to_num())):
            return "values differ"
        return None
    if type(a) is not type(b):
        return f"{type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{len(a)} vs {len(b)} values"
        for i, (x, y) in enumerate(zip(a, b)):
            why = same_values(x, y)
            if why:
                return f"[{i}]: {why}"
        return None
    return None if a == b else f"{a!r} vs {b!r}"
