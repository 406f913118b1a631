"""Whole functions built from what library code is made of: decorated functions and closures, objects that hold a
lock, a registry of functions, module hooks, torch.compile's modes.  A fresh process hits and traces nothing where
the stored guards can say the same thing there; an identity guard is never loosened (another function in the
registry is traced, not served the stored code); a function that cannot be stored is stored as refused once, and
every later process says why and rewrites nothing.  Real Dynamo, real Inductor compiles, real processes."""

from __future__ import annotations

import json

import pytest
import torch
from _cli import cli, cli_json
from conftest import run_python, spawn_python

LIBRARY = '''
import functools, threading, torch

def returns_twice(fn):                     # a transformers-style output decorator
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        return out * 2
    return wrapper

def relu(x):
    return torch.relu(x)

def gelu(x):
    return torch.nn.functional.gelu(x)

ACTIVATIONS = {"act": relu}                # a registry, as ALL_ATTENTION_FUNCTIONS

def rotate(x):                             # a module function called by name, as apply_rotary_pos_emb is
    return x.flip(-1)

class Settings:                            # a config object holding a lock, as StaticCache and loggers do
    def __init__(self):
        self.scale = 0.5
        self.lock = threading.Lock()

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 16)
        self.settings = Settings()

    @returns_twice
    def forward(self, x):
        return rotate(ACTIVATIONS["act"](self.proj(x))) * self.settings.scale

class Narrow(torch.nn.Module):             # another model whose forward the same decorator wraps
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 8)

    @returns_twice
    def forward(self, x):
        return torch.tanh(self.proj(x))

class Hooked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 16)
        self.register_forward_pre_hook(lambda mod, args: (args[0] * 3,))
        self.register_forward_hook(lambda mod, args, out: out - 1)

    def forward(self, x):
        return torch.relu(self.proj(x))

def accelerated():                         # a model with accelerate's hooks, as device_map= places them
    from accelerate.hooks import ModelHook, add_hook_to_module

    global Scale

    class Scale(ModelHook):                # at module level, as accelerate's own hooks are
        def pre_forward(self, module, *args, **kwargs):
            return (args[0] * 3,) + args[1:], kwargs

        def post_forward(self, module, output):
            return output - 1

    Scale.__qualname__ = "Scale"
    net = Hooked.__new__(Hooked)
    torch.nn.Module.__init__(net)
    torch.manual_seed(0)
    net.proj = torch.nn.Linear(16, 16)
    add_hook_to_module(net, Scale())       # module.forward becomes a partial of accelerate's own wrapper
    return net

def local_config():                        # a config whose class is defined in a function: torch cannot store it
    class Config:
        scale = 0.25

    net = Hooked.__new__(Hooked)
    torch.nn.Module.__init__(net)
    torch.manual_seed(0)
    net.proj = torch.nn.Linear(16, 16)
    net.cfg = Config()
    net.forward = lambda x: torch.relu(net.proj(x)) * net.cfg.scale
    return net

class PerInstance(torch.nn.Module):        # a function made per instance: no import path names it
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 16)
        k = 3.0
        self.act = lambda x: torch.tanh(x) * k

    def forward(self, x):
        return self.act(self.proj(x))
'''

RUN = '''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import library, precompile
from precompile.inductor.dynamo.pkg import frames_traced
cache, what, swap, mode = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
if swap == "swap":
    library.ACTIVATIONS["act"] = library.gelu
if swap == "patch":  # monkeypatched at its import path, as kernel libraries patch transformers' functions
    library.rotate = lambda x: x.roll(1, -1)
net = {"net": library.Net, "hooked": library.Hooked, "per_instance": library.PerInstance,
       "accelerated": library.accelerated, "local_config": library.local_config}[what]().eval()
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    f = precompile.compile(net, cache=cache, mode=None if mode == "none" else mode)
    before = frames_traced()
    out = f(x)
    info = {"outcome": f.outcome, "frames": frames_traced() - before, "reason": f.miss_reason,
            "not_stored": f.not_stored, "equal": torch.equal(out, net(x)),
            "close": torch.allclose(out, net(x), rtol=1e-5, atol=1e-6)}
print(json.dumps(info))
'''


def _run(tmp_path, what, swap="-", mode="none"):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "library.py").write_text(LIBRARY)
    text = run_python(RUN, str(src), f"file://{tmp_path / 'cache'}", what, swap, mode)
    return json.loads(text.strip().splitlines()[-1])


