"""The torch.compile backend degrades instead of failing; the serialized graph rebuilds the same graph."""

from __future__ import annotations

import logging
from pathlib import Path

import _graphs
import pytest
import torch

import precompile
from precompile.key.graph import graph_from_json, graph_to_json, normalize_graph


def test_backend_compiles_uncached_when_a_graph_cannot_be_stored(tmp_path, caplog):
    def local_fn(x):  # a local function kept in the graph: not importable by name, so not storable
        return x * 2 + 1

    torch._dynamo.allow_in_graph(local_fn)

    def f(x):
        return local_fn(torch.relu(x)) - 3

    x = torch.randn(8, 8)
    be = precompile.backend(cache="file://" + str(tmp_path / "cache"))
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="precompile"):
        out = torch.compile(f, backend=be)(x)
    torch.testing.assert_close(out, f(x))
    assert be.records == []
    assert "compiling it with Inductor directly, uncached" in caplog.text and "local_fn" in caplog.text
    assert not any(Path(tmp_path, "cache", "ref").glob("*"))


def test_bad_engine_mode_fails_before_any_cache_lookup(tmp_path, monkeypatch):
    gm, inputs = _graphs.dynamo_graph(_graphs.mlp().requires_grad_(False), _graphs.example())
    url = "file://" + str(tmp_path / "cache")
    monkeypatch.setenv("PRECOMPILE_ENGINE", "turbo")
    with pytest.raises(ValueError, match="PRECOMPILE_ENGINE"):
        precompile.standalone_compile(gm, inputs, cache=url)
    assert precompile.open_cache(url).counters()["misses"] == 0


def test_serialized_graph_rebuilds_an_equivalent_module():
    model = _graphs.mlp()
    x = _graphs.example()
    for gm, inputs in (_graphs.dynamo_graph(model, x), _graphs.make_fx_graph(model, x)):
        norm, flat = normalize_graph(gm, inputs)
        data = graph_to_json(norm.gm)
        rebuilt = graph_from_json(data)
        assert graph_to_json(rebuilt) == data
        torch.testing.assert_close(rebuilt(*flat), norm.gm(*flat), rtol=0, atol=0)


class _Norm(torch.nn.Module):
    """Python floats read from modules (LayerNorm's eps, a scale): under ``dynamic=True`` Dynamo passes them in as
    0-d tensors read with ``.item()``, and every parameter is a graph input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.scale = 0.125

    def forward(self, x):
        return self.norm(self.lin(x)).view(x.shape[0], 4, 8).sum(-1) * self.scale


def test_dynamic_true_graphs_with_float_attributes_are_cached_and_hit(tmp_path):
    # both used to fall back to an uncached compile: AOTAutograd refakified every input in a fresh tracing context
    # (new symbols without sources for each parameter size, and the floats' .item() lost its value)
    model = _Norm().eval()
    url = "file://" + str(tmp_path / "cache")
    outs = []
    for outcome in ("built", "hit"):
        be = precompile.backend(cache=url)
        torch._dynamo.reset()
        with torch.no_grad():
            f = torch.compile(model, backend=be, dynamic=True)
            outs.append([f(torch.randn(n, 32, generator=torch.Generator().manual_seed(n))) for n in (3, 7)])
        assert [r.outcome for r in be.records] == [outcome]
    with torch.no_grad():
        eager = [model(torch.randn(n, 32, generator=torch.Generator().manual_seed(n))) for n in (3, 7)]
    for got, hit, want in zip(*outs, eager):
        torch.testing.assert_close(got, want)
        assert torch.equal(got, hit)
