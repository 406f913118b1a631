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
import subprocess

import pytest

from _cli import cli, cli_json, error_line

from cache_backends.base import digest_bytes
from cache_backends.local.cache import LocalCache
from precompile import config
from precompile.manifest import trust
from precompile.key.ambient import ambient_state
from precompile.key.graph import canonical_graph, canonical_json


@pytest.fixture
def builder_key(tmp_path) -> tuple[str, str]:
    """``(private key path, public key text)`` of a builder."""
    return str(tmp_path / "builder.pem"), trust.generate_key(tmp_path / "builder.pem")


def plant(cache: LocalCache, marker: str, env: object, graph: dict | None = None, placeholders: list | None = None,
          options: dict | None = None) -> str:
    """An unsigned static artifact, consistent in every digest, whose stored graph (by default) runs ``touch marker``
    through ``{"fn": "os:system"}``."""
    graph = graph or {"schema": 1, "submodules": {}, "nodes": [
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
               "ambient": ambient_state({"cpu"}, False), "options": options or {}}
    key = digest_bytes(canonical_json(factors))
    doc = {"schema": config.FORMAT_VERSION, "key": key, "factors": factors, "placeholders": placeholders or [],
           "parts": parts, "kernels": [], "autotune": {}, "alignment": [], "env": {}, "blobs": blobs, "build": {},
           "calling": {}, "shapes": {}}
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


# ------------------------------------------------- issue 34: the probe's rebuild cases, with and without verify keys

X = [{"name": "x", "kind": "user_input", "fqn": None, "type": "tensor", "shape": [4], "stride": [1],
      "dtype": "float32", "device": "cpu", "requires_grad": False, "aligned": True}]


def _graph(*nodes: tuple) -> dict:
    """A stored graph: placeholder ``x``, ``nodes`` (``(name, op, target, args)``), returning ``x`` and the last."""
    specs = [{"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {}}]
    specs += [{"name": n, "op": op, "target": t, "args": a, "kwargs": {}} for n, op, t, a in nodes]
    specs.append({"name": "output", "op": "output", "target": "output",
                  "args": [[{"$node": 0}, {"$node": len(specs) - 1}]], "kwargs": {}})
    return {"schema": 1, "submodules": {}, "nodes": specs}


@pytest.fixture
def probes(tmp_path) -> tuple[LocalCache, dict[str, str], list, str]:
    """A cache holding the probe's four unsigned entries, built for another torch: ``(cache, {case: key}, markers,
    cwd)``.  Run from ``cwd``, ``import pc_probe_payload`` writes a marker; so does loading ``evil.so``; so does the
    shell command of the stored option and of the ``__getattribute__`` chain."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    markers = [tmp_path / f"marker_{n}" for n in ("chain", "import", "dlopen", "march")]
    (cwd / "pc_probe_payload.py").write_text(f"open({str(markers[1])!r}, 'w').write('imported')\n")
    (tmp_path / "evil.c").write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                                     f'{{ FILE *f = fopen("{markers[2]}", "w"); if (f) fclose(f); }}\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "evil.so"), str(tmp_path / "evil.c")], check=True)
    cache = LocalCache(tmp_path / "c")
    node = {"$node": 0}
    old = {"torch": "0.0"}
    keys = {
        "chain": plant(cache, "", old, _graph(
            ("a", "call_method", "__getattribute__", [node, "__repr__"]),
            ("b", "call_method", "__getattribute__", [{"$node": 1}, "__globals__"]),
            ("c", "call_method", "get", [{"$node": 2}, "__builtins__"]),
            ("d", "call_method", "get", [{"$node": 3}, "__import__"]),
            ("e", "call_method", "__call__", [{"$node": 4}, "os"]),
            ("f", "call_method", "system", [{"$node": 5}, f"touch {markers[0]}"])), X),
        "import": plant(cache, "", old, _graph(
            ("a", "call_function", {"oppacket": "__class__::import_module"}, [node, "pc_probe_payload"])), X),
        "dlopen": plant(cache, "", old, _graph(
            ("a", "call_function", {"oppacket": "__class__::load_library"}, [node, str(tmp_path / "evil.so")])), X),
        "march": plant(cache, "", old, _graph(("a", "call_function", {"op": "aten::relu.default"}, [node])), X,
                       {"cpp.march": f"native -wrapper /bin/sh,-c,touch${{IFS}}{markers[3]}"}),
    }
    return cache, keys, markers, str(cwd)


def _rebuild(*args: str, env: dict, cwd: str) -> tuple[list[dict], str]:
    proc = cli("rebuild", *args, "--json", env={"PRECOMPILE_REQUIRE_NO_HOST_CODE": "1", **env}, check=False, cwd=cwd)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["rows"], proc.stderr


def test_the_probes_rebuild_cases_run_nothing_without_verify_keys(probes):
    cache, keys, markers, cwd = probes
    url = "file://" + str(cache.root)
    no_keys = {"PRECOMPILE_VERIFY_KEYS": None}
    for args in ([*keys.values(), "--force"], []):  # each key named, then over the stale listing
        rows, log = _rebuild(*args, "--cache", url, env=no_keys, cwd=cwd)
        assert not any(m.exists() for m in markers), [m.name for m in markers if m.exists()]
        by_key = {r["old_key"]: r for r in rows}
        assert set(by_key) == set(keys.values())
        for case in ("chain", "import", "dlopen"):
            assert by_key[keys[case]]["outcome"] == "refused" and "node 1 ('a'" in by_key[keys[case]]["detail"], rows
        # the option is refused and this machine's default used: the graph (relu) is rebuilt with it, and found
        # rebuilt already from the stale listing
        assert "stored option 'cpp.march'" in log and "using this machine's default" in log, log
        march = by_key[keys["march"]]
        assert march["outcome"] == ("rebuilt" if args else "present"), march
        assert not args or "stored option(s) refused" in march["detail"], march


def test_the_probes_rebuild_cases_are_refused_unread_under_verify_keys(probes, tmp_path):
    cache, keys, markers, cwd = probes
    url = "file://" + str(cache.root)
    keyed = {"PRECOMPILE_VERIFY_KEYS": trust.generate_key(tmp_path / "builder.pem")}
    rows, _ = _rebuild(*keys.values(), "--force", "--cache", url, env=keyed, cwd=cwd)
    assert [r["outcome"] for r in rows] == ["refused"] * 4 and all("unsigned" in r["detail"] for r in rows), rows
    assert _rebuild("--cache", url, env=keyed, cwd=cwd)[0] == []  # not even listed as stale
    assert not any(m.exists() for m in markers), [m.name for m in markers if m.exists()]
