"""The models and cases the benchmarks build, in one place; the tests import them from here as fixtures.

- :mod:`.base`: what a library case is (``Case``, ``Setup``), shared by :mod:`.libs` and :mod:`.vision`;
- :mod:`.libs`: the transformers and diffusers families, and the table of every library case (``CASES``);
- :mod:`.vision`: torchvision's and timm's classifiers (their own venv: tools/install/vision.sh);
- :mod:`.run_libs`: one process of library cases, the child of tools/bench/libs.py and of tests/function/;
- :mod:`.graphs`: the graphs servers compile, of tools/bench/coverage.py and tools/bench/call.py;
- :mod:`.recipes`: ``module:function`` recipes for ``precompile warmup --model`` and tools/bench/load.py, and
  the decode step that writes into its caller's buffers;
- :mod:`.vllm_tiny`: the tiny Llama under real vLLM, and one vLLM start in a fresh process.

Tests that use them: tests/_graphs.py (:mod:`.recipes`), tests/function/_libs.py and test_vision.py
(:mod:`.run_libs`, :mod:`.vision`), tests/inductor/test_gpu_paths.py and test_gpu_no_host_code.py (:mod:`.graphs`),
tests/integrations/test_vllm.py (:mod:`.vllm_tiny`).
"""
