"""Worker process for tests/cache_backends/test_local_counters.py: hammers one LocalCache directory from a real process.

Usage: python tests/_cache_worker.py ROOT WORKER_ID ROUNDS GO_FILE [MAX_BYTES]

Waits until GO_FILE exists (so that all workers start together), then for each round:
- puts the shared blobs (same bytes in every worker) and a blob of its own,
- writes a manifest naming them and points a shared ref and a ref of its own at it,
- reads back and checks what it wrote, and increments hits=1, misses=2, builds=3.
Prints one JSON line with what it did; exits non-zero on any failure.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cache_backends.base import MISS, digest_bytes  # noqa: E402
from cache_backends.local.cache import LocalCache  # noqa: E402

N_SHARED = 4


def shared_blob(i: int) -> bytes:
    return f"shared blob {i}\n".encode() * 50


def own_blob(worker: int, i: int) -> bytes:
    return f"worker {worker} round {i}\n".encode() * (10 + i % 7)


def main() -> int:
    root, worker, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    max_bytes = int(sys.argv[5]) if len(sys.argv) > 5 else None
    cache = LocalCache(root, max_bytes=max_bytes)
    deadline = time.monotonic() + 30
    while not go.exists():
        if time.monotonic() > deadline:
            print("GO file never appeared", file=sys.stderr)
            return 2
        time.sleep(0.005)
    shared_key = "a" * 64
    own_keys = []
    for i in range(rounds):
        digests = [cache.put_blob(shared_blob(j)) for j in range(N_SHARED)]
        mine = cache.put_blob(own_blob(worker, i))
        manifest = json.dumps({"blobs": {d: {} for d in [*digests, mine]}, "worker": worker, "round": i}).encode()
        mdigest = cache.put_blob(manifest, digest_bytes(manifest))
        key = digest_bytes(f"key {worker} {i}".encode())
        cache.set_ref(key, mdigest)
        cache.set_ref(shared_key, mdigest)
        own_keys.append(key)
        if max_bytes is None:  # without eviction everything just written must read back
            assert cache.get_ref(key) == mdigest, "own ref lost"
            assert cache.get_blob(mine) == own_blob(worker, i), "own blob lost"
            got = cache.get_blobs(digests)
            assert all(got[d] == shared_blob(j) for j, d in enumerate(digests)), "shared blob lost"
        else:
            got = cache.get_blob(mine)
            assert got is MISS or got == own_blob(worker, i), "wrong bytes"
        cache.incr(hits=1, misses=2, builds=3)
    print(json.dumps({"worker": worker, "keys": own_keys}))
    cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
