"""Ambient state: the process-wide settings that change what AOTAutograd and Inductor produce for one graph.

The same FX graph compiled under ``torch.no_grad()`` is an inference graph (one wrapper, no autograd), and with
grad enabled and weights that require grad a training graph (forward and backward); under autocast its matmuls
run in bfloat16; and so on.  Each such setting is a key factor, read when the key is computed (the caller's
state at ``standalone_compile``, or Dynamo's when a ``torch.compile`` backend is called), and shown by
``precompile inspect``.  The list follows what AOTAutograd's and Inductor's own cache keys hash in torch 2.13
(``AOTAutogradCacheDetails._record_runtime_state``, ``FxGraphHashDetails``):

| factor | why it changes the compile |
|---|---|
| ``grad_enabled`` | with an input that requires grad, a training graph instead of an inference graph |
| ``autocast`` | per device type, the autocast dtype when enabled: casts traced into the graph |
| ``deterministic`` | ``use_deterministic_algorithms`` (and warn-only, fill of uninitialized memory): other lowerings |
| ``default_dtype`` | factory calls without a dtype are lowered with it |
| ``float32_matmul_precision`` | TF32 / bf16 matmul templates and autotune choices |
| ``cuda_matmul`` | (CUDA graphs) fp32 precision, fp16/bf16 reduced-precision reductions |
| ``cpu_threads`` | (CPU graphs, unless ``cpp.threads`` is set or threads are dynamic) C++ kernels are built for it |
| ``sdpa`` | (graphs calling ``scaled_dot_product_attention``) the attention backends enabled and, on CUDA, their priority order: the backend is picked when the graph is traced (:mod:`precompile.key.sdpa`) |

Proven irrelevant, so not factors (tests/key/test_ambient.py): ``torch.inference_mode`` (grad is off in it, and
Inductor produces the same code as under ``no_grad``), and cuDNN's flags, which act when the artifact runs, as
they do for eager code, not when it is compiled.
"""

from __future__ import annotations

from typing import Any

import torch

from precompile.key import sdpa


def ambient_state(devices: set[str] | frozenset[str], cpp_threads_fixed: bool, calls_sdpa: bool = False,
                  sdpa_order: list[str] | None = None) -> dict[str, Any]:
    """The ambient key factors of this thread for a graph on ``devices``, JSON-ready (see module docstring).

    Args:
        devices: device types of the graph's tensors (``{"cpu"}``, ``{"cuda"}``...).
        cpp_threads_fixed: Inductor's C++ kernels do not depend on the thread count here (``cpp.threads`` is
            set, or ``cpp.dynamic_threads``): then ``cpu_threads`` is left out.
        calls_sdpa: the graph calls ``scaled_dot_product_attention``: then ``sdpa`` is a factor.
        sdpa_order: the SDPA priority order the graph is compiled under, where precompile sets one; None: torch's
            own (:func:`precompile.key.sdpa.state`).
    """
    state: dict[str, Any] = {
        "grad_enabled": torch.is_grad_enabled(),
        "autocast": {dev: str(torch.get_autocast_dtype(dev)).removeprefix("torch.")
                     for dev in sorted(torch._C._autocast_supported_devices()) if torch.is_autocast_enabled(dev)},
        "deterministic": [torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled(),
                          bool(torch.utils.deterministic.fill_uninitialized_memory)],
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if "cuda" in devices:
        matmul = torch.backends.cuda.matmul
        state["cuda_matmul"] = [str(getattr(matmul, "fp32_precision", "")), bool(matmul.allow_fp16_reduced_precision_reduction),
                                bool(matmul.allow_bf16_reduced_precision_reduction)]
    if "cpu" in devices and not cpp_threads_fixed:
        state["cpu_threads"] = torch.get_num_threads()
    if calls_sdpa:
        state["sdpa"] = sdpa.state(devices, sdpa_order)
    return state
