"""The wrapper as data (precompile.manifest.wrapper.graph): Inductor's FX wrapper graph stored as JSON, checked against
the allow-list and rebuilt into a callable that runs nothing the artifact names.

On CPU Inductor's FX wrapper expresses only graphs without fused kernels (its converter takes Triton kernels
only), so the real producer is exercised on library calls; a Triton launch node is exercised with a launcher
given here.  Refusals are checked on graphs serialized here and then damaged.
"""

from __future__ import annotations

import copy
import json
import operator

import pytest
import torch
import torch._higher_order_ops.triton_kernel_wrap as tkw

from precompile.manifest.wrapper import graph as wg
from precompile.manifest.graph_json import graph_to_json
from precompile.manifest.wrapper.codegen import build
from precompile.inductor.build.fx_wrapper import NotExpressible, wrapper_graph


class Gemms(torch.nn.Module):
    def forward(self, a, b, c):
        return torch.mm(a, b), torch.addmm(c, a, b)


def test_inductor_fx_wrapper_graph_stored_as_json_runs_bit_equal_to_inductor():
    gm = torch.fx.symbolic_trace(Gemms())
    example = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)]
    graph, compiled, kernels = wrapper_graph(gm, example)
    assert kernels == {}  # library calls only
    data = json.loads(json.dumps(wg.to_data(graph)))  # what an artifact stores, read back
    targets = {json.dumps(n["target"]) for n in data["nodes"] if n["op"] == "call_function"}
    assert targets == {'{"fn": "torch:empty_strided"}', '{"op": "aten::mm.out"}', '{"op": "aten::addmm.out"}'}
    fn = build(data)
    for inputs in (example, [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)]):
        got, want = fn(*inputs), compiled(*inputs)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert all(torch.equal(g, e) for g, e in zip(got, Gemms()(*inputs)))


def test_a_graph_with_a_fused_kernel_is_not_expressible_and_says_why():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(NotExpressible, match="only supports Triton kernels"):
        wrapper_graph(gm, [torch.randn(8)])


class TopK(torch.nn.Module):
    def forward(self, x, w):
        return torch.topk(x @ w, 3, dim=-1).values


def test_an_extern_kernel_outside_the_allow_list_keeps_the_python_wrapper_and_says_why():
    """Inductor calls ``aten::topk`` as a fallback kernel, which the FX wrapper expresses (once its alignment
    asserts are off) but the allow-list does not take: the artifact keeps the Python wrapper, naming the node."""
    from precompile.inductor.build.fx_wrapper import stored_graph

    graph, _, _ = wrapper_graph(torch.fx.symbolic_trace(TopK()), [torch.randn(8, 16), torch.randn(16, 32)],
                                {"alignment_asserts": False, "size_asserts": False})
    assert "torch.ops.aten.topk.default" in graph.code
    why = stored_graph(graph)
    assert why.startswith("the wrapper graph is outside the allow-list: node") and "aten::topk.default" in why
    assert isinstance(stored_graph(wrapper_graph(torch.fx.symbolic_trace(Gemms()), [
        torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)])[0]), bytes)


def _launching_graph(launches: int = 1):
    """A wrapper graph as Inductor's FX wrapper writes one for a GPU graph: buffers, a view, a library call
    into a buffer, sizes read from an input, and ``launches`` Triton kernel launches over the buffer."""
    g = torch.fx.Graph()
    x, w, b = g.placeholder("x"), g.placeholder("w"), g.placeholder("b")
    n = g.call_function(torch.ops.aten.sym_size.int, (x, 0))
    buf = g.call_function(torch.empty_strided, ((n, 8), (8, 1)),
                          {"dtype": torch.float32, "device": torch.device("cpu")})
    view = g.call_function(torch.as_strided, (w, (16, 8), (1, 16), 0))
    g.call_function(torch.ops.aten.addmm.out, (b, x, view), {"alpha": 1, "beta": 1, "out": buf})
    numel = g.call_function(operator.mul, (n, 8))
    for _ in range(launches):
        g.call_function(tkw.triton_kernel_wrapper_mutation, (), {
            "kernel_idx": 0, "constant_args_idx": 0, "grid": [(numel, 1, 1)], "tma_descriptor_metadata": {},
            "kwargs": {"in_out_ptr0": buf, "xnumel": numel, "XBLOCK": 256}})
    g.output((buf,))
    return graph_to_json(torch.fx.GraphModule(torch.nn.Module(), g))


