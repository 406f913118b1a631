"""The attention backend ``scaled_dot_product_attention`` is compiled to is part of the key (precompile.key.sdpa).

The bug this guards against: torch picks SDPA's backend when a graph is traced, from the backends enabled (and, on
CUDA, their priority order), so one graph compiled under ``sdpa_kernel(MATH)`` and under the defaults got one key
and a shared cache served whichever was built first.
"""

from __future__ import annotations

import _graphs
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import precompile
from precompile.key import sdpa
from precompile.ops.rebuild import rebuild_one


class Attention(torch.nn.Module):
    """Causal self-attention over ``x`` [batch, sequence, hidden] in ``heads`` heads, through SDPA."""

    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.qkv, self.heads = torch.nn.Linear(hidden, 3 * hidden), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)


def _attention_graph():
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 24, 32)
    gm, inputs = _graphs.capture(model, (x,))
    return model, x, gm, inputs


def _wrapper(art) -> str:
    return "".join(art.blob(d).decode() for d in art.manifest.parts["wrappers"].values())


def test_attention_backends_are_a_key_factor_and_each_setting_gets_its_own_artifact(tmp_path):
    model, x, gm, inputs = _attention_graph()
    url = "file://" + str(tmp_path / "cache")
    with torch.no_grad():
        default = precompile.standalone_compile(gm, inputs, cache=url)
        with sdpa_kernel([SDPBackend.MATH]):
            math = precompile.standalone_compile(gm, inputs, cache=url)
        want = model(x)
    assert default.key != math.key and (default.outcome, math.outcome) == ("built", "built")
    assert default.manifest.factors["ambient"]["sdpa"] == {"enabled": ["flash", "efficient", "math", "cudnn"]}
    assert math.manifest.factors["ambient"]["sdpa"] == {"enabled": ["math"]}
    # what each compiled: the CPU's fused flash kernel by default, the math decomposition under MATH alone
    assert "_scaled_dot_product_flash_attention_for_cpu" in _wrapper(default)
    assert "_scaled_dot_product_flash_attention_for_cpu" not in _wrapper(math)
    with torch.no_grad():
        for art in (default, math):
            torch.testing.assert_close(art(*inputs)[0], want, rtol=1e-5, atol=1e-5)
        again = precompile.standalone_compile(gm, inputs, cache=url)
    assert again.outcome == "hit" and again.key == default.key  # the setting restored, the default's artifact
    assert sdpa.state({"cpu"}, None) == {"enabled": ["flash", "efficient", "math", "cudnn"]}


def test_graphs_without_attention_carry_no_attention_factor():
    gm, inputs = _graphs.graph("dynamo")
    base = _graphs.key(gm, inputs)
    with sdpa_kernel([SDPBackend.MATH]):
        assert _graphs.key(gm, inputs) == base  # the keys of graphs without SDPA did not change
    _, _, agm, ainputs = _attention_graph()
    assert sdpa.sdpa_calls(agm) == 1 and sdpa.sdpa_calls(gm) == 0


def test_a_rebuild_restores_the_recorded_attention_backends(tmp_path):
    _, _, gm, inputs = _attention_graph()
    url = "file://" + str(tmp_path / "cache")
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        art = precompile.standalone_compile(gm, inputs, cache=url)
    assert torch.backends.cuda.flash_sdp_enabled()  # the block above restored the switches
    out = rebuild_one(precompile.open_cache(url), art.key, force=True)  # run with every backend enabled
    assert (out.outcome, out.new_key) == ("rebuilt", art.key), out.detail
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.cudnn_sdp_enabled()


def test_fast_start_order_puts_flash_and_efficient_ahead_and_priority_restores_torchs():
    assert sdpa.fast_start_order(["cudnn", "flash", "efficient", "math"]) == ["flash", "efficient", "cudnn", "math"]
    assert sdpa.fast_start_order(["flash", "efficient", "math", "cudnn", "overrideable"]) == [
        "flash", "efficient", "math", "cudnn", "overrideable"]
    before = torch._C._get_sdp_priority_order()
    with sdpa.priority(["math", "flash", "efficient", "cudnn", "overrideable"]):
        assert torch._C._get_sdp_priority_order() == [0, 1, 2, 3, 4]
    assert torch._C._get_sdp_priority_order() == before
    with pytest.raises(KeyError):
        with sdpa.priority(["warp-speed"]):
            pass
    assert torch._C._get_sdp_priority_order() == before
