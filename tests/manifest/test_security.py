"""Attacks on a shared cache and on artifact files, each of which must fail (issue 10, findings 1-4; the Redis
faults 5-8 are in tests/store/test_faults.py).

Every attack plants a self-consistent artifact (each blob named by its true sha256) that would run code: a fast
wrapper that writes a marker file, a pickled engine payload whose ``__reduce__`` does, a ``.so`` whose
constructor does, or a name that writes outside its directory.  Each test asserts that no marker file appears,
that the outcome is a miss (or a clear error) with the reason counted, and that the outputs are right.  Real
``file://`` caches, a real redis-server, real ``.pc`` files and unpacked directories; no mocks.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest
from conftest import assert_same_output, run_python

import precompile
from cache_backends import open_cache
from cache_backends.base import digest_bytes
from cache_backends.local.cache import LocalCache
from precompile.manifest import formats, trust
from precompile.manifest.manifest import Manifest
from precompile.errors import ArtifactFormatError, UnsafePathError, UntrustedArtifactError
from precompile.loader.artifact import Artifact
from precompile.store.cache_io import load_from_cache, store


# ------------------------------------------------------------------------------------------------- helpers
@pytest.fixture
def keys(tmp_path) -> dict[str, str]:
    """A builder's and an attacker's Ed25519 keys: ``{"builder": pem path, "builder_pub": text, ...}``."""
    out = {}
    for who in ("builder", "attacker"):
        path = tmp_path / f"{who}.pem"
        out[f"{who}_pub"] = trust.generate_key(path)
        out[who] = str(path)
    return out


def copy_of(art: Artifact) -> Artifact:
    """A fresh artifact with the same manifest and blobs (the session's artifacts stay unsigned)."""
    return Artifact(Manifest.from_dict(json.loads(art.manifest.to_json())), art.all_blobs())


def replaced(art: Artifact, old: str, new: bytes) -> tuple[dict, dict[str, bytes]]:
    """``(manifest dict, blobs)`` of ``art`` with blob ``old`` replaced by ``new`` everywhere it is named: a
    self-consistent artifact (every digest true), unsigned."""
    d_new = digest_bytes(new)
    doc = json.loads(art.manifest.to_json().decode().replace(old, d_new))
    doc.pop("signature", None)
    doc["blobs"][d_new]["size"] = len(new)
    blobs = {d: b for d, b in art.all_blobs().items() if d != old}
    blobs[d_new] = new
    return doc, blobs


def plant(cache, key: str, doc: dict, blobs: dict[str, bytes]) -> str:
    """Write ``blobs`` and ``doc`` under ``key``, as a writer of the shared cache can; returns the manifest digest."""
    for d, b in blobs.items():
        cache.put_blob(b, d)
    digest = cache.put_blob(json.dumps(doc, sort_keys=True, indent=1).encode())
    cache.set_ref(key, digest)
    return digest


def evil_wrapper(art: Artifact, marker: Path) -> tuple[dict, dict[str, bytes]]:
    """The fast wrapper with a first line that writes ``marker`` (the rest still computes the right result)."""
    old = art.manifest.parts["fast"]["source"]
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('pwned')\n".encode() + art.blob(old)
    return replaced(art, old, code)


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_payload(art: Artifact, marker: Path) -> tuple[dict, dict[str, bytes]]:
    return replaced(art, art.manifest.parts["engine_payload"], pickle.dumps(_Evil(marker)))


def evil_so(tmp_path: Path, marker: Path) -> bytes:
    """A shared object whose constructor writes ``marker`` when it is dlopen()ed."""
    src = tmp_path / "evil.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {\n'
                   f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("pwned", f); fclose(f); }}\n}}\n')
    out = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return out.read_bytes()


def first_binary(art: Artifact) -> tuple[str, str]:
    """``(file name, digest)`` of the first kernel's first binary."""
    return next(iter(art.manifest.kernels[0]["binaries"].items()))


