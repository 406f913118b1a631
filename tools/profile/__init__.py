"""Profilers and probes, run by path from the repository root: where one steady call goes (``call.py``), a first
call after a fresh-process load (``first_call.py``), the time to first output and what overlaps in it
(``ttfo_probe.py``), and what a library's first call costs on the GPU (``library_first_use.py``).
"""
