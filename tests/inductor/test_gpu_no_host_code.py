"""GPU artifacts that carry no host code: built with Inductor's FX wrapper where it expresses the graph, validated
bit for bit, and loaded with ``PRECOMPILE_REQUIRE_NO_HOST_CODE=1`` in a fresh process that runs the wrapper graph
(data) and the kernels' cubins (data), importing no Inductor, Dynamo, Triton or sympy.  A stored graph naming a
target outside the allow-list is refused before anything runs.  Skipped without a CUDA GPU (CI has none).
"""

from __future__ import annotations

import json

import pytest
import torch
from _cli import store_variant
from conftest import run_python

import precompile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")

LOAD = r"""
import json, os, sys
import torch
sets = torch.load(sys.argv[3], weights_only=False)
before = set(sys.modules)
import precompile
try:
    art = precompile.load(sys.argv[1], cache=sys.argv[2])
except Exception as err:
    print(json.dumps({"error": type(err).__name__, "message": str(err)[:300]}))
    raise SystemExit(0)
compile_time = ("torch._inductor", "torch._dynamo", "triton", "sympy")
results = []
with torch.no_grad():
    for inputs in sets:
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
        results.append({"out": art(*args), "args": args})
torch.cuda.synchronize()
torch.save(results, sys.argv[4])
print(json.dumps({"engine": art.engine_kind,
                  "new_modules": sorted(m for m in set(sys.modules) - before if m.startswith(compile_time))}))
"""

CASES = ("static_mlp", "mlp_requires_grad", "kv_decode", "triton_op", "multi_kernel", "max_autotune")
#: Cases whose graph torch 2.11's FX wrapper cannot express (``KeyError: 'multi_kernel_0'``).
NEEDS_PYTHON_WRAPPER = {"multi_kernel"}


def _load(key, url, sets, tmp_path):
    torch.save(sets, tmp_path / "sets.pt")
    out = run_python(LOAD, key, url, str(tmp_path / "sets.pt"), str(tmp_path / "got.pt"),
                     env={"PRECOMPILE_REQUIRE_NO_HOST_CODE": "1", "PRECOMPILE_PRIME": "off"})
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("name", CASES)
def test_a_coverage_graph_loads_without_host_code_where_the_fx_wrapper_expresses_it(name, tmp_path):
    from tools.cases.graphs import build_case

    case = build_case(name, "cuda")
    gm, example = case.capture()
    url = f"file://{tmp_path}/cache"
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, cache=url, **({"options": case.options} if case.options else {}))
    part, why = art.manifest.parts["wrapper_graph"], art.manifest.build["host_code"]
    print(name, json.dumps({"wrapper_graph": bool(part), "host_code": why}))
    assert (part is None) == (why is not None)
    # every case but the multi-kernel one is a static graph Inductor's FX wrapper expresses (max_autotune too: the
    # FX-wrapper compile replays the first compile's picks, so the bit-equality check holds)
    assert (part is None) == (name in NEEDS_PYTHON_WRAPPER), why
    report = _load(art.key, url, [example], tmp_path)
    if part is None:  # a counted miss for a worker that requires no host code
        assert report["error"] == "ArtifactNotFoundError", report
        return
    assert report == {"engine": "graph", "new_modules": []}, report
    got = torch.load(tmp_path / "got.pt", weights_only=False)[0]
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in example]
    with torch.no_grad():
        want = art(*args)
    torch.cuda.synchronize()
    assert all(torch.equal(g, w) for g, w in zip(torch.utils._pytree.tree_leaves(got["out"]),
                                                 torch.utils._pytree.tree_leaves(want)))
    assert all(torch.equal(g, w) for g, w in zip(got["args"], args) if isinstance(g, torch.Tensor))


def test_a_wrapper_graph_naming_a_target_outside_the_allow_list_is_refused_before_anything_runs(tmp_path):
    from cache_backends.registry import open_cache
    from tools.cases.graphs import build_case

    gm, example = build_case("static_mlp", "cuda").capture()
    url = f"file://{tmp_path}/cache"
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, cache=url)
    assert art.manifest.parts["wrapper_graph"], art.manifest.build["host_code"]
    marker = tmp_path / "ran"
    cache = open_cache(url)
    data = json.loads(cache.get_blob(art.manifest.parts["wrapper_graph"]["graph"]))
    call = next(n for n in data["nodes"] if n["op"] == "call_function")
    call.update(target={"fn": "os:system"}, args=[f"touch {marker}"], kwargs={})
    bad = json.dumps(data).encode()
    digest = cache.put_blob(bad)

    def plant(m):
        m["parts"]["wrapper_graph"]["graph"] = digest
        m["blobs"][digest] = {"size": len(bad), "role": "wrapper graph (data)"}

    assert store_variant(url, art.key, plant) == art.key  # planted under the victim's key (no verify keys set)
    report = _load(art.key, url, [example], tmp_path)
    assert report["error"] == "WrapperGraphError" and "allow-list" in report["message"], report
    assert not marker.exists()
