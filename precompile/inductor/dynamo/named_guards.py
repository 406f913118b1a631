"""Identity guards that hold across processes: an object named by its import path instead of by its ``id()``.

Dynamo checks that a function, class, module or builtin a frame used is *the same object* on every call
(``ID_MATCH`` and its kin ``FUNCTION_MATCH``, ``CLASS_MATCH``, ``MODULE_MATCH``, ``BUILTIN_MATCH``; ``CLOSURE_MATCH``
and ``CONSTANT_MATCH`` on a code object compare the ``__code__`` by identity).  An ``id()`` means nothing in
another process, so torch refuses to store these guards, and its ``caching_precompile`` drops them: a stored frame
then runs for *any* object in that place — a different attention function registered under ``"sdpa"``, another
hook — which is a looser guard than the one Dynamo made.

Across processes an object's identity is its import name.  For each such guard, :func:`portable_guards` (the
``guard_filter_fn`` precompile traces with) finds a path that names the guarded object from an importable root:

1. its module and qualified name (``transformers.masking_utils.sdpa_mask``), where they lead back to it (an enum
   member: its class's, then its name);
2. for a function they do not lead to (the inner function of a ``functools.wraps`` decorator, a property's
   getter), a walk from what they do name through ``__wrapped__``, ``__func__``, a property's accessors and closure
   cells;
3. for a code object, the path of the function that holds it, then ``__code__``;
4. else the guard's own source, where it starts at a module global (an imported module, or a global of the
   frame's own module) and steps through attributes, constant subscripts, ``type()``, ``__dict__`` and ``__mro__``
   (Dynamo's sources).

The guard is kept, re-pointed at :func:`named_id_match`, and the guarded object is pickled as its path and the
digest of what it was (:mod:`precompile.inductor.dynamo.object_digest`: a function's code and defaults, a class's
functions...), so the loading process compares each call's object with the object the path names there, provided
that object is still what was stored (:func:`resolve`; a function monkeypatched at its import path is not, and its
guard then fails).  A
guard whose object no path names, and guards that cannot mean anything in another process (``WEAKREF_ALIVE``,
``DICT_VERSION``, ``NN_MODULE``), are kept as Dynamo made them: the frame is then left out of the stored function
and traced at run time, and :func:`refusals` says why.
"""

from __future__ import annotations

import enum
import importlib
import logging
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

from precompile.inductor.dynamo import object_digest

log = logging.getLogger("precompile")

#: This module's name before precompile.inductor was split into wings (2026-11-27): the guard-state pickles of
#: function artifacts stored before then name :func:`resolve` and :func:`named_id_match` by it, and find them under
#: it once it is imported (as :mod:`precompile.inductor.dynamo.pkg` does before it installs a record).
FORMER_NAME = "precompile.inductor.named_guards"
sys.modules.setdefault(FORMER_NAME, sys.modules[__name__])

