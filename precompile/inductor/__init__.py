"""Everything precompile needs from Inductor, and the only package that touches Inductor internals.

Upgrading torch means changing this package only, and private APIs are reached through :mod:`.shim` alone
(README.md here says how an upgrade goes).  Modules, one concern each:

- :mod:`.shim`: one function per private Inductor / AOTAutograd / ShapeEnv / launcher API, for torch 2.11-2.13.
- :mod:`.options`: Inductor options as key factors (normalized patches, the effective config).
- :mod:`.compile`: ``standalone_compile`` in a private cache dir; :mod:`.harvest` reads what it produced
  (wrappers, kernel sources and binaries, autotune picks, alignment assumptions, mutated inputs).
- :mod:`.cuda_pack`: Triton kernels packaged for the fast path (picked cubin + launch record in a ``.so``).
- :mod:`.fast_plan`: whether an artifact offers the fast path, validated bit for bit at build.
- :mod:`.runtime` (CPU and the wrapper) and :mod:`.cuda_runtime` (Triton): the fast load path.
- :mod:`.portable`: the fallback load path through Inductor's own cache entries.
- :mod:`.runs`, :mod:`.memfd`: running a fresh compile on copies; loading binaries from memory.

Submodules are imported on use: a fast load imports only :mod:`.runtime`, :mod:`.cuda_runtime`, :mod:`.memfd`
and the load-side functions of :mod:`.shim`, never ``torch._inductor``.

May import: :mod:`precompile.artifact` (names, the wrapper graph), :mod:`precompile.metrics`,
:mod:`precompile.config` and :mod:`precompile.errors`; nothing that decides keys, stores or loads
(docs/architecture.md).
"""