# --------------------------------------------------------------------------- finding 1: code from the cache
@pytest.mark.parametrize("signed_by", ["nobody", "attacker", "builder_then_edited"])
def test_planted_fast_wrapper_never_runs_from_a_file_cache(signed_by, artifacts, keys, tmp_path, monkeypatch):
    c = artifacts("make_fx")
    assert c.art.manifest.parts["fast"], "the make_fx graph loads through the fast path"
    marker = tmp_path / "marker"
    doc, blobs = evil_wrapper(c.art, marker)
    if signed_by == "attacker":
        doc = json.loads(trust.Policy(signer=trust.load_signing_key(keys["attacker"])).sign(
            Manifest.from_dict(doc)).to_json())
    elif signed_by == "builder_then_edited":  # a genuine signature, then the wrapper swapped under it
        signed = trust.Policy(signer=trust.load_signing_key(keys["builder"])).sign(copy_of(c.art).manifest)
        doc["signature"] = signed.signature
    url = f"file://{tmp_path / 'cache'}"
    plant(open_cache(url), c.art.key, doc, blobs)

    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", keys["builder_pub"])
    art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled", "the planted entry was used"
    assert_same_output(art(*c.inputs), c.expected)
    assert not marker.exists(), "the planted wrapper ran"
    reason = {"nobody": "unsigned", "attacker": "unknown_key", "builder_then_edited": "bad_signature"}[signed_by]
    counters = LocalCache(tmp_path / "cache").counters()
    assert counters["untrusted"] == 1 and counters[f"untrusted_{reason}"] == 1, counters

    # without verify keys the same planted entry is not refused: what the keys are for (marker proves the attack)
    monkeypatch.delenv("PRECOMPILE_VERIFY_KEYS")
    plant(open_cache(url), c.art.key, doc, blobs)
    precompile.load(c.art.key, cache=url)
    assert marker.exists()


def test_planted_pickle_never_unpickled_from_a_cache_or_a_file(artifacts, keys, tmp_path, monkeypatch):
    c = artifacts("dynamo")
    assert not c.art.manifest.parts["fast"], "the dynamo (training) graph loads through the portable path"
    marker = tmp_path / "marker"
    doc, blobs = evil_payload(c.art, marker)
    url = f"file://{tmp_path / 'cache'}"
    plant(open_cache(url), c.art.key, doc, blobs)
    bad_file = tmp_path / "evil.pc"
    formats.write_binary(bad_file, json.dumps(doc).encode(), blobs)

    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", keys["builder_pub"])
    assert load_from_cache(c.art.key, url) is None
    assert LocalCache(tmp_path / "cache").counters()["untrusted_unsigned"] == 1
    before = trust.refused["unsigned"]
    with pytest.raises(UntrustedArtifactError, match="not signed") as info:
        precompile.load(bad_file)
    assert info.value.reason == "unsigned" and isinstance(info.value, PermissionError)
    assert trust.refused["unsigned"] == before + 1
    assert not marker.exists(), "the planted pickle was unpickled"
    art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled"
    assert_same_output(art(*c.inputs), c.expected)
    assert not marker.exists()


def test_planted_so_in_redis_never_loads_nor_reaches_a_read_only_workers_near_tier(artifacts, keys, tmp_path,
                                                                                   redis_server):
    c = artifacts("make_fx")
    marker = tmp_path / "marker"
    fname, old = first_binary(c.art)
    so = evil_so(tmp_path, marker)
    doc, blobs = replaced(c.art, old, so)
    evil = digest_bytes(so)
    planted_manifest = plant(open_cache(redis_server.url()), c.art.key, doc, blobs)

    near = tmp_path / "near"
    url = f"file://{near}?verify_keys={keys['builder_pub']}|{redis_server.url(read_only=1)}"
    art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled"
    assert_same_output(art(*c.inputs), c.expected)
    assert not marker.exists(), "the planted .so was loaded"
    local = LocalCache(near)
    assert not local.has_blob(evil) and not local.has_blob(planted_manifest), "poison backfilled into the near tier"
    assert local.counters()["untrusted_unsigned"] == 1
    assert redis_server.client().get(f"precompile:ref:{c.art.key}").decode() == planted_manifest  # left alone


