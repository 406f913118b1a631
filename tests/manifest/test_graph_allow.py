"""Stored FX graphs come back through a positive allow-list (precompile.manifest.graph_allow): real Dynamo, make_fx
and export graphs round-trip (custom operators of a registered namespace included), and the probe's graphs of
issue 34 (a call_method chain through ``__getattribute__``, operator-packet walks to ``import_module`` and
``load_library``, names that would reach the generated code) are refused with an ``ArtifactFormatError`` naming the
node, importing nothing.  A hypothesis fuzz mixes allowed and hostile targets, methods, names and arguments.
"""

from __future__ import annotations

import functools
import json
import sys

import _custom_ops  # noqa: F401 - registers pctest::scale_add
import _graphs
import pytest
import torch
from conftest import run_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from precompile.manifest import graph_allow
from precompile.manifest.graph_json import _encode_target, graph_from_json, graph_to_json
from precompile.errors import ArtifactFormatError, ConfigError
from precompile.key.graph import normalize_graph


class _Rich(torch.nn.Module):
    """A Dynamo graph with what models put in one: a custom operator, tensor attributes and methods, torch and
    functional calls, size arithmetic, a grad-mode region and ``.data`` (as vLLM's pieces hold)."""

    def forward(self, x, y):
        a = torch.ops.pctest.scale_add(x, y, 0.5)
        b = a.T.contiguous().view(-1).reshape(4, 4).transpose(0, 1)
        c = torch.nn.functional.layer_norm(b, (4,)) + torch.sin(x) * 2
        with torch.enable_grad():  # the capture runs under no_grad: Dynamo emits the switch
            d = c.sum(-1)
        return c.permute(1, 0)[0] * x.shape[0], d + y.data


def _round_trip(gm, inputs):
    norm, flat = normalize_graph(gm, inputs)
    data = graph_to_json(norm.gm)
    rebuilt = graph_from_json(json.loads(json.dumps(data)))
    assert graph_to_json(rebuilt) == data
    with torch.no_grad():  # as captured (a graph's grad-mode switches restore the mode it was traced in)
        torch.testing.assert_close(rebuilt(*flat), norm.gm(*flat), rtol=0, atol=0)
    assert torch.is_grad_enabled()
    return data


def test_real_graphs_round_trip():
    for kind in _graphs.KINDS:
        _round_trip(*_graphs.graph(kind))
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    data = _round_trip(*_capture(_Rich(), (x, y)))
    targets = [n["target"] for n in data["nodes"]]
    assert {"oppacket": "pctest::scale_add"} in targets and {"fn": "builtins:getattr"} in targets
    assert {"fn": "torch._C:_set_grad_enabled"} in targets and {"fn": "torch._C._autograd:_get_data_attr"} in targets
    from torch.fx.experimental.proxy_tensor import make_fx  # an ATen graph calling the custom op

    _round_trip(make_fx(lambda a, b: torch.ops.pctest.scale_add(a, b, 2.0).relu())(x, y), [x, y])


def _capture(model, inputs):
    from precompile.builder.capture import capture_graphs

    [graph] = capture_graphs(model, inputs)
    return graph


