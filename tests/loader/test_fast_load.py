"""The fast load path: carried binaries, nothing compiled, no compile-time modules; the portable path as fallback.

Every test loads in a fresh process, as a serving worker would.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import _graphs
import pytest
import torch
from conftest import assert_same_output, run_python

import precompile
from precompile.inductor.load import cuda_runtime, runtime

LOAD_AND_RUN = r"""
import json, sys, time
import torch
before = set(sys.modules)
import precompile, _graphs
t = time.perf_counter()
art = precompile.load(sys.argv[1], weights=_graphs.mlp())   # weights bound by name (FQN)
out = art(_graphs.example())
seconds = time.perf_counter() - t
new = sorted(m for m in set(sys.modules) - before if m.startswith(("torch._inductor", "torch._dynamo")))
ours = sorted(m for m in set(sys.modules) - before if m.startswith("precompile.inductor"))
torch.save(out, sys.argv[2])
print(json.dumps({"engine": art.engine_kind, "seconds": seconds, "new_modules": new, "inductor_modules": ours}))
"""


@pytest.fixture(scope="module")
def dynamo_artifact(tmp_path_factory):
    model = _graphs.mlp().requires_grad_(False)  # inference: the fast path is for serving
    gm, inputs = _graphs.dynamo_graph(model, _graphs.example())
    art = precompile.standalone_compile(gm, inputs)
    path = tmp_path_factory.mktemp("fast") / "mlp.pc"
    art.save(path)
    return art, gm, inputs, path


def _load_in_fresh_process(path: Path, tmp_path: Path, env: dict | None = None) -> tuple[dict, object]:
    out_file = tmp_path / "out.pt"
    report = json.loads(run_python(LOAD_AND_RUN, str(path), str(out_file), env=env).splitlines()[-1])
    return report, torch.load(out_file)


@pytest.fixture(scope="module")
def fast_load(dynamo_artifact, tmp_path_factory):
    """``(report, outputs)`` of the artifact loaded and called once in a fresh process, through the fast path."""
    return _load_in_fresh_process(dynamo_artifact[3], tmp_path_factory.mktemp("fast_load"))


def test_training_graph_takes_the_portable_path_only():
    model = _graphs.mlp()  # parameters require grad: Inductor compiles forward and backward
    gm, inputs = _graphs.dynamo_graph(model, _graphs.example())
    art = precompile.standalone_compile(gm, inputs)
    assert art.manifest.parts["fast"] is None
    assert len(art.manifest.parts["wrappers"]) == 2


def test_cpu_artifact_offers_the_fast_path(dynamo_artifact):
    art, *_ = dynamo_artifact
    fast = art.manifest.parts["fast"]
    assert fast is not None and fast["wrapper"] in art.manifest.parts["wrappers"]
    # the fast path needs only the rewritten wrapper (stored at build) and the binaries, not the payload
    needed = set(art.manifest.load_digests())
    assert fast["source"] in needed and art.manifest.parts["engine_payload"] not in needed
    rewritten = art.blob(fast["source"]).decode()
    original = art.blob(art.manifest.parts["wrappers"][fast["wrapper"]]).decode()
    assert rewritten == runtime.rewrite_wrapper(original) and rewritten != original and "= __pc." in rewritten
    assert all(d in needed for k in art.manifest.kernels for d in k["binaries"].values())


def test_fresh_process_loads_without_compiling(dynamo_artifact, fast_load):
    art, gm, inputs, path = dynamo_artifact
    report, out = fast_load
    assert report["engine"] == "fast"
    # no Inductor/Dynamo module was imported: nothing was probed, compiled or traced
    assert report["new_modules"] == []
    assert_same_output(out, gm(*inputs), rtol=0, atol=0)


def test_a_fast_load_imports_the_load_side_only(fast_load):
    """precompile.inductor's build side (compile, harvest, the fast plan...) is never imported by a fast load and
    its call (tests/test_layout.py keeps load/ from importing it)."""
    report, _ = fast_load
    assert report["engine"] == "fast"
    assert "precompile.inductor.load.runtime" in report["inductor_modules"], report["inductor_modules"]
    assert [m for m in report["inductor_modules"] if m.startswith("precompile.inductor.build")] == []


def test_portable_path_gives_the_same_outputs(dynamo_artifact, tmp_path):
    art, gm, inputs, path = dynamo_artifact
    report, out = _load_in_fresh_process(path, tmp_path, env={"PRECOMPILE_ENGINE": "portable"})
    assert report["engine"] == "portable"
    assert any(m.startswith("torch._inductor") for m in report["new_modules"])
    assert_same_output(out, gm(*inputs))


def test_artifact_for_another_cpu_isa_is_refused(dynamo_artifact, tmp_path):
    art, *_ = dynamo_artifact
    unpacked = art.save(tmp_path / "unpacked", format="unpacked")
    manifest = json.loads((unpacked / "manifest.json").read_text())
    here = manifest["env"]["cpu_capability"]
    manifest["env"]["cpu_capability"] = "NEON" if here != "NEON" else "AVX2"
    (unpacked / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(precompile.EnvironmentMismatchError) as info:
        precompile.load(unpacked)
    assert info.value.reasons == [("cpu_capability", manifest["env"]["cpu_capability"], here)]
    assert "cpu_capability" in str(info.value)


def test_bad_engine_mode_is_a_clear_error(dynamo_artifact, monkeypatch):
    _, _, _, path = dynamo_artifact
    monkeypatch.setenv("PRECOMPILE_ENGINE", "turbo")
    with pytest.raises(ValueError, match="PRECOMPILE_ENGINE"):
        precompile.load(path)


# ------------------------------------------------------------------------------------------- GPU (Triton)
CUDA_WRAPPER = Path(__file__).parents[1] / "data" / "inductor_2_11_cuda_wrapper.txt"  # torch 2.11, H200, 3 kernels

EXEC_CUDA_WRAPPER = r"""
import hashlib, json, sys
import torch
torch._C._cuda_getCurrentRawStream = getattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0)
before = set(sys.modules)
from precompile.inductor.build import harvest
from precompile.inductor.load import runtime
source = open(sys.argv[1]).read()
kernels = {hashlib.sha256(text.encode()).hexdigest(): name for name, _, text in harvest.TRITON_KERNEL.findall(source)}
seen = []

