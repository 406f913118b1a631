"""Inductor's wrapper stored as data: a graph of allow-listed operations and kernel launches, never host code.

Modules: :mod:`.graph` (the graph's JSON form and its checks), :mod:`.ops` (the allow-list of operations it may
call), :mod:`.bounds` (bounds on sizes and allocations, checked before anything runs), :mod:`.codegen` (the
checked graph made callable) and :mod:`.text` (the graph as readable text for ``precompile inspect``).
Nothing here runs, unpickles or imports what it reads until the checks pass.

May import: :mod:`precompile.manifest.graph_json`, :mod:`precompile.config` and :mod:`precompile.errors`.
"""
