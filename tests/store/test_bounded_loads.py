"""Loads from a cache whose entry cannot be read within bounds (issue 30, finding 3), in fresh processes under a
memory limit (tests/_probe.py): a FIFO as the ref, the manifest blob or a part, a part that is a symlink to
``/dev/zero``, larger than its manifest says, or a zstd frame inflating to 1 GiB; in Redis, a 32 KiB manifest value
inflating to 1 GiB, signed and unsigned.  Each lookup is a miss within 10 s with its peak memory bounded, no planted
byte runs (the planted parts start with a pickle that writes a marker file), and ``standalone_compile`` against the
same cache rebuilds and returns the eager output.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from _probe import assert_refused, probe, zstd_bomb

from cache_backends.local.cache import LocalCache
from cache_backends.redis.codec import MAGIC
from precompile.manifest import trust
from precompile.store.opening import open_with_policy

GiB = 1 << 30
LOAD_PROBE = """
import _graphs, torch
from precompile.store.cache_io import load_from_cache
import precompile
gm, inputs = _graphs.graph("dynamo", _graphs.mlp())
with torch.no_grad():
    want = gm(*inputs)
key = sys.argv[1]
for url in sys.argv[2:]:
    measure(lambda: repr(load_from_cache(key, url)))
    art = precompile.standalone_compile(gm, inputs, cache=url)
    got = art(*inputs)
    print(json.dumps({"source": art.source, "same": all(torch.allclose(g, w, rtol=1e-4, atol=1e-5)
                                                        for g, w in zip(got, want))}), flush=True)
"""


class _Evil:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def damaged_copy(src: Path, dest: Path, key: str, case: str, marker: Path) -> str:
    """A copy of the cache ``src`` whose entry ``key`` is damaged as ``case`` says; returns its URL."""
    shutil.copytree(src, dest)
    ref = dest / "ref" / key
    manifest_digest = ref.read_text().strip()
    manifest = json.loads(LocalCache(dest).get_blob(manifest_digest))
    part = manifest["parts"]["engine_payload"]  # read at load (the dynamo graph loads the portable way)
    blob = lambda d: dest / "blob" / d[:2] / d[2:]  # noqa: E731
    target = ref if case == "ref_fifo" else blob(manifest_digest) if case == "manifest_fifo" else blob(part)
    target.unlink()
    evil = pickle.dumps(_Evil(marker))
    if case.endswith("fifo"):
        os.mkfifo(target)
    elif case == "part_dev_zero":
        target.symlink_to("/dev/zero")
    elif case == "part_larger":  # a valid frame, of more bytes than the manifest records
        target.write_bytes(zstd_bomb(manifest["blobs"][part]["size"] + (64 << 20), prefix=evil))
    else:
        target.write_bytes(zstd_bomb(GiB, with_size=False, prefix=evil))
    return "file://" + str(dest)


CASES = ("ref_fifo", "manifest_fifo", "part_fifo", "part_dev_zero", "part_larger", "part_bomb")


def check_rebuilds(lines: list[dict], cases: tuple[str, ...], marker: Path, max_grew_mib: float = 96) -> None:
    assert len(lines) == 2 * len(cases), lines
    for case, looked, built in zip(cases, lines[::2], lines[1::2]):
        assert_refused(looked, None, max_grew_mib=max_grew_mib, what=case)
        assert looked["value"] == "None", f"{case}: {looked['value']}"
        assert built == {"source": "compiled", "same": True}, f"{case}: {built}"
    assert not marker.exists(), "a planted part ran"


def test_an_entry_that_cannot_be_read_within_bounds_is_a_miss_and_is_rebuilt(artifacts, tmp_path):
    c = artifacts("dynamo")
    marker = tmp_path / "marker"
    urls = [damaged_copy(artifacts.cache_dir, tmp_path / case, c.art.key, case, marker) for case in CASES]
    check_rebuilds(probe(LOAD_PROBE, c.art.key, *urls, timeout=600), CASES, marker)


@pytest.mark.parametrize("signed", [True, False])
def test_a_redis_manifest_inflating_to_1_gib_is_a_bounded_miss_and_is_rebuilt(artifacts, redis_server, tmp_path,
                                                                             signed):
    c = artifacts("dynamo")
    env = {}
    url = redis_server.url()
    if signed:
        pub = trust.generate_key(tmp_path / "builder.pem")
        url = redis_server.url(signing_key=str(tmp_path / "builder.pem"))
        env = {"PRECOMPILE_VERIFY_KEYS": pub}
    cache, policy = open_with_policy(url)
    src = LocalCache(artifacts.cache_dir)
    for d in c.art.manifest.blobs:
        cache.put_blob(src.get_blob(d), d)
    stored = policy.sign(c.art.manifest)
    digest = cache.put_blob(stored.to_json())
    cache.set_ref(c.art.key, digest)
    marker = tmp_path / "marker"
    redis_server.client().set(f"precompile:blob:{{{digest}}}",
                              MAGIC + b"Z" + zstd_bomb(GiB, prefix=pickle.dumps(_Evil(marker))))
    check_rebuilds(probe(LOAD_PROBE, c.art.key, url, env=env, timeout=600), ("redis_bomb",), marker)
