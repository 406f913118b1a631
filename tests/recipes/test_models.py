"""Tests of precompile.recipes.catalog: shape lists, the built-in recipes and module:function specs.

Eager and Dynamo tracing only (no Inductor compile), so the whole file runs in well under a minute on CPU.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import urllib.parse
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from precompile.errors import RecipeError  # noqa: E402
from precompile.recipes.catalog import (  # noqa: E402
    BUILTIN_RECIPES,
    MINILM_SENTENCES,
    Recipe,
    Shape,
    get_recipe,
    minilm_reference_embeddings,
    minilm_sentences,
    parse_shapes,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo_on_path(monkeypatch):
    """Make ``tests.fixtures_models`` importable whatever way pytest was started."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))


def _proxy_ports() -> set[int]:
    """Ports of the proxies configured in the environment: a loopback proxy leads to the network."""
    ports = set()
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        try:
            port = urllib.parse.urlsplit(os.environ.get(name, "")).port
        except ValueError:
            port = None
        if port:
            ports.add(port)
    return ports


def _is_local(address: tuple) -> bool:
    """A loopback address (a test's own redis-server) that is not a configured proxy."""
    host, port = address[0], address[1]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only localhost is local
        loopback = host == "localhost"
    return loopback and port not in _proxy_ports()


@pytest.fixture
def no_network(monkeypatch):
    """Fail any attempt to open a network connection; yields the list of attempts."""
    attempts: list[object] = []

    def refuse(self, address, *args, **kwargs):
        # AF_INET / AF_INET6 to anywhere but loopback (a test's own redis-server); unix sockets are local
        if isinstance(address, tuple) and not _is_local(address):
            attempts.append(address)
            raise OSError(f"network access attempted in an offline test: {address!r}")
        return real_connect(self, address, *args, **kwargs)

    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield attempts
    assert attempts == [], f"network access attempted: {attempts}"


