"""The load side of :mod:`precompile.inductor`: what a worker runs to turn a stored artifact into a callable.

Modules: :mod:`.runtime` (the fast path: the wrapper with stand-ins, C++ kernels from memory), :mod:`.cuda_runtime`
(Triton kernels launched from their cubins), :mod:`.graph_engine` (the no-host-code engine), :mod:`.portable` (the
fallback through Inductor's own cache entries), :mod:`.memfd` (binaries loaded from memory), :mod:`.externs`
(stand-ins for Inductor's extern kernels), :mod:`.prime` (library calls replayed beside a load) and
:mod:`.tensor_guards` (the C++ check of a call's tensors).  A fast load imports nothing else of this package and no
Inductor, Dynamo, Triton or sympy module (tests/loader/test_fast_load.py).

May import: :mod:`precompile.inductor.shim` and the other modules at the root of :mod:`precompile.inductor`, and
what that package may import; never :mod:`precompile.inductor.build` nor :mod:`precompile.inductor.dynamo`
(tests/test_layout.py).
"""