def _graph(*nodes, submodules=None):
    """A stored graph: a placeholder ``x``, ``nodes`` (``(name, op, target, args, kwargs)``), output of the last."""
    specs = [{"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {}}]
    specs += [{"name": n, "op": op, "target": t, "args": a, "kwargs": k} for n, op, t, a, k in nodes]
    specs.append({"name": "output", "op": "output", "target": "output", "args": [{"$node": len(specs) - 1}],
                  "kwargs": {}})
    return {"schema": 1, "submodules": submodules or {}, "nodes": specs}


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """``(name, marker)``: an importable module that writes ``marker`` when imported."""
    marker = tmp_path / "imported"
    (tmp_path / "pc_probe_payload.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "pc_probe_payload", marker
    assert "pc_probe_payload" not in sys.modules and not marker.exists()


def _n(i):
    return {"$node": i}


PROBES = {
    "getattribute chain": (_graph(
        ("a", "call_method", "__getattribute__", [_n(0), "__repr__"], {}),
        ("b", "call_method", "__getattribute__", [_n(1), "__globals__"], {}),
        ("c", "call_method", "get", [_n(2), "__builtins__"], {}),
        ("d", "call_method", "get", [_n(3), "__import__"], {}),
        ("e", "call_method", "__call__", [_n(4), "MODULE"], {})), "'a', 'call_method'", "__getattribute__"),
    "import_module walk": (_graph(("a", "call_function", {"oppacket": "__class__::import_module"}, [_n(0), "MODULE"],
                                   {})), "'a', 'call_function'", "__class__::import_module"),
    "load_library walk": (_graph(("a", "call_function", {"oppacket": "__class__::load_library"}, [_n(0), "/x.so"],
                                  {})), "'a', 'call_function'", "__class__::load_library"),
    "ops attribute": (_graph(("a", "call_function", {"op": "import_module::x.default"}, ["MODULE"], {})),
                      "'a'", "import_module"),
    "importable fn": (_graph(("a", "call_function", {"fn": "importlib:import_module"}, ["MODULE"], {})), "'a'",
                      "importlib:import_module"),
    "a file operator": (_graph(("a", "call_function", {"op": "aten::from_file.default"}, ["/etc/passwd"], {})),
                        "'a'", "filename"),
    "getattr of a dunder": (_graph(("a", "call_function", {"fn": "builtins:getattr"}, [_n(0), "__class__"], {})),
                            "'a'", "__class__"),
    "get_attr walk": (_graph(("a", "get_attr", "__class__", [], {})), "'a', 'get_attr'", "__class__"),
    "placeholder code": ({"schema": 1, "submodules": {}, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x=__import__('MODULE')", "args": [], "kwargs": {}},
        {"name": "output", "op": "output", "target": "output", "args": [_n(0)], "kwargs": {}}]}, "'x'", "__import__"),
    "keyword code": (_graph(("a", "call_function", {"op": "aten::relu.default"}, [_n(0)],
                             {"x=__import__('MODULE'),y": 1})), "'a'", "kwargs"),
    "method code": (_graph(("a", "call_method", "relu();__import__('MODULE').x", [_n(0)], {})), "'a'", "relu()"),
    "sub-graph name": (_graph(submodules={"__class__": _graph()}), "sub-graph", "__class__"),
    "forward reference": (_graph(("a", "call_function", {"op": "aten::relu.default"}, [_n(5)], {})), "'a'",
                          "$node"),
}


@pytest.mark.parametrize("case", sorted(PROBES))
def test_probe_graphs_are_refused_naming_the_node(case, probe_module):
    name, _ = probe_module
    data, where, what = PROBES[case]
    data = json.loads(json.dumps(data).replace("MODULE", name))
    with pytest.raises(ArtifactFormatError) as err:
        graph_from_json(data)
    assert where in str(err.value) and what in str(err.value), str(err.value)


def test_custom_namespaces_need_a_registration_or_the_setting(monkeypatch):
    data = _graph(("a", "call_function", {"op": "pcnowhere::op.default"}, [_n(0)], {}))
    with pytest.raises(ArtifactFormatError, match="not an operator registered here"):
        graph_from_json(data)
    data = _graph(("a", "call_function", {"op": "_c10d_functional::wait_tensor.default"}, [_n(0)], {}))
    with pytest.raises(ArtifactFormatError, match="PRECOMPILE_GRAPH_OP_NAMESPACES"):
        graph_from_json(data)
    monkeypatch.setenv("PRECOMPILE_GRAPH_OP_NAMESPACES", "quantized, _c10d_functional")
    gm = graph_from_json(data)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        torch.ops._c10d_functional.wait_tensor.default]
    monkeypatch.setenv("PRECOMPILE_GRAPH_OP_NAMESPACES", "a,__class__")
    with pytest.raises(ConfigError, match="PRECOMPILE_GRAPH_OP_NAMESPACES"):
        graph_from_json(data)


def test_every_function_on_the_list_is_stored_under_its_name():
    class Node:
        op, name = "call_function", "n"

    for name, fn in graph_allow.functions().items():
        node = Node()
        node.target = fn
        assert _encode_target(node) == {"fn": name}


def test_torch_registers_no_namespace_the_list_does_not_know():
    out = run_python("import torch, torch._inductor.config, torch.distributed, torch._dynamo, json\n"
                     "import torch._inductor.lowering\n"
                     "print(json.dumps(sorted({n.split('::')[0] for n in torch._C._dispatch_get_all_op_names()})))")
    found = set(json.loads(out.splitlines()[-1]))
    assert found - graph_allow.TORCH_NAMESPACES - {"aten", "prims"} == set()


# ------------------------------------------------------------------------------------------------------- fuzz

HOSTILE_TARGETS = [{"fn": "os:system"}, {"fn": "builtins:eval"}, {"fn": "builtins:__import__"},
                   {"fn": "torch:load"}, {"fn": "torch.serialization:load"}, {"fn": "torch:from_file"},
                   {"fn": "torch._ops:_Ops.import_module"}, {"fn": "torch:__getattr__"}, {"fn": "operator:attrgetter"},
                   {"oppacket": "__class__::import_module"}, {"oppacket": "__class__::load_library"},
                   {"oppacket": "aten::__getattribute__"}, {"op": "aten::__class__.__init__"},
                   {"op": "aten::from_file.default"}, {"op": "aten::set_.source_Storage"}, {"op": "aten::save.default"},
                   {"op": "c10d::allreduce_.default"}, {"hop": "__class__"}, {"hop": "triton_kernel_wrapper_mutation"},
                   {"op": "import_module::x.default"}, {"fn": 1}, {"op": ["aten::mm"]}, "torch:relu", None]
ALLOWED_TARGETS = [{"op": "aten::relu.default"}, {"op": "aten::add.Tensor"}, {"oppacket": "aten::mul"},
                   {"op": "pctest::scale_add.default"}, {"fn": "torch:relu"}, {"fn": "_operator:add"},
                   {"fn": "_operator:getitem"}, {"fn": "torch.nn.functional:relu"}, {"fn": "torch:sym_max"},
                   {"fn": "math:ceil"}, {"fn": "builtins:getattr"}, {"hop": "wrap"}, {"op": "prims::sin.default"}]
GOOD_METHODS = ["view", "sum", "relu", "item", "size", "transpose", "contiguous"]
BAD_METHODS = ["__getattribute__", "__call__", "__reduce_ex__", "get", "system", "storage", "register_hook", "numpy",
               "__class__", "x; import os", "apply_", "untyped_storage", "view()"]
GOOD_NAMES = ["x", "a", "b_1", "l_x_", "add"]
BAD_NAMES = ["__class__", "__init__", "x=1", "import os", "π", "if", "a.b", "", "forward", "sub.__dict__"]
GOOD_LEAVES = [None, True, 0, 2, -1, 0.5, "T", "cpu", {"$float": "nan"}, {"$dtype": "float32"}, {"$device": "cpu"},
               {"$ellipsis": True}, {"$size": [2, 2]}, {"$slice": [None, 2, None]}]
BAD_LEAVES = [{"$float": "1e9"}, {"$dtype": "load"}, {"$device": "xla:0"}, {"$import": "os"}, {"a": 1, "b": 2},
              {"$node": "0"}, {"$node": -1}, {"$node": 99}, {"$size": [{"$node": 0}]}, {"$dict": [[[1], 2]]}]


@functools.cache
def _arg(n_nodes, hostile):
    leaf = st.sampled_from(GOOD_LEAVES + [{"$node": i} for i in range(n_nodes)])
    if hostile:
        leaf = st.one_of(leaf, st.sampled_from(BAD_LEAVES), st.text(max_size=6), st.floats(allow_infinity=False))
    return st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.builds(lambda v: {"$tuple": v}, st.lists(inner, max_size=3)),
                                                      st.builds(lambda v: {"$dict": [["k", v]]}, inner)), max_leaves=5)