def test_a_kernel_launch_goes_to_the_loaders_launcher_with_the_grid_of_the_call():
    data = json.loads(json.dumps(_launching_graph()))
    launches = []

    def launch(**kw):  # stands in for a cubin launch: the kernel applies relu in place
        launches.append((kw["kernel_idx"], kw["grid"], kw["kwargs"]["xnumel"]))
        kw["kwargs"]["in_out_ptr0"].relu_()

    fn = build(data, launch)
    for rows in (4, 9):
        x, w, b = torch.randn(rows, 16), torch.randn(8, 16), torch.randn(8)
        (out,) = fn(x, w, b)
        assert torch.equal(out, torch.relu(torch.addmm(b, x, w.t())))
        assert launches[-1] == (0, [(rows * 8, 1, 1)], rows * 8)
    with pytest.raises(wg.WrapperGraphError, match="no launcher"):
        build(data)


def _damaged(edit):
    data = copy.deepcopy(_launching_graph())
    edit(data)
    return data


def _node(data, target):
    return next(n for n in data["nodes"] if n["target"] == target)


DAMAGES = {
    "a function outside the allow-list": (
        lambda d: _node(d, {"fn": "torch:empty_strided"}).update(target={"fn": "os:system"}), "allow-list"),
    "an ATen op that reads a file": (
        lambda d: _node(d, {"op": "aten::addmm.out"}).update(target={"op": "aten::from_file.default"}), "allow-list"),
    "an ATen view without a bounds check": (
        lambda d: _node(d, {"op": "aten::addmm.out"}).update(target={"op": "aten::_reshape_alias.default"}),
        "allow-list"),
    "a prims op": (
        lambda d: _node(d, {"op": "aten::addmm.out"}).update(target={"op": "prims::view_of.default"}), "allow-list"),
    "another operator namespace": (
        lambda d: _node(d, {"op": "aten::addmm.out"}).update(target={"op": "mylib::evil.default"}), "allow-list"),
    "an operator this torch lacks": (
        lambda d: _node(d, {"op": "aten::addmm.out"}).update(target={"op": "aten::no_such_op.default"}),
        "allow-list"),
    "a module call": (lambda d: d["nodes"][4].update(op="call_module"), "not allowed"),
    "a reference to a later node": (lambda d: d["nodes"][4]["args"].__setitem__(0, {"$node": 9}), "only earlier"),
    "a name that is not an identifier": (lambda d: d["nodes"][3].update(name="x; import os"), "not an identifier"),
    "a dtype that is not one": (
        lambda d: d["nodes"][4]["kwargs"].update(dtype={"$dtype": "load"}), "not one of torch's"),
    "a dtype naming a torch submodule": (
        lambda d: d["nodes"][4]["kwargs"].update(dtype={"$dtype": "_inductor"}), "not one of torch's"),
    "a keyword as a keyword argument": (lambda d: d["nodes"][4]["kwargs"].update({"lambda": 1}), "identifiers"),
    "size arithmetic on a list": (lambda d: _node(d, {"fn": "_operator:mul"}).update(args=[["x"], 10 ** 9]),
                                  "integers and nodes"),
    "a kernel index that is not an integer": (
        lambda d: _node(d, {"hop": "triton_kernel_wrapper_mutation"})["kwargs"].update(kernel_idx=[0]),
        "integer kernel_idx"),
    "a target name that is not a string": (
        lambda d: _node(d, {"fn": "torch:empty_strided"}).update(target={"fn": ["torch:empty_strided"]}),
        "allow-list"),
    "an unknown tag": (lambda d: d["nodes"][4]["kwargs"].update(dtype={"$pickle": "gASV"}), "not allowed"),
    "a long string": (lambda d: d["nodes"][4]["kwargs"].update(dtype="x" * 1000), "more than"),
    "deep nesting": (lambda d: d["nodes"][4]["args"].append([[[[[[[[[[1]]]]]]]]]]), "nested deeper"),
    "a huge list": (lambda d: d["nodes"][4]["args"].append(list(range(wg.MAX_ITEMS + 1))), "more than"),
    "too many nodes": (lambda d: d.update(nodes=[d["nodes"][0]] * (wg.MAX_NODES + 1)), "more than"),
    "no output last": (lambda d: d["nodes"].pop(), "output"),
    "a submodule": (lambda d: d.update(submodules={"m": {}}), "submodules"),
    "another schema": (lambda d: d.update(schema=99), "schema"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_or_hostile_wrapper_graph_is_refused_before_anything_runs(damage, tmp_path):
    edit, why = DAMAGES[damage]
    data = _damaged(edit)
    with pytest.raises(wg.WrapperGraphError, match=why):
        build(data, lambda **kw: (tmp_path / "ran").write_text("ran"))
    assert not (tmp_path / "ran").exists()


class BoundLaunch:
    """A launcher offering ``bind``, as cuda_runtime.GraphLaunch does: the graph calls it directly."""

    def __init__(self):
        self.calls, self.streams = [], []

    def stream(self, device):
        self.streams.append(device)
        return 1000 + device

    def bind(self, kernel_idx):
        if kernel_idx != 0:
            raise KeyError(kernel_idx)

        def run(stream, x, y, z, ptr, numel):
            self.calls.append((stream, x, y, z, numel))
            ptr.relu_()

        return ("in_out_ptr0", "xnumel"), ("in_out_ptr0",), run, 0


def test_a_launcher_with_bind_is_called_directly_with_the_cubins_arguments_in_order():
    launch = BoundLaunch()
    fn = build(json.loads(json.dumps(_launching_graph(launches=2))), launch)
    x, w, b = torch.randn(5, 16), torch.randn(8, 16), torch.randn(8)
    (out,) = fn(x, w, b)
    assert torch.equal(out, torch.relu(torch.addmm(b, x, w.t())))
    # two launches on device 0, one read of its stream for the call
    assert launch.calls == [(1000, 40, 1, 1, 40)] * 2 and launch.streams == [0]
    fn(x, w, b)
    assert launch.streams == [0, 0]
    data = _launching_graph()
    launch_node = next(n for n in data["nodes"] if n["target"] == {"hop": wg.TRITON_LAUNCH})
    launch_node["kwargs"]["kernel_idx"] = 3
    with pytest.raises(wg.WrapperGraphError, match="no launch record"):
        build(data, BoundLaunch())
    data = _launching_graph()  # a made-up address where the kernel takes a pointer
    launch_node = next(n for n in data["nodes"] if n["target"] == {"hop": wg.TRITON_LAUNCH})
    launch_node["kwargs"]["kwargs"]["$dict"][0][1] = 140000000000
    with pytest.raises(wg.WrapperGraphError, match="as pointers"):
        build(data, BoundLaunch())


def test_diff_shows_two_wrapper_graphs_node_by_node():
    from precompile.store.diff import _wrapper_diff
    from precompile.store.lookup import Source

    a, b = _launching_graph(), _launching_graph()
    next(n for n in b["nodes"] if n["target"] == {"op": "aten::addmm.out"})["kwargs"]["beta"] = 0
    blobs = {"a": json.dumps(a).encode(), "b": json.dumps(b).encode()}
    sources = [Source(k * 64, {"parts": {"wrapper_graph": {"graph": k}}}, "here", blobs.get) for k in "ab"]
    diff = _wrapper_diff(*sources, 1)
    assert "-    addmm_out = aten::addmm.out(b, x, as_strided, alpha=1, beta=1, out=empty_strided)" in diff
    assert "+    addmm_out = aten::addmm.out(b, x, as_strided, alpha=1, beta=0, out=empty_strided)" in diff
    assert _wrapper_diff(sources[0], sources[0], 1) == ""


FIRST_CALL = """
import json, sys, torch
from precompile.manifest.wrapper.codegen import build
fn = build(json.loads(open(sys.argv[1], "rb").read()))  # as the graph engine builds it (its launcher needs CUDA)
torch.manual_seed(0)
x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
got = fn(x, w)  # the process's first ATen call with a bool argument (``transposed``)
want = torch.nn.functional.conv2d(x, w, padding=1)
assert torch.equal(got, want), (got - want).abs().max()
print("equal")
"""


def test_a_convolution_is_right_as_the_first_call_of_a_fresh_process(tmp_path):
    """The generated wrapper's globals hold no builtins but ``__import__`` for the C code its calls run: torch's
    argument parser imports ``torch`` on first use from the calling frame's builtins, which once made the first
    ``aten::convolution`` of a process raise ``KeyError: '__import__'`` (a warmed process, as at build, passed)."""
    import subprocess
    import sys

    from conftest import python_env

    from precompile.inductor.build.fx_wrapper import stored_graph

    def conv(x, w):
        return torch.nn.functional.conv2d(x, w, padding=1)

    # without layout optimization Inductor's CPU graph is one library call, which the FX wrapper expresses
    graph, _, _ = wrapper_graph(torch.fx.symbolic_trace(conv), [torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)],
                                {"layout_optimization": False})
    data = stored_graph(graph)
    assert isinstance(data, bytes) and b"aten::convolution.default" in data
    (tmp_path / "conv.json").write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", FIRST_CALL, str(tmp_path / "conv.json")], capture_output=True,
                          text=True, env=python_env(), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "equal", proc.stderr
    # the wrapper's globals: its bound names and one builtin, which hands out torch and imports nothing else
    scope = build(json.loads(data)).__globals__
    assert scope["__builtins__"].keys() == {"__import__"}
    assert scope["__builtins__"]["__import__"]("torch") is torch
    with pytest.raises(ImportError, match="imports only torch, torch.cuda, not 'tabnanny'"):
        scope["__builtins__"]["__import__"]("tabnanny")  # a harmless stdlib module nothing here imports
    assert "tabnanny" not in sys.modules


def test_the_wrapper_imports_only_what_torch_asks_of_it():
    """Issue 39: the wrapper's ``__import__`` hands out ``torch`` (torch's argument parser asks for it) and
    ``torch.cuda`` (a first CUDA allocation's lazy init asks for it; tests/inductor/test_gpu_wrapper_graph.py runs
    that path), as ``__import__`` returns them, and refuses every other module, loaded or not, with its name."""
    import sys

    gm = torch.fx.symbolic_trace(Gemms())
    graph, _, _ = wrapper_graph(gm, [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)])
    imp = build(json.loads(json.dumps(wg.to_data(graph)))).__globals__["__builtins__"]["__import__"]
    assert imp("torch") is torch and imp("torch", None, None, [], 0) is torch
    assert imp("torch.cuda") is torch and imp("torch.cuda", None, None, ["__doc__"], 0) is torch.cuda
    before = set(sys.modules)
    for name in ("os", "subprocess", "ctypes", "torch.utils.cpp_extension", "builtins", "importlib", "sys",
                 "torch.utils", "torch._dynamo", "torchvision"):
        with pytest.raises(ImportError, match=f"not {name!r}") as refused:
            imp(name, None, None, ["__doc__"], 0)
        assert refused.value.name == name
    with pytest.raises(ImportError, match="relative"):
        imp("cuda", None, None, [], 1)
    assert set(sys.modules) == before  # nothing was imported on the way