def test_signed_artifacts_load_from_every_store_and_survive_copies(artifacts, keys, tmp_path, redis_server,
                                                                   monkeypatch):
    c = artifacts("make_fx")
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", keys["builder"])  # the builder
    art = copy_of(c.art)
    assert store(open_cache(redis_server.url()), art)
    assert art.manifest.signature["key_id"] == trust.key_id(trust.load_signing_key(keys["builder"]).public_key())
    monkeypatch.delenv("PRECOMPILE_SIGNING_KEY")

    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", f"{keys['attacker_pub']},{keys['builder_pub']}")  # a rotation
    cache = open_cache(f"file://{tmp_path / 'near'}|{redis_server.url(read_only=1)}")
    hit = precompile.load(c.art.key, cache=cache)
    assert hit.engine_kind == "fast"
    assert_same_output(hit(*c.inputs), c.expected)
    assert LocalCache(tmp_path / "near").get_ref(c.art.key)  # verified, so backfilled
    line = trust.describe(hit.manifest.to_dict())
    assert hit.manifest.signature["key_id"] in line and "verified" in line
    # the signature is part of the manifest: a file, a directory and a copy of refs + blobs carry it
    for path in (hit.save(tmp_path / "a.pc"), hit.save(tmp_path / "a.d", format="unpacked")):
        assert_same_output(precompile.load(path)(*c.inputs), c.expected)
    copy = LocalCache(tmp_path / "bundle")
    remote = open_cache(redis_server.url())
    for key, digest in remote.iter_refs():
        for d in [digest, *json.loads(remote.get_blob(digest))["blobs"]]:
            copy.put_blob(remote.get_blob(d), d)
        copy.set_ref(key, digest)
    assert_same_output(precompile.load(c.art.key, cache=copy)(*c.inputs), c.expected)
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", keys["attacker_pub"])  # the builder's key rotated out
    with pytest.raises(UntrustedArtifactError) as info:
        precompile.load(tmp_path / "a.pc")
    assert info.value.reason == "unknown_key"


# --------------------------------------------------------------------- finding 2: writes outside a directory
@pytest.mark.parametrize("where", ["../../../escaped.pth", "/tmp/../{tmp}/escaped-abs.pth"])
def test_relpaths_that_escape_are_refused_from_a_cache_a_file_and_a_directory(where, artifacts, tmp_path):
    c = artifacts("dynamo")
    target = tmp_path / ("escaped-abs.pth" if where.startswith("/") else "escaped.pth")
    rel = where.format(tmp=str(tmp_path).lstrip("/"))
    doc = json.loads(c.art.manifest.to_json())
    fname = next(iter(doc["kernels"][0]["relpaths"]))
    doc["kernels"][0]["relpaths"][fname] = rel
    blobs = c.art.all_blobs()
    url = f"file://{tmp_path / 'cache'}"
    plant(open_cache(url), c.art.key, doc, blobs)
    assert load_from_cache(c.art.key, url) is None  # a miss, counted
    assert LocalCache(tmp_path / "cache").counters()["untrusted_unsafe_path"] == 1
    formats.write_binary(tmp_path / "evil.pc", json.dumps(doc).encode(), blobs)
    with pytest.raises(UnsafePathError, match="relpaths") as info:
        precompile.load(tmp_path / "evil.pc")
    assert isinstance(info.value, ValueError) and isinstance(info.value, precompile.PrecompileError)
    d = copy_of(c.art).save(tmp_path / "art.d", format="unpacked")
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UnsafePathError):
        precompile.load(d)
    # the portable loader checks its relpaths itself, before it unpickles anything
    from precompile.inductor.load import portable

    marker = tmp_path / "marker"
    with pytest.raises(UnsafePathError):
        portable.load_engine(pickle.dumps(_Evil(marker)), {rel: b"import os"})
    assert not target.exists() and not marker.exists()


