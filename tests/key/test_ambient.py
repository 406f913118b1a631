"""Ambient state that changes what Inductor produces is part of the key; what does not is proven not to matter.

The bug this guards against: one graph compiled with grad enabled (a training graph, forward and backward) and
under ``no_grad`` (an inference graph) got one key, so a shared cache served whichever was built first.
"""

from __future__ import annotations

import contextlib
import json
import re

import _graphs
import pytest
import torch
from conftest import run_python

import precompile


def test_grad_mode_is_a_key_factor_and_a_shared_cache_serves_each_mode_its_own(tmp_path):
    url = "file://" + str(tmp_path / "cache")
    model = _graphs.mlp()  # parameters require grad
    gm, inputs = _graphs.dynamo_graph(model, _graphs.example())
    training = precompile.standalone_compile(gm, inputs, cache=url)  # grad enabled: forward and backward
    with torch.no_grad():
        inference = precompile.standalone_compile(gm, inputs, cache=url)
    assert training.key != inference.key
    assert (training.outcome, inference.outcome) == ("built", "built")  # no hit across grad modes
    assert training.manifest.factors["ambient"]["grad_enabled"] is True
    assert inference.manifest.factors["ambient"]["grad_enabled"] is False
    differing = {k for k in training.manifest.factors if training.manifest.factors[k] != inference.manifest.factors[k]}
    assert differing == {"ambient"}
    assert len(training.manifest.parts["wrappers"]) == 2 and "training graph" in training.manifest.build["fast_off"]
    assert len(inference.manifest.parts["wrappers"]) == 1 and inference.manifest.parts["fast"] is not None
    with torch.no_grad():
        again = precompile.standalone_compile(gm, inputs, cache=url)
    assert again.outcome == "hit" and again.key == inference.key and again.engine_kind == "fast"
    # an operator sees which artifact loads slowly and why, without reading logs
    listed = {i["key"]: i for i in json.loads(run_python("from precompile.cli import main; main()", "ls",
                                                         "--cache", url, "--json"))}
    assert listed[inference.key]["engine"] == "fast" and listed[inference.key]["fast_off"] is None
    assert listed[training.key]["engine"] == "portable" and "training graph" in listed[training.key]["fast_off"]
    shown = run_python("from precompile.cli import main; main()", "inspect", training.key, "--cache", url,
                       env={"COLUMNS": "200"})
    assert "portable path only" in shown and "training graph" in shown
    trained = precompile.load(training.key, cache=url)
    trained.engine  # noqa: B018 - build the callable: a portable load, counted
    counters = precompile.open_cache(url).counters()
    assert counters["loads_portable"] == 1 and counters["loads_fast"] >= 1


@pytest.mark.parametrize("setting", ["autocast", "deterministic", "default_dtype", "matmul_precision"])
def test_each_ambient_setting_changes_the_key(setting):
    gm, inputs = _graphs.graph("dynamo")
    base = _graphs.key(gm, inputs)
    if setting == "autocast":
        ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    elif setting == "deterministic":
        ctx = _deterministic()
    elif setting == "default_dtype":
        ctx = _default_dtype(torch.float64)
    else:
        ctx = _matmul_precision("medium")
    with ctx:
        changed = _graphs.key(gm, inputs)
    assert changed != base
    assert _graphs.key(gm, inputs) == base  # and back


def test_autocast_artifact_runs_the_autocast_graph():
    model = _graphs.mlp().requires_grad_(False)
    x = _graphs.example()
    gm, inputs = _graphs.dynamo_graph(model, x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        art = precompile.standalone_compile(gm, inputs)
        want = model(x)
    assert art.manifest.factors["ambient"]["autocast"] == {"cpu": "bfloat16"}
    with torch.no_grad():
        got = art(*inputs)[0]
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_inference_mode_is_irrelevant_to_the_compile(tmp_path):
    """Under ``inference_mode`` grad is disabled too, and Inductor produces the very same wrapper and kernels as
    under ``no_grad``: so it is not a factor, and one artifact serves both."""
    model = _graphs.mlp()
    gm, inputs = _graphs.dynamo_graph(model, _graphs.example())
    with torch.no_grad():
        a = precompile.standalone_compile(gm, inputs, cache="file://" + str(tmp_path / "a"))
    with torch.inference_mode():
        b = precompile.standalone_compile(gm, inputs, cache="file://" + str(tmp_path / "b"))
    assert a.key == b.key and b.outcome == "built"

    def wrapper(art):  # the AOT id names this process's n-th compile: the rest is the code
        (source,) = [art.blob(d).decode() for d in art.manifest.parts["wrappers"].values()]
        return re.sub(r"# AOT ID: .*", "", source)

    assert wrapper(a) == wrapper(b)
    assert [k["source"] for k in a.manifest.kernels] == [k["source"] for k in b.manifest.kernels]
    with torch.inference_mode():
        out = a(*inputs)[0]
        assert out.is_inference()
        torch.testing.assert_close(out, b(*inputs)[0], rtol=0, atol=0)
        torch.testing.assert_close(out, model(_graphs.example()), rtol=1e-5, atol=1e-5)


def test_inspect_shows_the_ambient_factors(tmp_path):
    url = "file://" + str(tmp_path / "cache")
    gm, inputs = _graphs.graph("dynamo")
    with torch.no_grad():
        art = precompile.standalone_compile(gm, inputs, cache=url)
    out = run_python("from precompile.cli import main; main()", "inspect", art.key[:12], "--cache", url,
                     env={"COLUMNS": "200"})
    assert "grad_enabled" in out and "float32_matmul_precision" in out
    m = json.loads(run_python("from precompile.cli import main; main()", "inspect", art.key, "--cache", url, "--json"))
    assert m["factors"]["ambient"]["grad_enabled"] is False


@contextlib.contextmanager
def _deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _matmul_precision(value):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)
