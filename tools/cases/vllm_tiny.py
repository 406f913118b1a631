"""The tiny Llama that proves precompile under real vLLM, and one vLLM start in a fresh process.

``python tools/cases/vllm_tiny.py make DIR [--size cpu|gpu]`` writes the model, random bf16 weights seeded with 0, built
from a ``transformers`` config and ``save_pretrained`` (nothing comes from a hub):

- ``cpu`` (default): Llama, hidden 256, 2 layers, 4 heads of 64, vocab 1024;
- ``gpu``: Llama, hidden 1024, 8 layers, 16 heads of 64 (8 key/value heads), MLP 2816, vocab 32000.

``python tools/cases/vllm_tiny.py run DIR [JSON]`` starts vLLM on it (``LLM(model=DIR, skip_tokenizer_init=True,
max_model_len=256, **JSON)``, on a CPU also ``max_num_seqs=2``: on a GPU vLLM keeps its defaults, so its CUDA
graphs are captured for its default sizes), generates greedily from ``prompt_token_ids`` and prints, last on
stdout, one JSON line::

    {"ready_s": seconds from process start to LLM(...) returned, "ttft_s": ... to the first generated token,
     "init_s": seconds in LLM(...),
     "tokens": [[8 token ids] per prompt], ...}

The time to first token is measured on a one-token request made right after the engine is up (what a server's
first request waits for, the engine start included); the tokens come from a second, 8-token request.

With ``VLLM_TINY_PHASES=1`` (``tools/bench/vllm.py --device cuda`` sets it) the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the start's phases are read where they happen and added to the JSON:
``compile_s`` (vLLM's own ``compilation_time``: Dynamo or its AOT load, and the backend's compile or load of every
piece, timed by vLLM's ``monitor_torch_compile``, CUDA graph capture not included), ``capture_s`` (vLLM's
``GPUModelRunner.capture_model``, timed here) and ``frames`` (frames Dynamo traced in the process: calls of its
``convert_frame.compile_frame``, through which ``aot_compile`` goes too).
``tools/bench/vllm.py`` and ``tests/integrations/test_vllm.py`` run it with the environment of each scenario.
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


#: The two sizes of the module docstring: ``transformers.LlamaConfig`` arguments.
SIZES = {
    "cpu": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 256},
    "gpu": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 2048},
}


def shape(size: str = "cpu", layers: int | None = None, hidden: int | None = None) -> dict:
    """The ``transformers.LlamaConfig`` arguments of ``size`` (:data:`SIZES`) at another depth or width: ``layers``
    decoder layers; ``hidden`` (a multiple of 64) with heads of 64, a quarter as many key/value heads (at least 1)
    and an MLP of 11/4 of it rounded to 256.

    Raises:
        ValueError: ``layers`` < 1, or ``hidden`` not a positive multiple of 64.
    """
    cfg = dict(SIZES[size])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        cfg["num_hidden_layers"] = layers
    if hidden is not None:
        if hidden < 64 or hidden % 64:
            raise ValueError(f"hidden must be a positive multiple of 64, got {hidden}")
        heads = hidden // 64
        cfg.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                   intermediate_size=-(-hidden * 11 // 4 // 256) * 256)
    return cfg


def make_tiny_llama(path: str, size: str = "cpu", layers: int | None = None, hidden: int | None = None) -> str:
    """Write the tiny Llama of ``size`` (see module docstring), at ``layers``/``hidden`` where given (:func:`shape`),
    to ``path`` unless a model is there; returns ``path``.

    Raises:
        ValueError: a model of another shape is at ``path`` already, or as :func:`shape`.
    """
    want = shape(size, layers, hidden)
    config_file = os.path.join(path, "config.json")
    if os.path.exists(config_file):
        with open(config_file) as f:
            have = json.load(f)
        wrong = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
        if wrong:
            raise ValueError(f"{path} holds a model of another shape (have, want): {wrong}; use another --workdir")
        return path
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**want, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def run(model: str, extra: dict) -> dict:
    """Start vLLM on ``model`` with ``extra`` ``LLM`` arguments; return the JSON of the module docstring."""
    phases = os.environ.get("VLLM_TINY_PHASES") == "1"
    if phases:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams

    gpu = torch.cuda.is_available()
    timed = _time_capture() if phases and gpu else None
    traced = _count_dynamo_frames() if phases else None
    kwargs = {"gpu_memory_utilization": 0.3} if gpu else {"max_num_seqs": 2, "gpu_memory_utilization": 0.2}
    t0 = time.perf_counter()
    llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, **kwargs, **extra)
    init = time.perf_counter() - t0
    ready = time.perf_counter() - START
    measured = {}
    if phases:
        cc = llm.llm_engine.vllm_config.compilation_config
        measured = {"compile_s": round(float(cc.compilation_time), 3), "frames": traced[0],
                    "capture_s": round(timed[0], 3) if timed else None,
                    "capture_sizes": len(cc.cudagraph_capture_sizes or []) if gpu else 0}
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": PROMPTS[0]}], first, use_tqdm=False)
    ttft = time.perf_counter() - START
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    out = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return {"ready_s": round(ready, 3), "ttft_s": round(ttft, 3), "init_s": round(init, 3), "tokens": [list(o.outputs[0].token_ids) for o in out],
            **measured}


def _count_dynamo_frames() -> list[int]:
    """Count the frames Dynamo traces in this process from now on (calls of ``convert_frame.compile_frame``, which
    both ``torch.compile``'s frame callback and ``aot_compile``'s full-graph capture go through, torch 2.11-2.13):
    the returned list holds the count."""
    from torch._dynamo import convert_frame

    count = [0]
    original = convert_frame.compile_frame

    def compile_frame(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    convert_frame.compile_frame = compile_frame
    return count


def _time_capture() -> list[float]:
    """Time vLLM's CUDA graph capture (``capture_model`` of its model runner: V1's
    ``vllm.v1.worker.gpu_model_runner`` or V2's ``vllm.v1.worker.gpu.model_runner``, which vLLM picks for a dense
    model on a GPU with Triton) in this process: the returned list holds the seconds once it has run."""
    import importlib

    seconds = [0.0]
    for name in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"):
        try:
            runner = importlib.import_module(name).GPUModelRunner
        except (ImportError, AttributeError):
            continue
        original = runner.capture_model

        def capture_model(self, *args, _original=original, **kwargs):
            t0 = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                seconds[0] += time.perf_counter() - t0

        runner.capture_model = capture_model
    return seconds


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "make":
        size = argv[3] if len(argv) >= 4 and argv[2] == "--size" else "cpu"
        print(make_tiny_llama(argv[1], size))
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