def test_unpacked_index_and_links_cannot_lead_outside(artifacts, tmp_path):
    c = artifacts("make_fx")
    d = copy_of(c.art).save(tmp_path / "art.d", format="unpacked")
    index = json.loads((d / "index.json").read_text())
    digest, rel = next(iter(index.items()))
    secret = tmp_path / "secret.txt"
    secret.write_bytes((d / rel).read_bytes())  # same bytes, so only the path check can refuse it
    bad = dict(index, **{digest: "../secret.txt"})
    (d / "index.json").write_text(json.dumps(bad))
    with pytest.raises(UnsafePathError, match=r"\.\."):
        precompile.load(d)
    (d / "index.json").write_text(json.dumps(index))
    (d / rel).unlink()
    (d / rel).symlink_to(secret)
    with pytest.raises(UnsafePathError, match="leads outside"):
        precompile.load(d)


# ---------------------------------------------------------------- finding 3: binaries in a machine-wide dir
POISONED_DIR_SNIPPET = r"""
import json, os, sys, torch, precompile, _graphs
art = precompile.load(sys.argv[1])
c_model = _graphs.mlp()
gm, inputs = _graphs.graph("dynamo", c_model)
with torch.no_grad():
    want = gm(*inputs)
got = art(*inputs)
ok = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want) if isinstance(a, torch.Tensor))
print(json.dumps({"engine": art.engine_kind, "ok": ok}))
"""


def test_a_poisoned_binary_left_in_inductors_dir_is_never_loaded(artifacts, tmp_path):
    c = artifacts("dynamo")
    marker = tmp_path / "marker"
    so = evil_so(tmp_path, marker)
    shared = tmp_path / "machine-wide-inductor"
    for k in c.art.manifest.kernels:  # what an earlier, poisoned load would have left behind
        for rel in k["relpaths"].values():
            (shared / rel).parent.mkdir(parents=True, exist_ok=True)
            (shared / rel).write_bytes(so)
    path = copy_of(c.art).save(tmp_path / "pristine.pc")
    out = run_python(POISONED_DIR_SNIPPET, str(path), env={"TORCHINDUCTOR_CACHE_DIR": str(shared),
                                                           "TORCHINDUCTOR_VEC_ISA_OK": "1"})
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"engine": "portable", "ok": True}, report
    assert not marker.exists(), "a binary from the machine-wide dir was loaded"


# -------------------------------------------------------------------- finding 4: save of a poisoned entry
@pytest.mark.parametrize("field, value", [("name", "../../escaped"), ("binaries", "../../../escaped.so"),
                                          ("wrappers", "/tmp/escaped")])
def test_save_unpacked_refuses_names_that_escape(field, value, artifacts, tmp_path):
    c = artifacts("make_fx")
    art = copy_of(c.art)
    m = art.manifest
    if field == "name":
        m.kernels[0]["name"] = value
    elif field == "binaries":
        fname, d = first_binary(art)
        m.kernels[0]["binaries"] = {value: d}
    else:
        m.parts["wrappers"] = {value: d for d in m.parts["wrappers"].values()}
    with pytest.raises(UnsafePathError):
        art.save(tmp_path / "out" / "art.d", format="unpacked")
    assert not (tmp_path / "out" / "art.d").exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # no temporary left behind
    assert not list(tmp_path.rglob("escaped*")) and not Path("/tmp/escaped.py").exists()


# ------------------------------------------------------------------------ parsers: garbage is a clean miss
def test_garbled_manifests_are_misses_never_exceptions(artifacts, tmp_path):
    c = artifacts("make_fx")
    url = f"file://{tmp_path / 'cache'}"
    cache = open_cache(url)
    blobs = c.art.all_blobs()
    good = json.loads(c.art.manifest.to_json())
    garbage = [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe not utf-8", json.dumps({**good, "kernels": 7}).encode(),
               json.dumps({**good, "blobs": {"zz": 1}}).encode(), json.dumps({**good, "alignment": ["x"]}).encode(),
               json.dumps({**good, "calling": {"in_spec": "[not a spec"}}).encode()]
    for raw in garbage:
        for d, b in blobs.items():
            cache.put_blob(b, d)
        cache.set_ref(c.art.key, cache.put_blob(raw))
        assert load_from_cache(c.art.key, cache) is None, raw[:60]
        with pytest.raises(ArtifactFormatError):
            formats.write_binary(tmp_path / "g.pc", raw, blobs)
            precompile.load(tmp_path / "g.pc")



