"""Model recipes for benchmarks (``module:function`` specs for ``precompile warmup`` and tools/bench_*.py).

``tools.recipes:transformer_blocks`` is the CPU anchor model of docs/benchmarks.md: ``n`` pre-norm transformer
blocks of width ``d`` (LayerNorm, 4-head self-attention through ``scaled_dot_product_attention``, a 4*d GELU
MLP), random weights seeded with 0, input ``float32[batch, seq, d]``.  It is written out rather than taken from
``nn.TransformerEncoder``, whose eval-mode fast path is one opaque fused operator Inductor cannot compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    """One pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def transformer_blocks(n: int = 4, d: int = 256, heads: int = 4):
    """``(model, inputs_fn)`` for ``n`` blocks of width ``d``; ``inputs_fn(shape)`` gives
    ``(float32[shape.batch, shape.seq, d],)`` drawn from a generator seeded by the shape."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(d, heads) for _ in range(n)])

    def inputs(shape):
        g = torch.Generator().manual_seed(shape.batch * 100003 + shape.seq)
        return (torch.randn(shape.batch, shape.seq, d, generator=g),)

    return model.eval(), inputs
