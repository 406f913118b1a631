"""Dynamo's output for a whole function, through torch's own package machinery (``torch._dynamo.package``).

torch 2.11-2.13 can record what Dynamo made of a function — per code object (the function, the resume functions of
its graph breaks) the guarded, transformed bytecode and the guards' state, plus the sources it inlined — in a
``CompilePackage``, and install such a record into a fresh process so that a call whose guards pass runs the
stored bytecode without tracing (``CompilePackage.install``; ``_load_precompile_entry`` in the C eval frame).  A
call whose guards fail falls through to Dynamo's callback and is traced as usual, and the package records the new
entry beside the old ones.

This module is the one place precompile touches that machinery (as :mod:`precompile.inductor` is for Inductor):
:func:`optimize` traces under a package, :func:`dump`/:func:`restore` turn its record into bytes and back,
:func:`install` puts a restored record into this process.  The record is a pickle, as torch writes it; callers
must verify its digest and signature before :func:`restore` (precompile.function.store does).
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

#: Guard kinds that name objects of the building process (their ids, weakrefs, dict versions): they cannot
#: hold in another process, so they are left out of a stored function, as torch's ``caching_precompile`` does.
PROCESS_LOCAL_GUARDS = ("ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION")


def portable_guards(entries: Sequence[Any]) -> list[bool]:
    """A Dynamo ``guard_filter_fn``: keep every guard but those in :data:`PROCESS_LOCAL_GUARDS`."""
    keep = []
    for g in entries:
        derived = getattr(g, "derived_guard_types", ()) or ()
        keep.append(not (g.guard_type in PROCESS_LOCAL_GUARDS or any(t in derived for t in PROCESS_LOCAL_GUARDS)))
    return keep


def new_package(fn: Callable[..., Any]) -> Any:
    """An empty ``CompilePackage`` for ``fn`` (a function or bound method), to trace under."""
    from torch._dynamo.package import CompilePackage

    return CompilePackage(fn)


def optimize(fn: Callable[..., Any], backend: Callable[..., Any], package: Any, *, dynamic: bool | None,
             fullgraph: bool, guard_export: Callable[[Any], None] | None = None) -> Callable[..., Any]:
    """``fn`` under Dynamo with ``backend``, recording into ``package`` (guards that cannot be stored left out).

    Args:
        fn: the function or bound method.
        backend: called with ``(gm, example_inputs)`` for each graph Dynamo captures.
        package: from :func:`new_package` or :func:`install`.
        dynamic, fullgraph: as ``torch.compile``'s.
        guard_export: called with each compiled frame's guards (a ``GuardsSet``), to describe them.
    """
    return torch._dynamo.optimize(backend, nopython=fullgraph, dynamic=dynamic, package=package,
                                  guard_filter_fn=portable_guards, guard_export_fn=guard_export)(fn)


def backend_name(gm: torch.fx.GraphModule) -> str:
    """The name Dynamo gave a captured graph's compiled callable (``__compiled_fn_<n>_<uuid>``): the name its
    stored bytecode calls it by."""
    name = gm.meta.get("backend_id") or getattr(gm, "_backend_id", None)
    if not isinstance(name, str):
        raise RuntimeError("this torch's Dynamo does not name its captured graphs (no meta['backend_id'])")
    return name


def dump(package: Any) -> tuple[bytes, list[dict[str, Any]], int]:
    """``package``'s record as bytes, with the sources it inlined and its count of code objects.

    The record is torch's ``_DynamoCacheEntry`` pickled, without the inlined modules' whole texts (torch keeps
    them for debugging; precompile stores each inlined function's sha256 instead).

    Returns:
        ``(bytes, sources, codes)``: sources as ``[{"module", "first", "last", "sha256"}]`` (line numbers 1-based,
        ``last`` exclusive), sorted; codes: how many code objects the record holds.

    Raises:
        RuntimeError: Dynamo left the function's entry out of the record (``bypassed``: a guard or graph it cannot
            store), so a load would trace anyway.
    """
    entry = package.cache_entry()
    bypassed = [c.python_module + ":" + ",".join(c.function_names or ["<main>"]) for c in entry.codes if c.bypassed]
    if bypassed:
        raise RuntimeError(f"Dynamo could not record every frame of the function ({bypassed}); see torch's "
                           "'Detected a package bypass' warning for why")
    inlined = {dataclasses.replace(s, content="") for s in entry.source_info.inlined_sources}
    entry = dataclasses.replace(entry, source_info=dataclasses.replace(entry.source_info, inlined_sources=inlined))
    sources = sorted(({"module": s.module, "first": s.firstlineno, "last": s.lastlineno, "sha256": s.checksum}
                      for s in inlined), key=lambda s: (s["module"], s["first"]))
    return pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL), sources, len(entry.codes)


def backend_ids(record: Any) -> list[str]:
    """The compiled-graph names a restored record calls."""
    return sorted(record.backend_ids)


def restore(data: bytes) -> Any:
    """The record :func:`dump` wrote.  Unpickles: ``data`` must be verified (digest, signature) first.

    Raises:
        ValueError: ``data`` does not unpickle to a Dynamo record.
    """
    from torch._dynamo.package import _DynamoCacheEntry

    try:
        record = pickle.loads(data)  # noqa: S301 - verified by the caller (precompile.function.store)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a damaged part
        raise ValueError(f"the Dynamo part does not unpickle: {type(err).__name__}: {err}") from err
    if not isinstance(record, _DynamoCacheEntry):
        raise ValueError(f"the Dynamo part holds a {type(record).__name__}, not Dynamo's record of a function")
    return record


@dataclasses.dataclass
class _Loaded:
    """What ``CompilePackage.install`` asks of a stored backend: ``after_deserialization()`` -> the callable."""

    fn: Callable[..., Any]

    def after_deserialization(self) -> Callable[..., Any]:
        return self.fn


def install(fn: Callable[..., Any], record: Any, graphs: Mapping[str, Callable[..., Any]]) -> Any:
    """Install a restored record for ``fn`` in this process: its bytecode and guards on ``fn``'s code objects,
    its resume functions and compiled graphs (``graphs``: name -> callable) in their modules' globals.

    Returns:
        the package, to pass to :func:`optimize` (so that a guard failure is traced into it).

    Raises:
        RuntimeError: the record does not fit this process (torch's or Python's version, a missing graph, a code
            object it cannot find); nothing is left installed then.
    """
    from torch._dynamo.package import CompilePackage

    package = CompilePackage(fn, record, ignore_inlined_sources=True)  # precompile checks the sources itself
    try:
        package.install({name: _Loaded(g) for name, g in graphs.items()})
    except Exception as err:
        package.uninstall()
        raise RuntimeError(f"Dynamo's record does not install here: {type(err).__name__}: {err}") from err
    _advance_unique_ids(sys.modules[c.python_module].__dict__ for c in record.codes if c.python_module in sys.modules)
    return package


_NUMBERED = re.compile(r"^__.*?_(\d+)(?:_[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})?$")


def _advance_unique_ids(scopes: Iterable[dict[str, Any]]) -> None:
    """Move Dynamo's process-wide name counter past every numbered global the record installed.

    Dynamo names the globals it installs (``__builtins_dict___0``, ``__resume_at_30_1``) from a counter that starts
    at 0 in each process; the stored record brings names from the building process, so a later trace here (a call
    the stored guards refuse) would pick a name already taken and fail.
    """
    from torch._dynamo import bytecode_transformation as bt

    top = -1
    for scope in scopes:
        for name in list(scope):
            m = _NUMBERED.match(name)
            if m:
                top = max(top, int(m.group(1)))
    current = next(bt._unique_id_counter)
    bt._unique_id_counter = itertools.count(max(current, top + 1))


def frames_traced() -> int:
    """Frames Dynamo has traced in this process (its ``frames.total`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])
