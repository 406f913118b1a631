"""The fast path on the GPU for the graphs servers compile: symbolic sizes (Triton grids computed per call for the
picked config), writes into caller buffers (misaligned ones included), multi-kernel picks and user Triton kernels.

Each artifact is loaded in a fresh process and called on several input sets; outputs and the buffers it writes
must equal the fresh compile's bit for bit, and no Inductor, Dynamo, Triton or sympy module may be imported on
the load path.  Skipped without a CUDA GPU (CI has none); run on the GPU machine by tools/gpu/session.sh.
"""

from __future__ import annotations

import json
import os

import _graphs
import pytest
import torch
from conftest import assert_same_output, run_python

import precompile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")

LOAD_AND_CALL = r"""
import json, os, sys
import torch
sets = torch.load(sys.argv[2], weights_only=False)
if sys.argv[4:] == ["warm-custom-ops"]:  # a Python custom op's first call imports Dynamo (and with it Triton)
    import _custom_ops
    one = torch.ones(1, device="cuda")
    _custom_ops.scale_add(one, one, 1.0), _custom_ops.bump_(one.clone(), one)
before = set(sys.modules)
# the graph's library calls replayed beside the load (the default for GPU graphs) only where a test asks
os.environ["PRECOMPILE_PRIME"] = "on" if "prime" in sys.argv[4:] else "off"
import precompile
art = precompile.load(sys.argv[1])
compile_time = ("torch._inductor", "torch._dynamo", "triton", "sympy")
at_load = sorted(m for m in set(sys.modules) - before if m.startswith(compile_time))
results = []
with torch.no_grad():
    for inputs in sets:
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
        out = art(*args)
        torch.cuda.synchronize()
        results.append({"out": out, "args": args})
torch.save(results, sys.argv[3])
# modules that compile or load compiled code
compilers = ("torch._inductor.codecache", "torch._inductor.compile_fx", "triton", "torch._inductor.runtime.triton_heuristics")
after = sorted(m for m in set(sys.modules) - before if m in compilers)
primed = art.primer and {"done": art.primer.done, "failed": art.primer.failed}
print(json.dumps({"engine": art.engine_kind, "new_modules": at_load, "after_calls": after, "primed": primed}))
"""


def _roundtrip(art, sets, tmp_path, *extra):
    """Load ``art`` in a fresh process, call it on copies of each input set; compare with the fresh compile."""
    path = art.save(tmp_path / "a.pc")
    torch.save(sets, tmp_path / "sets.pt")
    report = json.loads(run_python(LOAD_AND_CALL, str(path), str(tmp_path / "sets.pt"),
                                   str(tmp_path / "r.pt"), *extra).splitlines()[-1])
    got = torch.load(tmp_path / "r.pt", weights_only=False)
    written = art.manifest.build["mutated_inputs"]
    for i, inputs in enumerate(sets):
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
        with torch.no_grad():
            want = art(*args)  # the fresh compile
        torch.cuda.synchronize()
        assert_same_output(got[i]["out"], want, rtol=0, atol=0, where=f"set {i} outputs")
        for j in written:
            assert torch.equal(got[i]["args"][j], args[j]), f"set {i}: written input {j} differs"
    return report


def _at_size(art, example, x, n):
    """``example`` (a Dynamo graph's flat inputs) with the user tensor replaced by ``x`` and sizes by ``n``."""
    return [x if s["kind"] == "user_input" and s.get("type") == "tensor" else
            n if isinstance(s.get("size"), str) else v
            for v, s in zip(example, art.placeholders)]


def test_symbolic_batch_runs_fast_with_grids_per_call(tmp_path):
    model = _graphs.mlp(d=256, h=512, dtype=torch.bfloat16).cuda()
    x = _graphs.example(batch=64, d=256, dtype=torch.bfloat16).cuda()
    gm, example = _graphs.capture(model, (x,), dynamic=((0, 0),))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, dynamic_shapes="from_graph")
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    assert any(k["lang"] == "triton" for k in art.manifest.kernels)
    sets = [_at_size(art, example, _graphs.example(batch=n, d=256, dtype=torch.bfloat16, seed=n).cuda(), n)
            for n in (64, 2, 13, 100, 1000)]
    report = _roundtrip(art, sets, tmp_path, "prime")
    # the graph's matmuls (extern mm calls, recorded at build) were replayed beside the load, none failed
    primed = report.pop("primed")
    assert primed["done"] >= 1 and primed["failed"] == 0, primed
    assert report == {"engine": "fast", "new_modules": [], "after_calls": []}


