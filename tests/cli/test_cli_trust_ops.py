"""The operations commands that write a cache, under verify keys (a second probe of issue 30).

``precompile rebuild`` rebuilds a stored FX graph and runs it, so a planted graph naming ``{"fn": "os:system"}``
would run a shell command: an entry the verify keys do not accept is refused unread, with or without KEYS; under
``PRECOMPILE_REQUIRE_NO_HOST_CODE`` without verify keys a graph may call only ATen operators and size arithmetic; a
malformed ``env`` is skipped, never a traceback.  ``precompile import`` of a bundle holding an artifact the verify
keys refuse writes nothing (its ref would replace a trusted one with an entry every worker refuses).  Real
processes, real local caches, a marker file that must never appear.
"""

from __future__ import annotations

import json
import os

import pytest

from _cli import cli, cli_json, error_line

from cache_backends.base import digest_bytes
from cache_backends.local.cache import LocalCache
from precompile import config
from precompile.artifact import trust
from precompile.key.ambient import ambient_state
from precompile.key.graph import canonical_graph, canonical_json


@pytest.fixture
def builder_key(tmp_path) -> tuple[str, str]:
    """``(private key path, public key text)`` of a builder."""
    return str(tmp_path / "builder.pem"), trust.generate_key(tmp_path / "builder.pem")


def plant(cache: LocalCache, marker: str, env: object) -> str:
    """An unsigned static artifact whose stored graph runs ``touch marker``, consistent in every digest."""
    graph = {"schema": 1, "submodules": {}, "nodes": [
        {"name": "x", "op": "call_function", "target": {"fn": "os:system"}, "args": [f"touch {marker}"],
         "kwargs": {}},
        {"name": "output", "op": "output", "target": "output", "args": [[{"$node": 0}]], "kwargs": {}}]}
    blobs = {}

    def put(data: bytes, role: str) -> str:
        d = cache.put_blob(data)
        blobs[d] = {"size": len(data), "role": role}
        return d

    graph_digest = put(json.dumps(graph).encode(), "graph")
    parts = {"fx_graph": {"code": put(b"#", "code"), "graph": graph_digest}, "engine_payload": put(b"x", "engine")}
    factors = {"dynamic_shapes": "static", "graph": digest_bytes(canonical_json(canonical_graph(graph))), "env": env,
               "ambient": ambient_state({"cpu"}, False), "options": {}}
    key = digest_bytes(canonical_json(factors))
    doc = {"schema": config.FORMAT_VERSION, "key": key, "factors": factors, "placeholders": [], "parts": parts,
           "kernels": [], "autotune": {}, "alignment": [], "env": {}, "blobs": blobs, "build": {}, "calling": {},
           "shapes": {}}
    cache.set_ref(key, cache.put_blob(json.dumps(doc).encode()))
    return key


def test_an_entry_the_verify_keys_refuse_is_never_rebuilt(tmp_path):
    cache = LocalCache(tmp_path / "c")
    marker = tmp_path / "marker"
    key = plant(cache, str(marker), {"torch": "0.0"})
    url = "file://" + str(cache.root)
    public = trust.generate_key(tmp_path / "builder.pem")
    signed = {"PRECOMPILE_SIGNING_KEY": str(tmp_path / "builder.pem"), "PRECOMPILE_VERIFY_KEYS": public}
    # a builder (signing and verify keys) upgrading its fleet: the documented step, with and without KEYS
    named = cli_json("rebuild", key, "--force", "--cache", url, env=signed, check=False)
    assert [r["outcome"] for r in named["rows"]] == ["refused"] and "unsigned" in named["rows"][0]["detail"]
    assert cli_json("rebuild", "--cache", url, env=signed)["rows"] == []  # not even listed as stale
    assert not marker.exists()


def test_without_verify_keys_no_host_code_lets_a_graph_call_only_operators_and_size_arithmetic(tmp_path):
    cache = LocalCache(tmp_path / "c")
    marker = tmp_path / "marker"
    key = plant(cache, str(marker), {"torch": "0.0"})
    out = cli_json("rebuild", key, "--force", "--cache", "file://" + str(cache.root),
                   env={"PRECOMPILE_REQUIRE_NO_HOST_CODE": "1"}, check=False)
    assert [r["outcome"] for r in out["rows"]] == ["refused"] and "os:system" in out["rows"][0]["detail"]
    assert not marker.exists()