@functools.cache
def _strategies(n_nodes, hostile):
    """The node-level strategies for node ``n_nodes`` of a graph (built once: hypothesis validates each new one)."""
    def pick(good, bad):
        return st.sampled_from(good + bad if hostile else good)

    ops = ["placeholder", "call_function", "call_function", "call_method", "get_attr", "call_module"]
    return {
        "op": pick(ops, ["bogus"]) if n_nodes or hostile else st.just("placeholder"),
        "placeholder": pick([f"p{n_nodes}"], BAD_NAMES + ["x"]), "call_function": pick(ALLOWED_TARGETS,
                                                                                         HOSTILE_TARGETS),
        "call_method": pick(GOOD_METHODS, BAD_METHODS), "get_attr": pick(["sub"], BAD_NAMES),
        "call_module": pick(["sub"], BAD_NAMES), "bogus": st.just("x"), "name": pick(GOOD_NAMES, BAD_NAMES),
        "attr": pick(["T", "real", "shape"], ["__class__", "grad_fn", "storage"]),
        "args": st.lists(_arg(n_nodes, hostile), max_size=3),
        "kwargs": st.dictionaries(pick(GOOD_NAMES, BAD_NAMES), _arg(n_nodes, hostile), max_size=2),
        "receiver": st.builds(lambda i: {"$node": i}, st.integers(0, max(n_nodes - 1, 0))),
    }


