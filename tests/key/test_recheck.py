"""A stored key's process-side factors, checked again without its graph (precompile/key/recheck.py).

vLLM's piece map loads artifacts by key, without keying their graphs; ``stale_factor`` must then name every factor
that keying the graph here would give differently: precompile's format, the environment, the effective Inductor
config, the ambient state.  Checked on a real built artifact, each factor flipped the way a user would flip it.
"""

from __future__ import annotations

import copy

import pytest
import torch

import _graphs
from precompile.builder.standalone import standalone_compile
from precompile.key.recheck import stale_factor
from precompile.key.plan import prepare


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    gm, inputs = _graphs.make_fx_graph(_graphs.mlp(seed=3), _graphs.example(seed=4))
    art = standalone_compile(gm, inputs, cache=f"file://{tmp_path_factory.mktemp('recheck')}")
    return art.manifest, gm, inputs


def test_a_key_made_here_holds_here(manifest):
    m, _, _ = manifest
    assert stale_factor(m.factors, m.placeholders) is None


def test_each_process_side_factor_flipped_is_named(manifest):
    m, gm, inputs = manifest
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if before != "medium" else "high")
    try:
        assert stale_factor(m.factors, m.placeholders) == "ambient.float32_matmul_precision"
    finally:
        torch.set_float32_matmul_precision(before)
    with torch._inductor.config.patch(epilogue_fusion=not torch._inductor.config.epilogue_fusion):
        assert stale_factor(m.factors, m.placeholders) == "inductor_config"
        # and keying the graph here agrees that the key would differ
        assert prepare(gm, inputs, dynamic_shapes="from_example_inputs", options=None)[1].key != m.key
    with torch.no_grad():
        assert stale_factor(m.factors, m.placeholders) == "ambient.grad_enabled"


@pytest.mark.parametrize("path, value, named", [
    (("format",), -1, "format"),
    (("env", "torch"), "0.0.0", "env.torch"),
    (("env",), "not a dict", "env"),
    (("options",), {"no_such_inductor_option": 1}, "options"),
    (("inductor_config",), "0" * 64, "inductor_config"),
    (("ambient", "sdpa"), {"order": ["math"]}, "ambient.sdpa (not rechecked)"),
    (("ambient", "default_dtype"), "float64", "ambient.default_dtype"),
])
def test_a_stored_factor_that_differs_from_here_is_named(manifest, path, value, named):
    m, _, _ = manifest
    factors = copy.deepcopy(m.factors)
    where = factors
    for name in path[:-1]:
        where = where[name]
    where[path[-1]] = value
    assert stale_factor(factors, m.placeholders) == named
