"""Dynamo's output for a whole function, through torch's own package machinery (``torch._dynamo.package``).

torch 2.11-2.13 can record what Dynamo made of a function — per code object (the function, the resume functions of
its graph breaks) the guarded, transformed bytecode and the guards' state, plus the sources it inlined — in a
``CompilePackage``, and install such a record into a fresh process so that a call whose guards pass runs the
stored bytecode without tracing (``CompilePackage.install``; ``_load_precompile_entry`` in the C eval frame).  A
call whose guards fail falls through to Dynamo's callback and is traced as usual, and the package records the new
entry beside the old ones.

This module, with :mod:`~precompile.inductor.dynamo.record` (the package class and Dynamo's patched recording),
:mod:`~precompile.inductor.dynamo.frame_state`, :mod:`~precompile.inductor.dynamo.named_guards` (what the guard
state holds) and :mod:`~precompile.inductor.dynamo.check` (the check before storing), is where precompile touches
that machinery: :func:`optimize` traces under a package, :func:`dump`/:func:`restore` turn its record into bytes and
back, :func:`install` puts a restored record into this process.  The record is a pickle, as torch writes it; callers
must verify its digest and signature before :func:`restore` (precompile.function.store does).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import pickle
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from precompile.inductor.dynamo import named_guards
from precompile.inductor.dynamo.record import (  # noqa: F401 - frames_traced: part of this module's API
    frame_name,
    frames_traced,
    package_class,
    patch_dynamo,
)

log = logging.getLogger("precompile.function")

def new_package(fn: Callable[..., Any]) -> Any:
    """An empty ``CompilePackage`` for ``fn`` (a function or bound method), to trace under."""
    patch_dynamo()
    package = package_class()(fn)
    _reinstall_others(package)  # torch's constructor reset the stored entries of fn's code: other functions' too
    return package


#: Installed packages per code object of their first frame, each with its compiled graphs: ``{code: [(weak ref
#: to the package, backends), ...]}``.
_INSTALLED: dict[Any, list[tuple[Any, dict[str, Any]]]] = {}
_INSTALLED_LOCK = threading.Lock()


def _reinstall_others(package: Any, backends: dict[str, Any] | None = None) -> None:
    """Put back the stored entries of every other installed package on ``package``'s first code object.

    torch keeps one list of stored (precompile) entries per code object, and a ``CompilePackage`` resets that
    whole list when it is made or installed (``uninstall``: ``_reset_precompile_entries``).  Library models share
    their first frame's code (transformers' output decorators wrap every model's forward; two instances of one
    class share ``forward``), so a second compiled function would wipe the first's entries and the first would
    trace again.  Each other package is installed again without its reset (an instance attribute shadowing
    ``uninstall`` for the call), appending its entries beside this one's.  With ``backends``, ``package`` itself
    (just installed) is registered for the next.
    """
    code = getattr(getattr(package, "_innermost_fn", None), "__code__", None)
    if code is None:  # not a torch whose packages this module knows
        return
    with _INSTALLED_LOCK:
        live = [(ref, b) for ref, b in _INSTALLED.get(code, []) if ref() is not None and ref() is not package]
        _INSTALLED[code] = live + ([(weakref.ref(package), backends)] if backends is not None else [])
    for ref, other_backends in live:
        other = ref()
        if other is None:
            continue
        other.uninstall = lambda: None
        try:
            other.install(other_backends)
        except Exception as err:  # noqa: BLE001 - it then traces, as any function whose entries are gone
            log.info("the stored entries of another function on %s could not be put back: %s", code.co_name, err)
        finally:
            del other.uninstall


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
    from torch._dynamo import eval_frame

    with _OPTIMIZE_LOCK:  # another thread's torch.compile meanwhile gets torch's own get_compiler_fn
        original = eval_frame.get_compiler_fn
        eval_frame.get_compiler_fn = lambda f: _LazyDebugBackend(f) if f is backend else original(f)
        try:
            return torch._dynamo.optimize(backend, nopython=fullgraph, dynamic=dynamic, package=package,
                                          guard_filter_fn=named_guards.portable_guards, guard_export_fn=guard_export,
                                          **_isolated())(fn)
        finally:
            eval_frame.get_compiler_fn = original


_OPTIMIZE_LOCK = threading.Lock()


@functools.cache
def _isolated() -> dict[str, bool]:
    """``isolate_recompiles=True`` where this torch has it (2.13): each compiled function's recompilations then
    count and stay apart from other functions' on a code object they share.  Library models share their top
    frame's code (transformers' output decorators wrap every model's forward), and without it a process with a few
    models meets Dynamo's recompile limit (8) on that code and runs the rest uncompiled."""
    import inspect as _inspect

    from torch._dynamo import eval_frame

    return {"isolate_recompiles": True} if "isolate_recompiles" in _inspect.signature(
        eval_frame._optimize).parameters else {}


