"""What Dynamo records of a frame of library code, made storable: its guard state, and the globals it names.

Dynamo stores a frame's guards as the guard list plus a pickle of the values they were built on (torch's
``GuardsStatePickler``, ``torch/_dynamo/guards.py``); a fresh process rebuilds the guard tree from that pickle and
then checks every guard against the live objects of each call.  The pickle is only the *example* the tree is built
on, but it must hold every value a guard source reaches: a ``CONSTANT_MATCH`` takes its expected value from it.

torch 2.11-2.13 store two things of library code in a form that cannot be rebuilt:

- a function that its module does not name under its qualified name: the inner function of a
  ``functools.wraps`` decorator (transformers' ``can_return_tuple``, ``check_model_inputs``, diffusers'
  ``apply_forward_hook``) has the wrapper's ``__qualname__``, so torch's by-reference lookup finds the wrapper
  instead and stores ``_Missing("fqn mismatch")``; a guard on ``L['func'].__code__`` or ``.__defaults__`` then fails
  in the fresh process with ``AttributeError: '_Missing' object has no attribute ...``;
- a plain object in the guard tree (a cache object such as ``StaticCache``, a config) is pickled whole, with
  attributes no guard reads: a lock, a logger, a file.  The frame is then not stored at all.

:class:`Pickler` stores the first by value — its code object, as torch stores a nested function, with its module,
defaults, keyword defaults and closure — and the second with only the attributes the guard tree reads (the others
become torch's own ``_Missing`` placeholder, as torch does for an ``nn.Module``'s attributes).  Neither loosens a
guard: guards are rebuilt from the stored guard list only, and a value stored by value compares as strictly as the
original (a guard on a code object compares it by identity with the code found at the same path).  Everything else goes to torch's pickler.

A frame also names globals that Dynamo installs in the function's module.  For a module object (``type(x)`` of a
tensor guards on ``torch.Tensor``; bytecode that loads a module) it installs one named by the module's ``id()`` in
the building process (``OutputGraph.install_global_by_id``), which the package does not record: a fresh process
lacks that global, so the guard on it fails and the frame is traced again.  :func:`install_global_by_id` names such
a module by its import name instead, as Dynamo's own ``import_source`` does, and records it in the package, which
installs it in the loading process.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import types
from typing import Any

from precompile.inductor.dynamo import named_guards

#: This module's name before precompile.inductor was split into wings (2026-11-27): the guard-state pickles of
#: function artifacts stored before then name its functions by it, and find them under it once it is imported (as
#: :mod:`precompile.inductor.dynamo.pkg` does before it installs a record).
FORMER_NAME = "precompile.inductor.frame_state"
sys.modules.setdefault(FORMER_NAME, sys.modules[__name__])

#: Attribute a reduced plain object's class must not override for the pruned form to rebuild it faithfully.
_DEFAULT_PICKLING = ("__reduce_ex__", "__reduce__", "__getstate__", "__setstate__", "__getnewargs__",
                     "__getnewargs_ex__")


def unpickle_function(code: types.CodeType, module: str, name: str, qualname: str, defaults: tuple[Any, ...] | None,
                      kwdefaults: dict[str, Any] | None, closure: tuple[types.CellType, ...] | None) -> Any:
    """A function rebuilt by value in module ``module``'s globals (what :class:`Pickler` stored).

    Raises:
        ImportError: ``module`` cannot be imported here.
    """
    fn = types.FunctionType(code, importlib.import_module(module).__dict__, name, defaults, closure)
    fn.__qualname__ = qualname
    fn.__kwdefaults__ = kwdefaults
    return fn


def unpickle_object(cls: type, state: dict[str, Any]) -> Any:
    """An instance of ``cls`` made without calling ``__init__``, with ``state`` as its attributes."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def make_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    """``cls(**fields)``: a Dynamo source rebuilt from the fields its constructor takes."""
    return cls(**fields)


def make_cell(value: Any) -> types.CellType:
    """A closure cell holding ``value``."""
    return types.CellType(value)


@functools.cache
def pickler_class() -> type:
    """torch's ``GuardsStatePickler`` with the two reductions of the module docstring added."""
    import torch
    from torch._dynamo.guards import GuardsStatePickler, _Missing
    from torch._guards import Source

    class Pickler(GuardsStatePickler):  # type: ignore[misc, valid-type]
        def reducer_override(self, obj: Any) -> Any:
            named = named_guards.path_for(obj)
            if named is not None:  # an object an identity guard checks: the loading process's object of that name
                return named_guards.resolve, named
            if isinstance(obj, Source) and dataclasses.is_dataclass(obj):
                # by the fields its constructor takes: torch 2.11 pickles every field, init=False ones too
                # (DefaultsSource), and its unpickling then fails with "takes from 3 to 4 positional arguments"
                return make_dataclass, (type(obj), {f.name: getattr(obj, f.name)
                                                    for f in dataclasses.fields(obj) if f.init})
            if id(obj) not in self.missing_values and id(obj) not in self.empty_values:
                if inspect.isfunction(obj) and _unreachable_by_name(obj):
                    return self._function_by_value(obj)
                if isinstance(obj, torch.nn.Module) and id(obj) in self.guard_tree_values:
                    # torch keeps a module's callable attributes whole (``model.forward = compiled`` holds a cache,
                    # a lock): those no guard reads become placeholders, as its other attributes do
                    for attr in vars(obj).values():
                        if callable(attr) and not isinstance(attr, (type, torch.Tensor, torch.nn.Module)) \
                                and id(attr) not in self.guard_tree_values:
                            self.missing_values[id(attr)] = attr
                if id(obj) in self.guard_tree_values and _plain_object(obj):
                    state = {k: v if id(v) in self.guard_tree_values or _scalar(v) else _Missing("not guarded")
                             for k, v in vars(obj).items()}
                    return unpickle_object, (type(obj), state)
            return super().reducer_override(obj)

        def _function_by_value(self, fn: types.FunctionType) -> Any:
            closure = None
            if fn.__closure__ is not None:
                # a cell no guard reaches holds whatever the decorator closed over (often the model's config):
                # stored as a placeholder, as torch stores a module attribute no guard reads
                closure = tuple(c if id(c) in self.guard_tree_values else make_cell(_Missing("not guarded"))
                                for c in fn.__closure__)
            return unpickle_function, (fn.__code__, fn.__module__, fn.__name__, fn.__qualname__, fn.__defaults__,
                                       fn.__kwdefaults__, closure)

    # torch's reductions name ``type(self)._unpickle_*``: the class must be found by name where it is unpickled
    Pickler.__module__, Pickler.__qualname__ = __name__, "Pickler"
    return Pickler


