"""GEMM and convolution picks as the manifest stores them (precompile.inductor.build.picks): ``diff`` names a pick that
changed, ``inspect`` prints them as text, and a second compile replaying a first one's records takes its picks.
The diff and inspect records are written out by hand because a CPU build tunes no GEMM (Inductor's C++ GEMM
template needs constant weights, which only ``freezing`` gives: the replay test compiles that way);
tests/inductor/test_gpu_picks.py builds real ones on a GPU."""

from __future__ import annotations

import io

from precompile.store.diff import pick_changes

_KIND = {"mm": ("extern", {"kernel_call_name": "extern_kernels.mm"}),
         "bias_addmm": ("extern", {"kernel_call_name": "bias_addmm"}),
         "triton_mm_3": ("triton template", {"num_stages": 3, "num_warps": 4}),
         "triton_mm_9": ("triton template", {"num_stages": 3, "num_warps": 4}),
         "decompose_k_mm_64_split_26": ("decompose_k", {"k_split": 64})}


def _manifest(*ops):
    return {"autotune": {"tuned": [
        {"op": op, "inputs": ["32x16384 float32", "16384x64 float32"], "chosen": chosen, "by": by,
         "candidates": [{"choice": chosen, "kind": _KIND[chosen][0], "config": _KIND[chosen][1], "ms": 0.01}]}
        for op, chosen, by in ops]}}


def test_diff_names_each_changed_pick_and_each_op_only_one_side_tuned():
    a = _manifest(("mm", "mm", "benchmark"), ("mm", "triton_mm_3", "benchmark"), ("addmm", "bias_addmm", "benchmark"))
    b = _manifest(("mm", "mm", "benchmark"), ("mm", "decompose_k_mm_64_split_26", "benchmark"))
    changes = pick_changes(a, b)
    assert [(c.path, c.a, c.b) for c in changes] == [
        ("autotune.tuned mm(32x16384 float32, 16384x64 float32) #2", "triton template num_stages=3, num_warps=4",
         "decompose_k k_split=64"),
        ("autotune.tuned addmm(32x16384 float32, 16384x64 float32)", "extern kernel_call_name=bias_addmm",
         "(not tuned)")]
    assert pick_changes(a, a) == []
    # the same config under another per-process name is the same pick; the same pick made otherwise is not
    assert pick_changes(_manifest(("mm", "triton_mm_3", "benchmark")), _manifest(("mm", "triton_mm_9", "benchmark"))) == []
    fused = pick_changes(_manifest(("mm", "triton_mm_3", "benchmark")),
                         _manifest(("mm", "triton_mm_3", "benchmark fusion")))
    assert [(c.a, c.b) for c in fused] == [("triton template num_stages=3, num_warps=4",
                                            "triton template num_stages=3, num_warps=4 (by benchmark fusion)")]


def test_manifests_without_picks_or_with_malformed_ones_compare_empty():
    assert pick_changes({}, {"autotune": {"tuned": "not a list"}}) == []
    assert pick_changes({"autotune": None}, {"autotune": {"tuned": [1, "x", None]}}) == []
    odd = {"autotune": {"tuned": [{"op": "mm", "inputs": 5, "candidates": 5, "chosen": None, "more": "x"}]}}
    assert [(c.a, c.b) for c in pick_changes({}, odd)] == [("(not tuned)", "(no pick)")]


def test_inspect_survives_malformed_and_markup_laden_records(monkeypatch):
    from rich.console import Console

    from precompile.cli import picks_view

    out = io.StringIO()
    monkeypatch.setattr(picks_view, "console", lambda: Console(file=out, width=200))
    picks_view.show_tuned([{"op": "[/]x", "inputs": 5, "candidates": 5, "more": "x", "chosen": "[/]"},
                           {"op": "mm", "candidates": [{"choice": "c", "ms": True, "config": "[/]"}], "more": -3}], "7")
    assert "[/]x" in out.getvalue() and "tuned ops (2)" in out.getvalue()


def test_inspect_prints_a_pick_table_and_treats_stored_strings_as_text(monkeypatch):
    from rich.console import Console

    from precompile.cli import picks_view

    out = io.StringIO()
    monkeypatch.setattr(picks_view, "console", lambda: Console(file=out, width=200))
    m = _manifest(("mm", "triton_mm_3", "benchmark"))
    m["autotune"]["tuned"][0]["chosen"] = m["autotune"]["tuned"][0]["candidates"][0]["choice"] = "[red]triton_mm_3[/]"
    picks_view.show_tuned(m["autotune"]["tuned"], 3)
    text = out.getvalue()
    assert "tuned ops (1)" in text and "[red]triton_mm_3[/]" in text and "chosen" in text
    assert "3 autotune configs of kernels that only a benchmark compiled" in text


def _tuned_compile(model, x, replay=None):
    """Compile ``model`` afresh with CPU GEMM tuning (the C++ GEMM template needs frozen weights), recording the
    picks, optionally replaying ``replay``; returns the records."""
    import contextlib

    import torch
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    from precompile.inductor.build import picks

    torch._dynamo.reset()
    with fresh_cache(), torch.no_grad(), config.patch({"max_autotune": True, "freezing": True,
                                                       "max_autotune_gemm_backends": "CPP,ATEN"}), \
            (picks.replaying(replay) if replay is not None else contextlib.nullcontext()), \
            picks.recording() as records:
        torch.compile(model)(x)
    return records


def test_a_second_compile_replaying_the_first_ones_records_takes_their_picks():
    """Real CPU GEMM tuning (C++ template against MKL): a compile under ``replaying`` benchmarks nothing for the ops
    the records cover and picks what they say, even where that is not what a benchmark would pick."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
    x = torch.randn(8, 64)
    first = _tuned_compile(model, x)
    assert len(first) == 2 and all(len(r["candidates"]) >= 2 for r in first), first
    # the records made to say the opposite: the slowest candidate of each op is now the fastest
    flipped = []
    for r in first:
        cands = [dict(c) for c in r["candidates"]]
        slowest = max(cands, key=lambda c: c["ms"])
        slowest["ms"] = 1e-6
        flipped.append({**r, "candidates": cands, "chosen": slowest["choice"]})
    second = _tuned_compile(model, x, replay=flipped)
    assert len(second) == 2
    for want, got in zip(flipped, second):
        assert sorted((c["kind"], repr(sorted(c["config"].items())), c["ms"]) for c in got["candidates"]) == \
            sorted((c["kind"], repr(sorted(c["config"].items())), c["ms"]) for c in want["candidates"])  # no benchmark
        chosen = next(c for c in want["candidates"] if c["choice"] == want["chosen"])
        picked = next(c for c in got["candidates"] if c["choice"] == got["chosen"])
        assert (picked["kind"], picked["config"]) == (chosen["kind"], chosen["config"])
    firsts = [next((c["kind"], c["config"]) for c in r["candidates"] if c["choice"] == r["chosen"]) for r in first]
    seconds = [next((c["kind"], c["config"]) for c in r["candidates"] if c["choice"] == r["chosen"]) for r in second]
    assert firsts != seconds  # the replay, not a benchmark, decided
