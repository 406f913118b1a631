"""``precompile rebuild`` on planted entries (a second probe of issue 30): a rebuild rebuilds the stored FX graph
and runs it, so a graph naming ``{"fn": "os:system"}`` would run a shell command.  An entry the verify keys do not
accept is refused unread, with or without KEYS; under ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` without verify keys a
graph may call only ATen operators and size arithmetic; a malformed ``env`` is skipped, never a traceback.  Real
processes, a real local cache, a marker file that must never appear.
"""

from __future__ import annotations

import json
import os

from _cli import cli, cli_json

from cache_backends.base import digest_bytes
from cache_backends.local import LocalCache
from precompile import config
from precompile.artifact import trust
from precompile.key.ambient import ambient_state
from precompile.key.graph import canonical_graph, canonical_json


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
