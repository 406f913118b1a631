"""The build side of :mod:`precompile.inductor`: what runs while an artifact is made, never while one is loaded.

Modules: :mod:`.compile` (``standalone_compile`` in a private cache dir), :mod:`.harvest` (wrappers, kernel sources
and binaries, alignment and mutation facts), :mod:`.products` (what a build returns), :mod:`.picks` (GEMM and
convolution autotune picks), :mod:`.cuda_pack` (Triton kernels packed as ``.launch`` blobs), :mod:`.fast_plan` (the
fast path, validated bit for bit), :mod:`.fx_wrapper` (Inductor's FX wrapper graph) and :mod:`.runs` (running a
fresh compile on copies of what it writes).

May import: :mod:`precompile.inductor.load` (a build validates what a load will run), the modules at the root of
:mod:`precompile.inductor` (:mod:`~precompile.inductor.shim`...), and what that package may import; never
:mod:`precompile.inductor.dynamo` (tests/test_layout.py).
"""