def test_decode_step_writes_caller_buffers_on_the_gpu(tmp_path):
    model, inputs = _graphs.decode_step(batch=4, cache_len=64, d=128, dtype=torch.bfloat16, device="cuda")
    gm, example = _graphs.capture(model, tuple(inputs.values()))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example)
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    assert len(art.manifest.build["mutated_inputs"]) == 4
    caches = {i for i, s in enumerate(art.placeholders) if s["name"] in ("l_k_cache_", "l_v_cache_")}
    misaligned = [_graphs.misaligned_like(v) if i in caches else v for i, v in enumerate(example)]
    report = _roundtrip(art, [example, misaligned], tmp_path, "warm-custom-ops")
    assert report.pop("primed") is None  # priming is off in LOAD_AND_CALL unless asked
    assert report == {"engine": "fast", "new_modules": [], "after_calls": []}


def test_multi_kernel_pick_is_made_at_build_and_loaded(tmp_path):
    class RowNorm(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * 2.0, -1) + torch.nn.functional.layer_norm(x, x.shape[-1:])

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    gm, example = _graphs.capture(RowNorm(), (x,))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, options={"triton.multi_kernel": 1})
    picks = art.manifest.autotune["multi_kernel"]
    assert picks, "Inductor generated no multi-kernel for this graph"
    assert art.manifest.parts["fast"] is not None and art.manifest.parts["fast"]["multi_kernel"] == picks
    report = _roundtrip(art, [example, [torch.randn_like(x)]], tmp_path)
    assert report.pop("primed") is None  # priming is off in LOAD_AND_CALL unless asked
    assert report == {"engine": "fast", "new_modules": [], "after_calls": []}
    shown = run_python("from precompile.cli import main; main()", "inspect", str(tmp_path / "a.pc"),
                       env={"COLUMNS": "200"})
    assert "multi-kernel picks" in shown


def test_user_triton_kernel_through_triton_op(tmp_path):
    from tools.cases.graphs import build_case

    case = build_case("triton_op", "cuda")
    gm, example = case.capture()
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example)
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    report = _roundtrip(art, [example], tmp_path)
    assert report.pop("primed") is None  # priming is off in LOAD_AND_CALL unless asked
    assert report == {"engine": "fast", "new_modules": [], "after_calls": []}


def test_rotary_outer_product_is_a_multiply_and_calls_no_library(tmp_path):
    """The rotary embedding's float32 ``inv_freq @ position_ids`` (inner dimension 1), as every Llama-like
    ``transformers`` model computes it, is compiled as a multiply (precompile.key.passes): the same bits as cuBLAS,
    and no library call left for a first call to set up."""
    import copy

    from precompile.key.passes import outer_products_as_mul

    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64))

        def forward(self, x, position_ids):
            freqs = (self.inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            return x * emb.cos().to(x.dtype) + x.flip(-1) * emb.sin().to(x.dtype)

    model = Rotary().cuda()
    x = torch.randn(1, 256, 64, device="cuda", dtype=torch.bfloat16)
    positions = torch.arange(256, device="cuda")[None]
    gm, example = _graphs.capture(model, (x, positions))
    rewritten = copy.deepcopy(gm)
    assert outer_products_as_mul(rewritten) == 1
    with torch.no_grad():  # the multiply computes cuBLAS's bits
        assert torch.equal(rewritten(*example)[0], gm(*example)[0])
        art = precompile.standalone_compile(gm, example)
    assert art.manifest.build["rewrites"] == {"outer_products_as_mul": 1}
    fast = art.manifest.parts["fast"]
    assert fast is not None, art.manifest.build["fast_off"]
    assert fast["prime"] == [], fast["prime"]  # no library call was made by the compiled graph
    report = _roundtrip(art, [example], tmp_path)
    assert report.pop("primed") is None
    assert report == {"engine": "fast", "new_modules": [], "after_calls": []}
    with torch.no_grad():
        assert_same_output(art(*example)[0], model(x, positions), rtol=2e-2, atol=2e-2, where="against eager")
    os.environ["PRECOMPILE_REWRITES"] = "off"  # the graph as given: the matmul stays a library call
    try:
        with torch.no_grad():
            plain = precompile.standalone_compile(gm, example)
    finally:
        del os.environ["PRECOMPILE_REWRITES"]
    assert plain.key != art.key and plain.manifest.build["rewrites"] == {}
    assert [c["op"] for c in plain.manifest.parts["fast"]["prime"]] in (["mm"], ["bmm"])


def test_attention_compiles_to_flash_ahead_of_cudnn(tmp_path):
    """CUDA graphs are compiled with flash and memory-efficient attention ahead of cuDNN's (precompile.key.sdpa), so a
    first call builds no cuDNN plan; ``PRECOMPILE_REWRITES=off`` compiles under torch's own order."""
    from test_sdpa import Attention

    from precompile.key import sdpa

    torch.manual_seed(0)
    model = Attention(hidden=256, heads=4).cuda().to(torch.bfloat16).eval()
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    gm, example = _graphs.capture(model, (x,))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example)
        want = model(x)
    torch_order = sdpa.settled_order()
    assert art.manifest.factors["ambient"]["sdpa"]["order"] == sdpa.fast_start_order(torch_order)
    ops = [c["op"] for c in art.manifest.parts["fast"]["prime"]]
    assert "_scaled_dot_product_flash_attention" in ops and "_scaled_dot_product_cudnn_attention" not in ops, ops
    report = _roundtrip(art, [example], tmp_path)
    assert report["engine"] == "fast" and report["new_modules"] == [], report
    with torch.no_grad():
        assert_same_output(art(*example)[0], want, rtol=2e-2, atol=2e-2, where="against eager")
    os.environ["PRECOMPILE_REWRITES"] = "off"
    try:
        with torch.no_grad():
            plain = precompile.standalone_compile(gm, example)
    finally:
        del os.environ["PRECOMPILE_REWRITES"]
    assert plain.manifest.factors["ambient"]["sdpa"]["order"] == torch_order
    plain_ops = [c["op"] for c in plain.manifest.parts["fast"]["prime"]]
    print(f"torch's SDPA order here: {torch_order}; its compile calls {plain_ops}; precompile's: {ops}")
    if torch_order[0] == "cudnn":  # Hopper/Blackwell: torch would build a cuDNN plan on the first call
        assert plain.key != art.key and "_scaled_dot_product_cudnn_attention" in plain_ops
        assert art.manifest.build["rewrites"] == {"sdpa_fast_start": 1}


