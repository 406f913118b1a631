"""Bad input and faults, for real: damaged cache blobs, truncated and foreign artifact files, wrong call inputs,
graphs that cannot be serialized.  Read-only caches and concurrent builds: test_shared_cache.py; Redis faults:
tests/cache_backends/test_redis_faults.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import _graphs
import pytest
import torch
from conftest import assert_same_output

import precompile
from cache_backends.local.cache import LocalCache
from precompile.errors import ArtifactFormatError, InputMismatchError, UnserializableGraphError


def blob_path(root: Path, digest: str) -> Path:
    return root / "blob" / digest[:2] / digest[2:]


# ------------------------------------------------------------------------------------ damaged cache blobs
def _target_digest(root: Path, key: str, role: str) -> str:
    manifest_digest = (root / "ref" / key).read_text().strip()
    if role == "manifest":
        return manifest_digest
    manifest = json.loads(LocalCache(root).get_blob(manifest_digest))
    if role == "engine_payload":
        return manifest["parts"]["engine_payload"]
    if role == "kernel_binary":
        return next(iter(manifest["kernels"][0]["binaries"].values()))
    raise ValueError(role)


@pytest.mark.parametrize("role, damage", [("engine_payload", "flip"), ("kernel_binary", "flip"), ("manifest", "flip"),
                                          ("kernel_binary", "truncate")])
def test_damaged_blob_is_detected_dropped_and_rebuilt(role, damage, artifacts, cache_copy, caplog):
    c = artifacts("dynamo")
    root = cache_copy()
    digest = _target_digest(root, c.art.key, role)
    path = blob_path(root, digest)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x10
    else:
        raw = raw[: len(raw) // 2]
    path.write_bytes(bytes(raw))
    before = LocalCache(root).counters()

    url = "file://" + str(root)
    with caplog.at_level(logging.WARNING, logger="precompile"):
        art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled", "a damaged entry was used"
    assert_same_output(art(*c.inputs), c.expected)
    after = LocalCache(root).counters()
    assert after["errors"] >= before["errors"] + 1, "the damaged blob was not counted"
    assert after["builds"] == before["builds"] + 1 and after["misses"] == before["misses"] + 1
    assert after["hits"] == before["hits"]
    assert any(digest in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    # the entry was replaced by the rebuild: the cache verifies and the next call is a hit
    report = LocalCache(root).verify()
    assert report["ok"], report
    assert LocalCache(root).get_ref(c.art.key)
    again = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert again.source == "cache"
    assert_same_output(again(*c.inputs), c.expected)


def test_missing_blob_is_a_miss_and_rebuilt(artifacts, cache_copy):
    c = artifacts("dynamo")
    root = cache_copy()
    blob_path(root, _target_digest(root, c.art.key, "engine_payload")).unlink()
    before = LocalCache(root).counters()
    art = precompile.standalone_compile(c.gm, c.inputs, cache="file://" + str(root))
    assert art.source == "compiled"
    assert_same_output(art(*c.inputs), c.expected)
    assert LocalCache(root).counters()["builds"] == before["builds"] + 1
    assert LocalCache(root).verify()["ok"]


def test_damaged_part_that_load_does_not_read(artifacts, cache_copy, tmp_path):
    """A hit reads only what it runs (engine payload, binaries); a damaged kernel *source* is never executed, is
    detected when read (e.g. by ``save``), dropped and counted, and the next get-or-build rebuilds the entry."""
    c = artifacts("dynamo")
    root = cache_copy()
    url = "file://" + str(root)
    source = c.art.manifest.kernels[0]["source"]
    path = blob_path(root, source)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))

    hit = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert hit.source == "cache"
    assert_same_output(hit(*c.inputs), c.expected)
    errors = LocalCache(root).counters()["errors"]
    with pytest.raises(precompile.ArtifactNotFoundError, match=source[:12]):
        hit.save(tmp_path / "incomplete.pc")
    assert not (tmp_path / "incomplete.pc").exists()
    assert LocalCache(root).counters()["errors"] == errors + 1 and not path.exists()

    builds = LocalCache(root).counters()["builds"]
    art = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert art.source == "compiled", "an entry with a lost part was served again"
    assert LocalCache(root).counters()["builds"] == builds + 1
    assert_same_output(art(*c.inputs), c.expected)
    again = precompile.standalone_compile(c.gm, c.inputs, cache=url)
    assert again.source == "cache"
    again.save(tmp_path / "complete.pc")  # every part is there again
    assert LocalCache(root).verify()["ok"]


# ------------------------------------------------------------------------------ bad files given to load
@pytest.fixture(scope="module")
def saved_binary(artifacts, tmp_path_factory) -> Path:
    return artifacts("make_fx").art.save(tmp_path_factory.mktemp("faults") / "art.pc")


@pytest.mark.parametrize("keep", ["0", "3", "10", "30", "half", "all-1"])
def test_truncated_artifact_file(keep, saved_binary, tmp_path):
    raw = saved_binary.read_bytes()
    n = {"half": len(raw) // 2, "all-1": len(raw) - 1}.get(keep) or int(keep)
    bad = tmp_path / "cut.pc"
    bad.write_bytes(raw[:n])
    with pytest.raises(ArtifactFormatError, match="truncated") as info:
        precompile.load(bad)
    assert str(bad) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, precompile.PrecompileError)


def test_flipped_byte_in_artifact_file(saved_binary, tmp_path):
    raw = bytearray(saved_binary.read_bytes())
    raw[-200] ^= 0x01  # inside the last blob's zstd frame
    bad = tmp_path / "flipped.pc"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ArtifactFormatError, match="corrupt|does not decompress|does not match"):
        precompile.load(bad)


def _foreign_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    files["text"] = tmp_path / "notes.txt"
    files["text"].write_text("this is not an artifact\n" * 50)
    files["torch.save"] = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(3)}, files["torch.save"])
    files["json"] = tmp_path / "manifest.json"
    files["json"].write_text(json.dumps({"schema": 1, "key": "0" * 64}))
    files["random"] = tmp_path / "random.bin"
    files["random"].write_bytes(os.urandom(4096))
    files["directory"] = tmp_path / "some-dir"
    files["directory"].mkdir()
    (files["directory"] / "readme.txt").write_text("hello")
    return files


def test_foreign_files(tmp_path):
    for what, path in _foreign_files(tmp_path).items():
        with pytest.raises(ArtifactFormatError, match="not a precompile artifact|not an unpacked precompile") as info:
            precompile.load(path)
        assert str(path) in str(info.value), what


def test_damaged_unpacked_directory(artifacts, tmp_path):
    d = artifacts("make_fx").art.save(tmp_path / "art.d", format="unpacked")
    kernel = next((d / "kernels").glob("*.cpp"))
    kernel.write_text(kernel.read_text() + "\n// edited\n")
    with pytest.raises(ArtifactFormatError, match="was modified"):
        precompile.load(d)
    kernel.unlink()
    with pytest.raises(ArtifactFormatError, match="is missing"):
        precompile.load(d)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactFormatError, match="not valid JSON"):
        precompile.load(d)


def test_missing_path_or_key(tmp_path):
    with pytest.raises(precompile.ArtifactNotFoundError):
        precompile.load(tmp_path / "nothing-here.pc")
    with pytest.raises(FileNotFoundError):  # ArtifactNotFoundError is a FileNotFoundError too
        precompile.load("f" * 64, cache="file://" + str(tmp_path / "empty-cache"))


# ----------------------------------------------------------------------------------- wrong call inputs
@pytest.mark.parametrize("kind", ["dynamo", "export"])
def test_wrong_inputs_name_the_placeholder(kind, artifacts):
    c = artifacts(kind)
    art = c.art
    user_index = next(i for i, t in enumerate(c.inputs) if t.shape == (_graphs.BATCH, _graphs.D))
    name = next(s["name"] for s in art.placeholders if s["kind"] == "user_input")

    def call_with(x):
        args = list(c.inputs)
        args[user_index] = x
        return art(*args)

    cases = {
        "shape": torch.randn(_graphs.BATCH + 1, _graphs.D),
        "rank": torch.randn(_graphs.BATCH, _graphs.D, 1),
        "dtype": torch.randn(_graphs.BATCH, _graphs.D, dtype=torch.float64),
        "int dtype": torch.ones(_graphs.BATCH, _graphs.D, dtype=torch.int64),
        "stride": torch.randn(_graphs.D, _graphs.BATCH).t(),
        "not a tensor": 3.0,
    }
    for what, x in cases.items():
        with pytest.raises(InputMismatchError, match=name) as info:
            call_with(x)
        assert "expected tensor[4x16] float32 on cpu" in str(info.value), (what, str(info.value))
    with pytest.raises(InputMismatchError, match=name):  # a nested list where a tensor goes
        call_with([[0.0] * _graphs.D] * _graphs.BATCH)
    # number of inputs: too few and too many, each naming placeholders
    with pytest.raises(InputMismatchError, match="Missing placeholders") as info:
        art(*c.inputs[:-1])
    assert art.placeholders[-1]["name"] in str(info.value)
    with pytest.raises(InputMismatchError, match=f"got {len(c.inputs) + 1}") as info:
        art(*c.inputs, c.inputs[-1])
    assert name in str(info.value)
    with pytest.raises(TypeError):  # InputMismatchError is a TypeError too
        art()
    assert_same_output(art(*c.inputs), c.expected)  # nothing was left broken


# ---------------------------------------------------------------------------------- unserializable graphs
def _graph_calling(fn) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.relu, (x,))
    z = graph.call_function(fn, (y,))
    graph.output((z,))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [torch.randn(_graphs.BATCH, _graphs.D)]


class _Opaque:
    """A Python object in a node's arguments (as a custom backend or a hand-built graph may leave there)."""

    def __repr__(self) -> str:  # FX writes the graph's code with repr(); keep it valid Python
        return "Opaque()"


