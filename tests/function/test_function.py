"""Whole-function artifacts (``precompile.compile``): a fresh process that hits traces no frame, runs the stored
bytecode bit-equal to the build, and falls back to tracing — never to a wrong answer — when a source changed or the
stored guards refuse a call.  Real Dynamo, real Inductor compiles, real processes, a real local cache."""

from __future__ import annotations

import json
import pickle

import pytest
from conftest import run_python

from precompile.manifest import trust
from precompile.errors import ArtifactFormatError, UnsafePathError

# A user module with a model, a helper Dynamo inlines, and a function with a graph break.
MODEL = '''
import torch

def act(x):
    return torch.relu(x) * 0.5

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = act(layer(x))
        return x

def with_break(x, y):
    a = torch.sin(x) + y
    torch._dynamo.graph_break()
    return torch.cos(a) * 2

_made = {"torch": torch, "__name__": __name__}
exec("def made(x):\\n    torch._dynamo.graph_break()\\n    return torch.cos(x) * 3", _made)  # code with no module

def calls_made(x, y):
    return _made["made"](torch.sin(x) + y) - 1
'''

# Compiles ``Net`` (or ``with_break``) through the cache, calls it, and prints what happened as JSON.
RUN = '''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import usermodel, precompile
from precompile.inductor.dynamo.pkg import frames_traced
cache, what, out_path = sys.argv[2], sys.argv[3], sys.argv[4]
torch.manual_seed(1)
x, y = torch.randn(4, 16), torch.randn(4, 16)
with torch.no_grad():
    if what in ("net", "dynamic"):
        net = usermodel.Net().eval()
        f = precompile.compile(net, cache=cache, dynamic=True if what == "dynamic" else None)
        out, eager = f(x), net(x)
    else:
        fn = usermodel.with_break if what == "break" else usermodel.calls_made
        f = precompile.compile(fn, cache=cache)
        out, eager = f(x, y), fn(x, y)
    info = {"outcome": f.outcome, "frames": frames_traced(), "graphs": len(f.graphs), "reason": f.miss_reason,
            "close": torch.allclose(out, eager, atol=1e-6), "inductor": "torch._inductor.compile_fx" in sys.modules}
    if len(sys.argv) > 5:  # a call the stored guards refuse: another batch size and dtype
        x2 = torch.randn(9, 16)
        info["other_size_close"] = bool(torch.allclose(f(x2), net(x2), atol=1e-6))
        info["retraces"] = f.retraces
        info["frames_after"] = frames_traced()
torch.save(out, out_path)
print(json.dumps(info))
'''


def _run(tmp_path, what, tag, *extra, env=None):
    out = tmp_path / f"{tag}.pt"
    text = run_python(RUN, str(tmp_path / "src"), f"file://{tmp_path / 'cache'}", what, str(out), *extra, env=env)
    return json.loads(text.strip().splitlines()[-1]), out


@pytest.fixture
def user_module(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "usermodel.py").write_text(MODEL)
    return src / "usermodel.py"


def _same(a, b) -> bool:
    import torch

    return torch.equal(torch.load(a), torch.load(b))


def test_fresh_process_hit_traces_no_frame(tmp_path, user_module):
    built, first = _run(tmp_path, "net", "build")
    assert built["outcome"] == "built" and built["frames"] >= 1 and built["close"]
    hit, second = _run(tmp_path, "net", "hit")
    assert hit["outcome"] == "hit", hit
    assert hit["frames"] == 0 and not hit["inductor"]  # Dynamo traced nothing, Inductor never imported
    assert hit["close"] and _same(first, second)  # bit-equal to the build's own compile


def test_graph_break_functions_store_every_graph(tmp_path, user_module):
    built, first = _run(tmp_path, "break", "build")
    assert built["outcome"] == "built" and built["graphs"] == 2
    hit, second = _run(tmp_path, "break", "hit")
    assert hit["outcome"] == "hit" and hit["frames"] == 0 and hit["graphs"] == 2
    assert hit["close"] and _same(first, second)


