"""Symbolic shapes take the fast path: one artifact serves every size its guards allow, bit for bit.

Graphs are captured by Dynamo with a batch dim marked dynamic (a SymInt placeholder and ``[s0, 16]`` tensors, as
vLLM's piecewise graphs take ``num_tokens``), compiled in each ``dynamic_shapes`` mode, and loaded in fresh
processes as a serving worker would.
"""

from __future__ import annotations

import json

import _graphs
import pytest
import torch
from conftest import assert_same_output, run_python

import precompile

SIZES = (2, 3, 4, 9, 33)

LOAD_AND_CALL = r"""
import json, sys
import torch
before = set(sys.modules)
import precompile, _graphs
art = precompile.load(sys.argv[1], weights=_graphs.mlp())
outs = {}
for n in map(int, sys.argv[3].split(",")):
    x = _graphs.example(batch=n)
    outs[n] = art(*_graphs.user_inputs(art, {"x": x}))
try:
    art(*_graphs.user_inputs(art, {"x": _graphs.example(batch=1)}))
    refused = None
except precompile.InputMismatchError as err:
    refused = str(err)
torch.save(outs, sys.argv[2])
new = sorted(m for m in set(sys.modules) - before if m.startswith(("torch._inductor", "torch._dynamo", "sympy")))
print(json.dumps({"engine": art.engine_kind, "refused": refused, "new_modules": new}))
"""


@pytest.fixture(scope="module")
def dynamic_mlp():
    model = _graphs.mlp()  # weights require grad, as every module's do; captured and compiled under no_grad
    gm, example = _graphs.capture(model, (_graphs.example(batch=4),), dynamic=((0, 0),))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, dynamic_shapes="from_graph")
    return model, gm, example, art.bind(model)


def test_symbolic_sizes_are_key_factors_and_guards(dynamic_mlp):
    _, _, _, art = dynamic_mlp
    m = art.manifest
    assert m.factors["dynamic_shapes"] == "symbolic" and m.factors["symbols"] == {"s0": [2, None]}
    x = next(p for p in m.placeholders if p.get("type") == "tensor" and p["kind"] == "user_input")
    n = next(p for p in m.placeholders if p.get("type") == "int")
    assert x["shape"] == ["s0", _graphs.D] and n["size"] == "s0" and n["value"] is None
    assert m.shapes["symbols"]["s0"] == {"range": [2, None], "hint": 4}
    assert "2 <=" in m.shapes["guards"]
    assert m.parts["fast"] is not None and m.build["fast_off"] is None


def test_fresh_process_serves_every_size_bit_for_bit(dynamic_mlp, tmp_path):
    model, gm, example, art = dynamic_mlp
    path = art.save(tmp_path / "dyn.pc")
    out_file = tmp_path / "outs.pt"
    report = json.loads(run_python(LOAD_AND_CALL, str(path), str(out_file), ",".join(map(str, SIZES))).splitlines()[-1])
    assert report["engine"] == "fast" and report["new_modules"] == []
    assert report["refused"] and "sizes outside what the artifact was compiled for" in report["refused"] \
        and "s0 in [2, inf]" in report["refused"]
    outs = torch.load(out_file)
    for n in SIZES:
        x = _graphs.example(batch=n)
        with torch.no_grad():
            want = art(*_graphs.user_inputs(art, {"x": x}))  # the fresh compile
            assert_same_output(outs[n], want, rtol=0, atol=0, where=f"batch {n}")
            assert_same_output(outs[n][0], model(x), where=f"batch {n} vs eager")
        assert outs[n][0].requires_grad is False  # as eager under no_grad


def test_backend_with_mark_dynamic_serves_new_sizes_without_recompiling(tmp_path):
    """``precompile.backend`` keeps a Dynamo graph's symbolic sizes (``from_tracing_context``): Dynamo calls the one
    artifact at every batch, and a fresh worker loads it fast from the cache."""
    url = "file://" + str(tmp_path / "cache")
    code = r"""
import json, sys
import torch
import precompile, _graphs
model = _graphs.mlp()
be = precompile.backend(cache=sys.argv[1])
torch._dynamo.reset()
fn = torch.compile(model, backend=be)
outs = {}
with torch.no_grad():
    for n in (4, 7, 12):
        x = _graphs.example(batch=n)
        if n == 4:
            torch._dynamo.mark_dynamic(x, 0)
        outs[n] = (fn(x), model(x))
c = precompile.open_cache(sys.argv[1]).counters()
print(json.dumps({"records": [[r.outcome, r.key] for r in be.records], "counters": c,
                  "max_diff": max(float((a - b).abs().max()) for a, b in outs.values())}))
"""
    first = json.loads(run_python(code, url).splitlines()[-1])
    again = json.loads(run_python(code, url).splitlines()[-1])
    assert [o for o, _ in first["records"]] == ["built"]  # one graph for every batch size
    assert [o for o, _ in again["records"]] == ["hit"] and again["records"][0][1] == first["records"][0][1]
    assert again["counters"]["loads_fast"] == 1 and again["counters"]["loads_portable"] == 0
    assert first["max_diff"] < 1e-5 and again["max_diff"] < 1e-5
    gm, example = _graphs.capture(_graphs.mlp(), (_graphs.example(batch=4),), dynamic=((0, 0),))
    # the same graph compiled directly with from_graph has the same key: both keep the graph's symbolic sizes
    with torch.no_grad():
        assert _graphs.key(gm, example, dynamic_shapes="from_graph") == first["records"][0][1]


def test_from_example_inputs_specializes_a_size_input(dynamic_mlp):
    _, gm, example, _ = dynamic_mlp
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, dynamic_shapes="from_example_inputs").bind(_graphs.mlp())
    m = art.manifest
    assert m.factors["dynamic_shapes"] == "static" and m.shapes == {} and m.parts["fast"] is not None
    n = next(p for p in m.placeholders if p.get("type") == "int")
    assert n["value"] == 4
    x4, x5 = _graphs.example(batch=4), _graphs.example(batch=5)
    with torch.no_grad():
        assert_same_output(art(*_graphs.user_inputs(art, {"x": x4}))[0], _graphs.mlp()(x4))
        with pytest.raises(precompile.InputMismatchError, match="specialized"):
            art(*[x5 if isinstance(a, torch.Tensor) else 5 for a in _graphs.user_inputs(art, {"x": x4})])


def test_size_range_is_the_callers_contract(dynamic_mlp):
    """``size_range`` (vLLM's compile range): the caller vouches for sizes Dynamo's 0/1 specialization left out
    (1 here); the range is a key factor and bounds every call."""
    model, gm, example, plain = dynamic_mlp
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, dynamic_shapes="from_graph", size_range=(1, 64)).bind(model)
    assert art.key != plain.key and art.manifest.factors["symbols"] == {"s0": [1, 64]}
    assert art.manifest.shapes["symbols"]["s0"]["range"] == [1, 64]
    with torch.no_grad():
        for n in (1, 64):
            x = _graphs.example(batch=n)
            assert_same_output(art(*_graphs.user_inputs(art, {"x": x}))[0], model(x))
        with pytest.raises(precompile.InputMismatchError, match="<= 64"):
            art(*_graphs.user_inputs(art, {"x": _graphs.example(batch=65)}))
    with pytest.raises(ValueError, match="symbolic sizes"):
        precompile.standalone_compile(*_graphs.graph("dynamo"), size_range=(1, 8))
