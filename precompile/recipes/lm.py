"""The random-weight ``transformers`` LM recipes: ``llama``, ``qwen2``, ``gpt2``, ``bert``."""

from __future__ import annotations

import logging
from typing import Any

import torch

from precompile.errors import RecipeError
from precompile.recipes.base import Recipe, Shape, _as_shape, _dtype_name, _import_transformers, _jsonable

log = logging.getLogger("precompile.models")


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
