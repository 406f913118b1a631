"""Custom operators the tests compile into graphs, registered with ``torch.library.custom_op`` on import.

A fresh process that loads an artifact calling them need not import this module itself: the artifact records
it as the operators' defining module and the fast load imports it.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("pctest::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, s: float) -> torch.Tensor:
    """``x * s + y``, an out-of-place custom op (Inductor calls it as an extern op)."""
    return x * s + y


@scale_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, s: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("pctest::bump_", mutates_args=("buf",))
def bump_(buf: torch.Tensor, v: torch.Tensor) -> None:
    """``buf += v`` in place: a custom op that writes into a caller's buffer."""
    buf.add_(v)


@bump_.register_fake
def _(buf: torch.Tensor, v: torch.Tensor) -> None:
    return None
