"""The artifacts a fetch-only storm reads: real CPU builds, and GPU-size ones made from them, signed and stored.

- **cpu**: the storm's ``K`` graphs (:func:`tools.bench.fleet.worker.graph`) built by ``precompile.standalone_compile``
  in a separate process (torch is imported there only) into a ``file://`` seed cache, or read from a seed cache
  given (``--seed-cache``, e.g. the directory of an earlier run's ``--workdir``).  About 0.6 MB a worker as stored
  (4 keys, zstd).
- **gpu**: the same manifests with every blob a load reads (kernel binaries, the fast wrapper) replaced by bytes of
  the same compressibility, scaled so that one worker's artifacts are about ``--gpu-mb`` MB as stored (13.1 MB a
  worker was measured on the H100 host's build of the same graphs), under keys of their own.  The other parts (sources,
  graph, engine payload) are the cpu set's: a load only checks that they exist.

Every manifest is signed with a key made for the run (its public key goes to the clients'
``PRECOMPILE_VERIFY_KEYS``) and stored with the real storage code: blobs (``put_blob``), the manifest, then the
ref (``set_ref``), as ``precompile.store`` writes an artifact.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

log = logging.getLogger("bench_fleet")

#: Bytes per synthetic block: a prefix of random bytes, the rest zeros (compressibility as the original's).
BLOCK = 4096


@dataclass
class Entry:
    """One artifact: its key, its manifest (parsed, unsigned) and every blob it names."""

    key: str
    doc: dict
    blobs: dict[str, bytes] = field(default_factory=dict)

    def load_digests(self) -> list[str]:
        from precompile.manifest.manifest import Manifest

        return Manifest.from_dict(self.doc).load_digests()


def stored_bytes(data: bytes) -> int:
    """Bytes of ``data`` as a Redis cache stores it (a zstd frame at level 3, or raw when zstd saves little)."""
    return min(len(data), len(zstandard.ZstdCompressor(level=3).compress(data)))


def build(seed_dir: Path, keys: int, env: dict[str, str]) -> str:
    """Build the ``keys`` graphs into ``file://seed_dir`` in a separate process (a hit for those stored there
    already); the cache URL."""
    url = f"file://{seed_dir}"
    subprocess.run([sys.executable, "-m", "tools.bench.fleet.artifacts", "build", "--cache", url, "--keys", str(keys)],
                   cwd=Path(__file__).resolve().parents[3], env=env, check=True)
    return url


def read_set(url: str, keys: int) -> list[Entry]:
    """The first ``keys`` graph artifacts (by key) stored whole in ``url`` (whole-function artifacts and records are
    passed over), signatures removed.

    Raises:
        SystemExit: fewer than ``keys`` are stored.
    """
    from cache_backends import MISS, open_cache
    from precompile.manifest.manifest import Manifest
    from precompile.errors import PrecompileError

    cache = open_cache(url)
    out = []
    for key, digest in sorted(cache.iter_refs()):
        raw = cache.get_blob(digest)
        try:
            doc = json.loads(raw)
            Manifest.from_dict(doc)
        except (PrecompileError, TypeError, ValueError):  # another kind of entry (or MISS)
            continue
        doc.pop("signature", None)
        blobs = cache.get_blobs(list(doc["blobs"]))
        if all(v is not MISS for v in blobs.values()):
            out.append(Entry(key, doc, blobs))
        if len(out) == keys:
            break
    cache.close()
    if len(out) < keys:
        raise SystemExit(f"{cache.url} holds {len(out)} whole graph artifacts, {keys} wanted")
    return out


def synthetic(size: int, stored: int, seed: str) -> bytes:
    """``size`` bytes that zstd stores in about ``stored`` bytes: blocks of random bytes then zeros."""
    rng = random.Random(seed)
    keep = max(1, min(BLOCK, round(BLOCK * stored / max(1, size))))
    blocks = [rng.randbytes(keep) + bytes(BLOCK - keep) for _ in range(-(-size // BLOCK))]
    return b"".join(blocks)[:size]


def gpu_size(cpu: list[Entry], mb_per_worker: float) -> list[Entry]:
    """The cpu set with every blob a load reads scaled so that one worker's artifacts (manifests and load blobs,
    as stored) come to about ``mb_per_worker`` MB; keys ``sha256("gpu-size:" + key)``."""
    load = {d: e.blobs[d] for e in cpu for d in e.load_digests()}
    manifests = sum(stored_bytes(json.dumps(e.doc).encode()) for e in cpu)
    stored = {d: stored_bytes(b) for d, b in load.items()}
    scale = max(1.0, (mb_per_worker * 1e6 - manifests) / sum(stored.values()))
    out = []
    for e in cpu:
        text = json.dumps(e.doc)
        blobs = {d: b for d, b in e.blobs.items()}
        for d in e.load_digests():
            big = synthetic(round(len(load[d]) * scale), round(stored[d] * scale), f"{e.key}:{d}")
            new = hashlib.sha256(big).hexdigest()
            text = text.replace(d, new)
            blobs[new] = big
            del blobs[d]
        doc = json.loads(text)
        for d, b in blobs.items():
            doc["blobs"][d]["size"] = len(b)
        doc["key"] = hashlib.sha256(f"gpu-size:{e.key}".encode()).hexdigest()
        out.append(Entry(doc["key"], doc, blobs))
    return out


def store(url: str, entries: list[Entry], signing_key: Path) -> int:
    """Store ``entries`` in ``url`` signed with ``signing_key``: blobs, manifest, then ref; the bytes one worker
    reads (manifests and load blobs, uncompressed)."""
    from cache_backends import open_cache
    from precompile.manifest.manifest import Manifest
    from precompile.manifest.trust import Policy
    from precompile.manifest.trust_keys import load_signing_key

    policy = Policy(signer=load_signing_key(str(signing_key)))
    cache = open_cache(url)
    read = 0
    for e in entries:
        for data in e.blobs.values():
            cache.put_blob(data)
        manifest = policy.sign(Manifest.from_dict(e.doc)).to_json()
        cache.set_ref(e.key, cache.put_blob(manifest))
        read += len(manifest) + sum(len(e.blobs[d]) for d in e.load_digests())
    cache.close()
    return read


def _build(url: str, keys: int) -> None:
    import precompile
    from tools.bench.fleet.worker import graph

    for k in range(keys):
        gm, inputs = graph(k)
        art = precompile.standalone_compile(gm, inputs, cache=url)
        print(f"key {k}: {art.key[:12]} {art.outcome}", file=sys.stderr)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["build"])
    p.add_argument("--cache", required=True)
    p.add_argument("--keys", type=int, default=4)
    a = p.parse_args()
    _build(a.cache, a.keys)
