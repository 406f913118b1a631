"""Which fused attention kernel a graph's ``scaled_dot_product_attention`` compiles to: a key factor, and the
order precompile compiles CUDA graphs under.

``scaled_dot_product_attention`` is a composite op: when AOTAutograd traces a graph, torch picks a backend (flash,
memory-efficient, cuDNN or math attention) from the backends enabled (``torch.backends.cuda.enable_*_sdp``,
``torch.nn.attention.sdpa_kernel``) and, on CUDA, a priority order, and the graph Inductor compiles calls that
backend's op (``aten._scaled_dot_product_flash_attention``...).  So these settings change the compile, and are
part of the key's ambient state for graphs that call it (:func:`state`).  On a CPU torch ignores the order (flash
for CPU, else math); on CUDA it is a process-wide list that torch 2.11's ``sdp_utils.cpp`` (``priority_order``)
rewrites on its first CUDA choice, putting cuDNN first on Hopper and Blackwell GPUs: :func:`settled_order` makes
that choice first, so that the order read is the one the compile uses.

cuDNN attention costs a fresh process's first call a plan build: 0.11 s on an H100 for a 4x16x256x64 bf16 causal
call, against 0.005 s for flash and 0.003 s for memory-efficient attention (``tools/profile/library_first_use.py``,
docs/benchmarks.md); PyTorch caches the plan per thread and per shape (``aten/src/ATen/native/cudnn/MHA.cpp``), so
each new sequence length of a dynamic graph pays it again, and a replay in another thread cannot pay it ahead.
So where graph rewrites are on (:func:`precompile.config.rewrites_enabled`), precompile compiles CUDA graphs with
flash and memory-efficient attention ahead of cuDNN (:func:`fast_start_order`, applied by :func:`priority`):
torch still checks each backend's constraints (a mask or a head size flash cannot take goes to the next).  The
artifact is validated against its own compile as always; its bits differ from a compile with cuDNN attention by
the kernels' rounding.  ``PRECOMPILE_REWRITES=off`` compiles under torch's own order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

#: torch's SDPBackend numbers (``torch.nn.attention.SDPBackend``) and the names the key records.
NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
_NUMBERS = {name: number for number, name in NAMES.items()}
#: The enable switch of each backend (``torch.backends.cuda.<name>_sdp_enabled``; they act on every device).
_SWITCHES = {"flash": "flash", "efficient": "mem_efficient", "math": "math", "cudnn": "cudnn"}


def sdpa_calls(gm: torch.fx.GraphModule) -> int:
    """How many times ``gm`` calls the composite ``scaled_dot_product_attention`` (as Dynamo records it, or its
    aten op), whose backend is picked when the graph is traced for Inductor."""
    targets = (torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention,
               torch.ops.aten.scaled_dot_product_attention.default)
    return sum(n.op == "call_function" and n.target in targets for n in gm.graph.nodes)


def settled_order() -> list[str]:
    """torch's SDPA priority order as its next CUDA choice will read it (backend names, first tried first).

    Makes one choice on tiny CUDA tensors first (no kernel runs), since torch rewrites the order on its first
    CUDA choice (see the module docstring).  Without CUDA, the order as set.
    """
    if torch.cuda.is_available():
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # real tensors even where a caller traces under a fake mode
            q = torch.empty(1, 1, 1, 8, device="cuda", dtype=torch.float16)
            torch._fused_sdp_choice(q, q, q)
    return [NAMES.get(int(n), str(n)) for n in torch._C._get_sdp_priority_order()]


def fast_start_order(order: list[str]) -> list[str]:
    """``order`` with flash and memory-efficient attention moved ahead of the others, each group kept in order:
    ``[cudnn, flash, efficient, math]`` becomes ``[flash, efficient, cudnn, math]``."""
    first = [b for b in order if b in ("flash", "efficient")]
    return first + [b for b in order if b not in first]


def state(devices: set[str] | frozenset[str], order: list[str] | None) -> dict[str, Any]:
    """The key factor for a graph calling SDPA on ``devices``: ``{"enabled": [backend, ...], "order": [...]}``
    (the order only for CUDA graphs: ``order`` if given, else :func:`settled_order`)."""
    cuda = torch.backends.cuda
    got: dict[str, Any] = {"enabled": [b for b, s in _SWITCHES.items() if getattr(cuda, f"{s}_sdp_enabled")()]}
    if "cuda" in devices:
        got["order"] = list(order) if order is not None else settled_order()
    return got


@contextlib.contextmanager
def priority(order: list[str] | None) -> Iterator[None]:
    """Compile under SDPA priority ``order`` (backend names, all of torch's), restored after; no-op for None.

    Raises:
        KeyError: ``order`` names a backend this torch does not have.
    """
    if order is None:
        yield
        return
    settled_order()  # torch's first CUDA choice would overwrite an order set before it
    saved = torch._C._get_sdp_priority_order()
    torch._C._set_sdp_priority_order([_NUMBERS[b] for b in order])
    try:
        yield
    finally:
        torch._C._set_sdp_priority_order(list(saved))


@contextlib.contextmanager
def restored(recorded: dict[str, Any] | None) -> Iterator[None]:
    """Run the block with the SDPA switches and order a key recorded (:func:`state`), restored after."""
    if not recorded:
        yield
        return
    cuda = torch.backends.cuda
    saved = {s: getattr(cuda, f"{s}_sdp_enabled")() for s in _SWITCHES.values()}
    try:
        for backend, switch in _SWITCHES.items():
            getattr(cuda, f"enable_{switch}_sdp")(backend in recorded.get("enabled", ()))
        with priority(recorded.get("order")):
            yield
    finally:
        for switch, on in saved.items():
            getattr(cuda, f"enable_{switch}_sdp")(on)

