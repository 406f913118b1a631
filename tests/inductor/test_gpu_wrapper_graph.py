"""A GPU graph with no host code: Inductor's FX wrapper graph stored as data (precompile.manifest.wrapper.graph), each
Triton kernel as a ``.launch`` blob (launch record + cubin), run in a fresh process that imports neither Inductor nor
Triton, against precompile's fresh compile of the same graph (Inductor's Python wrapper).  Skipped without a CUDA
GPU (CI has none).

The FX converter launches each kernel with its first compiled config (``compile_results[0]``); the Python wrapper
autotunes among them at its first run.  Where a kernel has one config the two are the same cubin and the outputs
are bit-equal; a reduction with several configs may settle on another, which changes the summation order: there
the outputs are compared within bfloat16 rounding, and the test says which.
"""

from __future__ import annotations

import json

import _graphs
import pytest
import torch
from conftest import run_python

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")

RUN = r"""
import json, sys
from pathlib import Path
import torch
before = set(sys.modules)
from precompile.manifest.wrapper.codegen import build
from precompile.inductor.load import cuda_runtime
d = Path(sys.argv[1])
data = json.loads((d / "wrapper.json").read_text())
kernels = {int(p.stem[1:]): cuda_runtime.TritonKernel(*cuda_runtime.read_launch(p.read_bytes(), p.stem),
                                                     grid_launcher=False)
           for p in d.glob("k*.launch")}
fn = build(data, cuda_runtime.GraphLaunch(kernels))
inputs = torch.load(d / "inputs.pt")
with torch.no_grad():  # an inference graph, as the fast path runs it
    out = fn(*inputs)
torch.cuda.synchronize()
torch.save({"out": out, "inputs": inputs}, d / "got.pt")
compile_time = ("torch._inductor", "torch._dynamo", "triton", "sympy")
print(json.dumps({"new_modules": sorted(m for m in set(sys.modules) - before if m.startswith(compile_time)),
                  "kernels": len(kernels)}))
"""


class RowNorm(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, -1) + torch.nn.functional.layer_norm(x, x.shape[-1:])


class KVWrite(torch.nn.Module):
    def forward(self, k, cache, slots):
        cache.index_copy_(0, slots, k * 2.0)
        return cache.sum(0)


def _case(name):
    dt = torch.bfloat16
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
        return model.cuda().to(dt).eval().requires_grad_(False), (torch.randn(8, 256, device="cuda", dtype=dt),)
    if name == "reductions":
        return RowNorm(), (torch.randn(64, 4096, device="cuda", dtype=dt),)
    return KVWrite(), (torch.randn(4, 64, device="cuda"), torch.zeros(32, 64, device="cuda"),
                       torch.tensor([3, 17, 0, 9], device="cuda"))


@pytest.mark.parametrize("name", ["mlp", "reductions", "kv_write"])
def test_a_wrapper_graph_with_its_cubins_runs_without_host_code_bit_equal(name, tmp_path):
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    import precompile
    from precompile.manifest.wrapper import graph as wg
    from precompile.inductor.load import cuda_runtime
    from precompile.inductor.build.fx_wrapper import launch_records, wrapper_graph

    gm, example = _graphs.capture(*_case(name))
    graph, _, kernels = wrapper_graph(gm, [a.clone() if isinstance(a, torch.Tensor) else a for a in example])
    single = all(len(t.compile_results) == 1 for t in kernels.values())
    launches = [n for n in graph.graph.nodes if n.op == "call_function" and "triton_kernel" in str(n.target)]
    assert launches and all(not kernel_side_table.get_constant_args(n.kwargs["constant_args_idx"]) for n in launches)
    (tmp_path / "wrapper.json").write_text(json.dumps(wg.to_data(graph)))
    for idx, (record, cubin) in launch_records(kernels).items():
        (tmp_path / f"k{idx}.launch").write_bytes(cuda_runtime.pack_launch(record, cubin))
    inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in example]
    torch.save(inputs, tmp_path / "inputs.pt")
    report = json.loads(run_python(RUN, str(tmp_path)).splitlines()[-1])
    print(name, json.dumps(report))
    assert report == {"new_modules": [], "kernels": len(kernels)}
    got = torch.load(tmp_path / "got.pt")
    fresh = precompile.standalone_compile(gm, example, cache=f"file://{tmp_path}/cache")
    want_inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in example]
    with torch.no_grad():
        want = fresh(*want_inputs)
    torch.cuda.synchronize()
    got_out = torch.utils._pytree.tree_leaves(got["out"])
    want_out = torch.utils._pytree.tree_leaves(want)
    bit_equal = all(torch.equal(g, w) for g, w in zip([*got_out, *got["inputs"]], [*want_out, *want_inputs]))
    print(name, json.dumps({"single_config_kernels": single, "bit_equal": bit_equal}))
    assert len(got_out) == len(want_out)
    if single:
        assert bit_equal  # outputs and written inputs
    else:
        for g, w in zip([*got_out, *got["inputs"]], [*want_out, *want_inputs]):
            torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
