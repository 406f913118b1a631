"""Dynamo's recording of a frame into a precompile package (:mod:`precompile.inductor.dynamo.pkg`), patched to
store what library code makes, and a count of the frames Dynamo traces.

:func:`package_class` is torch's ``CompilePackage`` with the changes its docstring lists; :func:`patch_dynamo`
patches Dynamo once per process (the guard-state pickler of :mod:`precompile.inductor.dynamo.frame_state`, identity
guards by :mod:`precompile.inductor.dynamo.named_guards`, the count behind :func:`frames_traced`).  Any caller but a
precompile package recording a frame sees torch's behaviour.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import sys
import threading
from typing import Any

from precompile.inductor.dynamo import frame_state, named_guards

log = logging.getLogger("precompile.function")

#: What :func:`patch_dynamo` hands Dynamo for a frame whose guards do not pickle.
UNPICKLABLE_GUARDS = b""

_recording = threading.local()  # .active: a precompile package is recording the frame being traced
_ONCE = threading.RLock()  # functools.cache alone lets two threads' first calls both run the body


def package_class() -> type:
    """The :class:`CompilePackage` subclass precompile records with (made once per process)."""
    with _ONCE:
        return _package_class()


@functools.cache
def _package_class() -> type:
    from torch._dynamo.package import CompilePackage, PackageError

    class Package(CompilePackage):  # type: ignore[misc, valid-type]
        """torch's ``CompilePackage``, except that a frame it cannot record is left out of the record (marked
        bypassed, the reason kept in :attr:`refusals`) instead of failing the user's call: code it cannot name
        (made by ``exec``, such as a dataclass's ``__init__``, has no module to find it in), guards that cannot be
        stored (:mod:`precompile.inductor.dynamo.named_guards`), or a guard state that does not pickle.  The
        function still runs as ``torch.compile`` would; :func:`dump` stores the other frames, or refuses the record
        when the function's own frame is the one left out."""

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


def frame_name(entry: Any) -> str:
    """``module:function`` of a recorded frame, for messages."""
    return f"{entry.python_module}:{','.join(entry.function_names) or '<main>'}"


def _globals_module(fn: Any) -> str | None:
    """The name of the module whose globals ``fn`` runs in, where that module is imported; else None."""
    scope = getattr(fn, "__globals__", None)
    name = scope.get("__name__") if isinstance(scope, dict) else None
    module = sys.modules.get(name) if isinstance(name, str) else None
    return name if module is not None and module.__dict__ is scope else None


def patch_dynamo() -> None:
    """Dynamo's recording of a frame into a precompile package, made to store what library code makes.

    Patched once per process; any caller but a precompile package recording a frame sees torch's behaviour:

    - the guard state is pickled by :mod:`precompile.inductor.dynamo.frame_state`'s pickler (decorated functions
      by value, plain objects with only the attributes the guard tree reads);
    - a module Dynamo installs as a global is named by its import name and recorded in the package
      (:func:`precompile.inductor.dynamo.frame_state.install_global_by_id`), so a fresh process has it;
    - each frame Dynamo traces is counted (:func:`frames_traced`);
    - a frame with a guard no other process could check
      (:func:`precompile.inductor.dynamo.named_guards.refusals`), and one whose state still does not pickle, is
      left out of the record instead of failing the user's call.
      In torch 2.11-2.13 ``pickle.PicklingError`` and ``TypeError`` escape, and the ``PackageError`` torch makes of
      an ``AttributeError`` leads to its own "guards_state must not be None" assertion; here such a failure hands
      Dynamo :data:`UNPICKLABLE_GUARDS`, which the package takes as a bypass of the frame.
    """
    with _ONCE:
        _patch_dynamo()


@functools.cache
def _patch_dynamo() -> None:
    from torch._dynamo import guards
    from torch._dynamo.exc import PackageError

    original = guards.pickle_guards_state
    torch_pickler = guards.GuardsStatePickler

    @functools.wraps(original)
    def pickle_guards_state(*args: Any, **kwargs: Any) -> bytes:
        if not getattr(_recording, "active", False):
            return original(*args, **kwargs)
        # library code's guard state (frame_state); swapped module-wide for the call: Dynamo builds and pickles
        # guards under its compile lock, so no other thread pickles a guard state meanwhile
        guards.GuardsStatePickler = frame_state.pickler_class()
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
        OutputGraph.install_global_by_id, lambda package: isinstance(package, package_class()))


def frames_traced() -> int:
    """Frames Dynamo has traced in this process since precompile first looked (calls of
    ``convert_frame._compile``).  Dynamo's ``counters["frames"]["total"]`` also counts frames its callback only
    looks at and skips (no tensor in them), and its compile ids also number the frames a package installs."""
    patch_dynamo()
    return _traced[0]


_traced = [0]
