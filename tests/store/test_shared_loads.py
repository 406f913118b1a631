"""One load per key per process (precompile/store/shared.py): pieces that share a key share one loaded artifact.

Two "layers" are the same 2-layer MLP graph with different weights (``make_fx`` with the weights as inputs, as vLLM's
pieces take them), so they have one key.  The first lookup reads, verifies and loads the entry; the second is served
from it without reading the cache (shown by deleting the cache's blobs in between: without sharing that lookup
misses), and each piece keeps its own inputs and outputs, called one after another and from two threads at once.
"""

from __future__ import annotations

import shutil
import threading

import pytest
import torch

import _graphs
from precompile.manifest.trust import Policy
from precompile.builder.standalone import standalone_compile
from precompile.store import shared
from precompile.store.opening import open_cache


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    """Two pieces of one key (different weights), a cache holding their artifact, and eager's outputs."""
    cache = f"file://{tmp_path_factory.mktemp('shared-cache')}"
    pieces = []
    for seed in (0, 1):
        gm, inputs = _graphs.make_fx_graph(_graphs.mlp(seed=seed), _graphs.example(seed=10 + seed))
        pieces.append((gm, inputs, gm(*inputs)))
    assert _graphs.key(*pieces[0][:2]) == _graphs.key(*pieces[1][:2])
    shared.forget()
    built = standalone_compile(pieces[0][0], pieces[0][1], cache=cache)
    assert built.outcome == "built"
    return cache, pieces


def _lookup(piece, cache):
    gm, inputs, _ = piece
    return standalone_compile(gm, inputs, cache=cache)


def test_a_second_piece_of_one_key_is_served_without_reading_the_cache(layers):
    url, pieces = layers
    shared.forget()
    cache = open_cache(url)  # one handle for every piece, as vLLM's adaptor holds one
    first = _lookup(pieces[0], cache)
    assert (first.outcome, first.engine_kind) == ("hit", "fast")
    shutil.rmtree(url.removeprefix("file://") + "/blob")  # nothing left to read: only the shared entry can serve
    second = _lookup(pieces[1], cache)
    assert second.outcome == "hit" and second.engine is first.engine and second is not first
    torch.testing.assert_close(second(*pieces[1][1]), pieces[1][2], rtol=1e-5, atol=1e-5)
    # another handle of the same cache reads anew: the blobs are gone, so it is a miss and a build
    third = _lookup(pieces[1], url)
    assert third.outcome == "built"
    shared.forget()  # and so does the same handle once the entry is forgotten (the build stored the blobs again)
    shutil.rmtree(url.removeprefix("file://") + "/blob")
    assert _lookup(pieces[1], cache).outcome == "built"


def test_a_built_artifact_is_shared_with_the_next_piece_of_its_key(tmp_path):
    cache = open_cache(f"file://{tmp_path}")
    gm0, in0 = _graphs.make_fx_graph(_graphs.mlp(seed=2), _graphs.example(seed=12))
    gm1, in1 = _graphs.make_fx_graph(_graphs.mlp(seed=3), _graphs.example(seed=13))
    shared.forget()
    built = standalone_compile(gm0, in0, cache=cache)
    again = standalone_compile(gm1, in1, cache=cache)
    assert (built.outcome, again.outcome) == ("built", "hit") and again.engine is built.engine
    torch.testing.assert_close(again(*in1), gm1(*in1), rtol=1e-5, atol=1e-5)


def test_pieces_keep_their_own_inputs_and_outputs(layers):
    url, pieces = layers
    shared.forget()
    cache = open_cache(url)
    arts = [_lookup(p, cache) for p in pieces]
    assert arts[0].engine is arts[1].engine
    firsts = [art(*p[1]) for art, p in zip(arts, pieces)]
    for out, p in zip(firsts, pieces):
        torch.testing.assert_close(out, p[2], rtol=1e-5, atol=1e-5)
    # interleaved: nothing of one call reaches the next, whichever piece made it
    for _ in range(3):
        for i in (1, 0, 0, 1):
            out = arts[i](*pieces[i][1])
            assert torch.equal(out[0], firsts[i][0]) and out[0].data_ptr() != firsts[i][0].data_ptr()


def test_two_pieces_of_one_key_called_from_two_threads_at_once(layers):
    url, pieces = layers
    shared.forget()
    cache = open_cache(url)
    arts = [_lookup(p, cache) for p in pieces]
    want = [art(*p[1])[0] for art, p in zip(arts, pieces)]
    wrong: list[str] = []
    start = threading.Barrier(2)

    def run(i: int) -> None:
        start.wait()
        for n in range(200):
            got = arts[i](*pieces[i][1])[0]
            if not torch.equal(got, want[i]):
                wrong.append(f"piece {i} call {n}")

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not wrong
    assert not torch.equal(want[0], want[1])  # different weights and inputs: a mix-up would show


def test_an_entry_is_shared_only_under_the_trust_it_was_verified_with(layers):
    url, pieces = layers
    shared.forget()
    cache = open_cache(url)
    first = _lookup(pieces[0], cache)
    assert shared.sibling(first.key, Policy(), cache=cache) is not None
    assert shared.sibling(first.key, Policy(no_host_code=True), cache=cache) is None
    assert shared.sibling(first.key, None, cache=cache) is not None  # no policy resolved is the empty policy
    assert shared.sibling(first.key, Policy(), cache=open_cache(url)) is None  # another handle reads anew
    assert shared.sibling("0" * 64, Policy(), cache=cache) is None


def test_an_entry_lives_while_a_piece_sharing_it_does(layers):
    import gc

    url, pieces = layers
    shared.forget()
    cache = open_cache(url)
    first = _lookup(pieces[0], cache)
    second = _lookup(pieces[1], cache)
    key = first.key
    del first
    gc.collect()
    assert shared.sibling(key, Policy(), cache=cache) is not None  # the second piece keeps the entry alive
    del second
    gc.collect()
    assert shared.sibling(key, Policy(), cache=cache) is None and shared.held() == 0