def test_dynamic_function_serves_other_sizes_without_tracing(tmp_path, user_module):
    built, first = _run(tmp_path, "dynamic", "build", "other-size")
    assert built["outcome"] == "built" and built["retraces"] == 0 and built["other_size_close"]
    hit, second = _run(tmp_path, "dynamic", "hit", "other-size")
    assert hit["outcome"] == "hit" and hit["frames_after"] == 0 and hit["retraces"] == 0  # symbolic batch size
    assert hit["close"] and hit["other_size_close"] and _same(first, second)


def test_a_frame_dynamo_cannot_record_is_left_out_and_traced_where_it_runs(tmp_path, user_module):
    # Dynamo compiles made() (code from exec, no module) as a frame of its own after the graph break; torch's
    # package cannot name it, so the function is stored without it, and every process traces that frame alone
    built, _ = _run(tmp_path, "exec", "first")
    assert built["outcome"] == "built" and built["close"], built
    from cache_backends.registry import open_cache

    cache = open_cache(f"file://{tmp_path / 'cache'}")
    stored = {k: json.loads(cache.get_blob(d)) for k, d in cache.iter_refs()}
    (fn,) = [m for m in stored.values() if m.get("kind") == "function"]
    (why,) = fn["build"]["left_out"].values()
    assert "made" in why[0], why  # the frame, named, and why it is left out
    hit, _ = _run(tmp_path, "exec", "second")
    assert hit["outcome"] == "hit" and hit["close"] and 1 <= hit["frames"] <= 2, hit  # made() and its resume only
    assert "left out of the record" in hit["reason"], hit
    again = {k: json.loads(cache.get_blob(d)) for k, d in cache.iter_refs()}
    assert again == stored  # the warm process rewrote nothing


def test_changed_inlined_source_is_a_miss_with_its_reason(tmp_path, user_module):
    _run(tmp_path, "net", "build")
    # the helper Dynamo inlined changes; the function's own source (its key) does not
    user_module.write_text(MODEL.replace("torch.relu(x) * 0.5", "torch.relu(x) * 0.25"))
    again, _ = _run(tmp_path, "net", "again")
    assert again["outcome"] == "built", again
    assert again["reason"].startswith("source changed: usermodel lines 4-5"), again["reason"]
    assert again["close"]  # the new source's values, not the stored ones
    hit, _ = _run(tmp_path, "net", "hit")  # the rebuilt artifact replaced the stale one
    assert hit["outcome"] == "hit" and hit["frames"] == 0


def test_guard_failure_retraces_and_is_stored(tmp_path, user_module):
    _run(tmp_path, "net", "build")
    hit, _ = _run(tmp_path, "net", "hit", "other-size")
    assert hit["outcome"] == "hit" and hit["retraces"] == 1 and hit["other_size_close"]
    assert hit["frames"] == 0 and hit["frames_after"] >= 1  # the refused call was traced, as torch.compile would
    again, _ = _run(tmp_path, "net", "again", "other-size")  # both sizes are now in the stored function
    assert again["outcome"] == "hit" and again["retraces"] == 0 and again["frames_after"] == 0
    assert again["other_size_close"]


MALICIOUS = '''
import os, pickle
class Boom:
    def __reduce__(self):
        return (os.mkdir, ({marker!r},))
print(pickle.dumps(Boom()).hex())
'''


