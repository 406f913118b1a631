"""The artifact core end to end: real Inductor compiles of tiny graphs (Dynamo, make_fx, torch.export), outputs
compared with eager, the manifest, both file formats loaded in fresh processes, and get-or-build through a cache.

Each graph kind is compiled once per session (``artifacts`` fixture in conftest.py); fresh-process loads share
the session's Inductor cache dir, so only the first one pays Inductor's CPU ISA probe.
"""

from __future__ import annotations

import json
from pathlib import Path

import _graphs
import pytest
import torch
from conftest import assert_same_output, spawn_python

import precompile
from cache_backends.local.cache import LocalCache
from precompile.manifest.manifest import Manifest
from precompile.builder.standalone import compute_key

HEX = set("0123456789abcdef")

#: Loads a saved artifact in a fresh process, calls it, saves what it returned (torch.save) and prints a report.
LOAD_SNIPPET = r"""
import json, sys, torch, precompile, _graphs
path, data_path, out_path, kind = sys.argv[1:5]
data = torch.load(data_path, weights_only=False)
art = precompile.load(path)
report = {"key": art.key, "source": art.source, "load_seconds": art.load_seconds}
outs = {}
if kind.startswith("export"):
    # weights are lifted placeholders: not in the artifact, bound by name after load
    try:
        art(*data["inputs"])
        report["unbound"] = None
    except precompile.InputMismatchError as err:
        report["unbound"] = str(err)
    model = _graphs.mlp()
    outs["bound"] = art.bind(model)(*data["inputs"])
    outs["weights="] = precompile.load(path, weights=model)(*data["inputs"])
else:
    outs["call"] = art(*data["inputs"])
    if kind == "make_fx":
        try:
            art(data["inputs"][-1])
            report["user_input_only"] = None
        except precompile.InputMismatchError as err:
            report["user_input_only"] = str(err)
torch.save(outs, out_path)
print(json.dumps(report))
"""


def is_key(text: str) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= HEX


