"""Graphs that write into their caller's buffers take the fast path: a KV-cache decode step with index_copy_,
index_put_, slice assignment and an in-place custom op, updating the caller's tensors exactly as Inductor's own
callable does, misaligned buffers included (their copies are written back)."""

from __future__ import annotations

import json

import _graphs
import pytest
import torch
from conftest import assert_same_output, run_python

import precompile

BUFFERS = ("k_cache", "v_cache", "last", "counter")

LOAD_AND_STEP = r"""
import json, sys
import torch
import _graphs
model, inputs = _graphs.decode_step()
had_ops = "_custom_ops" in sys.modules
before = set(sys.modules)
import precompile
art = precompile.load(sys.argv[1], weights=model)
at_load = sorted(m for m in set(sys.modules) - before if m.startswith(("torch._inductor", "torch._dynamo")))
results = {}
for label in ("aligned", "misaligned"):
    _, fresh = _graphs.decode_step()
    if label == "misaligned":
        fresh = {k: _graphs.misaligned_like(v) if k in ("k_cache", "v_cache") else v for k, v in fresh.items()}
    out = art(*_graphs.user_inputs(art, fresh))
    out = art(*_graphs.user_inputs(art, fresh))  # a second step reads what the first wrote
    results[label] = {"out": out, **{k: fresh[k].clone() for k in ("k_cache", "v_cache", "last", "counter")}}
torch.save(results, sys.argv[2])
# a Python custom op's first call imports Dynamo and parts of Inductor (torch's custom-op machinery), but
# nothing that compiles or loads compiled code may come in
compilers = sorted(m for m in set(sys.modules) - before
                   if m in ("torch._inductor.codecache", "torch._inductor.compile_fx", "triton"))
print(json.dumps({"engine": art.engine_kind, "had_ops": had_ops, "ops_imported": "_custom_ops" in sys.modules,
                  "new_modules": at_load, "compilers": compilers}))
"""


@pytest.fixture(scope="module")
def decode_artifact():
    model, inputs = _graphs.decode_step()
    gm, example = _graphs.capture(model, tuple(inputs.values()))
    before = [v.clone() for v in example]
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example)
    for spec, value, old in zip(art.placeholders, example, before):  # a build never writes to its inputs
        assert torch.equal(value, old), spec["name"]
    return model, art.bind(model)


def _expected(art, model, misaligned: bool):
    """Two steps of the freshly compiled callable (and of eager) on their own buffers."""
    results = []
    for engine in ("fresh", "eager"):
        _, fresh = _graphs.decode_step()
        if misaligned:
            fresh = {k: _graphs.misaligned_like(v) if k in ("k_cache", "v_cache") else v for k, v in fresh.items()}
        with torch.no_grad():
            for _ in range(2):
                out = art(*_graphs.user_inputs(art, fresh)) if engine == "fresh" else (model(*fresh.values()),)
        results.append({"out": out, **{k: fresh[k] for k in BUFFERS}})
    return results


def test_manifest_records_writes_and_custom_ops(decode_artifact):
    _, art = decode_artifact
    m = art.manifest
    fast = m.parts["fast"]
    assert fast is not None and m.build["fast_off"] is None
    written = {m.placeholders[i]["name"] for i in fast["mutated"]}
    assert written == {"l_k_cache_", "l_v_cache_", "l_last_", "l_counter_"}
    assert {o["op"]: o["module"] for o in fast["ops"]} == {"pctest::bump_": "_custom_ops",
                                                           "pctest::scale_add": "_custom_ops"}
    assert m.factors["ambient"]["grad_enabled"] is False


def test_fresh_process_updates_caller_buffers_like_inductor(decode_artifact, tmp_path):
    model, art = decode_artifact
    path = art.save(tmp_path / "step.pc")
    report = json.loads(run_python(LOAD_AND_STEP, str(path), str(tmp_path / "r.pt")).splitlines()[-1])
    assert report["engine"] == "fast" and report["new_modules"] == [] and report["compilers"] == []
    assert not report["had_ops"] and report["ops_imported"]  # the artifact imported the ops' module itself
    got = torch.load(tmp_path / "r.pt")
    for label, misaligned in (("aligned", False), ("misaligned", True)):
        fresh, eager = _expected(art, model, misaligned)
        for name in ("out", *BUFFERS):
            assert_same_output(got[label][name], fresh[name], rtol=0, atol=0, where=f"{label} {name}")
            assert_same_output(got[label][name], eager[name], where=f"{label} {name} vs eager")
    assert got["misaligned"]["counter"].tolist() == [2.0, 2.0]


