"""The tiny Llama that proves precompile under real vLLM, and one vLLM start in a fresh process.

``python tools/vllm_tiny.py make DIR`` writes the model: Llama, hidden 256, 2 layers, 4 heads of 64, vocab 1024,
random bf16 weights seeded with 0, built from a ``transformers`` config and ``save_pretrained`` (nothing comes
from a hub).  ``python tools/vllm_tiny.py run DIR [JSON]`` starts vLLM on it (``LLM(model=DIR,
skip_tokenizer_init=True, max_model_len=256, max_num_seqs=2, **JSON)``), generates greedily from
``prompt_token_ids`` and prints, last on stdout, one JSON line::

    {"ttft_s": seconds from process start to the first generated token, "init_s": seconds in LLM(...),
     "tokens": [[8 token ids] per prompt]}

The time to first token is measured on a one-token request made right after the engine is up (what a server's
first request waits for, the engine start included); the tokens come from a second, 8-token request.
``tools/bench_vllm.py`` and ``tests/integrations/test_vllm.py`` run it with the environment of each scenario.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

PROMPTS = [[1, 5, 9, 200, 300, 7], [3, 4]]
MAX_TOKENS = 8

#: vLLM settings that let the engine start on a 2-core box with a few GiB free: a 1 GiB KV cache.
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


def make_tiny_llama(path: str) -> str:
    """Write the tiny Llama (see module docstring) to ``path`` unless it is there; returns ``path``."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, head_dim=64, vocab_size=1024,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def run(model: str, extra: dict) -> dict:
    """Start vLLM on ``model`` with ``extra`` ``LLM`` arguments; return the JSON of the module docstring."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=2,
              gpu_memory_utilization=0.2, **extra)
    init = time.perf_counter() - t0
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": PROMPTS[0]}], first, use_tqdm=False)
    ttft = time.perf_counter() - START
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    out = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return {"ttft_s": round(ttft, 3), "init_s": round(init, 3), "tokens": [list(o.outputs[0].token_ids) for o in out]}


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "make":
        print(make_tiny_llama(argv[1]))
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        for k, v in ENV.items():
            os.environ.setdefault(k, v)
        result = run(argv[1], json.loads(argv[2]) if len(argv) > 2 else {})
        print(json.dumps(result), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":  # vLLM's engine processes are spawned: everything runs under this guard
    sys.exit(main(sys.argv[1:]))