def fqns(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


# ------------------------------------------------------------------------------------------- in process
@pytest.mark.parametrize("kind", _graphs.KINDS)
def test_compiled_artifact_matches_eager(kind, artifacts):
    c = artifacts(kind)
    art = c.art
    assert is_key(art.key) and art.source in ("compiled", "cache")
    assert art.key == _graphs.key(c.gm, c.inputs)  # the key prepare() computes is the one stored
    out = art(*c.inputs)
    assert_same_output(out, c.expected)
    # a second call and other input values (same shapes) still match eager
    user = next(i for i, t in enumerate(c.inputs) if t.shape == (_graphs.BATCH, _graphs.D))
    other = [_graphs.example(seed=5) if i == user else t for i, t in enumerate(c.inputs)]
    with torch.no_grad():
        want = c.gm(*other)
    assert_same_output(art(*other), want)
    assert "Artifact" in repr(art) and art.key[:12] in repr(art)


@pytest.mark.parametrize("kind", _graphs.KINDS)
def test_manifest(kind, artifacts):
    c = artifacts(kind)
    m = c.art.manifest
    d = m.to_dict()
    text = json.dumps(d)  # JSON-serializable as is
    assert Manifest.from_dict(json.loads(text)) == m
    assert Manifest.from_json(m.to_json()) == m
    assert d["key"] == c.art.key and compute_key(d["factors"]) == c.art.key
    assert set(d["factors"]) >= {"graph", "inputs", "options", "env", "format", "dynamic_shapes"}

    # placeholders: one per graph input, user inputs and weights told apart
    specs = d["placeholders"]
    user = [s for s in specs if s["kind"] == "user_input"]
    assert len(specs) == 5 and user and user[-1]["shape"] == [_graphs.BATCH, _graphs.D]
    assert all(s["dtype"] == "float32" and s["device"] == "cpu" for s in specs)
    if kind == "dynamo":
        assert [s["fqn"] for s in specs if s["kind"] == "parameter"] == fqns(c.model)
    if kind.startswith("export"):
        assert [s["fqn"] for s in specs[:4]] == fqns(c.model)
        assert all(s["kind"] == "parameter" for s in specs[:4])

    # kernels: C++ sources and the .so built from them, each a blob
    kernels = d["kernels"]
    assert kernels, "no kernels recorded"
    for k in kernels:
        assert k["lang"] == "cpp" and k["name"] and is_key(k["source"])
        source = c.art.blob(k["source"]).decode()
        assert "extern \"C\"" in source or "void kernel" in source, source[:200]
        assert k["binaries"], f"kernel {k['name']} has no binary"
        for fname, digest in k["binaries"].items():
            assert fname.endswith(".so") and is_key(digest)
            assert c.art.blob(digest)[:4] == b"\x7fELF"
            assert digest in m.load_digests()
    # alignment: one entry per tensor input
    assert [a["index"] for a in d["alignment"]] == list(range(len(specs)))
    for a in d["alignment"]:
        assert {"name", "aligned_at_build", "inductor_assumes_aligned", "at_run_time"} <= set(a)
    assert isinstance(d["autotune"], dict) and {"kernels", "other"} <= set(d["autotune"])
    # environment: what the binaries depend on
    assert d["env"]["torch"] == torch.__version__ and d["env"]["cpu_capability"]
    assert d["factors"]["env"]["cpu_capability"] == d["env"]["cpu_capability"]
    # every part is a blob with a size and a role, and the blobs hash to their names
    blobs = c.art.all_blobs()
    assert set(blobs) == set(d["blobs"])
    for digest, info in d["blobs"].items():
        assert info["size"] == len(blobs[digest]) and info["role"]
    assert m.total_bytes() == sum(len(b) for b in blobs.values())
    assert d["build"]["seconds"] > 0 and d["build"]["created"]


def test_export_module_binds_its_weights(artifacts):
    """A torch.export module's weights are lifted placeholders bound to the module's tensors on the fresh
    artifact: it takes only the user input, and other weights can be bound by name."""
    c = artifacts("export")
    art = c.art
    assert len(art.placeholders) == 5
    x = c.inputs[0]
    assert_same_output(art(x), c.expected)
    other = _graphs.mlp(seed=3)
    with torch.no_grad():
        want = other(x)
    try:
        assert_same_output(art.bind(other)(x), want)  # same artifact, another checkpoint
        with pytest.raises(precompile.InputMismatchError, match=r"mismatched: p_0_weight \('0.weight'\)"):
            art.bind({**other.state_dict(), "0.weight": torch.zeros(3, 3)})
    finally:
        art.bind(c.model)
    assert_same_output(art(x), c.expected)


# -------------------------------------------------------------------------------- save / load, fresh process
@pytest.fixture(scope="module")
def saved(artifacts, tmp_path_factory):
    """``saved(kind)`` -> ``{"binary": path, "unpacked": path, "data": path}`` (inputs + eager outputs)."""
    root = tmp_path_factory.mktemp("saved")
    done: dict[str, dict[str, Path]] = {}

    def save(kind: str) -> dict[str, Path]:
        if kind not in done:
            c = artifacts(kind)
            d = root / kind
            d.mkdir()
            paths = {"binary": c.art.save(d / "art.pc"),
                     "unpacked": c.art.save(d / "art.d", format="unpacked"),
                     "data": d / "data.pt"}
            torch.save({"inputs": c.inputs, "expected": c.expected}, paths["data"])
            done[kind] = paths
        return done[kind]

    return save


def test_save_rejects_unknown_format(artifacts, tmp_path):
    with pytest.raises(ValueError, match="'binary' or 'unpacked'"):
        artifacts("make_fx").art.save(tmp_path / "x", format="zip")
    assert not (tmp_path / "x").exists()


def test_unpacked_layout(artifacts, saved):
    c = artifacts("dynamo")
    d = saved("dynamo")["unpacked"]
    for rel in ("graph/code.py", "graph/graph.json", "manifest.json", "index.json", "inputs.json",
                "autotune.json", "alignment.json", "env.json", "engine/payload.bin"):
        assert (d / rel).is_file(), f"{rel} missing from the unpacked artifact"
    assert "def forward" in (d / "graph/code.py").read_text()
    cpp = sorted(p.name for p in (d / "kernels").glob("*.cpp"))
    assert cpp == sorted(f"{k['name']}.cpp" for k in c.art.manifest.kernels)
    sos = sorted(p.name for p in (d / "binaries").rglob("*.so"))
    assert sos and len(sos) == sum(len(k["binaries"]) for k in c.art.manifest.kernels)
    assert json.loads((d / "manifest.json").read_text())["key"] == c.art.key
    assert json.loads((d / "alignment.json").read_text()) == c.art.manifest.alignment
    assert json.loads((d / "env.json").read_text()) == c.art.manifest.env
    assert json.loads((d / "autotune.json").read_text()) == c.art.manifest.autotune
    assert json.loads((d / "inputs.json").read_text()) == c.art.manifest.placeholders
    assert not list(d.parent.glob(".art.d.*")), "temporary directory left behind"
    # saving again over an existing directory replaces it atomically
    c.art.save(d, format="unpacked")
    assert (d / "manifest.json").is_file() and not list(d.parent.glob(".art.d.*"))


def test_binary_file_layout(saved):
    from precompile.manifest.formats import END, MAGIC

    raw = saved("make_fx")["binary"].read_bytes()
    assert raw.startswith(MAGIC) and raw.endswith(END)
    assert not list(saved("make_fx")["binary"].parent.glob(".*incomplete"))


@pytest.mark.slow  # the first fresh process pays Inductor's CPU ISA probe (~15 s); the others reuse its results
@pytest.mark.parametrize("kind", _graphs.KINDS)
def test_fresh_process_load_binary_and_unpacked(kind, artifacts, saved, tmp_path):
    """``save(format=...)`` then ``precompile.load(path)`` in a fresh process: same outputs as eager."""
    c = artifacts(kind)
    paths = saved(kind)
    procs = {fmt: spawn_python(LOAD_SNIPPET, str(paths[fmt]), str(paths["data"]), str(tmp_path / f"{fmt}.pt"), kind)
             for fmt in ("binary", "unpacked")}
    for fmt, proc in procs.items():
        report = proc.json()
        assert report["key"] == c.art.key and report["source"] == str(paths[fmt])
        outs = torch.load(tmp_path / f"{fmt}.pt", weights_only=False)
        for how, out in outs.items():
            assert_same_output(out, c.expected, where=f"{kind} {fmt} {how}")
        if kind.startswith("export"):
            # called without its weights bound: a typed error naming the weight placeholders and their FQNs
            msg = report["unbound"]
            assert msg is not None, "an unbound export artifact ran"
            assert "p_0_weight" in msg and "'0.weight'" in msg and "bind" in msg, msg
        if kind == "make_fx":
            msg = report["user_input_only"]
            assert msg is not None and "Missing placeholders" in msg, msg
            assert all(name in msg for name in ("b0_1", "w2_1", "b2_1")), msg


def test_in_process_load_and_load_by_key(artifacts, saved):
    c = artifacts("dynamo")
    for fmt in ("binary", "unpacked"):
        art = precompile.load(saved("dynamo")[fmt])
        assert art.key == c.art.key and art.manifest == c.art.manifest and art.load_seconds > 0
        assert_same_output(art(*c.inputs), c.expected)
        assert isinstance(precompile.load(str(saved("dynamo")[fmt])), precompile.Artifact)
    art = precompile.load(c.art.key, cache=artifacts.cache_url)
    assert art.source == "cache"
    assert_same_output(art(*c.inputs), c.expected)
    with pytest.raises(precompile.ArtifactNotFoundError, match="no intact artifact"):
        precompile.load("0" * 64, cache=artifacts.cache_url)
    with pytest.raises(FileNotFoundError, match="neither an existing artifact path nor"):
        precompile.load(saved("dynamo")["binary"].parent / "missing.pc")


# ---------------------------------------------------------------------------------------------- get-or-build
def _compiles() -> int:
    """Inductor graph compiles and AOTAutograd traces run in this process so far (Dynamo's own counters; a cache
    hit through the portable path counts ``fxgraph_cache_hit`` instead, the fast path counts nothing)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["total"]


@pytest.mark.parametrize("kind", _graphs.KINDS)
def test_cache_get_or_build_hit_runs_no_compile(kind, artifacts):
    c = artifacts(kind)  # built through a session cache: a miss that stored the artifact
    assert c.art.source == "compiled"
    cache = LocalCache(artifacts.cache_dir_for(kind))
    assert cache.get_ref(c.art.key), "the build was not stored"
    before = cache.counters()
    assert before["builds"] >= 1 and before["misses"] >= 1
    compiles = _compiles()
    assert compiles > 0, "the session's builds left no trace in Dynamo's counters: has torch renamed them?"
    art = precompile.standalone_compile(c.gm, c.inputs, cache=artifacts.cache_url_for(kind))
    assert art.source == "cache" and art.key == c.art.key and art.load_seconds > 0
    assert _compiles() == compiles, "a cache hit ran an Inductor compile"
    after = cache.counters()
    assert after["hits"] == before["hits"] + 1 and after["builds"] == before["builds"]
    assert after["misses"] == before["misses"] and after["errors"] == before["errors"]
    assert art.manifest.to_dict() == c.art.manifest.to_dict()  # the stored build, not a new one
    assert_same_output(art(*c.inputs), c.expected)
    # an open cache object works the same
    again = precompile.standalone_compile(c.gm, c.inputs, cache=precompile.open_cache(artifacts.cache_url_for(kind)))
    assert again.source == "cache"
    assert_same_output(again(*c.inputs), c.expected)
    assert LocalCache(artifacts.cache_dir_for(kind)).verify()["ok"]


def test_cache_hit_serves_another_checkpoint(artifacts):
    """Weights are not in the key: the same architecture with other weights is a hit, run with those weights."""
    c = artifacts("export")
    other = _graphs.mlp(seed=11)
    x = c.inputs[0]
    gm = _graphs.export_module(other, x)
    art = precompile.standalone_compile(gm, [x], cache=artifacts.cache_url)
    assert art.source == "cache" and art.key == c.art.key
    with torch.no_grad():
        want = other(x)
    assert not torch.allclose(want, c.expected)
    assert_same_output(art(x), want)


HIT_SNIPPET = r"""
import json, sys, torch, precompile, _graphs
from torch._dynamo.utils import counters
url, out_path = sys.argv[1:3]
gm, inputs = _graphs.graph("dynamo")
art = precompile.standalone_compile(gm, inputs, cache=url)
compiles = counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["total"]
torch.save({"out": art(*inputs)}, out_path)
print(json.dumps({"source": art.source, "key": art.key, "compile_dirs": compiles,
                  "created": art.manifest.build["created"]}))
"""


def test_cache_hit_in_fresh_process(artifacts, tmp_path):
    c = artifacts("dynamo")
    cache = LocalCache(artifacts.cache_dir)
    before = cache.counters()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = spawn_python(HIT_SNIPPET, artifacts.cache_url, str(tmp_path / "out.pt"), env={"TMPDIR": str(tmp)})
    report = proc.json()
    assert report["source"] == "cache" and report["key"] == c.art.key
    assert report["compile_dirs"] == 0 and report["created"] == c.art.manifest.build["created"]
    assert_same_output(torch.load(tmp_path / "out.pt", weights_only=False)["out"], c.expected)
    after = cache.counters()
    assert after["hits"] == before["hits"] + 1 and after["builds"] == before["builds"]


def test_kernel_names_longer_than_a_file_name_save_and_load(artifacts, tmp_path):
    """Inductor names a kernel after every op it fuses (a Llama's attention prologue: 209 characters, 300 are
    possible); the unpacked directory shortens such file names, and both formats load them back."""
    import copy

    c = artifacts("dynamo")
    manifest = copy.deepcopy(c.art.manifest)
    long_name = "triton_poi_fused_" + "_".join(["scaled_dot_product_attention"] * 12) + "_4"
    assert len(long_name) > 255
    old = manifest.kernels[0]["name"]
    manifest.kernels[0]["name"] = long_name
    manifest.kernels[0]["binaries"] = {f.replace(old, long_name): d for f, d in manifest.kernels[0]["binaries"].items()}
    art = precompile.Artifact(manifest, c.art.all_blobs(), source="test")
    for fmt in ("unpacked", "binary"):
        path = art.save(tmp_path / f"long-{fmt}", format=fmt)
        if fmt == "unpacked":
            assert all(len(p.name) <= 255 for p in path.rglob("*"))
        loaded = precompile.load(path)
        assert loaded.manifest.kernels[0]["name"] == long_name
        assert_same_output(loaded(*c.inputs), c.expected)
