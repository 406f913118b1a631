"""precompile.key.passes: the outer-product rewrite changes exactly the matmuls it may, and computes the same bits.

CUDA graphs are described here by fake CUDA example values (no GPU needed to decide what is rewritten); the
rewritten graphs then run on real CPU tensors and must equal the originals bit for bit.  On the GPU,
tests/inductor/test_gpu_paths.py checks the same against cuBLAS and through a stored artifact.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from precompile.key.passes import outer_products_as_mul


def _traced(fn, *shapes, dtype=torch.bfloat16, device="cuda"):
    """``fn`` traced to FX with each node's fake value (``meta["val"]``) on ``device``, and real CPU inputs."""
    gm = torch.fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(s, dtype=dtype, device=device) for s in shapes]
    FakeTensorProp(gm, mode).propagate(*fakes)
    gen = torch.Generator().manual_seed(0)
    real = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    return gm, real


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def _rewritten_equals_original(gm, inputs):
    original = copy.deepcopy(gm)
    n = outer_products_as_mul(gm)
    assert torch.equal(gm(*inputs), original(*inputs))
    return n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_kind_of_outer_product_becomes_a_multiply(dtype):
    def f(a, b, c, d):
        return (a @ b).sum() + torch.matmul(a, b).sum() + torch.bmm(c, d).sum() + c.matmul(d).sum()

    gm, inputs = _traced(f, (32, 1), (1, 256), (2, 16, 1), (2, 1, 8), dtype=dtype)
    assert _rewritten_equals_original(gm, inputs) == 4
    assert _targets(gm).count(torch.mul) == 4
    assert not {torch.matmul, torch.bmm, "matmul"} & set(_targets(gm))


def test_batch_dims_broadcast_as_matmul_does():
    def f(a, b):  # [B, M, 1] @ [1, N]: matmul broadcasts b over B, and so does the multiply
        return torch.matmul(a, b)

    gm, inputs = _traced(f, (3, 32, 1), (1, 64))
    assert _rewritten_equals_original(gm, inputs) == 1
    assert gm(*inputs).shape == (3, 32, 64)


def test_what_is_not_an_exact_outer_product_is_left_alone():
    def f(a, b):
        return a @ b

    inner_two, _ = _traced(f, (32, 2), (2, 256))
    on_cpu, _ = _traced(f, (32, 1), (1, 256), device="cpu")
    integers, _ = _traced(f, (32, 1), (1, 256), dtype=torch.int32)
    untraced = torch.fx.symbolic_trace(f)  # no example values: sizes unknown
    vector, _ = _traced(f, (32, 1), (1,))
    for gm in (inner_two, on_cpu, integers, untraced, vector):
        code = gm.code
        assert outer_products_as_mul(gm) == 0
        assert gm.code == code


def test_float32_is_left_alone_when_tf32_matmuls_round_the_inputs():
    def f(a, b):
        return a @ b

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        gm, _ = _traced(f, (32, 1), (1, 256), dtype=torch.float32)
        assert outer_products_as_mul(gm) == 0
        torch.backends.cuda.matmul.allow_tf32 = False
        assert outer_products_as_mul(gm) == 1
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_rewrites_setting_is_checked(monkeypatch):
    from precompile import config
    from precompile.errors import ConfigError

    monkeypatch.delenv("PRECOMPILE_REWRITES", raising=False)
    assert config.rewrites_enabled()
    monkeypatch.setenv("PRECOMPILE_REWRITES", "off")
    assert not config.rewrites_enabled()
    monkeypatch.setenv("PRECOMPILE_REWRITES", "sometimes")
    with pytest.raises(ConfigError, match="PRECOMPILE_REWRITES must be on or off, got 'sometimes'"):
        config.rewrites_enabled()
