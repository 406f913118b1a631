"""Graph rewrites precompile applies before a key is computed, each exact: run eagerly, the rewritten graph
computes the same bits as the original.

:func:`outer_products_as_mul` turns a matmul whose inner dimension is 1 (an outer product, such as the rotary
embedding's ``inv_freq @ position_ids`` every Llama-like ``transformers`` model computes in float32) into a
broadcast multiply, on GPU graphs.  A library matmul costs its first call a cuBLAS kernel load of its own: 0.11 s
of a Llama's 0.27 s first call after a fresh load on an H100 with torch 2.11 (docs/benchmarks.md, time to first
output), for 32x256 products.  As a multiply, Inductor fuses it into a Triton kernel the artifact carries.
torch 2.13's Inductor makes the same decomposition itself for non-CPU devices (``torch._inductor.decomposition.mm``:
``self.size(-1) == 1`` becomes ``self * input2``); this applies it on every torch precompile supports, and before
the key, so that the key describes the graph that is compiled.

Exactness: with an inner dimension of 1 a matmul has no sum; each output element is one product of two inputs,
rounded once to the output dtype, which is what the multiply computes.  Float32 is rewritten only when TF32
matmuls are off (``torch.backends.cuda.matmul.allow_tf32``, part of the key's ambient state), since a TF32 matmul
rounds its inputs first.  Compiled, the multiply is fused into neighbouring kernels where the matmul's output was
a buffer, and Inductor may then round a later bf16 intermediate elsewhere: the artifact is bit-equal to its own
fresh compile (validated at build, as always), but may differ from torch's compile of the unrewritten graph by
such rounding (a Qwen2 on an H100: max |diff| 0.026 in bf16 logits; a Llama: equal).  ``PRECOMPILE_REWRITES=off``
(:func:`precompile.config.rewrites_enabled`) compiles the graph as given.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

#: Callables of a Dynamo graph that compute a matmul, and their method names on a tensor.
_MATMUL_FUNCTIONS = (operator.matmul, torch.matmul, torch.mm, torch.bmm)
_MATMUL_METHODS = ("matmul", "mm", "bmm", "__matmul__")
_EXACT_DTYPES = (torch.float16, torch.bfloat16, torch.float64)


def _value(arg: Any) -> torch.Tensor | None:
    """The fake tensor Dynamo or a fake-tensor pass left on a node (:func:`precompile.inductor.shim.fake_value`),
    or None."""
    from precompile.inductor.shim import fake_value

    value = fake_value(arg) if isinstance(arg, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_outer_product(a: torch.Tensor, b: torch.Tensor) -> bool:
    exact = a.dtype in _EXACT_DTYPES or (a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32)
    return (a.dtype == b.dtype and exact and a.device.type == b.device.type == "cuda"
            and a.dim() >= 2 and b.dim() >= 2
            and type(a.shape[-1]) is int and type(b.shape[-2]) is int and a.shape[-1] == 1 == b.shape[-2])


def outer_products_as_mul(gm: torch.fx.GraphModule) -> int:
    """Rewrite, in place, every matmul of two CUDA tensors with an inner dimension of 1 (``[..., M, 1] @
    [..., 1, N]``, same floating dtype, both at least 2-D, sizes known where the node's example value is) into
    ``torch.mul`` of the same operands, which broadcasts them to the same ``[..., M, N]`` result.

    Nodes without an example value (graphs not traced by Dynamo or a fake-tensor pass) are left alone.

    Returns:
        the number of matmuls rewritten (0 leaves ``gm`` untouched).

    Raises:
        nothing.
    """
    count = 0
    for node in gm.graph.nodes:
        is_call = node.op == "call_function" and node.target in _MATMUL_FUNCTIONS
        is_method = node.op == "call_method" and node.target in _MATMUL_METHODS
        if not (is_call or is_method) or len(node.args) != 2 or node.kwargs:
            continue
        a, b = (_value(x) for x in node.args)
        if a is None or b is None or not _is_outer_product(a, b):
            continue
        node.op, node.target = "call_function", torch.mul
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
