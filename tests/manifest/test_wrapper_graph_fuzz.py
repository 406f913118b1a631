"""Hostile wrapper graphs, fuzzed (tests/_wrapper_fuzz.py): random node sequences over the whole allow-list and over
targets outside it, random sizes, strides, offsets and placeholders, built and run on CPU tensors whose storages
sit between guard regions.  Each graph is refused by ``check``/``build`` with ``WrapperGraphError``, or runs with
everything it returns inside its storage and every guard unchanged.  The fuzz runs in a fresh process, so that a
crash fails the test instead of killing pytest; it is derandomized, so CI sees the same graphs every run.  The same
fuzz on CUDA tensors: tests/inductor/test_gpu_wrapper_graph_fuzz.py.
"""

from __future__ import annotations

import json

import torch
from _wrapper_fuzz import Arena, violations
from conftest import run_python

#: Graphs per CI run: about 20 s on two cores.
EXAMPLES = 1500


def test_hostile_wrapper_graphs_are_refused_or_run_inside_their_storages():
    out = run_python("import _wrapper_fuzz; _wrapper_fuzz.main()", "cpu", str(EXAMPLES), timeout=240)
    tally = json.loads(out.splitlines()[-1])
    print(tally)
    assert sum(tally.values()) == EXAMPLES
    # not vacuous: graphs refused at load, refused by a check in the call, stopped by ATen's checks, and run
    assert min(tally.values()) >= EXAMPLES // 50, tally


def test_the_fuzz_sees_a_read_and_a_write_past_a_storage():
    """What issue 30's graphs did, done here directly with ATen (no wrapper graph): the harness must see it."""
    arena = Arena([4, 4], "cpu")
    x = arena.inputs[0]
    alias = torch.ops.aten._reshape_alias.default(x, [8], [1])  # reaches into the guard after x's storage
    assert violations([x * 2], arena) == [] and arena.guards_intact()
    assert "reaches past its storage" in violations([alias], arena)[0]
    assert "guard's pattern" in violations([alias.clone()], arena)[0]
    alias.fill_(0.0)
    assert not arena.guards_intact()
