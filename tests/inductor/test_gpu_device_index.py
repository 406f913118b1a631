"""An artifact is compiled for one GPU: its key names the device index, and a call on another GPU is refused.

Inductor's wrapper and precompile's launch records name the device a kernel is loaded on, so an artifact built on
cuda:1 (a tensor-parallel rank's GPU) is not cuda:0's.  Found under vLLM at tensor_parallel_size=2: both ranks keyed
their last piece alike, one rank's build was stored, and the other rank's new-machine start crashed in its first
GEMM ("Expected all tensors to be on the same device").  Every CUDA key names its index, cuda:0 included: a key
made without one may hold such a cuda:1 build, so none is looked up again.
Needs two GPUs (the ``nvidia-h200-x2`` machine); skipped elsewhere.  The spec check is in CPU tests too.
"""

from __future__ import annotations

import _graphs
import pytest
import torch

from precompile.builder.standalone import standalone_compile
from precompile.errors import ArtifactFormatError, InputMismatchError
from precompile.loader.inputs import InputCheck
from precompile.store import shared


def test_a_device_index_in_a_spec_is_typed():
    spec = {"name": "x", "type": "tensor", "dtype": "float32", "shape": [2], "stride": [1], "device": "cuda"}
    assert InputCheck.from_spec(spec).index == 0
    assert InputCheck.from_spec(dict(spec, device_index=1)).index == 1
    for bad in ("1", -1, 4096, True, 1.0):
        with pytest.raises(ArtifactFormatError, match="device index"):
            InputCheck.from_spec(dict(spec, device_index=bad))
    assert InputCheck.from_spec(dict(spec, device="cpu")).index is None


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_an_artifact_built_on_cuda_1_is_its_own_and_refuses_cuda_0_inputs(tmp_path):
    cache = f"file://{tmp_path}"
    model = _graphs.mlp(seed=5)
    arts, inputs = {}, {}
    for index in (0, 1):
        device = torch.device("cuda", index)
        with torch.cuda.device(device):
            gm, ex = _graphs.make_fx_graph(model.to(device), _graphs.example(seed=6).to(device))
            arts[index], inputs[index] = standalone_compile(gm, ex, cache=cache), ex
    assert arts[0].key != arts[1].key
    assert {p.get("device_index") for p in arts[0].manifest.placeholders if p.get("type") == "tensor"} == {0}
    assert {p.get("device_index") for p in arts[1].manifest.placeholders if p.get("type") == "tensor"} == {1}
    shared.forget()
    from precompile.store.loading import load

    on_1 = load(arts[1].key, cache=cache)
    with torch.cuda.device(1):
        torch.testing.assert_close(on_1(*inputs[1]), arts[1](*inputs[1]), rtol=0, atol=0)
    with pytest.raises(InputMismatchError, match="cuda:1"):
        on_1(*inputs[0])