def test_a_malformed_env_factor_is_skipped_without_a_traceback(tmp_path):
    cache = LocalCache(tmp_path / "c")
    plant(cache, str(tmp_path / "marker"), ["not", "a", "dict"])
    proc = cli("rebuild", "--cache", "file://" + str(cache.root), "--json", env={"PRECOMPILE_VERIFY_KEYS": None},
               check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rows"] == []
    assert not os.path.exists(tmp_path / "marker")


def test_import_of_a_bundle_the_verify_keys_refuse_writes_nothing(artifacts, cache_copy, builder_key, tmp_path):
    key_path, public = builder_key
    key = artifacts("dynamo").art.key
    source = LocalCache(cache_copy())
    unsigned = tmp_path / "unsigned.pcb"
    cli("export", key, "--cache", str(source.root), "-o", str(unsigned))
    dest = tmp_path / "dest"
    keys = {"PRECOMPILE_VERIFY_KEYS": public}
    proc = cli("import", str(unsigned), "--cache", str(dest), env=keys, check=False)
    assert proc.returncode == 1 and "is refused" in error_line(proc) and "not signed" in error_line(proc)
    assert not (dest / "ref").exists() or not any((dest / "ref").iterdir())
    # the same artifact signed by the builder imports, and loads under the keys
    manifest = trust.Policy(signer=trust.load_signing_key(key_path)).sign(artifacts("dynamo").art.manifest)
    source.set_ref(key, source.put_blob(manifest.to_json()))
    cli("export", key, "--cache", str(source.root), "-o", str(tmp_path / "signed.pcb"))
    imported = cli_json("import", str(tmp_path / "signed.pcb"), "--cache", str(dest), env=keys)
    assert [r["outcome"] for r in imported["refs"]] == ["imported"]
    assert cli_json("verify", "--cache", str(dest), env=keys)["ok"]


def test_a_bundle_whose_manifest_is_not_json_is_refused_under_verify_keys_only(builder_key, tmp_path):
    source = LocalCache(tmp_path / "source")
    key = "cd" * 32
    source.set_ref(key, source.put_blob(b"{not json"))
    cli("export", key, "--cache", str(source.root), "-o", str(tmp_path / "b.pcb"))
    proc = cli("import", str(tmp_path / "b.pcb"), "--cache", str(tmp_path / "keyed"),
               env={"PRECOMPILE_VERIFY_KEYS": builder_key[1]}, check=False)
    assert proc.returncode == 1 and "not signed" in error_line(proc)  # never a traceback
    plain = cli_json("import", str(tmp_path / "b.pcb"), "--cache", str(tmp_path / "plain"),
                     env={"PRECOMPILE_VERIFY_KEYS": None})
    assert [r["outcome"] for r in plain["refs"]] == ["imported"]  # as before: a miss at load, nothing runs


def test_keys_only_in_the_cache_url_refuse_an_unsigned_bundle_and_judge_an_inspected_file(artifacts, cache_copy,
                                                                                            builder_key, tmp_path):
    from precompile.loader.artifact import Artifact

    public = builder_key[1]
    art = artifacts("dynamo").art
    unsigned = tmp_path / "unsigned.pcb"
    cli("export", art.key, "--cache", str(cache_copy()), "-o", str(unsigned))
    url = f"file://{tmp_path / 'dest'}?verify_keys={public}"
    no_keys = {"PRECOMPILE_VERIFY_KEYS": None, "PRECOMPILE_SIGNING_KEY": None, "PRECOMPILE_CACHE": None}
    proc = cli("import", str(unsigned), "--cache", url, env=no_keys, check=False)
    assert proc.returncode == 1 and "is refused" in error_line(proc) and "not signed" in error_line(proc)
    assert not any((tmp_path / "dest" / "ref").iterdir())
    # inspect judges a file's signature under the keys of the URL given, as a load would
    trust.generate_key(tmp_path / "other.pem")
    other = trust.Policy(signer=trust.load_signing_key(str(tmp_path / "other.pem")))
    path = Artifact(other.sign(art.manifest), art.all_blobs()).save(tmp_path / "other.pc")
    shown = cli("inspect", str(path), "--cache", url, env=no_keys).stdout
    assert "REFUSED" in shown and "not a configured verify key" in shown
    assert "not checked" in cli("inspect", str(path), env=no_keys).stdout