def __getattr__(name: str) -> Any:
    if name == "Pickler":  # made on first use: building it imports Dynamo
        return pickler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unreachable_by_name(fn: types.FunctionType) -> bool:
    """True for a module-level function that its module does not hold under its qualified name (torch's
    "fqn mismatch"), and whose module is importable by name, so that it can be rebuilt by value."""
    module = getattr(fn, "__module__", None)
    if "<locals>" in fn.__qualname__ or not isinstance(module, str) or module not in sys.modules:
        return False
    found: Any = sys.modules[module]
    for part in fn.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is not fn


def _plain_object(obj: Any) -> bool:
    """True for an instance of a Python class that pickles by its ``__dict__`` with no say of its own, and is
    neither a tensor, a module, a function, a class nor a container (torch's pickler owns those)."""
    import torch

    cls = type(obj)
    if cls.__module__ == "builtins" or isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType,
                                                       torch.Tensor, torch.nn.Module, tuple, list, dict, set)):
        return False
    if not isinstance(getattr(obj, "__dict__", None), dict) or hasattr(cls, "__slots__"):
        return False
    if cls.__qualname__ != cls.__name__:  # a class in local scope cannot be found by name: torch refuses it
        return False
    return all(getattr(cls, name, None) is getattr(object, name, None) for name in _DEFAULT_PICKLING)


def _scalar(value: Any) -> bool:
    """Values kept whatever the guard tree says: they carry no state and pickle as themselves."""
    return value is None or type(value) in (bool, int, float, str, bytes)


def install_global_by_id(original: Any, ours: Any) -> Any:
    """``OutputGraph.install_global_by_id`` that, while a package for which ``ours(package)`` is true records the
    frame, installs a module importable by its name under Dynamo's import alias (``__import_<name>``) and records
    the alias in the package."""

    @functools.wraps(original)
    def wrapped(self: Any, prefix: str, value: Any) -> str:
        package = getattr(self, "package", None)
        name = getattr(value, "__name__", None)
        if not (package is not None and ours(package) and isinstance(value, types.ModuleType)
                and isinstance(name, str) and sys.modules.get(name) is value):
            return original(self, prefix, value)
        alias = f"__import_{name.replace('.', '_dot_')}"
        package.add_import_source(alias, name)
        self.import_sources[alias] = name
        if alias not in self.global_scope:
            self.install_global_unsafe(alias, value)
        elif self.global_scope[alias] is not value:
            return original(self, prefix, value)
        return alias

    return wrapped
