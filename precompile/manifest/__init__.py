"""The artifact as data: what a cache or a file holds, and the checks every byte read from one goes through.

Owns the three manifest kinds (:mod:`.manifest` for graph artifacts, :mod:`.function_manifest`,
:mod:`.record_manifest`), the names that become paths or imports (:mod:`.names`), the file formats
(:mod:`.formats`) and files written at a user's path (:mod:`.output`), FX graphs as JSON (:mod:`.graph_json`) and
what a stored graph may call (:mod:`.graph_allow`; the ATen operators of :mod:`.op_list`, whose guard
:mod:`.op_guard` checks what a graph reaches when it runs),
the wrapper stored as a graph and made callable or readable (the package :mod:`.wrapper`) and signatures
(:mod:`.trust`, :mod:`.trust_keys`).
Nothing here runs, unpickles or imports what it reads.

May import: the backends' :mod:`cache_backends.base`, :mod:`precompile.config` and :mod:`precompile.errors`
(docs/architecture.md).
"""
