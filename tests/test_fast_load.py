"""The fast load path: carried binaries, nothing compiled, no compile-time modules; the portable path as fallback.

Every test loads in a fresh process, as a serving worker would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import precompile
from conftest import assert_same_output, run_python

import _graphs

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
torch.save(out, sys.argv[2])
print(json.dumps({"engine": art.engine_kind, "seconds": seconds, "new_modules": new}))
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
    # the fast path needs only the wrapper and the binaries besides the payload
    needed = set(art.manifest.load_digests())
    assert art.manifest.parts["wrappers"][fast["wrapper"]] in needed
    assert all(d in needed for k in art.manifest.kernels for d in k["binaries"].values())


def test_fresh_process_loads_without_compiling(dynamo_artifact, tmp_path):
    art, gm, inputs, path = dynamo_artifact
    report, out = _load_in_fresh_process(path, tmp_path)
    assert report["engine"] == "fast"
    # no Inductor/Dynamo module was imported: nothing was probed, compiled or traced
    assert report["new_modules"] == []
    assert_same_output(out, gm(*inputs), rtol=0, atol=0)


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