SUBMODULES = st.sampled_from([{"sub": _graph()}, {}, {"__class__": _graph()}, {"sub": {"schema": 2}},
                              {"training": _graph()}])


@st.composite
def fuzzed_graphs(draw):
    """``(graph, hostile)``: a graph of allowed things only, or one mixing in hostile targets, names and values."""
    hostile = draw(st.booleans())
    specs = []
    for i in range(draw(st.integers(1, 6))):
        s = _strategies(i, hostile)
        op = draw(s["op"])
        target = draw(s[op])
        args, kwargs = draw(s["args"]), draw(s["kwargs"])
        if op in ("call_method", "call_function") and i and (not hostile or draw(st.booleans())):
            if target == {"fn": "builtins:getattr"}:
                args, kwargs = [draw(s["receiver"]), draw(s["attr"])], {}
            elif op == "call_method":
                args = [draw(s["receiver"]), *args]
            elif isinstance(target, dict) and str(target.get("fn")).startswith("_operator:"):
                args, kwargs = [draw(s["receiver"]), 2], {}
        if op == "placeholder" and (not hostile or draw(st.booleans())):
            args, kwargs = [], {}
        specs.append({"name": draw(s["name"]), "op": op, "target": target, "args": args, "kwargs": kwargs})
    specs.append({"name": "output", "op": "output", "target": "output",
                  "args": [{"$node": draw(st.integers(0, len(specs) - 1))}], "kwargs": {}})
    return {"schema": 1, "submodules": draw(SUBMODULES) if hostile else {"sub": _graph()}, "nodes": specs}, hostile


def _only_allowed(gm):
    table = set(map(id, graph_allow.functions().values()))
    for node in gm.graph.nodes:
        t = node.target
        if node.op == "call_function":
            op_name = (t._schema.name if isinstance(t, torch._ops.OpOverload)
                       else getattr(t, "_qualified_op_name", ""))
            assert (isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
                    and op_name.split("::")[0] in ("aten", "prims", "pctest")
                    or id(t) in table or isinstance(t, torch._ops.HigherOrderOperator)), t
        elif node.op == "call_method":
            assert t in graph_allow.METHODS
        elif node.op in ("get_attr", "call_module"):
            assert isinstance(gm.get_submodule(t), torch.fx.GraphModule)
    assert "__import__" not in gm.code


def test_hostile_graphs_are_refused_or_call_only_allowed_things():
    graph_from_json(_graph(("a", "call_function", {"fn": "builtins:getattr"}, [_n(0), "T"], {}),
                           ("b", "call_method", "sum", [_n(1)], {"dim": 0})))  # warm: lazy imports of torch.fx
    outcomes = {"refused": 0, "rebuilt": 0}

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(fuzzed_graphs())
    def check(case):
        data, hostile = case
        before = set(sys.modules)
        try:
            gm = graph_from_json(data)
        except ArtifactFormatError:
            assert hostile, json.dumps(data)  # a graph of allowed things only comes back
            outcomes["refused"] += 1
        else:
            outcomes["rebuilt"] += 1
            _only_allowed(gm)
            graph_from_json(json.loads(json.dumps(graph_to_json(gm))))
        assert set(sys.modules) == before

    check()
    assert min(outcomes.values()) >= 100, outcomes  # not vacuous: both outcomes occur
