"""The store: artifacts, whole-function artifacts' graphs and records in a cache (DESIGN.md, "Cache layout").

Owns opening a cache with its trust policy (:mod:`.opening`, the public ``precompile.open_cache``), the one entry
store every kind of entry is read and written through (:mod:`.entries`, with the refusals it remembers:
:mod:`.refusals`), graph artifacts (:mod:`.cache_io`) and records (:mod:`.record`) in it, finding a key, a unique
prefix or a file (:mod:`.lookup`), the public ``precompile.load`` (:mod:`.loading`), one build per key across a fleet
(:mod:`.coordination`) and why two keys differ (:mod:`.diff`).

May import: :mod:`precompile.loader`, :mod:`precompile.key`, :mod:`precompile.inductor`,
:mod:`precompile.manifest`, :mod:`cache_backends`, :mod:`precompile.metrics`,
:mod:`precompile.config` and :mod:`precompile.errors` (docs/architecture.md).
"""
