"""A manifest whose digests check but whose fields have the wrong shape (a second probe of issue 30): a kernel
without ``binaries``, a placeholder that is a string or has no name, sizes that are a number or do not match their
strides, a specialized number that is a string, ``shapes`` of the wrong types.  Without verify keys nothing checks
who wrote it, so each must be caught by the structure checks: a miss (the ref dropped) in a fresh process, then
``standalone_compile`` against the same cache rebuilds and returns the eager output.  Before, a ``KeyError`` or a
``TypeError`` escaped ``standalone_compile``.
"""

from __future__ import annotations

import json
import shutil

from _probe import probe
from test_bounded_loads import LOAD_PROBE, check_rebuilds

from cache_backends.local.cache import LocalCache
from precompile.manifest.manifest import Manifest


def _placeholder(m: dict, **spec: object) -> None:
    m["placeholders"][0] = spec


CASES = {
    "kernel_without_binaries": lambda m: m["kernels"][0].pop("binaries"),
    "placeholder_a_string": lambda m: m["placeholders"].__setitem__(0, "x"),
    "placeholder_without_name": lambda m: m["placeholders"][0].pop("name"),
    "shape_a_number": lambda m: m["placeholders"][0].__setitem__("shape", 5),
    "strides_unlike_sizes": lambda m: m["placeholders"][0].__setitem__("stride", [1]),
    "size_past_int64": lambda m: m["placeholders"][0].__setitem__("shape", [1 << 64, 1]),
    "number_a_string": lambda m: _placeholder(m, name="x", kind="input", type="int", value="7"),
    "symbols_a_list": lambda m: m["shapes"].__setitem__("symbols", ["s0"]),
    "guards_a_number": lambda m: m["shapes"].__setitem__("guards", 7),
}


def test_a_manifest_of_the_wrong_shape_is_a_miss_and_is_rebuilt(artifacts, tmp_path):
    c = artifacts("dynamo")
    assert c.art.manifest.kernels and c.art.manifest.placeholders[0]["type"] == "tensor"
    urls = []
    for case, edit in CASES.items():
        dest = tmp_path / case
        shutil.copytree(artifacts.cache_dir, dest)
        cache = LocalCache(dest)
        manifest = json.loads(cache.get_blob(cache.get_ref(c.art.key)))
        edit(manifest)
        cache.set_ref(c.art.key, cache.put_blob(json.dumps(manifest).encode()))
        urls.append("file://" + str(dest))
    check_rebuilds(probe(LOAD_PROBE, c.art.key, *urls, timeout=600), tuple(CASES), tmp_path / "no-marker")
    for url in urls:  # each ref dropped by the miss, replaced by the rebuild's own, well-formed
        cache = LocalCache(url.removeprefix("file://"))
        assert Manifest.from_json(cache.get_blob(cache.get_ref(c.art.key))).key == c.art.key
