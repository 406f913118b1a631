"""The benchmarks: one script a measurement, run by path from the repository root (``python tools/bench/load.py
--help``); each docstring gives the method and the commands, docs/benchmarks.md the results.

``fleet/`` is the storm benchmark's package, run as ``python -m tools.bench.fleet``; ``load_phases.py`` and
``vllm_report.py`` are parts of ``load.py`` and ``vllm.py``.  The models they build are in :mod:`tools.cases`.
"""
