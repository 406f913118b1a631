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

import contextlib
import dataclasses
import functools
import itertools
import logging
import pickle
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

log = logging.getLogger("precompile.function")

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


#: What :func:`_tolerate_unpicklable_guards` hands Dynamo for a frame whose guards do not pickle.
UNPICKLABLE_GUARDS = b""

_recording = threading.local()  # .active: a precompile package is recording the frame being traced


@functools.cache
def _package_class() -> type:
    from torch._dynamo.package import CompilePackage, PackageError

    class Package(CompilePackage):  # type: ignore[misc, valid-type]
        """torch's ``CompilePackage``, except that a frame it cannot record is left out of the record (marked
        bypassed) instead of failing the user's call: code it cannot name (made by ``exec``, such as a dataclass's
        ``__init__``, has no module to find it in), or guards that do not pickle.  The function still runs as
        ``torch.compile`` would, and :func:`dump` refuses to store the record."""

        def _add_user_function(self, code: Any) -> None:
            try:
                super()._add_user_function(code)
            except PackageError as err:
                log.warning("Dynamo cannot record frame %s (%s:%d) for a stored function: %s", code.co_name,
                            code.co_filename, code.co_firstlineno, err)
                self._add_function(code, "<unrecorded>")
                self._codes[code].bypassed = True

        @contextlib.contextmanager
        def code_context(self, code: Any) -> Any:
            with super().code_context(code):
                before = getattr(_recording, "active", False)
                _recording.active = True
                try:
                    yield
                finally:
                    _recording.active = before

        def add_guarded_code(self, guards_state: bytes, dynamo_code: Any) -> None:
            if guards_state == UNPICKLABLE_GUARDS:
                self.bypass_current_entry()
                return
            super().add_guarded_code(guards_state, dynamo_code)

    return Package


@functools.cache
def _tolerate_unpicklable_guards() -> None:
    """Make a frame whose guard state does not pickle a frame left out of the record, not a failed call.

    Dynamo pickles each frame's guard state while tracing under a package.  In torch 2.11-2.13 a state that does
    not pickle (a guard on a function made by ``exec``, say) fails the user's call: ``pickle.PicklingError`` and
    ``TypeError`` escape, and the ``PackageError`` torch makes of an ``AttributeError`` leads to its own
    "guards_state must not be None" assertion.  Wrapped once per process: while a precompile package records
    the frame, such a failure hands Dynamo :data:`UNPICKLABLE_GUARDS`, which the package takes as a bypass of the
    frame; any other caller sees torch's behaviour unchanged.
    """
    from torch._dynamo import guards
    from torch._dynamo.exc import PackageError

    original = guards.pickle_guards_state

    @functools.wraps(original)
    def pickle_guards_state(*args: Any, **kwargs: Any) -> bytes:
        try:
            return original(*args, **kwargs)
        except (pickle.PicklingError, TypeError, PackageError) as err:
            if not getattr(_recording, "active", False):
                raise
            log.warning("a frame's guards cannot be stored (%s: %s); the function will not be stored",
                        type(err).__name__, err)
            return UNPICKLABLE_GUARDS

    guards.pickle_guards_state = pickle_guards_state


def new_package(fn: Callable[..., Any]) -> Any:
    """An empty ``CompilePackage`` for ``fn`` (a function or bound method), to trace under."""
    _tolerate_unpicklable_guards()
    return _package_class()(fn)


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
                                          guard_filter_fn=portable_guards, guard_export_fn=guard_export)(fn)
        finally:
            eval_frame.get_compiler_fn = original


_OPTIMIZE_LOCK = threading.Lock()


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
    _tolerate_unpicklable_guards()  # a guard failure here is traced into the package
    package = _package_class()(fn, record, ignore_inlined_sources=True)  # precompile checks the sources itself
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
