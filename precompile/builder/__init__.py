"""Builds: an FX graph and example inputs compiled into a stored artifact (DESIGN.md, "Builds").

Owns ``precompile.standalone_compile`` (:mod:`.standalone`) and the Dynamo backend that compiles each captured
graph through it (:mod:`.capture`, ``precompile.backend``).

May import: :mod:`precompile.store` and everything below it (docs/architecture.md).
"""
