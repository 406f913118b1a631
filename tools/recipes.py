"""Model recipes for benchmarks (``module:function`` specs for ``precompile warmup`` and tools/bench_*.py).

``tools.recipes:transformer_blocks`` is the anchor model of docs/benchmarks.md: ``n`` standard
``nn.TransformerEncoderLayer`` blocks (d_model ``d``, 4 heads, feed-forward 4*d, batch_first), random weights
seeded with 0, input ``float32[batch, seq, d]``.
"""

from __future__ import annotations

import torch


def transformer_blocks(n: int = 4, d: int = 256, heads: int = 4):
    """``(model, inputs_fn)`` for ``n`` encoder blocks of width ``d``; ``inputs_fn(shape)`` gives
    ``(float32[shape.batch, shape.seq, d],)`` drawn from a generator seeded by the shape."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
        model = torch.nn.TransformerEncoder(layer, n, enable_nested_tensor=False)

    def inputs(shape):
        g = torch.Generator().manual_seed(shape.batch * 100003 + shape.seq)
        return (torch.randn(shape.batch, shape.seq, d, generator=g),)

    return model.eval(), inputs
