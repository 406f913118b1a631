"""``precompile.load`` of paths that cannot be read within bounds (issue 30, finding 3), in a fresh process under a
memory limit (tests/_probe.py): the path a FIFO, a character device or a directory without a manifest; in an
unpacked directory, ``manifest.json``, ``index.json`` or a part a FIFO, a part a symlink to ``/dev/zero`` (a link
leading out of the directory: ``UnsafePathError``) or larger than its manifest records; a ``.pc`` file whose manifest claims more than the manifest cap, or whose part inflates
past the size its manifest records.  Each is a clean typed error within 10 s with its peak memory bounded, and no
planted byte runs.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from pathlib import Path

from _probe import assert_refused, probe, zstd_bomb
from test_bounded_loads import _Evil

from precompile.manifest import formats

GiB = 1 << 30
LOAD_PROBE = """
import precompile
import precompile.store.loading, precompile.manifest.formats  # imported before what is measured
for path in sys.argv[1:]:
    measure(lambda: repr(precompile.load(path)))
"""


def test_paths_that_cannot_be_read_within_bounds_are_typed_errors(artifacts, tmp_path):
    c = artifacts("dynamo")
    marker = tmp_path / "marker"
    evil = pickle.dumps(_Evil(marker))
    c.art.save(tmp_path / "good", format="unpacked")
    index = json.loads((tmp_path / "good" / "index.json").read_text())
    payload = index[c.art.manifest.parts["engine_payload"]]
    size = c.art.manifest.blobs[c.art.manifest.parts["engine_payload"]]["size"]
    cases: dict[str, tuple[Path, str, str | None]] = {}

    def unpacked(name: str, rel: str, plant) -> None:
        d = tmp_path / name
        shutil.copytree(tmp_path / "good", d)
        (d / rel).unlink()
        plant(d / rel)
        cases[name] = (d, "NotRegularFileError", None)

    os.mkfifo(tmp_path / "fifo.pc")
    cases["pc_fifo"] = (tmp_path / "fifo.pc", "NotRegularFileError", None)
    cases["char_device"] = (Path("/dev/zero"), "NotRegularFileError", None)
    (tmp_path / "empty_dir").mkdir()
    cases["directory"] = (tmp_path / "empty_dir", "ArtifactFormatError", None)
    unpacked("manifest_fifo", "manifest.json", os.mkfifo)
    unpacked("index_fifo", "index.json", os.mkfifo)
    unpacked("part_fifo", payload, os.mkfifo)
    unpacked("part_dev_zero", payload, lambda p: p.symlink_to("/dev/zero"))
    cases["part_dev_zero"] = (tmp_path / "part_dev_zero", "UnsafePathError", None)  # a link leading out: refused
    unpacked("part_larger", payload, lambda p: p.write_bytes(evil + b"\0" * (size + (64 << 20))))
    cases["part_larger"] = (tmp_path / "part_larger", "ArtifactFormatError", "InputLimitError")
    # a .pc file: a manifest length past the cap (the file holds it), a part inflating past its recorded size
    raw = c.art.save(tmp_path / "a.pc").read_bytes()
    mlen = struct.unpack_from("<Q", raw, 12)[0]
    big = json.loads(raw[20:20 + mlen])
    big["build"]["padding"] = " " * (17 << 20)
    blob = json.dumps(big).encode()
    (tmp_path / "big_manifest.pc").write_bytes(raw[:12] + struct.pack("<Q", len(blob)) + blob + raw[20 + mlen:])
    cases["pc_manifest_over_cap"] = (tmp_path / "big_manifest.pc", "ArtifactFormatError", "InputLimitError")
    formats.write_binary(tmp_path / "bomb.pc", c.art.manifest.to_json(), c.art.all_blobs())
    bomb = bytearray((tmp_path / "bomb.pc").read_bytes())
    target = bytes.fromhex(c.art.manifest.parts["engine_payload"])
    at = bomb.index(target)
    (zlen,) = struct.unpack_from("<Q", bomb, at + 32)
    frame = zstd_bomb(GiB, with_size=False, prefix=evil)
    bomb[at + 32:at + 40 + zlen] = struct.pack("<Q", len(frame)) + frame
    (tmp_path / "bomb.pc").write_bytes(bytes(bomb))
    cases["pc_part_bomb"] = (tmp_path / "bomb.pc", "ArtifactFormatError", "InputLimitError")

    results = probe(LOAD_PROBE, *(str(p) for p, _, _ in cases.values()), timeout=300)
    assert len(results) == len(cases)
    for (name, (_, error, cause)), result in zip(cases.items(), results):
        assert_refused(result, error, cause=cause, max_grew_mib=160, what=name)
    assert not marker.exists(), "a planted part ran"



def test_a_manifest_recording_more_bytes_than_an_artifact_may_hold_is_malformed():
    # each part within its own bound (2 GiB), together past what any worker could hold: refused at the parse
    import pytest

    from cache_backends.bounded import MAX_ARTIFACT_BYTES, MAX_BLOB_BYTES
    from precompile import config
    from precompile.manifest.function_manifest import FunctionManifest
    from precompile.manifest.manifest import Manifest
    from precompile.errors import ArtifactFormatError

    parts = {f"{i:064x}": {"size": MAX_BLOB_BYTES, "role": "part"} for i in range(MAX_ARTIFACT_BYTES // MAX_BLOB_BYTES + 1)}
    for cls in (Manifest, FunctionManifest):
        doc = {**{f: {} for f in cls._FIELDS}, "schema": config.FORMAT_VERSION, "blobs": parts}
        with pytest.raises(ArtifactFormatError, match="more than the"):
            cls._check_header(doc, "manifest")
        doc["blobs"] = dict(list(parts.items())[:2])  # within the bound: the header check passes
        cls._check_header(doc, "manifest")
