"""What a ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` worker reads from a cache (issue 34, "Stalls"): only the wrapper graph
and its launch blobs, each within the graph engine's own bound, never the host-code parts it does not run.
Before, it read the host-code parts a load needs eagerly (up to the sizes the manifest records) and the wrapper
graph up to its recorded size before the 8 MiB graph bound refused it: a manifest recording 2 GiB + 1 GiB cost
3.48 GB.  On CPU Inductor's FX wrapper expresses a graph of library calls only; the entry here is a real artifact of
one with its wrapper graph added (no verify keys: nothing checks who wrote it)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _cli import store_variant
from _probe import assert_refused, probe, zstd_bomb

import precompile
from cache_backends.bounded import MAX_BLOB_BYTES
from cache_backends.local.cache import LocalCache
from precompile.manifest.manifest import Manifest
from precompile.store.cache_io import load_from_cache

GiB = 1 << 30


class Gemms(torch.nn.Module):
    def forward(self, a, b, c):
        return torch.mm(a, b), torch.addmm(c, a, b)


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    """``(key, cache directory)`` of an artifact with a wrapper graph."""
    from precompile.manifest.wrapper import graph as wg
    from precompile.inductor.build.fx_wrapper import wrapper_graph

    root = tmp_path_factory.mktemp("nohost") / "cache"
    gm = torch.fx.symbolic_trace(Gemms())
    example = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)]
    art = precompile.standalone_compile(gm, example, cache=f"file://{root}")
    graph, _, kernels = wrapper_graph(gm, example)
    assert kernels == {}
    data = json.dumps(wg.to_data(graph)).encode()
    digest = LocalCache(root).put_blob(data)

    def add_graph(m):
        m["parts"]["wrapper_graph"] = {"graph": digest, "kernels": {}}
        m["blobs"][digest] = {"size": len(data), "role": "wrapper graph (data)"}

    assert store_variant(f"file://{root}", art.key, add_graph) == art.key
    return art.key, root


def blob_file(root, digest):
    return root / "blob" / digest[:2] / digest[2:]


def test_only_the_wrapper_graph_is_read(entry, monkeypatch):
    key, root = entry
    monkeypatch.setenv("PRECOMPILE_REQUIRE_NO_HOST_CODE", "1")
    cache = LocalCache(root)
    manifest = Manifest.from_json(cache.get_blob(cache.get_ref(key)))
    host_code = set(manifest.load_digests())  # what a load with host code reads: the fast wrapper, binaries
    assert host_code and manifest.parts["wrapper_graph"]["graph"] not in host_code
    before = cache.counters()["bytes_read"]
    art = load_from_cache(key, f"file://{root}")
    assert art is not None  # (its graph engine launches cubins through CUDA: on CPU it is built, not called)
    read = cache.counters()["bytes_read"] - before
    digests = [cache.get_ref(key), manifest.parts["wrapper_graph"]["graph"]]
    assert read == sum(blob_file(root, d).stat().st_size for d in digests), "a host-code part was read"


INFLATED = """
from precompile.store.cache_io import load_from_cache
key, honest, inflated = sys.argv[1:]
measure(lambda: type(load_from_cache(key, honest)).__name__)
measure(lambda: repr(load_from_cache(key, inflated)))
"""


def test_parts_recorded_as_gigabytes_are_read_within_the_engines_bounds(entry, tmp_path):
    """The wrapper graph recorded as 2 GiB (a frame inflating to that) and a host-code part as 1 GiB: a miss whose
    peak memory stays within that of an honest load, plus far less than 100 MiB."""
    key, root = entry
    dest = tmp_path / "inflated"
    shutil.copytree(root, dest)
    cache = LocalCache(dest)
    manifest = json.loads(cache.get_blob(cache.get_ref(key)))
    graph = manifest["parts"]["wrapper_graph"]["graph"]
    host = Manifest.from_dict(manifest).load_digests()[0]
    for digest, size in ((graph, MAX_BLOB_BYTES), (host, GiB)):
        blob_file(dest, digest).write_bytes(zstd_bomb(size, with_size=False))

    def inflate(m):
        m["blobs"][graph]["size"], m["blobs"][host]["size"] = MAX_BLOB_BYTES, GiB

    assert store_variant(f"file://{dest}", key, inflate) == key
    honest, inflated = probe(INFLATED, key, f"file://{root}", f"file://{dest}",
                             env={"PRECOMPILE_REQUIRE_NO_HOST_CODE": "1"})
    assert honest["value"] == "Artifact", honest
    assert_refused(inflated, None, max_grew_mib=honest["grew_mib"] + 32, what="inflated parts")
    assert inflated["value"] == "None"