def test_misaligned_caller_buffers_in_process(decode_artifact):
    """The fast callable in this process with misaligned caches: the caller's own tensors are written."""
    model, art = decode_artifact
    fast = precompile.Artifact(art.manifest, art.all_blobs(), source="test").bind(model)
    assert fast.engine is not None and fast.engine_kind == "fast"
    _, buffers = _graphs.decode_step()
    buffers = {k: _graphs.misaligned_like(v) if k in ("k_cache", "v_cache") else v for k, v in buffers.items()}
    k_ptr = buffers["k_cache"].data_ptr()
    with torch.no_grad():
        for _ in range(2):
            out = fast(*_graphs.user_inputs(fast, buffers))
    fresh, _ = _expected(art, model, misaligned=True)
    assert buffers["k_cache"].data_ptr() == k_ptr
    for name in BUFFERS:
        assert_same_output(buffers[name], fresh[name], rtol=0, atol=0, where=name)
    assert_same_output(out, fresh["out"], rtol=0, atol=0)


# Inductor assumes 16-byte alignment of the inputs its Triton kernels read (GPU: tests/inductor/test_gpu_paths.py shows
# it on real graphs); on a CPU its C++ kernels assume none.  The fast runtime's handling is checked here directly: a
# wrapper that reports whether it saw an aligned pointer and writes to its input.
WRAPPER = """
def call(args):
    x, y = args
    args.clear()
    seen = (x.data_ptr() % 16 == 0, y.data_ptr() % 16 == 0)
    x.add_(1)
    return seen
"""


@pytest.mark.parametrize("defers", [False, True], ids=["torch-2.11", "torch-2.13"])
def test_misaligned_written_input_is_copied_and_written_back(defers):
    from precompile.inductor.load import runtime

    fn = runtime.load_fast(WRAPPER, {}, inputs_to_check=[0, 1], mutated=[0], defers_alignment=defers)
    x = _graphs.misaligned_like(torch.zeros(8))
    y = _graphs.misaligned_like(torch.ones(8))
    seen = fn(x, y)
    # the written input always reaches the kernel aligned and its writes come back; a read-only one is copied
    # here unless the wrapper copies it itself (torch 2.13's deferred alignment copies)
    assert seen == (True, not defers)
    assert x.tolist() == [1.0] * 8 and x.data_ptr() % 16
    assert fn(x, y) == (True, not defers) and x.tolist() == [2.0] * 8


def test_stand_in_inputs_are_never_run_and_the_fast_path_says_so(tmp_path):
    """``runnable=False`` (an integration with only fake tensors, or inputs that are process-specific handles):
    the build runs nothing, and a CPU graph still gets a fast path, checked statically and marked unvalidated."""
    model, inputs = _graphs.decode_step()
    gm, example = _graphs.capture(model, tuple(inputs.values()))
    before = [v.clone() for v in example]
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, runnable=False, key_extra={"integration": "test"})
    assert all(torch.equal(a, b) for a, b in zip(example, before))
    m = art.manifest
    assert m.parts["fast"] is not None and m.build["validated"] is False
    assert m.factors["extra"] == {"integration": "test"}
    with torch.no_grad():
        validated = precompile.standalone_compile(gm, example)
    assert validated.key != art.key and validated.manifest.build["validated"] is True
    fast = precompile.Artifact(m, art.all_blobs(), source="test").bind(model)
    _, mine = _graphs.decode_step()
    _, theirs = _graphs.decode_step()
    with torch.no_grad():
        got = fast(*_graphs.user_inputs(fast, mine))
        want = validated.bind(model)(*_graphs.user_inputs(validated, theirs))
    assert fast.engine_kind == "fast"
    assert_same_output(got, want, rtol=0, atol=0)
    for name in BUFFERS:
        assert_same_output(mine[name], theirs[name], rtol=0, atol=0, where=name)
