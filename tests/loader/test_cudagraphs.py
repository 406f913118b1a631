"""CUDA graphs over a loaded graph (``mode="reduce-overhead"``): replays equal direct calls, writes into a caller's
buffer land there (in place for a static buffer, copied back for another), and an output held by the caller is never
overwritten by a later replay.  Needs a GPU; skipped without one."""

from __future__ import annotations

import pytest
import torch

from precompile.loader.cudagraphs import CudaGraphRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _step(x, w, static_cache, cache):
    static_cache.add_(x.sum())   # a KV cache marked static: written in place
    cache.mul_(2)                # a buffer that is not: copied in, and back out
    return (x @ w + static_cache, cache * 1)


def test_replays_equal_direct_calls_and_writes_reach_the_callers_buffers():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8, device="cuda"), requires_grad=False)
    static_cache = torch.zeros(8, device="cuda")
    torch._dynamo.mark_static_address(static_cache)
    cache = torch.ones(8, device="cuda")
    ref_static, ref_cache = static_cache.clone(), cache.clone()
    runner = CudaGraphRunner(_step, mutated=[2, 3], name="step")
    held = []
    for i in range(5):
        x = torch.randn(4, 8, device="cuda")
        got = runner(x, w, static_cache, cache)
        want = _step(x, w, ref_static, ref_cache)
        held.append((got, want))
        assert torch.equal(static_cache, ref_static) and torch.equal(cache, ref_cache), i
    assert runner.replays == 4  # call 1 warms up, call 2 records and replays, calls 3-5 replay
    for got, want in held:  # outputs the caller kept were not overwritten by later replays
        assert all(torch.equal(g, r) for g, r in zip(got, want))


def test_a_new_shape_records_a_new_graph_and_cpu_inputs_run_directly():
    runner = CudaGraphRunner(lambda x: (x * 3,), name="triple")
    for n in (4, 4, 4, 6, 6, 6):
        x = torch.randn(n, device="cuda")
        assert torch.equal(runner(x)[0], x * 3)
    assert runner.replays == 4 and len(runner._graphs) == 2  # per shape: a warm-up, then two replays
    assert torch.equal(runner(torch.ones(3))[0], torch.full((3,), 3.0))


def test_a_graph_that_cannot_be_captured_runs_without_one_and_leaves_the_process_as_it_was():
    def syncs_for_five(x):
        if x.shape[0] == 5:
            return (x * float(x.sum().item()),)  # a host sync: capture fails
        return (x * 3,)

    runner = CudaGraphRunner(syncs_for_five, name="syncs")
    stream = torch.cuda.current_stream()
    for _ in range(4):
        x = torch.randn(5, device="cuda")
        rng = torch.cuda.get_rng_state()
        assert torch.equal(runner(x)[0], syncs_for_five(x)[0])
        # the failed capture left the generator where it was (same seed and offset, not capturing), so random ops
        # still run and draw what they would have drawn; the caller's stream is still current
        assert torch.equal(torch.cuda.get_rng_state(), rng)
        assert torch.cuda.current_stream() == stream
    assert runner.replays == 0 and not runner._graphs
    torch.cuda.manual_seed(7)
    a = torch.randn(5, device="cuda")
    torch.cuda.manual_seed(7)
    assert torch.equal(torch.randn(5, device="cuda"), a)
    # the allocator no longer records into the runner's pool: the next signature records a graph into it
    for _ in range(3):
        y = torch.randn(6, device="cuda")
        assert torch.equal(runner(y)[0], y * 3)
    assert runner.replays == 2 and len(runner._graphs) == 1


def test_a_failed_capture_leaves_graphs_recorded_before_it_replaying():
    """torch 2.11: every capture holds the default generator's state, and a failed one left it in capture mode, so a
    graph recorded earlier raised on its next replay.  Recorded for 6, failed for 5: 6 still replays, and random
    ops draw as before."""
    def syncs_for_five(x):
        if x.shape[0] == 5:
            return (x * float(x.sum().item()),)
        return (x * 3,)

    runner = CudaGraphRunner(syncs_for_five, name="syncs")
    six = torch.randn(6, device="cuda")
    for _ in range(2):
        runner(six)  # a warm-up, then recorded
    assert len(runner._graphs) == 1
    five = torch.randn(5, device="cuda")
    for _ in range(2):
        assert torch.equal(runner(five)[0], syncs_for_five(five)[0])  # a warm-up, then a failed capture
    replays = runner.replays
    assert torch.equal(runner(six)[0], six * 3) and runner.replays == replays + 1
    torch.cuda.manual_seed(3)
    a = torch.randn(4, device="cuda")
    torch.cuda.manual_seed(3)
    assert torch.equal(torch.randn(4, device="cuda"), a)