#: Guards that check an object's identity (``CLOSURE_MATCH`` on a Python function: its code's identity).
IDENTITY = frozenset({"ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "CLOSURE_MATCH"})
#: Identity guards torch stores itself: a builtin is pickled by name, and its guard rebuilt on the loading
#: process's builtin.
NATIVE = frozenset({"BUILTIN_MATCH"})
#: Guards on the state of this process only: a frame that needs one is not stored.
PROCESS_ONLY = frozenset({"WEAKREF_ALIVE", "DICT_VERSION", "NN_MODULE"})
#: How deep :func:`_walk` looks from a named object for an unnamed function.
MAX_WALK = 4

Path = tuple[Any, ...]
_frame = threading.local()  # .paths: {id(value): (value, path, digest)}; .refused: [reason]
#: Every object :func:`resolve` returned in this process (see there).
_KEPT: list[Any] = []


def portable_guards(entries: Sequence[Any]) -> list[bool]:
    """Dynamo's ``guard_filter_fn`` for a stored frame: keeps every guard, re-points each identity guard at
    :func:`named_id_match` with a path for its object, and notes the guards that cannot be stored
    (:func:`refusals`).  Those are kept as they are, so the building process checks them; torch's serializer then
    refuses them and leaves the frame out of the record.

    Returns:
        ``[True] * len(entries)``: no guard is dropped.
    """
    paths: dict[int, tuple[Any, Path, str | None]] = {}
    refused: list[str] = []
    _frame.paths, _frame.refused = paths, refused
    by_name = {e.name: e.value for e in entries if e.has_value}
    keep = []
    for e in entries:
        kinds = {e.guard_type, *(e.derived_guard_types or ())}
        keep.append(True)  # a guard that cannot be stored stays: torch then leaves the frame out of the record
        if kinds & PROCESS_ONLY:
            refused.append(f"a {'/'.join(sorted(kinds & PROCESS_ONLY))} guard on {e.name[:120]} holds in this process "
                           "only")
            continue
        if e.guard_type in NATIVE or not ({"ID_MATCH", "FUNCTION_MATCH"} & kinds or e.guard_type in IDENTITY) \
                or not e.has_value:
            continue
        value, source = e.value, e.orig_guard.originating_source
        closure = e.guard_type == "CLOSURE_MATCH" and type(value) is types.FunctionType
        if not (e.guard_type in IDENTITY or isinstance(value, types.CodeType)):
            refused.append(f"a {e.guard_type} guard on {e.name[:120]} checks a {type(value).__name__}'s identity")
            continue
        path = path_of(value, e.name, source, by_name)
        expected = object_digest.digest(value)
        if path is None or expected is None:
            refused.append(f"a {e.guard_type} guard on {e.name[:120]} checks the identity of "
                           f"{_describe(value)}, which no import path names" if path is None else
                           f"a {e.guard_type} guard on {e.name[:120]} checks the identity of {_describe(value)}, "
                           "which has no digest to check it by in another process")
            continue
        paths[id(value)] = (value, path, expected)
        _repoint(e.orig_guard, named_code_match if closure else named_id_match)
    return keep


def reset(module: str | None = None) -> None:
    """Forget the last frame's paths and refusals: a new frame is being traced, whose globals are ``module``'s."""
    _frame.paths, _frame.refused, _frame.module = {}, [], module


def refusals() -> list[str]:
    """Why the frame :func:`portable_guards` last looked at cannot be stored (empty if it can)."""
    return list(getattr(_frame, "refused", ()))


def path_for(value: Any) -> tuple[Path, str] | None:
    """``(path, digest)`` :func:`portable_guards` chose for an object of the frame it last looked at, or None."""
    hit = getattr(_frame, "paths", {}).get(id(value))
    return (hit[1], hit[2]) if hit is not None and hit[0] is value else None


def path_of(value: Any, name: str, source: Any, by_name: dict[str, Any]) -> Path | None:
    """A path naming ``value`` (rules 1-4 of the module docstring), or None."""
    named = _canonical(value)
    if named is not None:
        return named
    if isinstance(value, types.CodeType) and name.endswith(".__code__"):
        holder = by_name.get(name[: -len(".__code__")])
        base = path_of(holder, "", None, {}) if getattr(holder, "__code__", None) is value else None
        if base is not None:
            return (*base, ("attr", "__code__"))
    if isinstance(value, types.FunctionType):
        found = _walk(value)
        if found is not None:
            return found
    return _from_source(source)


class Mismatch:
    """Stands for an object whose path leads, in this process, to something other than what was stored (a function
    monkeypatched at its import path): no object is ever it, so its identity guard fails and the frame is traced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.__code__ = compile("None", "<precompile: another object at this path>", "eval")  # never anyone's code

    def __repr__(self) -> str:
        return f"<precompile.Mismatch {self.path!r}>"


def resolve(path: Path, expected: str | None = None) -> Any:
    """The object ``path`` names in this process; a :class:`Mismatch` when ``expected`` is given and that object's
    :func:`precompile.inductor.dynamo.object_digest.digest` is not it.

    Raises:
        ImportError, AttributeError, KeyError, IndexError, ValueError: the path does not lead to an object here.
    """
    obj = _walk_path(path)
    if expected is not None and object_digest.digest(obj) != expected:
        log.info("%s is not the object stored under that name (changed at run time); its guard will fail", path)
        obj = Mismatch(path)
    # An installed identity guard compares ids, and torch does not invalidate an installed entry when its object
    # dies: kept alive here, no later object (a rebinding's new function) can take its address and pass the guard.
    _KEPT.append(obj)
    return obj


def _walk_path(path: Path) -> Any:
    root, *steps = path
    kind, module = root[0], root[1]
    obj: Any = importlib.import_module(module)
    if kind == "global":
        obj = obj.__dict__[root[2]]
    for step in steps:
        op = step[0]
        if op == "attr":
            obj = getattr(obj, step[1])
        elif op == "item":
            obj = obj[step[1]]
        elif op == "cell":
            obj = obj.__closure__[step[1]].cell_contents
        elif op == "type":
            obj = type(obj)
        elif op == "dict":
            obj = dict(obj.__dict__)
        else:
            raise ValueError(f"unknown path step {op!r}")
    return obj


def named_id_match(builder: Any, guard: Any) -> None:
    """Dynamo guard: the guarded object is the one its path names here (the stored value is that object)."""
    from torch._dynamo.guards import get_verbose_code_parts

    source = guard.originating_source
    if getattr(builder, "save_guards", False) and type(source).__name__ == "DictGetItemSource":
        builder.check_fn_manager.used_builtin_vars.add(source.index)  # a builtin: stored as BUILTIN_MATCH keeps it
    ref = builder.arg_ref(guard)
    value = builder.get(guard)
    id_val = builder.id_ref(value, guard.name)
    code = f"___check_obj_id({ref}, {id_val})"  # no export info: Dynamo only records it for its own guard kinds
    builder.get_guard_manager(guard).add_id_match_guard(id_val, get_verbose_code_parts(code, guard), guard.user_stack)


def named_code_match(builder: Any, guard: Any) -> None:
    """Dynamo guard: the guarded function's code is the code of the function its path names here (what
    ``CLOSURE_MATCH`` checks of a Python function)."""
    from torch._dynamo.source import AttrSource
    from torch._guards import Guard

    Guard(AttrSource(guard.originating_source, "__code__"), named_id_match, user_stack=guard.user_stack).create(builder)


# ----------------------------------------------------------------------------------------------- paths
def _canonical(value: Any) -> Path | None:
    """``value``'s module and qualified name, where they lead back to it."""
    if isinstance(value, types.ModuleType):
        name = getattr(value, "__name__", None)
        return (("module", name),) if isinstance(name, str) and sys.modules.get(name) is value else None
    if isinstance(value, enum.Enum):  # a member: its class's name, then the member's
        owner = _canonical(type(value))
        return (*owner, ("attr", value.name)) if owner and getattr(type(value), value.name, None) is value else None
    module = getattr(value, "__module__", None)
    if module is None and isinstance(value, types.BuiltinFunctionType):
        owner = getattr(value, "__self__", None)
        module = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
    qualname = getattr(value, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or "<" in qualname or module not in sys.modules:
        return None
    path = (("module", module), *(("attr", part) for part in qualname.split(".")))
    try:
        return path if _walk_path(path) is value else None
    except Exception:  # noqa: BLE001 - any failure means the name does not lead back
        return None


def _walk(fn: types.FunctionType) -> Path | None:
    """A path to ``fn`` from the object its module and qualified name do name (a decorator's wrapper, a property),
    through :func:`_children`, at most :data:`MAX_WALK` steps; breadth first."""
    module, qualname = getattr(fn, "__module__", None), fn.__qualname__
    if not isinstance(module, str) or "<" in qualname or module not in sys.modules:
        return None
    root = (("module", module), *(("attr", part) for part in qualname.split(".")))
    try:
        start = _walk_path(root)
    except Exception:  # noqa: BLE001
        return None
    frontier, seen = [(start, root)], {id(start)}
    for _ in range(MAX_WALK):
        nxt = []
        for obj, path in frontier:
            for step, child in _children(obj):
                if child is fn:
                    return (*path, step)
                if id(child) not in seen and isinstance(child, (types.FunctionType, types.MethodType, property,
                                                                 staticmethod, classmethod)):
                    seen.add(id(child))
                    nxt.append((child, (*path, step)))
        frontier = nxt
    return None


def _children(obj: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """The objects a function may be reached through from ``obj``: a property's accessors, a method's or
    static/class method's function, a function's ``__wrapped__`` and closure cells.  Only these types are opened,
    and only by attributes that run no user code (no ``__getattr__``)."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    if isinstance(obj, property):
        out += [(("attr", a), getattr(obj, a)) for a in ("fget", "fset", "fdel") if getattr(obj, a) is not None]
    elif isinstance(obj, (types.MethodType, staticmethod, classmethod)):
        out.append((("attr", "__func__"), obj.__func__))
    elif isinstance(obj, types.FunctionType):
        if "__wrapped__" in obj.__dict__:
            out.append((("attr", "__wrapped__"), obj.__dict__["__wrapped__"]))
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                out.append((("cell", i), cell.cell_contents))
            except ValueError:  # an empty cell
                continue
    return out


def _from_source(source: Any) -> Path | None:
    """Dynamo's source of a guarded value as a path, where it starts at a module global (rule 4)."""
    from torch._dynamo import source as src

    steps: list[Any] = []
    while source is not None:
        kind = type(source).__name__
        if isinstance(source, src.GlobalSource):
            name = source.global_name
            if name.startswith("__import_"):
                module = name[len("__import_"):].replace("_dot_", ".")
                return (("module", module), *reversed(steps)) if module in sys.modules else None
            module = getattr(_frame, "module", None)  # a plain global of the frame's own module
            return (("global", module, name), *reversed(steps)) if module in sys.modules else None
        if kind in ("AttrSource", "GenericAttrSource"):
            steps.append(("attr", source.member))
        elif kind == "CodeSource":
            steps.append(("attr", "__code__"))
        elif kind == "ClosureSource":
            steps.append(("attr", "__closure__"))
        elif kind == "TypeMROSource":
            steps.append(("attr", "__mro__"))
        elif kind == "TypeSource":
            steps.append(("type",))
        elif kind == "TypeDictSource":
            steps.append(("dict",))
        elif kind in ("GetItemSource", "DictGetItemSource") and not getattr(source, "index_is_slice", False) \
                and type(source.index) in (int, str):
            steps.append(("item", source.index))
        else:
            return None
        source = getattr(source, "base", None)
    return None


def _repoint(guard: Any, create_fn: Any) -> None:
    """Make ``guard`` (a ``torch._guards.Guard``, mutable) build with ``create_fn`` from now on."""
    hash(guard)  # Dynamo caches a guard's hash on first use: keep the one it had
    guard.create_fn = create_fn
    guard.guard_types = None
    guard.code_list = None


def _describe(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return f"{type(value).__name__} {name}" if name else f"a {type(value).__name__}"
