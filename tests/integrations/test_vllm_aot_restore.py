"""Restoring vLLM's AOT artifact from the cache (precompile.integrations.vllm.aot, no vLLM needed): an entry stored
as refused (a function that cannot be stored whole, and why) has no AOT artifact; it was written to vLLM's path as
an empty file and counted as a hit (a second probe of issue 30).  It is a miss now: ``_read`` gives no entry, and
``load_through_cache`` writes to vLLM's path only what it gives."""

from __future__ import annotations

from cache_backends.local.cache import LocalCache
from precompile.function import store
from precompile.integrations.vllm import aot as vllm_aot

KEY = "ab" * 32


def test_an_entry_stored_as_refused_restores_nothing(tmp_path):
    cache = LocalCache(tmp_path / "cache")
    store.write_refused(cache, KEY, {"kind": "function", "x": 1}, {}, {"refused": "a frame's guards cannot be stored"})
    assert store.read(cache, KEY).manifest.refused  # the reason is stored, for the other workers to read
    # what a start reads before it writes anything to vLLM's path: nothing, so nothing is written and vLLM traces
    assert vllm_aot._read(cache, KEY) is None
    assert vllm_aot._read(cache, "cd" * 32) is None  # absent: the same