def _graph_with_opaque_argument() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.mul, (x, _Opaque()))
    graph.output((y,))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [torch.randn(_graphs.BATCH, _graphs.D)]


def test_unserializable_graph_names_the_node_and_writes_nothing(tmp_path):
    def local_double(t):
        return t * 2

    cases = {
        "lambda": (_graph_calling(lambda t: t + 1), "<lambda>"),
        "local function": (_graph_calling(local_double), "local_double"),
        "opaque argument": (_graph_with_opaque_argument(), "_Opaque"),
    }
    root = tmp_path / "cache"
    for what, ((gm, inputs), shown) in cases.items():
        node = [n.name for n in gm.graph.nodes if n.op == "call_function"][-1]
        with pytest.raises(UnserializableGraphError, match=node) as info:
            precompile.standalone_compile(gm, inputs, cache="file://" + str(root))
        assert shown in str(info.value), (what, str(info.value))
        assert isinstance(info.value, TypeError)
        with pytest.raises(UnserializableGraphError):
            precompile.standalone_compile(gm, inputs)  # without a cache too
    # nothing written: no refs, no blobs
    if root.exists():
        cache = LocalCache(root)
        assert list(cache.iter_refs()) == [] and cache.size_bytes() == 0
        assert not [p for p in (root / "blob").rglob("*") if p.is_file()]
