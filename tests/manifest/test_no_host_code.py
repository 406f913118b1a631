"""PRECOMPILE_REQUIRE_NO_HOST_CODE on a CPU machine: every CPU artifact carries host code (C++ kernels, a Python
wrapper), so a worker that requires none gets a counted miss from a cache and a typed refusal from a file, and
runs nothing of the artifact.  (A GPU artifact with its wrapper stored as data loads:
tests/inductor/test_gpu_no_host_code.py.)
"""

from __future__ import annotations

import _graphs
import pytest
import torch

import precompile
from cache_backends.registry import open_cache
from precompile.manifest.wrapper.text import describe
from precompile.errors import ArtifactNotFoundError, ConfigError, UntrustedArtifactError


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("nohost")
    gm, inputs = _graphs.dynamo_graph(_graphs.mlp(), _graphs.example())
    art = precompile.standalone_compile(gm, inputs, cache=f"file://{root}/cache")
    return art, inputs, f"file://{root}/cache", art.save(root / "a.pc")


def test_a_cpu_artifact_says_why_it_carries_host_code(built):
    art, _, _, _ = built
    assert art.manifest.parts["wrapper_graph"] is None
    assert art.manifest.build["host_code"] == "a CPU graph: its kernels are C++ shared objects"


def test_required_no_host_code_makes_a_cpu_entry_a_counted_miss(built, monkeypatch):
    art, inputs, url, _ = built
    monkeypatch.setenv("PRECOMPILE_REQUIRE_NO_HOST_CODE", "1")
    before = open_cache(url).counters().get("host_code_refused", 0)
    with pytest.raises(ArtifactNotFoundError):
        precompile.load(art.key, cache=url)
    assert open_cache(url).counters().get("host_code_refused", 0) == before + 1
    monkeypatch.delenv("PRECOMPILE_REQUIRE_NO_HOST_CODE")
    again = precompile.load(art.key, cache=url)  # the entry is left alone for workers that allow host code
    torch.testing.assert_close(again(*inputs), art(*inputs), rtol=0, atol=0)


def test_required_no_host_code_refuses_a_file_before_anything_runs(built, monkeypatch):
    _, _, _, path = built
    monkeypatch.setenv("PRECOMPILE_REQUIRE_NO_HOST_CODE", "yes")
    with pytest.raises(UntrustedArtifactError, match="carries host code") as info:
        precompile.load(path)
    assert info.value.reason == "host_code"


def test_a_bad_setting_is_a_config_error(built, monkeypatch):
    _, _, _, path = built
    monkeypatch.setenv("PRECOMPILE_REQUIRE_NO_HOST_CODE", "maybe")
    with pytest.raises(ConfigError, match="PRECOMPILE_REQUIRE_NO_HOST_CODE"):
        precompile.load(path)


def test_describe_prints_a_wrapper_graph_node_by_node():
    from test_wrapper_graph import _launching_graph

    text = describe(_launching_graph())
    assert text.splitlines()[0] == "def wrapper(x, w, b):"
    assert "    addmm_out = aten::addmm.out(b, x, as_strided, alpha=1, beta=1, out=empty_strided)" in text
    assert "triton_kernel_wrapper_mutation(kernel_idx=0, constant_args_idx=0, grid=[(mul, 1, 1, )]" in text