class Runtime(runtime.FastRuntime):
    def load_triton(self, text):
        seen.append(kernels[hashlib.sha256(text.encode()).hexdigest()])
        return object()

ns = {"__name__": "w", "__pc": Runtime({}, {"addmm": torch.addmm}, {})}
exec(compile(runtime.rewrite_wrapper(source), "w", "exec"), ns)
new = sorted(m for m in set(sys.modules) - before
             if m.startswith(("torch._inductor", "torch._dynamo", "triton", "sympy")))
print(json.dumps({"seen": seen, "kernels": sorted(kernels.values()), "new_modules": new, "call": callable(ns["call"])}))
"""


def test_cuda_wrapper_runs_with_stand_ins_only():
    """Inductor 2.11's CUDA wrapper module, rewritten: every compile-time import (Inductor, Triton) is a stand-in,
    and every Triton kernel is asked of the runtime by the exact source text the build harvested."""
    import ast

    source = CUDA_WRAPPER.read_text()
    rewritten = runtime.rewrite_wrapper(source)
    assert rewritten is not None
    for node in ast.parse(rewritten).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n.startswith(("torch._inductor", "triton")) for n in names), ast.unparse(node)
    report = json.loads(run_python(EXEC_CUDA_WRAPPER, str(CUDA_WRAPPER)).splitlines()[-1])
    assert report["call"] and report["new_modules"] == []
    assert sorted(report["seen"]) == report["kernels"] and len(report["kernels"]) == 3


def test_triton_launcher_computes_the_grid_of_the_picked_config():
    record = {"name": "triton_per_fused_amax_mul_2", "params": ["in_ptr0", "out_ptr0", "xnumel", "r0_numel"],
              "passed": ["in_ptr0", "out_ptr0", "xnumel"], "arg_tys": "OOiO", "scratch": 1, "num_warps": 8,
              "shared": 64, "grid": ["grid_0 = -((xnumel) // -(32))", "grid_1 = 1", "grid_2 = 1"]}
    calls = []
    run = cuda_runtime.launcher_function(record, lambda *a: calls.append(a), "FUNCTION")
    run("a", "b", 256, 64, stream=7)  # as the wrapper calls it: .run(buf6, buf11, 256, 64, stream=stream0)
    assert calls == [("FUNCTION", 8, 1, 1, 8, 64, "OOiO", ("a", "b", 256, None), 7)]


def test_every_grid_inductor_writes_is_plain_arithmetic():
    """What torch's GridExpr classes write (ceil-divisions, max of several numels, the y/z overflow split with its
    conditional, a fixed grid's arguments) passes the grid check and computes what Inductor's exec computes."""
    grid = ["y_grid_raw_ = -((max(ynumel_0, ynumel_1)) // -(64))", "y_grid_div_ = -((y_grid_raw_) // -(65535))",
            "grid_0 = max(-((xnumel) // -(128)), 4)",
            "grid_1 = (0 if y_grid_div_ == 0 else -((y_grid_raw_) // -(y_grid_div_)))", "grid_2 = y_grid_div_ + _extra"]
    record = {"name": "k", "params": ["xnumel", "ynumel_0", "ynumel_1", "_extra"], "passed": ["xnumel"],
              "arg_tys": "i", "scratch": 0, "num_warps": 4, "shared": 0, "device": 0, "grid": grid}
    got, _ = cuda_runtime.read_launch(cuda_runtime.pack_launch(record, b"cubin"), "3" * 16)
    calls = []
    cuda_runtime.launcher_function(got, lambda *a: calls.append(a), "F")(1000, 70000, 5, 1, stream=0)
    scope = {"xnumel": 1000, "ynumel_0": 70000, "ynumel_1": 5, "_extra": 1}
    for line in grid:
        exec(line, scope)  # noqa: S102 - the reference: how Inductor's own launcher evaluates them
    assert calls[0][1:4] == (scope["grid_0"], scope["grid_1"], scope["grid_2"])


def test_launch_blob_carries_the_cubin_and_its_record_as_data():
    record = {"name": "k", "params": ["x", "xnumel"], "passed": ["x", "xnumel"], "arg_tys": "Oi", "scratch": 0,
              "num_warps": 4, "shared": 0, "device": 0, "grid": ["grid_0 = -((xnumel) // -(256))", "grid_1 = 1"]}
    cubin = bytes(range(256)) * 40 + b"\0tail"
    blob = cuda_runtime.pack_launch(record, cubin)
    assert blob[:8] == b"PCLAUNCH" and b"\x7fELF" not in blob[:64]  # data, not a shared object
    assert cuda_runtime.read_launch(blob, "0" * 16) == ({**record, "format": cuda_runtime.LAUNCH_FORMAT}, cubin)


@pytest.mark.parametrize("damage, why", [
    (lambda b: b[:10], "shorter than its header"),
    (lambda b: b"XXLAUNCH" + b[8:], "not a Triton launch blob"),
    (lambda b: b[:8] + struct.pack("<I", 99) + b[12:], "format 99"),
    (lambda b: b[:12] + struct.pack("<I", 1 << 30) + b[16:], "declares a record of"),
    (lambda b: b[:16] + b"}" + b[17:], "not JSON"),
])
def test_a_damaged_launch_blob_is_refused_with_its_reason(damage, why):
    record = {"name": "k", "params": ["x"], "passed": ["x"], "arg_tys": "O", "scratch": 0, "num_warps": 4,
              "shared": 0, "device": 0, "grid": ["grid_0 = 1"]}
    with pytest.raises(ValueError, match=why):
        cuda_runtime.read_launch(damage(cuda_runtime.pack_launch(record, b"cubin")), "1" * 16)


@pytest.mark.parametrize("field, value, why", [
    ("grid", ["grid_0 = __import__('os').system('x')"], "not plain arithmetic"),
    ("grid", ["grid_0 = 1\nimport os"], "not plain arithmetic"),
    ("grid", ["grid_0 = x.__class__"], "not plain arithmetic"),
    # fullwidth low lines: Python's compiler folds them (NFKC) to "__class__"
    ("grid", ["grid_0 = x.\uff3f\uff3fclass\uff3f\uff3f"], "not plain arithmetic"),
    ("grid", ["grid_0 = 1\n"], "not plain arithmetic"),
    # no quote and no "__", yet a generator's frame leads to the caller's builtins (the second probe's escape)
    ("grid", ["g = (g.gi_frame.f_back.f_back for x in [0])", "grid_0 = 1"], "not plain arithmetic"),
    ("grid", ["grid_0 = x[0]"], "not plain arithmetic"),
    ("grid", ["grid_0 = 2 ** 100000000"], "not plain arithmetic"),
    ("grid", ["grid_0 = 1 << 100000000"], "not plain arithmetic"),
    ("grid", ["grid_0 = max(*x)"], "not plain arithmetic"),
    ("arg_tys", "OO", "type codes"),
    ("params", ["x; import os"], "not ASCII identifiers"),
    ("params", ["\uff58"], "not ASCII identifiers"),  # a fullwidth x: the compiler reads it as x
    ("name", "k(", "not ASCII identifiers"),
    ("num_warps", "4", "wrong type"),
])
def test_a_launch_record_that_could_run_code_is_refused(field, value, why):
    record = {"name": "k", "params": ["x"], "passed": ["x"], "arg_tys": "O", "scratch": 0, "num_warps": 4,
              "shared": 0, "device": 0, "grid": ["grid_0 = 1"], field: value}
    with pytest.raises(ValueError, match=why):
        cuda_runtime.read_launch(cuda_runtime.pack_launch(record, b"cubin"), "2" * 16)


GPU_D, GPU_H, GPU_BATCH = 256, 512, 64

LOAD_CUDA = r"""
import json, sys, time
import torch
import _graphs
d, h, batch = map(int, sys.argv[3:6])
model = _graphs.mlp(d=d, h=h, dtype=torch.bfloat16).cuda().requires_grad_(False)
x = _graphs.example(batch=batch, d=d, dtype=torch.bfloat16).cuda()
before = set(sys.modules)
import precompile
t = time.perf_counter()
art = precompile.load(sys.argv[1], weights=model)
out = art(x)
torch.cuda.synchronize()
new = sorted(m for m in set(sys.modules) - before
             if m.startswith(("torch._inductor", "torch._dynamo", "triton", "sympy")))
