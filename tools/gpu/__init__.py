"""The GPU machine's scripts: ``session.sh`` (its verification run: the GPU tests and benchmarks, logs under
``$OUT``), ``vllm_gpu.py`` (carries vLLM 0.25 there in parts; docs/gpu.md) and ``vllm_adaptor.py`` (the vLLM
adaptor's compile and load round trip on vLLM-shaped pieces, without vLLM).
"""
