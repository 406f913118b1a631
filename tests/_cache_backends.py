"""The backends of this repository for the conformance suite (tests/_cache_suite.py): how each opens caches on real
storage, damages a stored blob and takes its storage away for a while."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

from _cache_suite import Backend

def unique_prefix() -> str:
    """A key prefix of its own for one test on a shared server."""
    return "t" + uuid.uuid4().hex[:12]


# ------------------------------------------------------------------------------------- the backends here
class LocalBackend(Backend):
    """``file://DIR``: leases held by a process's ``flock`` (they end with it), LRU eviction by size; down = the
    directory replaced by a regular file."""

    leases_end_with_holder = True
    evicts = True

    def __init__(self, root):
        from pathlib import Path

        self.root = Path(root)

    def url(self, *, read_only: bool = False, evict_bytes: int | None = None) -> str:
        from cache_backends.local.url import make_file_url

        opts: dict[str, object] = {"read_only": 1} if read_only else {}
        if evict_bytes is not None:
            opts.update(max_bytes=evict_bytes, grace_s=0)
        return make_file_url(str(self.root), opts)

    def open(self, *, read_only=False, lease_ttl=None, evict_bytes=None, ttl=None):
        from cache_backends import open_cache

        return open_cache(self.url(read_only=read_only, evict_bytes=evict_bytes))

    def plant(self, cache, digest, other):
        blob = self.root / "blob"
        (blob / digest[:2] / digest[2:]).write_bytes((blob / other[:2] / other[2:]).read_bytes())

    def corrupt(self, cache, digest):
        path = self.root / "blob" / digest[:2] / digest[2:]
        if path.exists():
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            path.write_bytes(bytes(raw))

    @contextmanager
    def down(self):
        aside = self.root.with_name(self.root.name + ".aside")
        os.rename(self.root, aside)
        self.root.write_bytes(b"not a directory")
        try:
            yield
        finally:
            self.root.unlink()
            os.rename(aside, self.root)


class RedisBackend(Backend):
    """``redis://`` on one redis-server (a key prefix of its own per test): leases, TTL; down = SIGSTOP."""

    expires = True

    def __init__(self, server):
        self.server = server
        self.prefix = unique_prefix()

    def url(self, *, read_only: bool = False, lease_ttl: float | None = None, ttl: float | None = None) -> str:
        opts: dict[str, object] = {"prefix": self.prefix, "chunk_size": "64KiB", "timeout": 0.5, "down_s": 1}
        opts.update({k: v for k, v in (("read_only", int(read_only)), ("lease_ttl", lease_ttl), ("ttl", ttl)) if v})
        return self.server.url(**opts)

    def open(self, *, read_only=False, lease_ttl=None, evict_bytes=None, ttl=None):
        from cache_backends import open_cache

        return open_cache(self.url(read_only=read_only, lease_ttl=lease_ttl, ttl=ttl))

    def _client_of(self, key: str):
        return self.server.client()

    def plant(self, cache, digest, other):
        head, source = f"{self.prefix}:blob:{{{digest}}}", f"{self.prefix}:blob:{{{other}}}"
        client = self._client_of(head)
        client.set(head, self._client_of(source).get(source))
        self._replicated(client)

    def _replicated(self, client) -> None:
        """Writes made through ``client`` reach its replicas (none on one redis-server)."""

    def corrupt(self, cache, digest):
        """Flip a byte of the blob's first chunk or spread piece, or of its head when it is stored whole; returns
        the client of the node holding the damage."""
        from cache_backends.redis.codec import CHUNKED_HEAD_BYTES, parse_chunked

        head, spread = f"{self.prefix}:blob:{{{digest}}}", f"{self.prefix}:spread:{{{digest}}}"
        client = self._client_of(head)  # the spread head has the same hash tag
        pieces = parse_chunked(client.getrange(spread, 0, CHUNKED_HEAD_BYTES - 1), spread=True)
        if pieces is not None:
            target = cache._piece_key(digest, 0, pieces.count)
            client = self._client_of(target)
        else:
            target = f"{head}:0" if client.exists(f"{head}:0") else head
        at = client.strlen(target) // 2
        client.setrange(target, at, bytes([client.getrange(target, at, at)[0] ^ 0x01]))
        return client

    @contextmanager
    def down(self):
        self.server.pause()
        try:
            yield
        finally:
            self.server.resume()


class ClusterBackend(RedisBackend):
    """``redis://...?cluster=1`` on a Redis Cluster of 3 masters with a replica each (replica reads on); down = every
    node SIGSTOPped.  Give it a cluster of its own whose node timeout outlasts a :meth:`down` block (no failover
    then), never the session's: stopping its nodes would disturb the other tests using it."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.prefix = unique_prefix()

    def url(self, *, read_only=False, lease_ttl=None, ttl=None):
        opts: dict[str, object] = {"prefix": self.prefix, "chunk_size": "64KiB", "timeout": 0.5, "down_s": 1}
        opts.update({k: v for k, v in (("read_only", int(read_only)), ("lease_ttl", lease_ttl), ("ttl", ttl)) if v})
        return self.cluster.url(**opts)

    def _client_of(self, key):
        return self.cluster.node_of(key).client()

    def _replicated(self, client) -> None:
        client.execute_command("WAIT", 1, 1000)  # the replica has it too: the replica pass reads what was planted

    def corrupt(self, cache, digest):
        self._replicated(super().corrupt(cache, digest))  # the replica has the damage too

    @contextmanager
    def down(self):
        for n in self.cluster.alive():
            n.pause()
        try:
            yield
        finally:
            for n in self.cluster.alive():
                n.resume()
            self.cluster.wait_ok()


class TieredBackend(Backend):
    """``file://DIR|redis://...``: leases are the remote's; down = the remote SIGSTOPped (the near tier serves)."""

    serves_when_down = True

    def __init__(self, root, server):
        self.near = LocalBackend(root)
        self.far = RedisBackend(server)

    def open(self, *, read_only=False, lease_ttl=None, evict_bytes=None, ttl=None):
        from cache_backends import open_cache

        far = self.far.url(read_only=read_only, lease_ttl=lease_ttl)
        return open_cache(f"{self.near.url(read_only=read_only)}|{far}")

    def corrupt(self, cache, digest):
        self.near.corrupt(cache, digest)
        self.far.corrupt(cache, digest)

    def plant(self, cache, digest, other):
        self.near.plant(cache, digest, other)
        self.far.plant(cache, digest, other)

    @contextmanager
    def down(self):
        with self.far.down():
            yield
