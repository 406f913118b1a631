"""Dynamo's output for a whole function: the package torch makes of its guarded bytecode, stored and installed.

Modules: :mod:`.pkg` (make, dump, restore and install Dynamo's package; the frames traced counter),
:mod:`.record` (the package class and Dynamo's recording, patched for library code), :mod:`.check` (an
installable package is checked before it is stored), and what the guard state holds: :mod:`.frame_state` (the
guard-state pickler), :mod:`.named_guards` (identity guards named by import path) and :mod:`.object_digest` (what
an object so named must still be).  These modules subclass and patch Dynamo's own classes, so they import
``torch._dynamo`` directly rather than through :mod:`precompile.inductor.shim` (README.md of the package lists
what they use).

May import: the modules at the root of :mod:`precompile.inductor` (its shim) and what that package may import;
not its :mod:`~precompile.inductor.build` or :mod:`~precompile.inductor.load` sides (tests/test_layout.py).
"""