def _stored(tmp_path):
    from cache_backends.registry import open_cache

    cache = open_cache(f"file://{tmp_path / 'cache'}")
    return {k: json.loads(cache.get_blob(d)) for k, d in cache.iter_refs()}


def test_decorated_forward_and_an_object_holding_a_lock_hit_in_a_fresh_process(tmp_path):
    built = _run(tmp_path, "net")
    assert built["outcome"] == "built" and built["not_stored"] is None and built["equal"], built
    hit = _run(tmp_path, "net")
    assert hit["outcome"] == "hit" and hit["frames"] == 0 and hit["equal"], hit


def test_an_identity_guard_is_not_loosened_another_function_in_the_registry_is_traced(tmp_path):
    _run(tmp_path, "net")
    # the registry now holds gelu where the build saw relu: the stored code (relu) must not run
    swapped = _run(tmp_path, "net", swap="swap")
    assert swapped["outcome"] == "hit" and swapped["frames"] >= 1, swapped
    # gelu's values (Inductor's and eager's gelu may round differently), not relu's
    assert swapped["close"] and swapped["reason"].startswith("the stored guards refused a call"), swapped


def test_a_function_monkeypatched_at_its_import_path_is_traced_not_served_the_stored_code(tmp_path):
    _run(tmp_path, "net")
    # library.rotate now names another function: the object at the path is not what was stored (its digest)
    patched = _run(tmp_path, "net", swap="patch")
    assert patched["outcome"] == "hit" and patched["frames"] >= 1, patched
    assert patched["equal"] and patched["reason"].startswith("the stored guards refused a call"), patched
    again = _run(tmp_path, "net")  # unpatched again: the stored function still hits
    assert again["outcome"] == "hit" and again["frames"] == 0 and again["equal"], again


TWO = '''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import library, precompile
from precompile.inductor.dynamo.pkg import frames_traced
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
net, narrow = library.Net().eval(), library.Narrow().eval()
with torch.no_grad():
    f, g = precompile.compile(net, cache=sys.argv[2]), precompile.compile(narrow, cache=sys.argv[2])
    before = frames_traced()
    outs = [f(x), g(x), f(x), g(x)]
    print(json.dumps({"outcomes": [f.outcome, g.outcome], "frames": frames_traced() - before,
                      "equal": all(torch.equal(o, m(x)) for o, m in zip(outs, [net, narrow] * 2))}))
'''