CAPTURE = r"""
import json, os, sys
import torch
os.environ["PRECOMPILE_PRIME"] = "on"  # the load replays the graph's library calls beside it
import precompile
sets = torch.load(sys.argv[2], weights_only=False)
art = precompile.load(sys.argv[1])
static = [a.clone() if isinstance(a, torch.Tensor) else a for a in sets[0]]
with torch.no_grad():
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch's CUDA graph docs ask
        art(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = art(*static)
    replays = []
    for inputs in sets:
        for dst, src in zip(static, inputs):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        replays.append(out.clone() if isinstance(out, torch.Tensor) else type(out)(o.clone() for o in out))
torch.save(replays, sys.argv[3])
print(json.dumps({"engine": art.engine_kind, "primed": bool(art.primer and art.primer.done)}))
"""


def test_a_loaded_artifact_captures_into_a_cuda_graph_right_after_load_and_replays_bit_equal(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(
        "cuda", torch.bfloat16)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    gm, example = _graphs.capture(model, (x,))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example)
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    user = next(i for i, s in enumerate(art.placeholders) if s["kind"] == "user_input")
    sets = []
    for seed in (1, 2, 3):
        inputs = list(example)
        inputs[user] = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16,
                                   generator=torch.Generator("cuda").manual_seed(seed))
        sets.append(inputs)
    path = art.save(tmp_path / "a.pc")
    torch.save(sets, tmp_path / "sets.pt")
    report = json.loads(run_python(CAPTURE, str(path), str(tmp_path / "sets.pt"), str(tmp_path / "r.pt"))
                        .splitlines()[-1])
    assert report == {"engine": "fast", "primed": True}
    got = torch.load(tmp_path / "r.pt", weights_only=False)
    for i, inputs in enumerate(sets):
        with torch.no_grad():
            want = art(*[a.clone() for a in inputs])
        assert_same_output(got[i], want, rtol=0, atol=0, where=f"replay {i}")


class KVWrite(torch.nn.Module):
    """A paged KV-cache write with ``num_tokens`` dynamic: K and V into caller caches at slot indices."""

    def forward(self, k_cache, v_cache, slots, k, v):
        k_cache.index_copy_(0, slots, k * 2.0)
        v_cache.index_copy_(0, slots, v + 1.0)
        return k_cache.sum(0) + v_cache.sum(0)


def test_kv_cache_write_with_dynamic_num_tokens_takes_the_fast_path(tmp_path):
    """The validation inputs at other sizes take the example's (unique) slot indices, so the GPU's scatter is
    deterministic and the fast path is offered (before: zero-filled indices, a race, the portable path)."""
    def inputs(n, seed):
        g = torch.Generator("cuda").manual_seed(seed)
        caches = [torch.zeros(64, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        slots = torch.randperm(64, device="cuda", generator=g)[:n]
        kv = [torch.randn(n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)]
        return (*caches, slots, *kv)

    example_inputs = inputs(6, 0)
    gm, example = _graphs.capture(KVWrite(), example_inputs, dynamic=((2, 0), (3, 0), (4, 0)))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, dynamic_shapes="from_graph")
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    assert len(art.manifest.build["mutated_inputs"]) == 2
    sets = []
    for n, seed in ((6, 0), (11, 1), (2, 2), (40, 3)):
        by_name = dict(zip(("k_cache", "v_cache", "slots", "k", "v"), inputs(n, seed)))
        sets.append(_graphs.user_inputs(art, by_name))
    report = _roundtrip(art, sets, tmp_path)
    assert report["engine"] == "fast", report
