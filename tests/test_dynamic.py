"""dynamic_shapes="from_graph": a graph Dynamo captured with a dynamic batch dim serves every batch size."""

from __future__ import annotations

import torch

import precompile


def _dynamic_graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    model = model.eval().requires_grad_(False)
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    x = torch.randn(4, 16)
    torch._dynamo.reset()
    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(model, backend=grab)(x)
    assert len(graphs) == 1
    return model, x, *graphs[0]


def test_from_graph_keeps_the_symbolic_batch(tmp_path):
    model, x, gm, example = _dynamic_graph()
    art = precompile.standalone_compile(gm, example, dynamic_shapes="from_graph")
    specs = art.manifest.placeholders
    user = next(i for i, s in enumerate(specs) if s["kind"] == "user_input" and s.get("type") == "tensor")
    size = next(i for i, s in enumerate(specs) if s.get("type") == "int")
    assert isinstance(specs[user]["shape"][0], str) and specs[user]["shape"][1] == 16
    assert art.manifest.parts["fast"] is None  # symbolic sizes take the portable path
    path = art.save(tmp_path / "dyn.pc")
    loaded = precompile.load(path)
    for batch in (4, 7, 1):
        y = torch.randn(batch, 16)
        args = list(example)
        args[user], args[size] = y, batch
        for a in (art, loaded):
            torch.testing.assert_close(a(*args)[0], model(y), rtol=1e-5, atol=1e-5)
