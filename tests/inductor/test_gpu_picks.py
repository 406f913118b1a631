"""GEMM picks on the GPU: for every op ``max_autotune`` tunes, the manifest records each candidate (cuBLAS through
the extern, Triton templates with their configs, ``decompose_k`` with its split), what it measured and the choice
taken; ``inspect`` shows them, ``diff`` names a changed pick, and the artifact still loads fast and bit-equal.

Skipped without a CUDA GPU (CI has none).  A 32x16384 @ 16384x64 bfloat16 GEMM: K is at least 32x both M and N,
so Inductor also offers ``decompose_k`` (``config.triton.decompose_k_threshold``); bfloat16 because Inductor offers
no Triton template for a float32 GEMM unless TF32 is allowed.
"""

from __future__ import annotations

import json

import _graphs
import pytest
import torch
from _cli import cli_json
from conftest import run_python
from test_gpu_paths import _roundtrip

import precompile
from precompile.store.diff import pick_text

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)")


class TwoGemms(torch.nn.Module):
    def forward(self, a, b, c, d):
        return torch.relu(a @ b), c @ d


def _build(tmp_path, **options):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(32, 16384, device="cuda", generator=gen, dtype=torch.bfloat16)
    b = torch.randn(16384, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
    c = torch.randn(64, 256, device="cuda", generator=gen, dtype=torch.bfloat16)
    d = torch.randn(256, 1024, device="cuda", generator=gen, dtype=torch.bfloat16)
    gm, example = _graphs.capture(TwoGemms(), (a, b, c, d))
    with torch.no_grad():
        art = precompile.standalone_compile(gm, example, options={"max_autotune": True, **options},
                                            cache=f"file://{tmp_path}/cache")
    return art, example


LONG_K = ["32x16384 bfloat16", "16384x64 bfloat16"]


def _check_record(art):
    """Check every tuned op's record; return the long-K GEMM's record and its chosen candidate."""
    tuned = art.manifest.autotune["tuned"]
    assert sorted(t["inputs"] for t in tuned) == sorted([LONG_K, ["64x256 bfloat16", "256x1024 bfloat16"]]), tuned
    kinds = set()
    for op in tuned:
        assert op["op"] == "mm"
        timed = [c for c in op["candidates"] if c["ms"] is not None]
        assert timed and all(c["ms"] > 0 for c in timed)
        assert [c["ms"] for c in timed] == sorted(c["ms"] for c in timed)  # fastest first
        kinds |= {c["kind"] for c in op["candidates"]}
        for c in op["candidates"]:
            if c["kind"] == "decompose_k":
                assert c["config"]["k_split"] > 1 and 16384 % c["config"]["k_split"] == 0
            if c["kind"] == "triton template":
                assert {"num_stages", "num_warps"} <= set(c["config"]), c
        chosen = next(c for c in op["candidates"] if c["choice"] == op["chosen"])
        if op["by"] == "benchmark":
            assert chosen is timed[0]
        else:  # benchmark fusion kept a Triton template that fuses the relu
            assert op["by"] == "benchmark fusion" and chosen["kind"] == "triton template"
    assert {"extern", "triton template", "decompose_k"} <= kinds, kinds
    op = next(t for t in tuned if t["inputs"] == LONG_K)
    assert "decompose_k" in {c["kind"] for c in op["candidates"]}
    return op, next(c for c in op["candidates"] if c["choice"] == op["chosen"])


def test_a_tuned_gemm_records_every_candidate_and_its_pick_and_loads_fast(tmp_path):
    art, example = _build(tmp_path)
    op, chosen = _check_record(art)
    print(json.dumps({"picks": [(t["inputs"], pick_text(t), len(t["candidates"])) for t in art.manifest.autotune["tuned"]],
                      "long_k_fastest": [(c["choice"], c["kind"], c["ms"]) for c in op["candidates"][:5]]}))
    assert art.manifest.parts["fast"] is not None, art.manifest.build["fast_off"]
    report = _roundtrip(art, [example], tmp_path)
    assert report["engine"] == "fast" and report["new_modules"] == []
    shown = run_python("from precompile.cli import main; main()", "inspect", str(tmp_path / "a.pc"),
                       env={"COLUMNS": "240"})
    assert "tuned ops (2)" in shown and op["chosen"] in shown and "decompose_k" in shown


def test_autotune_in_a_subprocess_with_benchmark_fusion_keeps_and_shows_the_picks(tmp_path):
    art, example = _build(tmp_path, autotune_in_subproc=True, benchmark_fusion=True)
    op, chosen = _check_record(art)
    print(json.dumps({"picks": [pick_text(t) for t in art.manifest.autotune["tuned"]], "other": len(art.manifest.autotune["other"]),
                      "leftovers": art.manifest.autotune["benchmark_leftovers"]}))
    # configs of kernels only a benchmark compiled are counted, never listed as picks
    assert art.manifest.autotune["benchmark_leftovers"] > 0
    triton_kernels = [k for k in art.manifest.kernels if k["lang"] == "triton"]
    assert len(art.manifest.autotune["other"]) <= len(triton_kernels), art.manifest.autotune["other"]
    report = _roundtrip(art, [example], tmp_path)
    assert report["engine"] == "fast"


def test_diff_names_a_changed_gemm_pick(tmp_path):
    both, _ = _build(tmp_path)
    triton_only, _ = _build(tmp_path, max_autotune_gemm_backends="TRITON")
    a, b = (next(t for t in art.manifest.autotune["tuned"] if t["inputs"] == LONG_K) for art in (both, triton_only))
    assert {c["kind"] for c in b["candidates"]} <= {"triton template", "decompose_k", "subgraph"}
    d = cli_json("diff", both.key, triton_only.key, "--cache", f"file://{tmp_path}/cache")
    assert d["factors"] == ["options", "inductor_config"]  # the option, and with it Inductor's effective config
    assert "options.max_autotune_gemm_backends" in [c["path"] for c in d["changes"]]
    long_k = [c for c in d["pick_changes"] if c["path"] == "autotune.tuned mm(32x16384 bfloat16, 16384x64 bfloat16)"]
    assert len(long_k) == (pick_text(a) != pick_text(b)), d["pick_changes"]
    if long_k:
        assert (long_k[0]["a"], long_k[0]["b"]) == (pick_text(a), pick_text(b))
    print(json.dumps({"a": pick_text(a), "b": pick_text(b), "pick_changes": d["pick_changes"]}))