def test_two_functions_whose_first_frames_share_code_both_stay_installed(tmp_path):
    """Both forwards run the decorator's wrapper first, so their stored entries sit on one code object, and torch
    resets that object's whole list when a package is installed: the second load must not wipe the first's."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "library.py").write_text(LIBRARY)
    cache = f"file://{tmp_path / 'cache'}"
    built = json.loads(run_python(TWO, str(src), cache).strip().splitlines()[-1])
    assert built["outcomes"] == ["built", "built"] and built["equal"], built
    warm = json.loads(run_python(TWO, str(src), cache).strip().splitlines()[-1])
    assert warm == {"outcomes": ["hit", "hit"], "frames": 0, "equal": True}, warm


def test_module_hooks_run_as_under_torch_compile(tmp_path):
    built = _run(tmp_path, "hooked")
    assert built["outcome"] == "built" and built["equal"], built  # equal to eager, hooks included
    hit = _run(tmp_path, "hooked")
    assert hit["outcome"] == "hit" and hit["frames"] == 0 and hit["equal"], hit


def test_accelerate_hooks_run_and_the_function_hits(tmp_path):
    built = _run(tmp_path, "accelerated")
    assert built["outcome"] == "built" and built["not_stored"] is None and built["equal"], built
    hit = _run(tmp_path, "accelerated")
    assert hit["outcome"] == "hit" and hit["frames"] == 0 and hit["equal"], hit


def test_a_function_that_cannot_be_stored_is_stored_as_refused_once_and_says_why(tmp_path):
    built = _run(tmp_path, "per_instance")
    assert built["outcome"] == "built" and built["equal"], built
    assert "no import path names" in built["not_stored"], built
    (refusal,) = [m for m in _stored(tmp_path).values() if m.get("kind") == "function"]
    assert refusal["parts"] == {} and refusal["build"]["refused"] == built["not_stored"]
    before = _stored(tmp_path)
    again = _run(tmp_path, "per_instance")
    assert again["outcome"] == "traced" and again["equal"], again
    assert again["reason"] == f"its builder could not store it: {built['not_stored']}", again
    assert _stored(tmp_path) == before  # the worker read the reason and rewrote nothing
    # the operator sees it too: diff of the key says why it is not a plain hit, inspect shows the reason
    (key,) = [k for k, m in before.items() if m.get("kind") == "function"]
    url = f"file://{tmp_path / 'cache'}"
    assert cli_json("diff", key, "--cache", url)["status"] == f"stored as refused: its builder could not store it: " \
                                                                  f"{built['not_stored']}"
    shown = cli("inspect", key, "--cache", url).stdout
    assert "stored as refused" in shown and "no import path names" in shown


def test_a_guard_torch_cannot_store_never_fails_the_call(tmp_path):
    built = _run(tmp_path, "local_config")  # torch raises TypeError for the local class: the call must still run
    assert built["outcome"] == "built" and built["equal"] and built["not_stored"], built
    again = _run(tmp_path, "local_config")
    assert again["outcome"] == "traced" and again["equal"], again


def test_reduce_overhead_on_a_cpu_hits_as_the_default_mode_does(tmp_path):
    built = _run(tmp_path, "net", mode="reduce-overhead")
    assert built["outcome"] == "built" and built["equal"], built
    hit = _run(tmp_path, "net", mode="reduce-overhead")
    assert hit["outcome"] == "hit" and hit["frames"] == 0 and hit["equal"], hit
    default = _run(tmp_path, "net")  # another key: the mode is a key factor
    assert default["outcome"] == "built", default


def test_modes_are_torch_compiles_and_an_unknown_mode_is_refused():
    import torch._inductor

    import precompile
    from precompile.function.modes import MODES, resolve

    for mode, options in MODES.items():
        assert options == torch._inductor.list_mode_options(mode), mode
    assert resolve(None, {"max_autotune": True}) == ({"max_autotune": True}, False)
    assert resolve("reduce-overhead", None) == ({}, True)
    with pytest.raises(ValueError, match="not a torch.compile mode"):
        precompile.compile(torch.nn.Linear(2, 2), mode="fast")
    with pytest.raises(ValueError, match="not both"):  # torch.compile refuses both too (a RuntimeError there)
        precompile.compile(torch.nn.Linear(2, 2), mode="max-autotune", options={"max_autotune": False})
    with pytest.raises(RuntimeError, match="both can't be specified"):
        torch.compile(torch.nn.Linear(2, 2), mode="max-autotune", options={"max_autotune": False})


# A worker that hit, then meets a size its stored guards refuse: it stores the function again only over the entry it
# loaded.  ``hold`` waits (after its hit) until told to go on, so another worker's rewrite can land in between.
RETRACE = '''
import json, os, sys, time, torch
sys.path.insert(0, sys.argv[1])
import library, precompile
from cache_backends.registry import open_cache
cache, sizes, hold = sys.argv[2], [int(n) for n in sys.argv[3].split(",")], sys.argv[4]
net = library.Hooked().eval()
with torch.no_grad():
    f = precompile.compile(net, cache=cache, dynamic=False)
    f(torch.randn(sizes[0], 16))
    if hold != "-":
        open(hold + ".ready", "w").close()
        while not os.path.exists(hold + ".go"):
            time.sleep(0.05)
    for n in sizes[1:]:
        f(torch.randn(n, 16))
print(json.dumps({"outcome": f.outcome, "retraces": f.retraces, "ref": open_cache(cache).get_ref(f.key)}))
'''


def test_after_a_retrace_a_worker_stores_only_over_the_entry_it_loaded(tmp_path):
    import time

    src = tmp_path / "src"
    src.mkdir()
    (src / "library.py").write_text(LIBRARY)
    url, flag = f"file://{tmp_path / 'cache'}", str(tmp_path / "b")

    def run(sizes, hold="-"):
        return spawn_python(RETRACE, str(src), url, sizes, hold)

    built = run("4").json()
    held = run("4,9", hold=flag)  # worker B: hit, then waits
    deadline = time.monotonic() + 120
    while not (tmp_path / "b.ready").exists():
        assert time.monotonic() < deadline and held.popen.poll() is None, "worker B did not get to its hit"
        time.sleep(0.05)
    other = run("4,7").json()  # worker C: hit, retraced for size 7, stored over the entry both loaded
    assert other["outcome"] == "hit" and other["retraces"] == 1 and other["ref"] != built["ref"], other
    (tmp_path / "b.go").touch()
    late = held.json()  # worker B retraced for size 9, but the key no longer holds what it loaded: kept C's
    assert late["outcome"] == "hit" and late["retraces"] == 1 and late["ref"] == other["ref"], late