def _capture(model, inputs):
    """torch.compile with a capturing backend; returns (graphs, output)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    try:
        out = torch.compile(model, backend=capture, fullgraph=True, dynamic=False)(*inputs)
    finally:
        torch._dynamo.reset()
    return graphs, out


# ------------------------------------------------------------------------------------------------- shapes
@pytest.mark.parametrize(
    "text, expected",
    [
        ("1x16", [Shape(1, 16)]),
        ("1x16,4x32", [Shape(1, 16), Shape(4, 32)]),
        (" 2 x 8 , 3X64 ,", [Shape(2, 8), Shape(3, 64)]),
        ("1x16,1x16,2x16", [Shape(1, 16), Shape(2, 16)]),
    ],
)
def test_parse_shapes_good(text, expected):
    assert parse_shapes(text) == expected


@pytest.mark.parametrize(
    "text", ["", " , ", "16", "1x", "x16", "1x16x2", "0x16", "1x0", "-1x16", "axb", "1.5x16", "1x16;2x8"]
)
def test_parse_shapes_bad(text):
    with pytest.raises(RecipeError, match="BATCHxSEQ|batch and seq"):
        parse_shapes(text)


def test_parse_shapes_not_a_string():
    with pytest.raises(RecipeError):
        parse_shapes(["1x16"])  # type: ignore[arg-type]


def test_shape_str_and_validation():
    assert str(Shape(4, 32)) == "4x32"
    assert isinstance(RecipeError("x"), ValueError)
    with pytest.raises(RecipeError):
        Shape(0, 16)
    with pytest.raises(RecipeError):
        Shape(1, True)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- get_recipe
@pytest.mark.parametrize("spec", ["nope", "", "   ", "llama:", ":fn", "a b:c", "mod:fn-x"])
def test_bad_recipe_names(spec):
    with pytest.raises(RecipeError):
        get_recipe(spec)


def test_bad_dtype_and_device():
    with pytest.raises(RecipeError, match="dtype"):
        get_recipe("llama", dtype="int8")
    with pytest.raises(RecipeError, match="device"):
        get_recipe("llama", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RecipeError, match="CUDA"):
            get_recipe("llama", device="cuda")


# -------------------------------------------------------------------------------------------------- MiniLM
@pytest.fixture(scope="module")
def minilm():
    recipe = get_recipe("minilm")
    recipe.model()
    return recipe


def test_minilm_model_is_frozen_eval_float32(minilm):
    model = minilm.model()
    assert model is minilm.model()  # cached per instance
    assert not model.training
    params = list(model.parameters())
    assert params and all(not p.requires_grad and p.dtype == torch.float32 for p in params)
    assert all(not m.training for m in model.modules())


def test_minilm_example_inputs_pad_and_truncate(minilm):
    ids, mask = minilm.example_inputs(Shape(3, 64))
    assert ids.shape == mask.shape == (3, 64)
    assert ids.dtype == mask.dtype == torch.int64
    assert (mask.sum(1) < 64).all()  # padded to max_length
    ids, mask = minilm.example_inputs(Shape(2, 6))
    assert ids.shape == (2, 6) and bool(mask.all())  # truncated, [SEP] kept last
    assert (ids[:, 0] == 101).all() and (ids[:, -1] == 102).all()
    assert minilm_sentences(18)[16:] == list(MINILM_SENTENCES[:2])
    ids2, _ = minilm.example_inputs(Shape(2, 6))
    assert torch.equal(ids, ids2)
    with pytest.raises(RecipeError, match="seq"):
        minilm.example_inputs(Shape(1, 513))


def test_minilm_matches_sentence_transformers(minilm, no_network):
    sentences = minilm_sentences(len(MINILM_SENTENCES))
    reference = minilm_reference_embeddings(sentences)
    assert reference.shape == (len(sentences), 384)

    tok = minilm.tokenizer()
    longest = max(len(tok(s)["input_ids"]) for s in sentences)
    inputs = minilm.example_inputs(Shape(len(sentences), longest))  # nothing truncated
    assert inputs[1].sum(1).tolist() == [len(tok(s)["input_ids"]) for s in sentences]
    with torch.no_grad():
        emb = minilm.postprocess(minilm.model()(*inputs), inputs)
    assert emb.shape == reference.shape and emb.dtype == torch.float32
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(len(sentences)))
    cos = torch.nn.functional.cosine_similarity(emb, reference, dim=1)
    assert cos.min().item() >= 0.9999, cos

    # one row at a time, with no padding at all
    for i in (0, 4, 13):
        n = int(inputs[1][i].sum())
        row = minilm.tokenize([sentences[i]], n)
        assert bool(row[1].all())
        with torch.no_grad():
            one = minilm.postprocess(minilm.model()(*row), row)
        assert torch.nn.functional.cosine_similarity(one, reference[i : i + 1]).item() >= 0.9999


def test_minilm_describe_is_json(minilm):
    info = minilm.describe()
    assert info["recipe"] == "minilm" and info["config"]["hidden_size"] == 384
    json.dumps(info)


def test_minilm_rejects_config():
    with pytest.raises(RecipeError, match="attn_implementation"):
        get_recipe("minilm", '{"num_hidden_layers": 2}')


# -------------------------------------------------------------------------------------- random-weight LMs
def test_llama_is_deterministic_across_constructions():
    torch.manual_seed(1234)
    before = torch.rand(3)
    torch.manual_seed(1234)
    a, b = get_recipe("llama"), get_recipe("llama")
    inputs_a, inputs_b = a.example_inputs(Shape(2, 16)), b.example_inputs(Shape(2, 16))
    assert torch.equal(inputs_a[0], inputs_b[0])
    assert inputs_a[0].dtype == torch.int64 and 0 <= int(inputs_a[0].min()) and int(inputs_a[0].max()) < 1024
    with torch.no_grad():
        la, lb = a.model()(*inputs_a), b.model()(*inputs_b)
    assert a.model() is not b.model()
    assert la.shape == (2, 16, 1024) and la.dtype == torch.float32
    assert torch.equal(la, lb)
    assert torch.equal(torch.rand(3), before)  # building did not touch the caller's RNG
    other = a.example_inputs(Shape(2, 17))[0]
    assert not torch.equal(other[:, :16], inputs_a[0])  # seeded by (batch, seq)


def test_llama_defaults_and_config_override(tmp_path):
    default = get_recipe("llama")
    cfg = default.hf_config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (256, 512, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (4, 2, 1024)
    assert cfg.max_position_embeddings == 512
    assert len(default.model().lm.model.layers) == 2

    deeper = get_recipe("llama", '{"num_hidden_layers": 3}')
    assert deeper.hf_config.num_hidden_layers == 3
    assert len(deeper.model().lm.model.layers) == 3
    assert deeper.describe()["config"]["num_hidden_layers"] == 3

    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"num_hidden_layers": 1, "vocab_size": 64}))
    from_file = get_recipe("llama", str(path))
    assert len(from_file.model().lm.model.layers) == 1
    with torch.no_grad():
        logits = from_file.model()(*from_file.example_inputs(Shape(1, 4)))
    assert logits.shape == (1, 4, 64)


@pytest.mark.parametrize(
    "config, match",
    [
        ('{"num_hidden_layers": 4', "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ("/no/such/dir/cfg.json", "neither a JSON object nor an existing file"),
    ],
)
def test_llama_bad_config(config, match):
    with pytest.raises(RecipeError, match=match):
        get_recipe("llama", config)


def test_lm_seq_longer_than_positions():
    recipe = get_recipe("gpt2", '{"max_position_embeddings": 8}')
    assert recipe.hf_config.n_positions == 8  # alias mapped to GPT-2's own name
    with pytest.raises(RecipeError, match="max_position_embeddings"):
        recipe.example_inputs(Shape(1, 9))


def test_lm_dtype_cast():
    recipe = get_recipe("llama", '{"num_hidden_layers": 1}', dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in recipe.model().parameters())
    with torch.no_grad():
        out = recipe.model()(*recipe.example_inputs(Shape(1, 4)))
    assert out.dtype == torch.bfloat16
    assert recipe.describe()["dtype"] == "bfloat16"


# ----------------------------------------------------------------------------------- module:function specs
def test_function_spec_tuple(repo_on_path):
    recipe = get_recipe("tests.fixtures_models:tiny_mlp")
    assert isinstance(recipe, Recipe) and recipe.name == "tests.fixtures_models:tiny_mlp"
    model = recipe.model()
    assert not model.training and all(not p.requires_grad for p in model.parameters())
    (x,) = recipe.example_inputs(Shape(2, 3))
    assert x.shape == (2, 3, 8)
    with torch.no_grad():
        out = recipe.postprocess(model(x), (x,))
    assert out.shape == (2, 3, 8)
    json.dumps(recipe.describe())

    wide = get_recipe("tests.fixtures_models:tiny_mlp", '{"hidden": 5}')
    assert wide.example_inputs(Shape(1, 2))[0].shape == (1, 2, 5)


def test_function_spec_object(repo_on_path):
    recipe = get_recipe("tests.fixtures_models:tiny_object", {"hidden": 3}, dtype="float16")
    (x,) = recipe.example_inputs(Shape(2, 2))  # a single tensor is wrapped into a tuple
    assert x.shape == (2, 2, 3) and x.dtype == torch.float16
    assert recipe.model().weight.dtype == torch.float16


@pytest.mark.parametrize(
    "spec, config, match",
    [
        ("tests.no_such_module:fn", None, "cannot import"),
        ("tests.fixtures_models:no_such_fn", None, "no attribute"),
        ("tests.fixtures_models:NOT_CALLABLE", None, "not a function"),
        ("tests.fixtures_models:bad_return", None, "expected"),
        ("tests.fixtures_models:tiny_mlp", '{"nope": 1}', "failed"),
    ],
)
def test_function_spec_errors(repo_on_path, spec, config, match):
    with pytest.raises(RecipeError, match=match) as info:
        get_recipe(spec, config)
    assert spec in str(info.value)


# ------------------------------------------------------------------------------------------- graph capture
@pytest.mark.parametrize("name", BUILTIN_RECIPES)
def test_builtin_recipe_captures_one_graph(name, request):
    recipe = request.getfixturevalue("minilm") if name == "minilm" else get_recipe(name)
    model = recipe.model()
    inputs = recipe.example_inputs(Shape(2, 16))
    with torch.no_grad():
        eager = model(*inputs)
        graphs, out = _capture(model, inputs)
    assert len(graphs) == 1, f"{name}: {len(graphs)} graphs"
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(recipe.postprocess(out, inputs), recipe.postprocess(eager, inputs))


def test_llama_captures_one_graph_with_grad_enabled():
    recipe = get_recipe("llama")
    inputs = recipe.example_inputs(Shape(1, 8))
    graphs, out = _capture(recipe.model(), inputs)
    assert len(graphs) == 1
    assert out.shape == (1, 8, 1024)