torch.save(out, sys.argv[2])
print(json.dumps({"engine": art.engine_kind, "seconds": time.perf_counter() - t, "new_modules": new}))
"""
GPU_ARGS = (str(GPU_D), str(GPU_H), str(GPU_BATCH))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")
@pytest.mark.parametrize("options", [{}, {"max_autotune": True}], ids=["default", "max_autotune"])
def test_gpu_artifact_loads_through_the_fast_path(options, tmp_path):
    model = _graphs.mlp(d=GPU_D, h=GPU_H, dtype=torch.bfloat16).cuda().requires_grad_(False)
    x = _graphs.example(batch=GPU_BATCH, d=GPU_D, dtype=torch.bfloat16).cuda()
    gm, inputs = _graphs.dynamo_graph(model, x)
    art = precompile.standalone_compile(gm, inputs, options=options)
    assert art.manifest.parts["fast"] is not None, "the fast path was not offered (the precompile log says why)"
    triton_kernels = [k for k in art.manifest.kernels if k["lang"] == "triton"]
    assert triton_kernels and all(  # a Triton kernel carries no host binary: its .launch blob is data
        [f for f in k["binaries"] if f.endswith((".so", ".launch"))] == [k["name"] + ".launch"] for k in triton_kernels)
    with torch.no_grad():
        want = art(*inputs)
    path = tmp_path / "mlp.pc"
    art.save(path)
    report = json.loads(run_python(LOAD_CUDA, str(path), str(tmp_path / "out.pt"), *GPU_ARGS).splitlines()[-1])
    assert report["engine"] == "fast"
    assert report["new_modules"] == []  # no Inductor, Dynamo, Triton or sympy on the load path
    assert_same_output(torch.load(tmp_path / "out.pt"), want, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")
def test_gpu_artifact_portable_path_still_loads(tmp_path):
    model = _graphs.mlp(d=GPU_D, h=GPU_H, dtype=torch.bfloat16).cuda().requires_grad_(False)
    x = _graphs.example(batch=GPU_BATCH, d=GPU_D, dtype=torch.bfloat16).cuda()
    gm, inputs = _graphs.dynamo_graph(model, x)
    art = precompile.standalone_compile(gm, inputs)
    path = tmp_path / "mlp.pc"
    art.save(path)
    report = json.loads(run_python(LOAD_CUDA, str(path), str(tmp_path / "out.pt"), *GPU_ARGS,
                                   env={"PRECOMPILE_ENGINE": "portable"}).splitlines()[-1])
    assert report["engine"] == "portable"
    with torch.no_grad():
        assert_same_output(torch.load(tmp_path / "out.pt"), art(*inputs), rtol=2e-2, atol=2e-2)


def test_warmup_runs_once_on_zeros_and_leaves_results_alone(artifacts):
    """``load(..., warmup=True)`` runs the graph on zero inputs with the bound weights; the caller's later calls
    are unaffected.  An artifact whose weights are not bound runs nothing and says why."""
    import precompile

    c = artifacts("export")  # weights bound by name, x is the only user input
    art = precompile.load(c.art.key, cache=artifacts.cache_url_for("export"), weights=c.model, warmup=True)
    assert_same_output(art(*c.inputs), c.expected)
    unbound = precompile.load(artifacts("dynamo").art.key, cache=artifacts.cache_url)
    assert unbound.warmup() is False  # parameters are placeholders here, and none is bound
    assert unbound.bind(artifacts("dynamo").model).warmup() is True


def test_graph_returning_one_bare_tensor_is_validated_and_fast():
    """A graph whose output is one tensor, not a tuple (vLLM's split pieces): Inductor's callable returns it
    unwrapped, the wrapper's ``call`` a tuple of one; the fast path is validated and returns what the graph does."""
    def f(x, w):
        return torch.relu(x @ w) * 2

    gm = torch.fx.symbolic_trace(f)
    assert isinstance(next(n for n in gm.graph.nodes if n.op == "output").args[0], torch.fx.Node)
    x, w = _graphs.example(), torch.randn(_graphs.D, _graphs.D)
    art = precompile.standalone_compile(gm, [x, w])
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    assert art.manifest.build["validated"] is True and art.manifest.calling["outputs"] == "single"
    loaded = precompile.Artifact(art.manifest, art.all_blobs(), source="test")
    out = loaded(x, w)
    assert loaded.engine_kind == "fast" and isinstance(out, torch.Tensor)
    assert_same_output(out, art(x, w), rtol=0, atol=0)
    assert_same_output(out, f(x, w))


def test_a_buffer_the_graph_never_writes_is_compared_by_layout_only():
    """vLLM's piece before an attention op returns the ``torch.empty`` buffer the op fills: two runs never agree on
    its contents, so the fast path's validation compares its shape, stride and dtype only (it kept a GPU piece on
    the portable path), and still every written output bit for bit."""
    from precompile.inductor.build.runs import same_values, unset_outputs

    def f(x, w):
        out = torch.empty_like(x)  # vLLM's attention layers make the buffer with torch.empty(...)
        return torch.relu(x @ w), torch.reshape(out, (-1, 4, _graphs.D // 4))  # ... and return a view of it

    def written(x, w):
        out = torch.empty_like(x)
        return out.view(-1, _graphs.D).add_(1), out

    gm = torch.fx.symbolic_trace(f)
    assert unset_outputs(gm) == frozenset({1})
    assert unset_outputs(torch.fx.symbolic_trace(written)) == frozenset()  # something writes it: values count
    a, b = torch.zeros(3), torch.ones(3)
    assert same_values([a, a], [a, b]) == "[1]: values differ" and same_values([a, a], [a, b], frozenset({1})) is None
    assert same_values([a, a], [b, a], frozenset({1})) == "[0]: values differ"
    assert same_values([a, a], [a, b.double()], frozenset({1})) is not None  # the layout still counts
    x, w = _graphs.example(), torch.randn(_graphs.D, _graphs.D)
    art = precompile.standalone_compile(gm, [x, w])
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    loaded = precompile.Artifact(art.manifest, art.all_blobs(), source="test")
    got = loaded(x, w)
    assert loaded.engine_kind == "fast" and got[1].shape == (x.shape[0], 4, _graphs.D // 4)
    assert_same_output(got[0], f(x, w)[0])
