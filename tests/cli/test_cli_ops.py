"""Operating a cache from the command line, in real processes, on a real local cache and a real redis-server:
diff, explain, verify, gc, export/import, rebuild, stats --format prometheus, key prefixes.

One module fixture compiles the tiny MLP twice (plain, and with an Inductor option) through ``precompile
warmup``; artifacts "from elsewhere" (another torch, another input dtype) are stored variants of it
(tests/_cli.py); tests that change a cache work on a copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from _cli import RECIPE, cli, cli_json, error_line, store_variant, user_input
from conftest import run_python


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """``(cache dir, url, keys)``: keys ``base`` (tiny MLP 1x4), ``option`` (built with ``comment_origin``),
    variants ``dtype`` (its input float16), ``env`` (built by torch 2.12), ``symbolic`` (env 2.12, symbolic),
    and ``explain_log``: what the option build logged with PRECOMPILE_EXPLAIN=1."""
    root = tmp_path_factory.mktemp("ops") / "cache"
    url = f"file://{root}"
    base = cli_json("warmup", RECIPE, "--shapes", "1x4", "--cache", url)["rows"][0]["key"]
    proc = cli("warmup", RECIPE, "--shapes", "1x4", "--cache", url, "--options", '{"comment_origin": true}',
               "--json", env={"PRECOMPILE_EXPLAIN": "1"})
    option = json.loads(proc.stdout.strip().splitlines()[-1])["rows"][0]["key"]

    def dtype(m):
        i = user_input(m)
        m["factors"]["inputs"][i]["dtype"] = m["placeholders"][i]["dtype"] = "float16"

    def env(m):
        m["factors"]["env"]["torch"] = m["env"]["torch"] = "2.12.0+cpu"

    def symbolic(m):
        env(m)
        m["factors"]["dynamic_shapes"] = "symbolic"

    keys = {"base": base, "option": option, "dtype": store_variant(url, base, dtype),
            "env": store_variant(url, base, env), "symbolic": store_variant(url, base, symbolic)}
    return root, url, keys, proc.stderr


def copy_cache(warmed, dest: Path) -> str:
    shutil.copytree(warmed[0], dest)
    return f"file://{dest}"


def test_diff_names_the_changed_factor(warmed):
    _, url, k, _ = warmed
    d = cli_json("diff", k["base"], k["dtype"], "--cache", url)
    assert [(c["what"], c["a"], c["b"]) for c in d["changes"]] == [("input dtype", "float32", "float16")]
    assert d["changes"][0]["path"].startswith("inputs[") and d["changes"][0]["path"].endswith(".dtype")
    d = cli_json("diff", k["base"], k["option"], "--cache", url)
    assert d["factors"] == ["options", "inductor_config"]
    assert ("options.comment_origin", "compile option", True) in {(c["path"], c["what"], c["b"]) for c in d["changes"]}
    assert [c["path"] for c in d["inductor_config_changes"]] == ["inductor_config.comment_origin"]
    d = cli_json("diff", k["base"], k["env"][:10], "--cache", url)  # a unique prefix works as a key
    assert [(c["path"], c["what"], c["a"], c["b"]) for c in d["changes"]] == [
        ("env.torch", "torch build", "2.13.0+cpu", "2.12.0+cpu")]
    table = cli("diff", k["base"], k["dtype"], "--cache", url).stdout
    assert "input dtype" in table and "float16" in table and "1 factor(s) differ: inputs" in table


def test_diff_shows_the_graph_code_diff(warmed, tmp_path):
    _, url, k, _ = warmed
    url = copy_cache(warmed, tmp_path / "c")

    def other_graph(m):
        from cache_backends.registry import open_cache

        cache = open_cache(url)
        code = cache.get_blob(m["parts"]["fx_graph"]["code"]).decode().replace("gelu", "relu")
        digest = cache.put_blob(code.encode())
        m["parts"]["fx_graph"]["code"] = digest
        m["blobs"][digest] = {"size": len(code), "role": "fx graph code"}
        m["factors"]["graph"] = "0" * 64

    changed = store_variant(url, k["base"], other_graph)
    d = cli_json("diff", k["base"], changed, "--cache", url)
    assert d["factors"] == ["graph"]
    assert "-" in d["graph_diff"] and "gelu" in d["graph_diff"] and "+" in d["graph_diff"] and "relu" in d["graph_diff"]
    assert "graph code diff" in cli("diff", k["base"], changed, "--cache", url).stdout


def test_one_key_diff_and_explain_name_the_nearest_and_why(warmed, tmp_path):
    _, url, k, explain_log = warmed
    # standalone_compile's miss log (PRECOMPILE_EXPLAIN=1): the option build's closest stored key is the base
    assert f"closest of 1 stored artifacts is {k['base'][:12]}, which differs in options, inductor_config" in \
        explain_log, explain_log
    near = cli_json("diff", k["env"], "--cache", url, "-n", "2")["nearest"]
    assert (k["base"], ["env"]) in [(n["key"], n["factors"]) for n in near]  # symbolic ties: dynamic_shapes only
    # the key a pod built (only in its own cache) against the fleet's cache, which holds the base only
    bundle = tmp_path / "base.pcb"
    cli("export", k["base"], "-o", str(bundle), "--cache", url)
    fleet = f"file://{tmp_path / 'fleet'}"
    cli("import", str(bundle), "--cache", fleet)
    out = cli_json("explain", k["env"][:12], "--from", url, "--cache", fleet)
    assert out["stored"] is False and out["closest"]["key"] == k["base"]
    line = cli("explain", k["env"], "--from", url, "--cache", fleet).stdout.strip()
    assert line.startswith(f"miss {k['env'][:12]}: closest of 1 stored artifacts is {k['base'][:12]}")
    assert "env.torch" in line and "2.12.0+cpu" in line
    assert cli("explain", k["base"], "--cache", fleet).stdout.startswith(f"hit {k['base'][:12]}")


def test_verify_local_finds_a_flipped_byte_and_a_mis_keyed_ref_and_fix_repairs(warmed, tmp_path):
    _, _, k, _ = warmed
    root = tmp_path / "c"
    url = copy_cache(warmed, root)
    first = cli_json("verify", "--cache", url)
    assert first["ok"] is True
    manifest = json.loads(cli("inspect", k["option"], "--cache", url, "--json").stdout)
    payload = manifest["parts"]["engine_payload"]
    blob = root / "blob" / payload[:2] / payload[2:]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    (root / "ref" / ("f" * 64)).write_text((root / "ref" / k["base"]).read_text())
    proc = cli("verify", "--cache", url, check=False)
    assert proc.returncode == 1
    assert "mis-keyed ref" in proc.stdout and "bad blob" in proc.stdout
    found = json.loads(proc.stdout.strip().splitlines()[-1])["tiers"][0]["problems"]
    kinds = {(p["kind"], p["name"]) for p in found}
    assert {("bad blob", payload), ("mis-keyed ref", "f" * 64), ("bad part", k["option"])} <= kinds
    fixed = cli_json("verify", "--fix", "--cache", url)
    assert set(fixed["fixes"][0]["dropped_refs"]) == {"f" * 64, k["option"]}
    assert fixed["fixes"][0]["dropped_blobs"] == [payload] and not blob.exists()
    again = cli_json("verify", "--cache", url)
    assert again["ok"] is True and again["tiers"][0]["refs_checked"] == first["tiers"][0]["refs_checked"] - 1


def test_gc_dry_run_is_what_it_deletes(warmed, tmp_path):
    root = tmp_path / "c"
    url = copy_cache(warmed, root)
    before = cli_json("stats", "--cache", url)["bytes_stored"]
    cap = str(before // 2)
    plan = cli_json("gc", "--max-bytes", cap, "--dry-run", "--cache", url)["tiers"][0]["plan"]
    assert plan["refs"] and plan["blobs"] and plan["bytes_after"] <= int(cap)
    done = cli_json("gc", "--max-bytes", cap, "--cache", url)["tiers"][0]
    assert [r["key"] for r in done["plan"]["refs"]] == [r["key"] for r in plan["refs"]]
    assert done["deleted"]["refs"] == [r["key"] for r in plan["refs"]]
    assert sorted(done["deleted"]["blobs"]) == sorted(b["digest"] for b in plan["blobs"])
    assert not done["deleted"]["kept"]
    assert cli_json("stats", "--cache", url)["bytes_stored"] == plan["bytes_after"]
    left = {i["key"] for i in cli_json("ls", "--cache", url)}
    assert left.isdisjoint(r["key"] for r in plan["refs"]) and cli_json("verify", "--cache", url)["ok"]
    table = cli("gc", "--older-than", "0s", "--dry-run", "--cache", url).stdout
    assert "(dry run)" in table and f"{len(left)} artifacts (0 kept)" in table
    assert {i["key"] for i in cli_json("ls", "--cache", url)} == left


def test_export_import_round_trip_hits_and_a_tampered_bundle_is_refused(warmed, tmp_path):
    _, url, k, _ = warmed
    bundle = tmp_path / "fleet.pcb"
    out = cli_json("export", k["base"][:8], k["option"], "-o", str(bundle), "--cache", url)
    assert [r["key"] for r in out["refs"]] == [k["base"], k["option"]]
    dest = tmp_path / "airgap"
    imported = cli_json("import", str(bundle), "--cache", str(dest))
    assert [(r["key"], r["outcome"]) for r in imported["refs"]] == [(k["base"], "imported"), (k["option"], "imported")]
    hit = cli_json("warmup", RECIPE, "--shapes", "1x4", "--cache", str(dest))["rows"]
    assert [(r["key"], r["outcome"]) for r in hit] == [(k["base"], "hit")]
    assert cli_json("verify", "--cache", str(dest))["ok"]
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0x40
    tampered = tmp_path / "tampered.pcb"
    tampered.write_bytes(bytes(data))
    proc = cli("import", str(tampered), "--cache", str(tmp_path / "other"), check=False)
    assert proc.returncode == 1 and "checksum does not match" in error_line(proc)
    assert not (tmp_path / "other").exists()
    tampered.write_bytes(bytes(data[:-100]))
    proc = cli("import", str(tampered), "--cache", str(dest), check=False)
    assert proc.returncode == 1 and "corrupt" in error_line(proc)
    # rewritten with a checksum that matches, its first ref naming a manifest it lacks: refused before the cache
    # is opened, like a bad checksum
    forged = bytearray(bundle.read_bytes())
    at = forged.index(out["refs"][0]["digest"].encode())
    forged[at:at + 64] = b"0" * 64
    forged[-32:] = hashlib.sha256(forged[:-40]).digest()
    tampered.write_bytes(bytes(forged))
    proc = cli("import", str(tampered), "--cache", str(tmp_path / "other"), check=False)
    assert proc.returncode == 1 and f"lacks the manifest of {k['base'][:12]}" in error_line(proc)
    assert not (tmp_path / "other").exists()


def test_rebuild_for_this_environment_gives_working_keys(warmed, tmp_path):
    root = tmp_path / "c"
    url = copy_cache(warmed, root)
    _, _, k, _ = warmed
    (root / "ref" / k["base"]).unlink()  # as after a torch upgrade: only the old environment's artifact is stored
    rows = cli_json("rebuild", "--cache", url, check=False)["rows"]
    by_old = {r["old_key"]: r for r in rows}
    assert set(by_old) == {k["env"], k["symbolic"]}
    assert by_old[k["env"]]["outcome"] == "rebuilt" and by_old[k["env"]]["new_key"] == k["base"], rows
    assert "torch '2.12.0+cpu' -> '2.13.0+cpu'" in by_old[k["env"]]["detail"]
    assert by_old[k["symbolic"]]["outcome"] == "refused" and "symbolic" in by_old[k["symbolic"]]["detail"]
    again = cli_json("rebuild", k["env"], "--cache", url)["rows"]
    assert [(r["outcome"], r["new_key"]) for r in again] == [("present", k["base"])]
    # a fresh process compiling the model here hits the rebuilt key, with eager's outputs; its metrics say so
    out = run_python(
        "import sys, json, torch, precompile\n"
        "from prometheus_client.parser import text_string_to_metric_families\n"
        "from precompile.recipes.catalog import get_recipe, parse_shapes\n"
        "recipe = get_recipe(sys.argv[2])\n"  # the model and inputs warmup compiled
        "model, inputs = recipe.model(), recipe.example_inputs(parse_shapes('1x4')[0])\n"
        "be = precompile.backend(sys.argv[1])\n"
        "with torch.no_grad():\n"
        "    got = torch.compile(model, backend=be, dynamic=False)(*inputs)\n"
        "    assert torch.allclose(got, model(*inputs), rtol=1e-5, atol=1e-6)\n"
        "import urllib.request\n"
        "from precompile import metrics\n"
        "server, _ = metrics.serve(0, '127.0.0.1')\n"  # what a serving process exposes on its own port
        "text = urllib.request.urlopen(f'http://127.0.0.1:{server.server_port}/metrics', timeout=30).read()\n"
        "fams = {f.name: f for f in text_string_to_metric_families(text.decode())}\n"
        "value = lambda name, **lab: sum(s.value for s in fams[name].samples if s.name.endswith('_total') and "
        "all(s.labels.get(a) == b for a, b in lab.items()))\n"
        "hist = [s.value for s in fams['precompile_load_seconds'].samples if s.name.endswith('_count')]\n"
        "print(json.dumps({'records': [(r.key, r.outcome) for r in be.records], "
        "'hits': value('precompile_lookups', outcome='hit'), 'fast': value('precompile_loads', path='fast'), "
        "'loads_timed': hist}))\n",
        url, RECIPE, cwd=str(Path(__file__).resolve().parents[2]))
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"records": [[k["base"], "hit"]], "hits": 1.0, "fast": 1.0, "loads_timed": [1.0]}


def test_key_prefixes_in_load_and_cli(warmed, tmp_path):
    root = tmp_path / "c"
    url = copy_cache(warmed, root)
    _, _, k, _ = warmed
    twin = k["base"][:8] + "0" * 56
    (root / "ref" / twin).write_text((root / "ref" / k["base"]).read_text())
    proc = cli("inspect", k["base"][:8], "--cache", url, check=False)
    line = error_line(proc)
    assert proc.returncode == 1 and "matches 2 artifacts" in line and k["base"] in line and twin in line
    out = run_python(
        "import sys, precompile\n"
        "art = precompile.load(sys.argv[2], cache=sys.argv[1])\n"
        "print(art.key, art.engine_kind)\n"
        "try:\n"
        "    precompile.load(sys.argv[3], cache=sys.argv[1])\n"
        "except precompile.AmbiguousKeyError as err:\n"
        "    print(sorted(err.matches) == sorted([sys.argv[4], sys.argv[5]]))\n"
        "try:\n"
        "    art.save(sys.argv[6])\n"
        "except FileNotFoundError as err:\n"
        "    print('missing-dir' if sys.argv[7] in str(err) and 'incomplete' not in str(err) else err)\n",
        url, k["base"][:12], k["base"][:8], k["base"], twin, str(tmp_path / "no" / "dir" / "a.pc"),
        str(tmp_path / "no" / "dir"))
    assert out.split() == [k["base"], "fast", "True", "missing-dir"]
    assert not (tmp_path / "no").exists()


def test_stats_prometheus_exposition_parses(warmed):
    from prometheus_client.parser import text_string_to_metric_families

    _, url, _, _ = warmed
    text = cli("stats", "--format", "prometheus", "--cache", url).stdout
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    stats = cli_json("stats", "--cache", url)
    builds = [s for s in fams["precompile_cache_builds"].samples if s.name == "precompile_cache_builds_total"]
    assert [(s.labels, s.value) for s in builds] == [({"cache": url}, float(stats["builds"]))]
    assert fams["precompile_cache_bytes_stored"].type == "gauge"
    assert fams["precompile_cache_bytes_stored"].samples[0].value == stats["bytes_stored"]


def test_verify_gc_export_on_redis(warmed, redis_server, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    _, url, k, _ = warmed
    remote = redis_server.url(chunk_size=4096)  # small chunks: blobs span several keys
    bundle = tmp_path / "all.pcb"
    stored = {i["key"] for i in cli_json("ls", "--cache", url)}  # the graphs in k and the warmups' functions
    assert set(k.values()) < stored
    assert len(cli_json("export", "--all", "-o", str(bundle), "--cache", url)["refs"]) == len(stored)
    cli("import", str(bundle), "--cache", remote)
    assert {i["key"] for i in cli_json("ls", "--cache", remote)} == stored
    assert cli_json("verify", "--cache", f"{url}|{remote}")["ok"]  # tier by tier
    client = redis_server.client()
    chunked = sorted(n.decode() for n in client.scan_iter(match="precompile:blob:{*}:1"))
    client.setrange(chunked[0], 7, b"\xff")
    client.set(f"precompile:ref:{'e' * 64}", client.get(f"precompile:ref:{k['base']}"))
    proc = cli("verify", "--cache", remote, check=False)
    problems = json.loads(proc.stdout.strip().splitlines()[-1])["tiers"][0]["problems"]
    bad = chunked[0][len("precompile:blob:{"):-len("}:1")]
    assert proc.returncode == 1 and ("bad blob", bad) in {(p["kind"], p["name"]) for p in problems}
    assert ("mis-keyed ref", "e" * 64) in {(p["kind"], p["name"]) for p in problems}
    cli("verify", "--fix", "--cache", remote)
    assert cli_json("verify", "--cache", remote)["ok"]
    # --grace 0s: the blobs of the refs verify dropped are fresh orphans, kept 60 s by default
    plan = cli_json("gc", "--max-bytes", "1", "--grace", "0s", "--dry-run", "--cache", remote)["tiers"][0]["plan"]
    done = cli_json("gc", "--max-bytes", "1", "--grace", "0s", "--cache", remote)["tiers"][0]["deleted"]
    assert done["refs"] == [r["key"] for r in plan["refs"]] and plan["refs"]
    assert sorted(done["blobs"]) == sorted(b["digest"] for b in plan["blobs"]) and not done["kept"]
    assert cli_json("ls", "--cache", remote) == [] and not list(client.scan_iter(match="precompile:blob:*"))
    fams = {f.name: f for f in text_string_to_metric_families(cli("stats", "--format", "prometheus", "--cache",
                                                                      remote).stdout)}
    assert any(s.labels == {"cache": remote} for s in fams["precompile_cache_puts"].samples)
