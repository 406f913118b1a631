"""Models from the libraries people compile, as cases for ``precompile.compile`` (issue 28): one module shared by
``tests/function/test_libs.py``, ``tests/function/test_vision.py`` and ``tools/bench/libs.py``.

Each case builds a model of its family from a small config with random weights under a fixed seed (nothing is
downloaded), compiles it the way a user of that library does, runs that user's calls and returns the outputs to
compare.  A case is written for its family, not for one config: :func:`setup` takes config overrides (keyword
arguments of the family's config class) over a small default, so held-back configs run through the same code.

- ``<arch>_forward`` (llama, qwen2, gpt2, mistral): ``precompile.compile(model, dynamic=True)``, logits at three
  sequence lengths;
- ``<arch>_generate_static`` / ``<arch>_generate_dynamic``: ``model.forward = precompile.compile(model.forward)``,
  greedy ``generate`` with ``cache_implementation="static"`` / the default dynamic cache; the token ids are
  compared with eager's too (:attr:`Setup.eager_equal`);
- ``bert`` / ``roberta`` / ``distilbert``: an encoder called with a padded batch and its attention mask, at two
  sequence lengths; ``t5_generate`` / ``bart_generate``: an encoder-decoder's greedy ``generate``;
- ``unet`` (``UNet2DConditionModel``), ``dit`` (``DiTTransformer2DModel``), ``sd3`` (``SD3Transformer2DModel``):
  the denoiser called at two timesteps, batch 2 (classifier-free guidance's doubled batch); ``unet_ddim`` and
  ``sd3_euler``: a pipeline's loop, 4 scheduler steps (``DDIMScheduler``, ``FlowMatchEulerDiscreteScheduler``)
  calling the compiled denoiser;
- vision (:mod:`tools.cases.vision`): torchvision's ``resnet18`` and a tiny ``VisionTransformer``, timm's ViT and
  ResNet.

Sizes are in tokens and pixels; every output is float32 on the case's device (token ids: int64).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from tools.cases.base import Case, Setup
from tools.cases.vision import MAKERS

# ------------------------------------------------------------------------------------------ transformers
#: Small configs per architecture (hidden 32, 2 layers, vocabulary 128), as ``AutoConfig.for_model`` keywords.
LM_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=128),
    "qwen2": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=128),
    "mistral": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=128, max_position_embeddings=128, sliding_window=None),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=128, bos_token_id=1, eos_token_id=2),
    "bert": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                 max_position_embeddings=128),
    "roberta": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                    max_position_embeddings=130),
    "distilbert": dict(dim=32, hidden_dim=64, n_layers=2, n_heads=4, vocab_size=128, max_position_embeddings=128),
    "t5": dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=128,
               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
    "bart": dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=128, max_position_embeddings=128,
                 pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None),
}
LM_SIZES = (5, 11, 8)  # sequence lengths of the forward cases' calls, in tokens
NEW_TOKENS = 6  # tokens each generate call adds


def _hf_model(arch: str, auto: str, device: str, config: dict[str, Any]) -> torch.nn.Module:
    import transformers

    cfg = transformers.AutoConfig.for_model(arch, **{**LM_CONFIGS[arch], **config})
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(cfg, attn_implementation="sdpa")
    return model.to(device).eval()


def _ids(vocab: int, batch: int, length: int, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=g).to(device)  # ids 0-2 are special tokens


def _lm_forward(arch: str, device: str, **config: Any) -> Setup:
    model = _hf_model(arch, "AutoModelForCausalLM", device, config)
    inputs = [_ids(model.config.vocab_size, 1, n, device, seed=n) for n in LM_SIZES]

    def run(fn):
        return {f"logits_{x.shape[1]}": fn(input_ids=x).logits.cpu() for x in inputs}

    return Setup(model, True, run, lambda fn, i: fn(input_ids=inputs[i % len(inputs)]).logits)


def _generate(model: torch.nn.Module, fn: Callable[..., Any], prompts: list[torch.Tensor], **kw: Any) -> dict:
    model.forward = fn  # as users compile a model for generate: its forward, in place
    # disable_compile: on a GPU, generate would otherwise wrap the forward in torch.compile itself (static cache)
    return {f"tokens_{p.shape[1]}": model.generate(p, attention_mask=torch.ones_like(p), do_sample=False,
                                                   max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                                   disable_compile=True, **kw).cpu() for p in prompts}


def _lm_generate(arch: str, device: str, cache: str | None, **config: Any) -> Setup:
    model = _hf_model(arch, "AutoModelForCausalLM", device, config)
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    prompts = [_ids(model.config.vocab_size, 1, n, device, seed=n) for n in (4, 7)]
    kw = {"cache_implementation": cache} if cache else {}

    def call(fn, i):
        return _generate(model, fn, [prompts[i % 2]], **kw)

    return Setup(model.forward, None, lambda fn: _generate(model, fn, prompts, **kw), call, eager_equal=True)


def _padded(vocab: int, length: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of 2 of ``length`` tokens, the second padded after ``length - 3`` (mask 0 there)."""
    ids = _ids(vocab, 2, length, device, seed=length)
    mask = torch.ones_like(ids)
    mask[1, length - 3:] = 0
    return ids, mask


