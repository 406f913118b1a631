"""Whole-function artifacts: Dynamo's output for a Python function, cached with its graphs' artifacts.

A graph artifact (:mod:`precompile.builder.standalone`) is what Inductor makes of one FX graph; a start that loads
only those still runs Dynamo over the model to find the graphs.  A whole-function artifact adds Dynamo's record of
the function — its guards, transformed bytecode and resume functions, the graphs it calls by name and the sources
it traced through, each with a hash — so that a warm start traces nothing (:func:`precompile.compile`).

Modules: :mod:`~precompile.function.key` (the key, computed before tracing), :mod:`~precompile.function.sources`
(the source check), :mod:`~precompile.function.store` (verified reads, signed writes) and
:mod:`~precompile.function.compiled` (``precompile.compile``).  The manifest and its checks are
:mod:`precompile.manifest.function_manifest`; Dynamo's own package machinery is reached through
:mod:`precompile.inductor.dynamo.pkg` only.

May import: :mod:`precompile.builder` (each graph is compiled through it) and everything below it
(docs/architecture.md).
"""
