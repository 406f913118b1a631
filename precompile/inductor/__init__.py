"""Everything precompile needs from Inductor, and the only package that touches Inductor internals.

Upgrading torch means changing this package only (README.md here says how an upgrade goes).  Its modules are
split by when their code runs:

- the root: :mod:`.shim` (one function per private Inductor / AOTAutograd / ShapeEnv / launcher API, for torch
  2.11-2.13), :mod:`.options` (Inductor options as key factors), :mod:`.stored_options` (stored options checked as
  data) and :mod:`.shapes` (size symbols, ranges and guards): what both sides and the key use;
- :mod:`.build`: what runs while an artifact is made (compile, harvest, autotune picks, the fast plan validated
  bit for bit, the FX wrapper graph);
- :mod:`.load`: what a worker runs to load one (the fast runtimes, the graph engine, the portable path);
- :mod:`.dynamo`: whole functions through Dynamo's own package machinery, at build and at load.

Private APIs are reached through :mod:`.shim`, except in :mod:`.dynamo`, which subclasses and patches Dynamo's
classes (README.md lists what it uses).  Submodules are imported on use: a fast load imports only modules of
:mod:`.load` and the load-side functions of :mod:`.shim`, never :mod:`.build` nor ``torch._inductor``.

May import: :mod:`precompile.manifest` (names, the wrapper graph), :mod:`precompile.metrics`,
:mod:`precompile.config` and :mod:`precompile.errors`; nothing that decides keys, stores or loads
(docs/architecture.md).  Within it: the root imports only the root, :mod:`.load` the root, :mod:`.build` the root
and :mod:`.load`, :mod:`.dynamo` the root (tests/test_layout.py).
"""
