"""Model recipes for benchmarks (``module:function`` specs for ``precompile warmup`` and tools/bench/).

``tools.cases.recipes:transformer_blocks`` is the CPU anchor model of docs/benchmarks.md: ``n`` pre-norm transformer
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


def resnet18(num_classes: int = 1000):
    """``(model, inputs_fn)``: torchvision's ResNet-18 with seeded random weights (nothing is downloaded);
    ``inputs_fn(shape)`` gives ``float32[shape.batch, 3, shape.seq, shape.seq]`` images (``--shape 16x224``).

    Raises:
        ImportError: torchvision is not installed.
    """
    from torchvision.models import resnet18 as build

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build(weights=None, num_classes=num_classes)

    def inputs(shape):
        g = torch.Generator().manual_seed(shape.batch * 100003 + shape.seq)
        return (torch.randn(shape.batch, 3, shape.seq, shape.seq, generator=g),)

    return model.eval(), inputs


class DecodeStep(torch.nn.Module):
    """One attention decode step that writes into buffers its caller owns, as a KV-cache decoder does.

    ``forward(x [B, 1, d], pos [1] int64, k_cache [B, T, d], v_cache [B, T, d], last [B, d], counter [B])``:
    the new key goes in with ``index_copy_``, the new value with an ``index_put_`` (``v_cache[:, pos] = v``),
    ``last`` is overwritten by slice assignment and ``counter`` is bumped in place (:meth:`count`); the output is
    ``[B, 1, d]``.  Subclasses replace :meth:`count` and :meth:`combine` (e.g. with custom operators).
    """

    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))

    def forward(self, x, pos, k_cache, v_cache, last, counter):
        k, v = self.k(x), self.v(x)
        k_cache.index_copy_(1, pos, k)
        v_cache[:, pos] = v
        last[:, :] = x[:, 0]
        self.count(counter)
        att = torch.softmax(self.q(x) @ k_cache.transpose(1, 2) / k_cache.shape[-1] ** 0.5, -1)
        return self.combine(att @ v_cache, x)

    def count(self, counter: torch.Tensor) -> None:
        counter.add_(1.0)

    def combine(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return a * 0.5 + x


def decode_step(batch: int = 2, cache_len: int = 8, d: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str = "cpu", cls: type[DecodeStep] = DecodeStep) -> tuple[DecodeStep, dict[str, torch.Tensor]]:
    """A seeded decode step (weights require grad, as every module's do) and its inputs by name: ``x``, ``pos``
    (position 3), random ``k_cache``/``v_cache`` of ``cache_len`` positions, zero ``last`` and ``counter``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(d).to(dtype=dtype, device=device).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    return model, {
        "x": torch.randn(batch, 1, d, generator=gen).to(dtype=dtype, device=device),
        "pos": torch.tensor([3], device=device),
        "k_cache": torch.randn(batch, cache_len, d, generator=gen).to(dtype=dtype, device=device),
        "v_cache": torch.randn(batch, cache_len, d, generator=gen).to(dtype=dtype, device=device),
        "last": torch.zeros(batch, d, dtype=dtype, device=device),
        "counter": torch.zeros(batch, dtype=dtype, device=device),
    }
