"""Artifact keys: stable across processes and machines' incidental state, different for anything that changes
the compiled code.  Keys are computed with ``precompile.builder.standalone.prepare`` (no Inductor compile), so this file
is cheap: its cost is the fresh processes (import torch + trace the graphs, a few seconds each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _graphs
import pytest
import torch
from conftest import python_env, run_python, spawn_python

from precompile.errors import InputMismatchError, OptionsError
from precompile.key.plan import compute_key, prepare

KEYS_SNIPPET = ("import json, _graphs; "
                "print(json.dumps({'keys': _graphs.all_keys(), 'env': _graphs.report_environment()}))")


@pytest.fixture(scope="module")
def baseline() -> dict[str, str]:
    """``{graph kind: key}`` computed in this process."""
    return _graphs.all_keys()


def key_of(gm, inputs, **kwargs) -> str:
    return _graphs.key(gm, inputs, **kwargs)


def _assert_same_keys(results: dict[str, dict], baseline: dict[str, str]) -> None:
    differ = {variant: {k: (r["keys"][k][:12], baseline[k][:12]) for k in baseline if r["keys"][k] != baseline[k]}
              for variant, r in results.items()}
    differ = {v: d for v, d in differ.items() if d}
    assert not differ, f"keys changed (variant: {{kind: (got, in-process)}}): {differ}\n" + json.dumps(
        {v: r["env"] for v, r in results.items()}, indent=1)


# --------------------------------------------------------------------------------------------- stability
def test_key_is_64_hex_and_deterministic(baseline):
    assert set(baseline) == set(_graphs.KINDS)
    for kind, key in baseline.items():
        assert len(key) == 64 and all(c in "0123456789abcdef" for c in key), (kind, key)
    assert _graphs.all_keys() == baseline
    _, plan = prepare(*_graphs.graph("dynamo"), dynamic_shapes="from_example_inputs", options=None)
    assert compute_key(plan.factors) == plan.key == baseline["dynamo"]
    json.dumps(plan.factors)  # stored in the manifest: must be plain JSON


@pytest.mark.slow  # six fresh processes tracing three graphs each: ~20 s on 2 idle cores, more when loaded
def test_key_stable_across_processes_cwd_home_tmpdir_inductor_dir(baseline, tmp_path):
    """Each variant changes one thing a key must never depend on; all run at once as real processes."""
    variants: dict[str, dict] = {
        "plain": {},
        "cwd": {"cwd": tmp_path / "elsewhere"},
        "HOME": {"env": {"HOME": str(tmp_path / "home")}},
        "TMPDIR": {"env": {"TMPDIR": str(tmp_path / "tmp")}},
        "TORCHINDUCTOR_CACHE_DIR": {"env": {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                                            "TRITON_CACHE_DIR": str(tmp_path / "triton")}},
        "HOSTNAME": {"env": {"HOSTNAME": "some-other-host", "USER": "someone", "LOGNAME": "someone"}},
    }
    for d in ("elsewhere", "home", "tmp", "inductor", "triton"):
        (tmp_path / d).mkdir()
    procs = {name: spawn_python(KEYS_SNIPPET, **v) for name, v in variants.items()}
    results = {name: p.json() for name, p in procs.items()}
    # the variation took effect in the child
    assert results["cwd"]["env"]["cwd"] == str(tmp_path / "elsewhere")
    assert results["HOME"]["env"]["home"] == str(tmp_path / "home")
    assert results["TMPDIR"]["env"]["tmp"] == str(tmp_path / "tmp")
    assert results["TORCHINDUCTOR_CACHE_DIR"]["env"]["inductor_cache"] == str(tmp_path / "inductor")
    _assert_same_keys(results, baseline)


def _can_set_hostname() -> str | None:
    """None if ``unshare --uts`` + ``hostname`` work here, else why not."""
    unshare, hostname = shutil.which("unshare"), shutil.which("hostname")
    if not unshare or not hostname:
        return "unshare or hostname is not installed"
    probe = subprocess.run([unshare, "--uts", "sh", "-c", "hostname pc-key-test && hostname"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != "pc-key-test":
        return ("cannot change the hostname in a new UTS namespace here (needs root/CAP_SYS_ADMIN): "
                + probe.stderr.strip())
    return None


def test_key_stable_across_hostname(baseline):
    why = _can_set_hostname()
    if why:
        pytest.skip(why + "; HOSTNAME is varied by the environment test instead")
    prefix = ["unshare", "--uts", "sh", "-c", 'hostname pc-key-test-host && exec "$@"', "sh"]
    result = json.loads(run_python(KEYS_SNIPPET, prefix=prefix).strip().splitlines()[-1])
    assert result["env"]["hostname"] == "pc-key-test-host"
    _assert_same_keys({"hostname": result}, baseline)


def _as_nobody() -> list[str] | str:
    """The ``setpriv`` prefix that runs a command as user nobody, or the reason that is impossible here."""
    setpriv = shutil.which("setpriv")
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root: cannot switch to another user"
    if setpriv is None:
        return "setpriv is not installed"
    prefix = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import torch, precompile, _graphs"],
                           capture_output=True, text=True, env=python_env({"HOME": "/"}), cwd="/")
    if probe.returncode != 0:
        return f"user nobody cannot import torch/precompile from this venv (not world-readable?): {probe.stderr[-300:]}"
    return prefix


def test_key_stable_across_user(baseline):
    prefix = _as_nobody()
    if isinstance(prefix, str):
        pytest.skip(prefix)
    home = Path(tempfile.mkdtemp(prefix="pc-nobody-"))  # pytest's tmp_path is private to root
    try:
        home.chmod(0o777)
        out = run_python(KEYS_SNIPPET, prefix=prefix, cwd=home, env={
            "HOME": str(home), "TMPDIR": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"), "TRITON_CACHE_DIR": str(home / "triton"),
            "USER": "nobody", "LOGNAME": "nobody"})
    finally:
        shutil.rmtree(home, ignore_errors=True)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["env"]["uid"] != os.getuid()
    _assert_same_keys({"user nobody": result}, baseline)


# ---------------------------------------------------------------------------------------- renaming, weights
def test_renamed_nodes_same_key():
    """Structurally identical graphs traced from code with other argument and variable names."""

    class A(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(_graphs.D, _graphs.D)

        def forward(self, x):
            y = self.lin(x)
            return torch.relu(y)

    class B(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(_graphs.D, _graphs.D)

        def forward(self, hidden_states):
            projected = self.lin(hidden_states)
            return torch.relu(projected)

    x = _graphs.example()
    ga, gb = _graphs.dynamo_graph(A(), x), _graphs.dynamo_graph(B(), x)
    assert [n.name for n in ga[0].graph.nodes] != [n.name for n in gb[0].graph.nodes]
    assert key_of(*ga) == key_of(*gb)
    ea, eb = _graphs.export_module(A(), x), _graphs.export_module(B(), x)
    assert key_of(ea, [x]) == key_of(eb, [x])

    from torch.fx.experimental.proxy_tensor import make_fx

    def f(w, b, x):
        h = x @ w.t()
        return (torch.relu(h + b),)

    def g(weight, bias, inp):
        out = inp @ weight.t()
        return (torch.relu(out + bias),)

    args = [torch.randn(_graphs.D, _graphs.D), torch.randn(_graphs.D), x]
    fa, fb = make_fx(f)(*args), make_fx(g)(*args)
    assert [n.name for n in fa.graph.nodes] != [n.name for n in fb.graph.nodes]
    assert key_of(fa, args) == key_of(fb, args)
    # ... but a different structure is a different key
    fc = make_fx(lambda w, b, x: (torch.sigmoid(x @ w.t() + b),))(*args)
    assert key_of(fc, args) != key_of(fa, args)


def test_weight_values_are_not_in_the_key():
    """One artifact serves every checkpoint of an architecture: weights are inputs, keyed on shape and dtype."""
    x = _graphs.example()
    for kind in ("dynamo", "export"):
        one, other = _graphs.mlp(seed=0), _graphs.mlp(seed=7)
        assert key_of(*_graphs.graph(kind, one, x)) == key_of(*_graphs.graph(kind, other, x))
    assert key_of(*_graphs.graph("export", x=x)) == key_of(*_graphs.graph("export", x=_graphs.example(seed=99)))


# ------------------------------------------------------------------------------------------ what changes it
@pytest.mark.parametrize("kind", ["dynamo", "make_fx", "export"])
def test_dtype_shape_stride_change_the_key(kind, baseline):
    base = baseline[kind]
    model = _graphs.mlp()
    # dtype: the same model and input in float64 / bfloat16
    for dtype in (torch.float64, torch.bfloat16):
        changed = key_of(*_graphs.graph(kind, _graphs.mlp(dtype=dtype), _graphs.example(dtype=dtype)))
        assert changed != base, f"{kind}: {dtype} gave the float32 key"
    # shape: another batch size
    assert key_of(*_graphs.graph(kind, model, _graphs.example(batch=_graphs.BATCH + 1))) != base
    # stride: the same shape, transposed in memory (non-contiguous)
    x_t = torch.randn(_graphs.D, _graphs.BATCH).t()
    assert x_t.shape == (_graphs.BATCH, _graphs.D) and not x_t.is_contiguous()
    gm, inputs = _graphs.graph(kind, model, x_t)
    assert key_of(gm, inputs) != base, f"{kind}: a transposed input gave the contiguous key"
    assert key_of(gm, [t.contiguous() for t in inputs]) == key_of(*_graphs.graph(kind, model, x_t.contiguous()))


def test_options_change_the_key_and_defaults_do_not(baseline):
    gm, inputs = _graphs.graph("dynamo")
    base = baseline["dynamo"]
    assert key_of(gm, inputs, options={}) == base
    assert key_of(gm, inputs, options={"max_autotune": False}) == base  # the default value: same compile
    tuned = key_of(gm, inputs, options={"max_autotune": True})
    assert tuned != base
    two = {"max_autotune": True, "epilogue_fusion": False}
    assert key_of(gm, inputs, options=two) == key_of(gm, inputs, options=dict(reversed(list(two.items()))))
    assert key_of(gm, inputs, options=two) != tuned
    assert key_of(gm, inputs, options={"cpp": {"simdlen": 8}}) == key_of(gm, inputs, options={"cpp.simdlen": 8})
    assert key_of(gm, inputs, options={"cpp.simdlen": 8}) != base


def test_the_callers_inductor_config_is_read_at_every_key(baseline):
    """The effective config is remembered per state of Inductor's config (vLLM's pieces key under one state): an
    assignment, a change made in place to a dict option, a patch and their undoing each show in the next key."""
    from torch._inductor import config

    gm, inputs = _graphs.graph("dynamo")
    base = baseline["dynamo"]
    assert key_of(gm, inputs) == base == key_of(gm, inputs)
    saved = config.comment_origin
    try:
        config.comment_origin = not saved
        flipped = key_of(gm, inputs)
        assert flipped != base
    finally:
        config.comment_origin = saved
    assert key_of(gm, inputs) == base
    with config.patch({"comment_origin": not saved}):
        assert key_of(gm, inputs) == flipped
    assert key_of(gm, inputs) == base
    fusions = config.post_grad_fusion_options
    try:
        fusions["precompile_test_marker"] = {}  # changed in place: the same object, another value
        assert key_of(gm, inputs) not in (base, flipped)
    finally:
        fusions.pop("precompile_test_marker", None)
    assert key_of(gm, inputs) == base


def test_dynamic_shapes_mode_keys_what_it_changes(baseline):
    """A static graph compiles the same in every mode (one key); a graph with symbolic sizes is specialized by
    from_example_inputs and kept symbolic by from_graph (two keys, the symbols' ranges a factor)."""
    gm, inputs = _graphs.graph("dynamo")
    assert key_of(gm, inputs, dynamic_shapes="from_graph") == baseline["dynamo"]
    dyn, example = _graphs.capture(_graphs.mlp(), (_graphs.example(),), dynamic=((0, 0),))
    _, static = prepare(dyn, example, dynamic_shapes="from_example_inputs", options=None)
    _, symbolic = prepare(dyn, example, dynamic_shapes="from_graph", options=None)
    assert static.key != symbolic.key
    assert (static.factors["dynamic_shapes"], symbolic.factors["dynamic_shapes"]) == ("static", "symbolic")
    assert symbolic.factors["symbols"] == {"s0": [2, None]} and static.factors["symbols"] == {}


# ------------------------------------------------------------------------------------------------- errors
def test_unknown_option_is_an_options_error():
    gm, inputs = _graphs.graph("export")
    with pytest.raises(OptionsError, match="max_autotoon") as info:
        prepare(gm, inputs, dynamic_shapes="from_example_inputs", options={"max_autotoon": True})
    assert isinstance(info.value, ValueError)
    assert "max_autotune" in str(info.value)  # a close name is suggested
    with pytest.raises(OptionsError, match="cannot be stored in a key"):
        prepare(gm, inputs, dynamic_shapes="from_example_inputs", options={"max_autotune": object()})
    import precompile

    with pytest.raises(OptionsError):  # the public entry point raises it before any compile
        precompile.standalone_compile(gm, inputs, options={"no_such_option": 1})


@pytest.mark.parametrize("value", ["dynamic", "", None, True, "FROM_EXAMPLE_INPUTS"])
def test_bad_dynamic_shapes_is_a_value_error(value):
    import precompile

    gm, inputs = _graphs.graph("export")
    with pytest.raises(ValueError, match="dynamic_shapes must be one of"):
        prepare(gm, inputs, dynamic_shapes=value, options=None)
    with pytest.raises(ValueError, match="dynamic_shapes must be one of"):
        precompile.standalone_compile(gm, inputs, dynamic_shapes=value)


def test_wrong_number_of_example_inputs():
    gm, inputs = _graphs.graph("make_fx")
    with pytest.raises(InputMismatchError, match="5 placeholders but 4 example inputs") as info:
        prepare(gm, inputs[:-1], dynamic_shapes="from_example_inputs", options=None)
    assert "x_1" in str(info.value)
