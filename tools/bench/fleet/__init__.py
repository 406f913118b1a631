"""The fleet storm, run as ``python -m tools.bench.fleet`` (:mod:`.__main__`, its method and commands): Redis
targets started on loopback ports (:mod:`.targets`), the worker process (:mod:`.worker`), one storm of N workers
released at once (:mod:`.storm`), faults injected during a storm (:mod:`.faults`) and the tables and JSON summary
(:mod:`.report`); for ``--fetch-only``, the fetch-only clients (:mod:`.client`), the artifacts they read
(:mod:`.artifacts`) and their storms (:mod:`.fetchonly`).

Nothing here is imported by precompile; the worker module imports only torch, ``make_fx`` and precompile, so that a
worker's start costs what a serving process's would, and the client module no torch at all.
"""
