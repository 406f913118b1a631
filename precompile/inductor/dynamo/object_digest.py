"""What an object named by an import path must still be when another process resolves the path.

An identity guard stored by path (:mod:`precompile.inductor.dynamo.named_guards`) would hold for *whatever* the
path holds in the loading process.  When the frame reaches the object through that same path (a module global
called by name), that check could never fail: a function monkeypatched at its import path before the call (as
kernel libraries patch ``modeling_llama.apply_rotary_pos_emb``) would be served the stored code for the old one.
So each stored path carries a digest of what the object was, and the loading process accepts the object at the path
only if its digest is the same (:func:`digest`):

| object | digest of |
|---|---|
| Python function | module, qualified name, code (below), defaults and keyword defaults (constants by value, other objects by type) |
| code object | bytecode, constants (nested code objects by the same digest), names, variable and free names, argument counts, flags; never file names or line numbers, so the same code installed elsewhere digests the same |
| class | module, qualified name, base classes' names, and the digest of each function, property and static/class method it defines |
| module | its name (a module is its name) |
| builtin function or method | module and qualified name |
| enum member | its class's digest, its name and its value |

Any other object has no digest: no path is stored for it, and its frame is left out of the stored function.
"""

from __future__ import annotations

import enum
import hashlib
import types
from typing import Any

#: Constants whose value a digest includes; any other default contributes its type's name only.
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def digest(obj: Any) -> str | None:
    """sha256 hex of what ``obj`` is (module docstring), or None for an object with no digest."""
    h = hashlib.sha256()
    if not _feed(h, obj, depth=0):
        return None
    return h.hexdigest()


def code_bytes(code: types.CodeType) -> bytes:
    """The bytes a code object's digest is made of (module docstring)."""
    parts = [code.co_code, repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                                 code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                                 code.co_flags)).encode()]
    for const in code.co_consts:
        parts.append(code_bytes(const) if isinstance(const, types.CodeType) else _plain(const))
    return b"\0".join(parts)


def _plain(value: Any) -> bytes:
    if type(value) in _PLAIN:
        return repr(value).encode()
    if type(value) in (tuple, frozenset):
        items = sorted(value, key=repr) if type(value) is frozenset else value
        return b"(" + b",".join(_plain(v) for v in items) + b")"
    return f"<{type(value).__module__}.{type(value).__qualname__}>".encode()


def _feed(h: Any, obj: Any, depth: int) -> bool:
    if isinstance(obj, types.ModuleType):
        h.update(b"module " + str(obj.__name__).encode())
    elif isinstance(obj, types.CodeType):
        h.update(b"code " + code_bytes(obj))
    elif isinstance(obj, types.FunctionType):
        h.update(f"function {obj.__module__}.{obj.__qualname__} ".encode() + code_bytes(obj.__code__))
        h.update(_plain(obj.__defaults__) + _plain(tuple(sorted((obj.__kwdefaults__ or {}).items()))))
    elif isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
        h.update(f"builtin {getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', None)}".encode())
    elif isinstance(obj, enum.Enum):
        h.update(f"enum {obj.name} ".encode() + _plain(obj.value))
        return _feed(h, type(obj), depth)
    elif isinstance(obj, type):
        h.update(f"class {obj.__module__}.{obj.__qualname__} ".encode())
        h.update(" ".join(f"{b.__module__}.{b.__qualname__}" for b in obj.__bases__).encode())
        if depth == 0:  # the class's own functions; a class an attribute holds counts by its name only
            for name, attr in sorted(vars(obj).items()):
                fn = _function_of(attr)
                if fn is not None:
                    h.update(f" {name}=".encode())
                    _feed(h, fn, depth + 1)
    else:
        return False
    return True


def _function_of(attr: Any) -> Any:
    """The function a class attribute defines: a plain function, a static or class method's, a property's getter."""
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    elif isinstance(attr, property):
        attr = attr.fget
    return attr if isinstance(attr, types.FunctionType) else None
