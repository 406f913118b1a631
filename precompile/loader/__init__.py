"""Loading: the callable behind a stored artifact (DESIGN.md, "Loading").

Owns :class:`~.artifact.Artifact` (a manifest, its blobs and the call), the engine choice (:mod:`.engine`: the
fast path where the manifest offers one, else the portable path) and the checks of what a call is given
(:mod:`.inputs`).  It finds nothing in a cache: :mod:`precompile.store` does, then hands it here.  (Named
``loader``, not ``load``: ``precompile.load`` is the public function, and a subpackage of that name would
replace it as an attribute of ``precompile`` once imported.)

May import: :mod:`precompile.key`, :mod:`precompile.inductor`, :mod:`precompile.manifest`,
:mod:`precompile.metrics`, the backends (not their opener), :mod:`precompile.config` and :mod:`precompile.errors`
(docs/architecture.md).
"""
