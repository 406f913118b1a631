"""Dynamo's output for a whole function: the package torch makes of its guarded bytecode, stored and installed.

Modules: :mod:`.pkg` (make, dump, restore and install Dynamo's package; the frames traced counter),
:mod:`.record` (what the package records, read without unpickling) and :mod:`.check` (an installable package
is checked before it is stored).

May import: the rest of :mod:`precompile.inductor` (its shim) and what that package may import.
"""