@pytest.mark.parametrize("bad", ["[not a spec", "[1, 7]", "[9, {}]", "[" * 5000 + "]" * 5000, 7])
def test_garbled_pytree_spec_is_a_format_error_and_a_dropped_cache_entry(bad, artifacts, tmp_path):
    from cache_backends.base import MISS

    c = artifacts("make_fx")
    blobs = c.art.all_blobs()
    doc = {**json.loads(c.art.manifest.to_json()), "calling": {"in_spec": bad, "out_spec": None}}
    with pytest.raises(ArtifactFormatError, match=r"calling\.in_spec"):
        Artifact(Manifest.from_dict(doc), blobs)
    cache = open_cache(f"file://{tmp_path / 'cache'}")
    for d, b in blobs.items():
        cache.put_blob(b, d)
    cache.set_ref(c.art.key, cache.put_blob(json.dumps(doc).encode()))
    assert load_from_cache(c.art.key, cache) is None
    assert cache.get_ref(c.art.key) is MISS  # a damaged entry is dropped so the next build replaces it

def test_binary_file_counts_and_lengths_are_bounded(artifacts, tmp_path):
    import struct

    import zstandard

    c = artifacts("make_fx")
    raw = bytearray(copy_of(c.art).save(tmp_path / "a.pc").read_bytes())
    mlen = struct.unpack_from("<Q", raw, 12)[0]
    count_at = 20 + mlen
    bad = bytearray(raw)
    struct.pack_into("<I", bad, count_at, 0xFFFFFFFF)
    (tmp_path / "count.pc").write_bytes(bytes(bad))
    with pytest.raises(ArtifactFormatError, match="claims 4294967295 blobs"):
        precompile.load(tmp_path / "count.pc")
    # a frame that decompresses to other bytes than the manifest records: refused, whatever its header claims
    digest = bytes(raw[count_at + 4:count_at + 36]).hex()
    (zlen,) = struct.unpack_from("<Q", raw, count_at + 36)
    other = zstandard.ZstdCompressor().compress(b"\0" * (1 << 20))
    swapped = raw[:count_at + 36] + struct.pack("<Q", len(other)) + other + raw[count_at + 44 + zlen:]
    (tmp_path / "swapped.pc").write_bytes(bytes(swapped))
    with pytest.raises(ArtifactFormatError, match=f"blob {digest[:12]} does not match"):
        precompile.load(tmp_path / "swapped.pc")


def test_garbled_counters_file_reads_as_zero(tmp_path):
    cache = LocalCache(tmp_path / "c")
    cache.incr(hits=1)
    (tmp_path / "c" / "stats.json").write_text("[" * 100_000 + "]" * 100_000)  # nested past the parser's depth
    assert cache.counters()["hits"] == 0 and cache.stats()["hit_rate"] == 0.0


def test_a_name_with_a_trailing_newline_is_no_digest_and_names_no_file(tmp_path):
    """``$`` matches before a final newline; digests and keys must be exactly 64 hex characters, so that no cache
    file gets a name with a newline in it."""
    cache = LocalCache(tmp_path / "c")
    digest = digest_bytes(b"x")
    for bad in (digest + "\n", "\n" + digest):
        with pytest.raises(ValueError, match="64 lowercase hex"):
            cache.set_ref(bad, digest)
        with pytest.raises(ValueError, match="64 lowercase hex"):
            cache.get_ref(bad)
    assert not any("\n" in p.name for p in (tmp_path / "c").rglob("*"))