def test_signed_mode_refuses_a_tampered_dynamo_part_without_unpickling_it(tmp_path, user_module):
    key_path = tmp_path / "builder.pem"
    public = trust.generate_key(key_path)
    built, _ = _run(tmp_path, "net", "build", env={"PRECOMPILE_SIGNING_KEY": str(key_path)})
    assert built["outcome"] == "built"
    from cache_backends.registry import open_cache

    cache = open_cache(f"file://{tmp_path / 'cache'}")
    fkey = next(k for k, d in cache.iter_refs() if json.loads(cache.get_blob(d)).get("kind") == "function")
    marker = tmp_path / "pwned"
    evil = bytes.fromhex(run_python(MALICIOUS.format(marker=str(marker))).strip())
    doc = json.loads(cache.get_blob(cache.get_ref(fkey)))
    part = cache.put_blob(evil)
    doc["blobs"] = {part: {"size": len(evil), "role": "dynamo"}}
    doc["parts"]["dynamo"] = part  # the signature still names the old part
    cache.set_ref(fkey, cache.put_blob(json.dumps(doc).encode()))
    served, _ = _run(tmp_path, "net", "served", env={"PRECOMPILE_VERIFY_KEYS": public})
    assert not marker.exists(), "the tampered Dynamo part was unpickled"
    assert served["outcome"] == "built" and served["close"]  # refused: traced and compiled here instead
    assert cache.stats().get("untrusted", 0) >= 1
    assert pickle.loads(evil) is None and marker.exists()  # the payload was live: unpickled here, it acts


def test_manifest_parse_refuses_unsafe_and_oversized_entries():
    from precompile.manifest.function_manifest import MAX_GRAPHS, FunctionManifest

    d = "a" * 64
    good = {"schema": 0, "kind": "function", "key": d, "factors": {}, "parts": {"dynamo": d}, "graphs": {},
            "sources": [], "frames": [], "env": {}, "blobs": {d: {"size": 1, "role": "dynamo"}}, "build": {}}
    from precompile import config

    good["schema"] = config.FORMAT_VERSION
    assert FunctionManifest.from_dict(good).to_dict() == good
    with pytest.raises(UnsafePathError, match="dotted module name"):
        FunctionManifest.from_dict({**good, "sources": [{"module": "../etc", "first": 1, "last": 2, "sha256": d}]})
    with pytest.raises(UnsafePathError, match="compiled-graph name"):
        FunctionManifest.from_dict({**good, "graphs": {"__builtins__": d}})
    with pytest.raises(ArtifactFormatError, match="at most"):
        FunctionManifest.from_dict({**good, "graphs": {f"__compiled_fn_{i}": d for i in range(MAX_GRAPHS + 1)}})
    with pytest.raises(ArtifactFormatError, match="parts.dynamo"):
        FunctionManifest.from_dict({**good, "parts": {"dynamo": "b" * 64}})
    with pytest.raises(ArtifactFormatError, match="not a whole-function manifest"):
        FunctionManifest.from_dict({**good, "kind": "graph"})


def test_required_no_host_code_makes_a_function_artifact_a_counted_miss_never_unpickled(tmp_path, user_module):
    built, _ = _run(tmp_path, "net", "build")
    assert built["outcome"] == "built"
    from cache_backends.registry import open_cache

    cache = open_cache(f"file://{tmp_path / 'cache'}")
    fkey = next(k for k, d in cache.iter_refs() if json.loads(cache.get_blob(d)).get("kind") == "function")
    marker = tmp_path / "pwned"
    evil = bytes.fromhex(run_python(MALICIOUS.format(marker=str(marker))).strip())
    doc = json.loads(cache.get_blob(cache.get_ref(fkey)))
    part = cache.put_blob(evil)
    doc["blobs"] = {part: {"size": len(evil), "role": "dynamo"}}
    doc["parts"]["dynamo"] = part  # unsigned, self-consistent: without the flag a worker would unpickle it
    cache.set_ref(fkey, cache.put_blob(json.dumps(doc).encode()))
    served, _ = _run(tmp_path, "net", "served", env={"PRECOMPILE_REQUIRE_NO_HOST_CODE": "1"})
    assert not marker.exists(), "the Dynamo part was unpickled although no host code is allowed"
    assert served["outcome"] == "built" and served["close"]  # a miss: traced and compiled here instead
    assert cache.stats().get("host_code_refused", 0) >= 1