def _encoder(arch: str, device: str, **config: Any) -> Setup:
    model = _hf_model(arch, "AutoModel", device, config)
    batches = [_padded(model.config.vocab_size, n, device) for n in (9, 16)]

    def run(fn):
        return {f"hidden_{ids.shape[1]}": fn(input_ids=ids, attention_mask=mask).last_hidden_state.cpu()
                for ids, mask in batches}

    def call(fn, i):
        ids, mask = batches[i % 2]
        return fn(input_ids=ids, attention_mask=mask).last_hidden_state

    return Setup(model, None, run, call)


def _seq2seq(arch: str, device: str, **config: Any) -> Setup:
    model = _hf_model(arch, "AutoModelForSeq2SeqLM", device, config)
    prompts = [_ids(model.config.vocab_size, 1, n, device, seed=n) for n in (6, 10)]
    return Setup(model.forward, None, lambda fn: _generate(model, fn, prompts),
                 lambda fn, i: _generate(model, fn, [prompts[i % 2]]), eager_equal=True)


# ---------------------------------------------------------------------------------------------- diffusers
DENOISER_CONFIGS: dict[str, dict[str, Any]] = {
    "unet": dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=4,
                 norm_num_groups=8),
    "dit": dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=1, sample_size=8,
                patch_size=2, num_embeds_ada_norm=10, norm_num_groups=8),
    "sd3": dict(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4,
                pos_embed_max_size=8),
}
DENOISER_CLASSES = {"unet": "UNet2DConditionModel", "dit": "DiTTransformer2DModel", "sd3": "SD3Transformer2DModel"}
TEXT_TOKENS = 7  # length of the stand-in text encoder's output, in tokens


def _denoiser(kind: str, device: str, config: dict[str, Any]) -> tuple[torch.nn.Module, Callable[..., Any]]:
    """The model and ``step(fn, latents, t) -> noise prediction`` as its pipeline calls it (batch of ``latents``)."""
    import diffusers

    torch.manual_seed(0)
    model = getattr(diffusers, DENOISER_CLASSES[kind])(**{**DENOISER_CONFIGS[kind], **config}).to(device).eval()
    c = model.config
    g = torch.Generator().manual_seed(1)
    if kind == "unet":
        text = torch.randn(2, TEXT_TOKENS, c.cross_attention_dim, generator=g).to(device)
        return model, lambda fn, x, t: fn(x, t, encoder_hidden_states=text[:x.shape[0]]).sample
    if kind == "dit":
        labels = torch.tensor([1, c.num_embeds_ada_norm], device=device)  # the last label: the unconditional one
        return model, lambda fn, x, t: fn(x, timestep=t.expand(x.shape[0]), class_labels=labels[:x.shape[0]]).sample
    text = torch.randn(2, TEXT_TOKENS, c.joint_attention_dim, generator=g).to(device)
    pooled = torch.randn(2, c.pooled_projection_dim, generator=g).to(device)
    return model, lambda fn, x, t: fn(x, encoder_hidden_states=text[:x.shape[0]],
                                     pooled_projections=pooled[:x.shape[0]], timestep=t.expand(x.shape[0])).sample


