"""The command line on input that cannot be read within bounds (issue 30, finding 3 and the bundle of finding 4):
``precompile import`` of a FIFO or of a bundle whose header is JSON nested 200,000 deep, ``inspect`` of a FIFO or a
device, ``ls`` and ``verify`` of a cache whose ref and manifest are FIFOs.  Each ends within 10 s (the process is
killed past its deadline) with exit status 1 and one line on stderr, or lists the cache; never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time

from _cli import cli, cli_json, error_line
from _local import KEY, KEY2, blob_file
from _probe import DEADLINE_S

from cache_backends.local.cache import LocalCache
from precompile.ops.bundle import END, MAGIC, VERSION


def timed_cli(*args: str):
    start = time.monotonic()
    proc = cli(*args, check=False, timeout=60)
    assert time.monotonic() - start < DEADLINE_S, f"precompile {' '.join(args)} took too long"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_import_of_a_fifo_or_a_deeply_nested_header_is_one_error_line(tmp_path):
    os.mkfifo(tmp_path / "fifo.pcb")
    proc = timed_cli("import", str(tmp_path / "fifo.pcb"), "--cache", str(tmp_path / "dest"))
    assert proc.returncode == 2 and "not a regular file" in error_line(proc)  # the caller's mistake, as inspect
    header = b"[" * 200_000 + b"]" * 200_000
    body = MAGIC + struct.pack("<I", VERSION) + struct.pack("<Q", len(header)) + header
    (tmp_path / "deep.pcb").write_bytes(body + END + hashlib.sha256(body).digest())
    proc = timed_cli("import", str(tmp_path / "deep.pcb"), "--cache", str(tmp_path / "dest"))
    assert proc.returncode == 1 and "malformed header" in error_line(proc) and "deeper" in error_line(proc)
    assert not (tmp_path / "dest").exists()


def test_inspect_of_a_fifo_or_a_device_is_one_error_line(tmp_path):
    os.mkfifo(tmp_path / "a.pc")
    for path in (str(tmp_path / "a.pc"), "/dev/zero"):
        proc = timed_cli("inspect", path, "--cache", str(tmp_path / "c"))
        # not an artifact at all: the caller's mistake (exit 2, as a bad argument), never a hang or a traceback
        assert proc.returncode == 2 and "not a regular file" in error_line(proc)


def test_ls_and_verify_of_a_cache_with_fifo_entries_list_the_rest(artifacts, cache_copy):
    key = artifacts("dynamo").art.key
    cache = LocalCache(cache_copy())
    os.mkfifo(cache.root / "ref" / KEY)
    other = cache.put_blob(b'{"schema": 3}')
    cache.set_ref(KEY2, other)
    blob_file(cache, other).unlink()
    os.mkfifo(blob_file(cache, other))
    url = "file://" + str(cache.root)
    start = time.monotonic()
    listed = cli_json("ls", "--cache", url, timeout=60)
    assert not os.path.lexists(blob_file(cache, other))  # read as a manifest: not a regular file, dropped
    proc = cli("verify", "--cache", url, "--json", check=False, timeout=60)
    assert time.monotonic() - start < 2 * DEADLINE_S
    assert key in json.dumps(listed) and proc.returncode == 1, proc.stderr
    kinds = {(p["kind"], p["name"]) for p in json.loads(proc.stdout.splitlines()[-1])["tiers"][0]["problems"]}
    assert kinds == {("garbled ref", KEY), ("bad manifest", KEY2)}


def test_export_reads_each_part_again_no_larger_than_its_manifest_records(artifacts, cache_copy, tmp_path):
    """The bundle writer reads every part a second time (after the closure walk): with the same bound, so a part
    swapped in between for a larger one is refused before it is allocated, not read up to the format's 2 GiB."""
    from precompile.ops.bundle import export

    class Recording(LocalCache):  # the real cache; it only notes each read's bound
        reads: list[tuple[str, int | None, int]] = []

        def get_blob(self, digest, max_bytes=None):
            got = super().get_blob(digest, max_bytes)
            self.reads.append((digest, max_bytes, len(got)))
            return got

    cache = Recording(cache_copy())
    done = export(cache, [artifacts("dynamo").art.key], tmp_path / "one.pcb")
    by_digest: dict[str, list[tuple[int | None, int]]] = {}
    for digest, bound, size in cache.reads:
        by_digest.setdefault(digest, []).append((bound, size))
    assert len(by_digest) == done.blobs and all(len(r) == 2 for r in by_digest.values())
    assert all(first == again for first, again in by_digest.values()), "a part was read again with another bound"
    firsts = [first for first, _ in by_digest.values()]  # (bound, size) of the closure's read
    assert all(bound is not None for bound, _ in firsts), "a part was read with only the format's bound"
    assert sum(bound == size for bound, size in firsts) >= done.blobs - 1  # every part but the manifest, exactly
