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

from precompile.inductor import frame_state, named_guards

log = logging.getLogger("precompile.function")

#: What :func:`_patch_dynamo` hands Dynamo for a frame whose guards do not pickle.
UNPICKLABLE_GUARDS = b""

_recording = threading.local()  # .active: a precompile package is recording the frame being traced


@functools.cache
def _package_class() -> type:
    from torch._dynamo.package import CompilePackage, PackageError

    class Package(CompilePackage):  # type: ignore[misc, valid-type]
        """torch's ``CompilePackage``, except that a frame it cannot record is left out of the record (marked
        bypassed, the reason kept in :attr:`refusals`) instead of failing the user's call: code it cannot name
        (made by ``exec``, such as a dataclass's ``__init__``, has no module to find it in), guards that cannot be
        stored (:mod:`precompile.inductor.named_guards`), or a guard state that does not pickle.  The function still
        runs as ``torch.compile`` would; :func:`dump` stores the other frames, or refuses the record when the
        function's own frame is the one left out."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.refusals: dict[int, list[str]] = {}  # id(code entry) -> why it is left out of the record
            super().__init__(*args, **kwargs)

        def _add_function(self, python_code: Any, python_module: str, *args: Any, **kwargs: Any) -> None:
            # torch names the function's module by its ``__module__``, which ``functools.wraps`` copies from the
            # function it wraps: a decorated forward's guards would then read another module's globals
            if python_code is getattr(self._innermost_fn, "__code__", None):
                python_module = _globals_module(self._innermost_fn) or python_module
            super()._add_function(python_code, python_module, *args, **kwargs)

        def _add_user_function(self, code: Any) -> None:
            try:
                super()._add_user_function(code)
            except PackageError as err:
                log.warning("Dynamo cannot record frame %s (%s:%d) for a stored function: %s", code.co_name,
                            code.co_filename, code.co_firstlineno, err)
                self._add_function(code, "<unrecorded>")
                self._codes[code].bypassed = True
                self.refusals[id(self._codes[code])] = [f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): "
                                                        f"{str(err)[:400]}"]

        @contextlib.contextmanager
        def code_context(self, code: Any) -> Any:
            with super().code_context(code):
                before = getattr(_recording, "active", False)
                _recording.active, _recording.why = True, None
                named_guards.reset(self._codes[code].python_module if code in self._codes else None)
                try:
                    yield
                finally:
                    _recording.active = before

        def bypass_current_entry(self) -> None:
            entry = self._current_entry
            if entry is not None:
                why = named_guards.refusals() or getattr(_recording, "why", None) or [
                    "torch could not store it (see its 'Detected a package bypass' warning)"]
                self.refusals.setdefault(id(entry), list(why)[:3])
            super().bypass_current_entry()

        def add_guarded_code(self, guards_state: bytes, dynamo_code: Any) -> None:
            if guards_state == UNPICKLABLE_GUARDS:
                self.bypass_current_entry()
                return
            super().add_guarded_code(guards_state, dynamo_code)

    return Package


def _frame_name(entry: Any) -> str:
    """``module:function`` of a recorded frame, for messages."""
    return f"{entry.python_module}:{','.join(entry.function_names) or '<main>'}"


def _globals_module(fn: Any) -> str | None:
    """The name of the module whose globals ``fn`` runs in, where that module is imported; else None."""
    scope = getattr(fn, "__globals__", None)
    name = scope.get("__name__") if isinstance(scope, dict) else None
    module = sys.modules.get(name) if isinstance(name, str) else None
    return name if module is not None and module.__dict__ is scope else None


@functools.cache
def _patch_dynamo() -> None:
    """Dynamo's recording of a frame into a precompile package, made to store what library code makes.

    Patched once per process; any caller but a precompile package recording a frame sees torch's behaviour:

    - the guard state is pickled by :mod:`precompile.inductor.frame_state`'s pickler (decorated functions by value,
      plain objects with only the attributes the guard tree reads);
    - a module Dynamo installs as a global is named by its import name and recorded in the package
      (:func:`precompile.inductor.frame_state.install_global_by_id`), so a fresh process has it;
    - each frame Dynamo traces is counted (:func:`frames_traced`);
    - a frame with a guard no other process could check (:func:`precompile.inductor.named_guards.refusals`), and
      one whose state still does not pickle, is left out of the record instead of failing the user's call.
      In torch 2.11-2.13 ``pickle.PicklingError`` and ``TypeError`` escape, and the ``PackageError`` torch makes of
      an ``AttributeError`` leads to its own "guards_state must not be None" assertion; here such a failure hands
      Dynamo :data:`UNPICKLABLE_GUARDS`, which the package takes as a bypass of the frame.
    """
    from torch._dynamo import guards
    from torch._dynamo.exc import PackageError

    original = guards.pickle_guards_state
    torch_pickler = guards.GuardsStatePickler

    @functools.wraps(original)
    def pickle_guards_state(*args: Any, **kwargs: Any) -> bytes:
        if not getattr(_recording, "active", False):
            return original(*args, **kwargs)
        guards.GuardsStatePickler = frame_state.pickler_class()  # library code's guard state (frame_state)
        try:
            return original(*args, **kwargs)
        except (pickle.PicklingError, TypeError, PackageError) as err:
            log.warning("a frame's guards cannot be stored (%s: %s); the frame will be traced at run time",
                        type(err).__name__, err)
            _recording.why = [f"its guard state does not pickle ({type(err).__name__}: {str(err)[:300]})"]
            return UNPICKLABLE_GUARDS
        finally:
            guards.GuardsStatePickler = torch_pickler

    guards.pickle_guards_state = pickle_guards_state
    serialize = guards.CheckFunctionManager.serialize_guards

    @functools.wraps(serialize)
    def serialize_guards(self: Any, *args: Any, **kwargs: Any) -> bytes:
        if not getattr(_recording, "active", False):
            return serialize(self, *args, **kwargs)
        refused = named_guards.refusals()  # guards kept for this process that no other process could check
        if refused:
            _recording.why = refused
            return UNPICKLABLE_GUARDS
        try:
            return serialize(self, *args, **kwargs)
        except (PackageError, TypeError, pickle.PicklingError) as err:
            # PackageError: torch's own bypass of it then fails its "guards_state" assertion; TypeError: a guard on
            # a class defined in local scope (torch's raise_local_type_error) would fail the user's call
            _recording.why = [f"torch cannot store its guards ({type(err).__name__}: {str(err)[:300]})"]
            return UNPICKLABLE_GUARDS

    guards.CheckFunctionManager.serialize_guards = serialize_guards
    from torch._dynamo import convert_frame

    compile_frame = convert_frame._compile

    @functools.wraps(compile_frame)
    def counted_compile(*args: Any, **kwargs: Any) -> Any:
        _traced[0] += 1
        return compile_frame(*args, **kwargs)

    convert_frame._compile = counted_compile  # frames_traced()
    from torch._dynamo.output_graph import OutputGraph

    OutputGraph.install_global_by_id = frame_state.install_global_by_id(
        OutputGraph.install_global_by_id, lambda package: isinstance(package, _package_class()))


def new_package(fn: Callable[..., Any]) -> Any:
    """An empty ``CompilePackage`` for ``fn`` (a function or bound method), to trace under."""
    _patch_dynamo()
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
                                          guard_filter_fn=named_guards.portable_guards, guard_export_fn=guard_export)(fn)
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
            left_out[_frame_name(code)] = why
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
    _patch_dynamo()  # a guard failure here is traced into the package
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
    """Frames Dynamo has traced in this process since precompile first looked (calls of
    ``convert_frame._compile``).  Dynamo's ``counters["frames"]["total"]`` also counts frames its callback only
    looks at and skips (no tensor in them), and its compile ids also number the frames a package installs."""
    _patch_dynamo()
    return _traced[0]


_traced = [0]