def _latents(model: torch.nn.Module, batch: int, device: str) -> torch.Tensor:
    c = model.config
    size = c.sample_size if isinstance(c.sample_size, int) else c.sample_size[0]
    g = torch.Generator().manual_seed(2)
    return torch.randn(batch, c.in_channels, size, size, generator=g).to(device)


def _denoise(kind: str, device: str, **config: Any) -> Setup:
    model, step = _denoiser(kind, device, config)
    latents = _latents(model, 2, device)
    times = [torch.tensor(t, device=device) for t in (999, 400)]

    def run(fn):
        return {f"noise_{int(t)}": step(fn, latents, t).cpu() for t in times}

    return Setup(model, None, run, lambda fn, i: step(fn, latents[: 1 + i % 2], times[i % 2]))


def _loop(kind: str, scheduler: str, device: str, **config: Any) -> Setup:
    """A pipeline's denoising loop: classifier-free guidance (batch 2, scale 5), 4 scheduler steps."""
    import diffusers

    model, step = _denoiser(kind, device, config)
    sched = getattr(diffusers, scheduler)(num_train_timesteps=1000)

    def denoise(fn):
        s = copy.deepcopy(sched)
        s.set_timesteps(4, device=device)
        x = _latents(model, 1, device) * getattr(s, "init_noise_sigma", 1.0)  # flow matching: none
        for t in s.timesteps:
            xx = torch.cat([x, x])
            uncond, cond = step(fn, s.scale_model_input(xx, t) if hasattr(s, "scale_model_input") else xx, t).chunk(2)
            x = s.step(uncond + 5.0 * (cond - uncond), t, x).prev_sample
        return x

    return Setup(model, None, lambda fn: {"latents": denoise(fn).cpu()}, lambda fn, i: denoise(fn))


# -------------------------------------------------------------------------------------------------- table
def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for arch in ("llama", "qwen2", "gpt2", "mistral"):
        cases[f"{arch}_forward"] = Case(f"{arch}_forward", "decoder", "transformers", partial(_lm_forward, arch))
        for cache in ("static", "dynamic"):
            cases[f"{arch}_generate_{cache}"] = Case(
                f"{arch}_generate_{cache}", "generate", "transformers",
                partial(_lm_generate, arch, cache=cache if cache == "static" else None))
    for arch in ("bert", "roberta", "distilbert"):
        cases[arch] = Case(arch, "encoder", "transformers", partial(_encoder, arch))
    for arch in ("t5", "bart"):
        cases[f"{arch}_generate"] = Case(f"{arch}_generate", "seq2seq", "transformers", partial(_seq2seq, arch))
    for kind in ("unet", "dit", "sd3"):
        cases[kind] = Case(kind, "diffusers", "diffusers", partial(_denoise, kind))
    cases["unet_ddim"] = Case("unet_ddim", "diffusers", "diffusers", partial(_loop, "unet", "DDIMScheduler"))
    cases["sd3_euler"] = Case("sd3_euler", "diffusers", "diffusers",
                              partial(_loop, "sd3", "FlowMatchEulerDiscreteScheduler"))
    cases.update({name: Case(name, "vision", needs, make) for name, (needs, make) in MAKERS.items()})
    return cases


CASES: dict[str, Case] = _cases()


def setup(name: str, device: str = "cpu", config: dict[str, Any] | None = None) -> Setup:
    """Build case ``name`` on ``device`` with ``config`` (the family's config keywords) over its small default.

    Raises:
        KeyError: no such case.
        ImportError: the library the case needs is not installed here.
    """
    return CASES[name].make(device, **(config or {}))
