"""The stored graphs of real models still come back under the list of issue 39 (precompile.manifest.op_list): each
graph Dynamo hands a precompile backend (tiny transformers decoders and encoders, an encoder-decoder, a diffusers
UNet, a ResNet-like CNN in inference, MiniLM with its real weights, and the tiny MLP as Dynamo, make_fx and export graphs) is stored as
``precompile.key.plan.prepare`` stores it, decoded by ``graph_from_json``, and run eagerly under the guard
(precompile.manifest.op_guard) with the outputs it gives without the guard.  A new operator a model reaches fails
here, named: add it to ``SEEN_IN_MODELS`` (after checking its kernel), regenerate the list.

Dynamo tracing only, no Inductor compile.
"""

from __future__ import annotations

import json
import os
from typing import Any

import _graphs
import pytest
import torch

from precompile.manifest.graph_json import graph_from_json
from precompile.manifest.op_guard import OpGuard
from precompile.key.plan import prepare

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: Small configs (hidden 32, 2 layers, vocabulary 128), as ``AutoConfig.for_model`` keywords.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=128),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=128),
    "bert": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                 max_position_embeddings=128),
    "t5": dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=128,
               decoder_start_token_id=0, pad_token_id=0),
}


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def _hf(arch: str, auto: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(arch, **CONFIGS[arch])
    return getattr(transformers, auto).from_config(cfg, attn_implementation="sdpa").eval()


def _unet() -> tuple[torch.nn.Module, tuple, dict]:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8).eval()
    return model, (torch.randn(2, 4, 8, 8), torch.tensor(999)), {"encoder_hidden_states": torch.randn(2, 7, 16)}


def _minilm() -> tuple[torch.nn.Module, tuple, dict]:
    from precompile.recipes.catalog import get_recipe, parse_shapes

    try:
        recipe = get_recipe("minilm")
        model = recipe.model()
    except Exception as err:  # noqa: BLE001 - its weights' package is not installed here
        pytest.skip(f"MiniLM is not available here: {err}")
    return model, tuple(recipe.example_inputs(parse_shapes("2x16")[0])), {}


def _case(name: str) -> tuple[torch.nn.Module, tuple, dict, bool | None]:
    """``(model, args, kwargs, dynamic)`` as a user calls it."""
    if name == "llama":
        return _hf("llama", "AutoModelForCausalLM"), (_ids(1, 7),), {}, True
    if name == "gpt2":
        return _hf("gpt2", "AutoModelForCausalLM"), (_ids(1, 5),), {}, False
    if name == "bert":
        ids = _ids(2, 9)
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0
        return _hf("bert", "AutoModel"), (ids,), {"attention_mask": mask}, None
    if name == "t5":
        return _hf("t5", "AutoModelForSeq2SeqLM"), (_ids(1, 6),), {"decoder_input_ids": _ids(1, 3, 1)}, False
    if name == "unet":
        return (*_unet(), None)
    if name == "cnn":  # a ResNet's stem and head, in inference: batch norm with running statistics, pooling
        torch.manual_seed(0)
        nn = torch.nn
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(8, 8, 3, groups=2), nn.BatchNorm2d(8), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Dropout(0.1), nn.Linear(8, 4)).eval()
        return model, (torch.randn(2, 3, 16, 16),), {}, False
    return (*_minilm(), False)


def _stored_graphs(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic: bool | None) -> list[tuple]:
    """``[(stored graph JSON, run inputs)]``: what a precompile backend stores for each graph Dynamo captures."""
    stored = []

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        _, plan = prepare(gm, inputs, dynamic_shapes="from_graph", options=None)
        stored.append((json.loads(json.dumps(plan.graph_json)), plan.run_inputs))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=dynamic)(*args, **kwargs)
    assert stored
    return stored


def _check(data: dict[str, Any], inputs: list[Any]) -> None:
    gm = graph_from_json(data)
    fresh = lambda: [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]  # noqa: E731
    with torch.no_grad():
        want = gm(*fresh())
        with OpGuard():
            got = gm(*fresh())
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5", "unet", "cnn", "minilm"])
def test_a_real_models_stored_graphs_decode_and_run_under_the_guard(name):
    model, args, kwargs, dynamic = _case(name)
    for data, inputs in _stored_graphs(model, args, kwargs, dynamic):
        _check(data, inputs)


@pytest.mark.parametrize("kind", _graphs.KINDS)
def test_the_tiny_mlps_dynamo_make_fx_and_export_graphs_run_under_the_guard(kind):
    gm, inputs = _graphs.graph(kind)
    _, plan = prepare(gm, inputs, dynamic_shapes="from_example_inputs", options=None)
    _check(json.loads(json.dumps(plan.graph_json)), plan.run_inputs)
