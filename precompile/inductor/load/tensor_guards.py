"""Dynamo's C++ tensor check (``torch._C._dynamo.guards.TensorGuards``, through
:func:`precompile.inductor.shim.tensor_guards_class`), the one place precompile uses it.

``TensorGuards(*examples, dynamic_dims_sizes=..., dynamic_dims_strides=...)`` records, per example tensor, its
dispatch keys (under the thread's dispatch state at construction), dtype, device (type and index) and
requires_grad; the given sizes and strides are the expected ones, ``None`` meaning "any".  ``check(*tensors)``
compares all of it in one C++ call (about 0.1 us per tensor, against 0.3 us for the fewest Python attribute reads).
It is what ``torch.compile``'s tensor guards were built on (torch/csrc/dynamo/guards.cpp, ``TensorCheck``), stable
in signature from torch 2.1 through 2.13; precompile uses only the constructor and ``check`` (``check_verbose``
crashes without names in 2.13, and is never called).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from precompile.inductor import shim

log = logging.getLogger("precompile")


def tensor_check(examples: Sequence[torch.Tensor], sizes: Sequence[Sequence[int | None]],
                 strides: Sequence[Sequence[int | None] | None]) -> Callable[..., bool] | None:
    """A C++ ``check(*tensors) -> bool`` that is True when each tensor has its example's dispatch keys, dtype,
    device and requires_grad, and the given sizes and strides (``None`` entries, or a ``None`` stride list, are
    free); None where this torch lacks it or refuses these examples (the caller keeps its Python check).

    Args:
        examples: real tensors, one per checked input (the first call's, so that dispatch keys match the caller's
            own tensors and grad mode).
        sizes: per tensor, the expected size of each dimension or None.
        strides: per tensor, the expected stride of each dimension or None, or None for all free.
    """
    TensorGuards = shim.tensor_guards_class()  # noqa: N806 - torch's class
    if TensorGuards is None:
        return None
    try:
        tg = TensorGuards(*examples, dynamic_dims_sizes=[list(s) for s in sizes],
                          dynamic_dims_strides=[list(st) if st is not None else [None] * len(s)
                                                for s, st in zip(sizes, strides)])
        if not tg.check(*examples):  # the examples must pass their own check, or the check means something else
            return None
    except Exception as err:  # noqa: BLE001 - a torch whose TensorGuards differs: keep the Python check
        log.debug("TensorGuards unavailable here (%s: %s); input checks stay in Python", type(err).__name__, err)
        return None
    return tg.check
