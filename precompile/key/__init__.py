"""Keys: what a compile will be, computed before anything is compiled (DESIGN.md, "Keys").

Owns the normalized FX graph and its placeholder specs (:mod:`.graph`), the plan and the artifact key
(:mod:`.plan`), symbolic sizes and the size guards an artifact checks on every call (:mod:`.symbolic`,
:mod:`.guards`), the ambient state and environment fingerprint that enter a key (:mod:`.ambient`,
:mod:`.fingerprint`), and the exact rewrites and attention choices made before it (:mod:`.passes`, :mod:`.sdpa`).

May import: :mod:`precompile.inductor`, :mod:`precompile.manifest`, :mod:`precompile.metrics`, the backends'
:mod:`cache_backends.base`, :mod:`precompile.config` and :mod:`precompile.errors` (docs/architecture.md).
"""
