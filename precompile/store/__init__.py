"""The store: artifacts, whole-function artifacts' graphs and records in a cache (DESIGN.md, "Cache layout").

Owns verified reads and blobs-then-ref writes (:mod:`.cache_io`), finding a key, a unique prefix or a file
(:mod:`.lookup`), the public ``precompile.load`` (:mod:`.loading`), one build per key across a fleet
(:mod:`.coordination`), records (:mod:`.record`) and why two keys differ (:mod:`.diff`).

May import: :mod:`precompile.loader`, :mod:`precompile.key`, :mod:`precompile.inductor`,
:mod:`precompile.artifact`, :mod:`cache_backends` (its opener too), :mod:`precompile.metrics`,
:mod:`precompile.config` and :mod:`precompile.errors` (docs/architecture.md).
"""