class _LazyDebugBackend:
    """What ``torch._dynamo.eval_frame.get_compiler_fn`` makes of a backend (``WrapBackendDebug``, the hook of
    Dynamo's minifier), built at the backend's first call instead of up front.

    ``get_compiler_fn`` imports ``torch._dynamo.repro.after_dynamo``, which pulls in functorch's AOT autograd and
    Dynamo's testing helpers: about 0.15 s of a warm start (CPU, median of 5 starts) that a stored function whose
    guards pass never needs.  The wrapper is built the first time a graph is compiled (a build or a retrace), so ``repro_after`` and
    the minifier behave as under ``torch.compile``.
    """

    def __init__(self, compiler_fn: Callable[..., Any]) -> None:
        functools.wraps(compiler_fn)(self)
        self._torchdynamo_orig_backend = compiler_fn
        self._wrapped: Any = None

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        if self._wrapped is None:
            from torch._dynamo.repro.after_dynamo import wrap_backend_debug

            self._wrapped = wrap_backend_debug(self._torchdynamo_orig_backend, None)
        return self._wrapped(gm, example_inputs, **kwargs)


def backend_name(gm: torch.fx.GraphModule) -> str:
    """The name Dynamo gave a captured graph's compiled callable (``__compiled_fn_<n>_<uuid>``): the name its
    stored bytecode calls it by."""
    name = gm.meta.get("backend_id") or getattr(gm, "_backend_id", None)
    if not isinstance(name, str):
        raise RuntimeError("this torch's Dynamo does not name its captured graphs (no meta['backend_id'])")
    return name


@dataclasses.dataclass
class Dumped:
    """A package's record, ready to store.

    Attributes:
        data: torch's ``_DynamoCacheEntry`` pickled.
        sources: the functions Dynamo inlined, ``[{"module", "first", "last", "sha256"}]`` (line numbers 1-based,
            ``last`` exclusive), sorted.
        codes: how many code objects the record holds.
        left_out: ``{frame: [why, ...]}``: the frames left out of the record (traced at run time after a load).
    """

    data: bytes
    sources: list[dict[str, Any]]
    codes: int
    left_out: dict[str, list[str]]


def dump(package: Any) -> Dumped:
    """``package``'s record as bytes, without the inlined modules' whole texts (torch keeps them for debugging;
    precompile stores each inlined function's sha256 instead).  A frame Dynamo could not record (a resume function
    of a graph break, say) stays out of it and is traced at run time, as ``torch.compile`` would.

    Raises:
        RuntimeError: the function's own frame is left out (then a load would trace everything), naming why.
    """
    entry = package.cache_entry()
    left_out, codes = {}, []
    for i, code in enumerate(entry.codes):
        if code.bypassed:
            why = getattr(package, "refusals", {}).get(id(code)) or ["see torch's 'Detected a package bypass' warning"]
            if i == 0:
                raise RuntimeError(f"Dynamo could not record the function's own frame: {'; '.join(why)}")
            left_out[frame_name(code)] = why
            if not code.install_to_global:  # a function of its own, traced when called: nothing to install
                continue
        codes.append(code)  # a left-out resume function is still installed (the stored bytecode calls it)
    entry = dataclasses.replace(entry, codes=codes)
    inlined = {dataclasses.replace(s, content="") for s in entry.source_info.inlined_sources}
    entry = dataclasses.replace(entry, source_info=dataclasses.replace(entry.source_info, inlined_sources=inlined))
    sources = sorted(({"module": s.module, "first": s.firstlineno, "last": s.lastlineno, "sha256": s.checksum}
                      for s in inlined), key=lambda s: (s["module"], s["first"]))
    return Dumped(pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL), sources, len(entry.codes), left_out)


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
    patch_dynamo()  # a guard failure here is traced into the package
    package = package_class()(fn, record, ignore_inlined_sources=True)  # precompile checks the sources itself
    backends = {name: _Loaded(g) for name, g in graphs.items()}
    try:
        package.install(backends)
    except Exception as err:
        package.uninstall()
        _reinstall_others(package)
        raise RuntimeError(f"Dynamo's record does not install here: {type(err).__name__}: {err}") from err
    _reinstall_others(package, backends)
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
