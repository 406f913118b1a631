"""Stand-ins for the extern kernels Inductor defines in its own modules, so that a fast load calling them
imports no Inductor module (importing ``torch._inductor.kernel.mm`` imports Inductor, sympy and Triton: seconds).

Each is a copy of Inductor's function, and the build still validates the fast callable that calls it against
Inductor's own fresh callable, bit for bit (:mod:`precompile.inductor.build.fast_plan`).  :data:`STAND_INS` maps the
importable name Inductor's object has to the stand-in's.
"""

from __future__ import annotations

import torch


def bias_addmm(inp: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, out: torch.Tensor | None = None,
               alpha: float = 1, beta: float = 1) -> torch.Tensor:
    """``addmm`` with a broadcast bias row passed as 1-D, which makes cuBLASLt fuse the bias (a kernel choice of
    max-autotune, ``aten_bias_addmm``).  ``inp``: ``[M, N]`` (a row broadcast with stride 0, or one row) or any
    bias ``addmm`` takes; ``mat1`` ``[M, K]``, ``mat2`` ``[K, N]``; written to ``out`` when given.

    Source: ``torch._inductor.kernel.mm.bias_addmm`` of torch 2.13 (2.11's lacks the ``size(0) != 0`` test, which
    only keeps an empty bias from being indexed).
    """
    if (inp.stride(0) == 0 and inp.size(0) != 0) or inp.size(0) == 1:
        return torch.addmm(inp[0], mat1, mat2, out=out, alpha=alpha, beta=beta)
    return torch.addmm(inp, mat1, mat2, out=out, alpha=alpha, beta=beta)


#: ``{importable name of Inductor's extern kernel: importable name of its stand-in}``.
STAND_INS = {"torch._inductor.kernel.mm:bias_addmm": "precompile.inductor.load.externs:bias_addmm"}
