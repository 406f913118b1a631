"""Upkeep of caches and fleets: what an operator runs, each behind a ``precompile`` command.

Owns ``warmup`` (:mod:`.warmup`), ``verify`` (:mod:`.verify`), ``gc`` (:mod:`.evict`), ``rebuild``
(:mod:`.rebuild`) and ``export`` / ``import`` (:mod:`.bundle`, its JSON reads in :mod:`.bundle_json`).

May import: :mod:`precompile.function`, :mod:`precompile.builder`, :mod:`precompile.recipes` and everything below
them (docs/architecture.md); never :mod:`precompile.cli`, which presents what these return.
"""
