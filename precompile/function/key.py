"""The key of a whole-function artifact, computed before anything is traced.

What a call of a compiled function looks up depends on nothing Dynamo would have to trace:

| factor | what |
|---|---|
| ``function`` | the function's module and qualified name, and the sha256 of its source (of its bytecode where there is no source) |
| ``args`` | per argument: a tensor's dtype, device, rank, requires_grad (and shape with ``dynamic=False``); a module's class and the name, shape, dtype, device and requires_grad of each parameter and buffer (hashed); a number's or string's type (bools, None and strings: the value) |
| ``dynamic``, ``fullgraph``, ``options`` | as given to :func:`precompile.compile` (``options`` with its ``mode``'s) |
| ``cudagraphs`` | whether the ``mode`` replays CUDA graphs (added by :mod:`precompile.function.compiled`) |
| ``ambient`` | grad mode, autocast, ... (:mod:`precompile.key.ambient`) and the SDPA backends enabled |
| ``env`` | the key fields of the environment fingerprint |
| ``format`` | precompile's format version, and ``kind: "function"`` |

Sizes are not factors (unless ``dynamic=False``): Dynamo's stored guards check them on every call, and a call they
refuse is traced and added to the same artifact.  The functions Dynamo inlines are not factors either, since they
are known only after tracing: the artifact records each one's source hash, and a load checks them
(:func:`precompile.function.sources.changed`), so an edited helper is a miss with its reason.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from precompile import config
from precompile.manifest.function_manifest import KIND
from precompile.key import fingerprint
from precompile.key.ambient import ambient_state
from precompile.key.graph import canonical_json
from precompile.key.plan import compute_key


def code_digest(fn: Callable[..., Any]) -> str:
    """sha256 hex of ``fn``'s source text, or of its code object's bytecode and constants where Python has no
    source for it (a function made by ``exec``, a REPL)."""
    target = inspect.unwrap(fn)
    try:
        text = inspect.getsource(target)
        return hashlib.sha256(text.encode()).hexdigest()
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        if code is None:
            return hashlib.sha256(type(target).__qualname__.encode()).hexdigest()
        return hashlib.sha256(_code_bytes(code)).hexdigest()


def _code_bytes(code: types.CodeType) -> bytes:
    consts = [(_code_bytes(c) if isinstance(c, types.CodeType) else repr(c).encode()) for c in code.co_consts]
    return code.co_code + b"\0".join(consts) + repr(code.co_names).encode()


def function_identity(fn: Callable[..., Any]) -> dict[str, str]:
    """``{"module", "qualname", "source"}`` of a function or bound method (its function's)."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    return {"module": getattr(target, "__module__", None) or "?",
            "qualname": getattr(target, "__qualname__", type(target).__qualname__),
            "source": code_digest(target)}


def _module_spec(mod: torch.nn.Module) -> dict[str, Any]:
    h = hashlib.sha256()
    for kind, items in (("p", mod.named_parameters()), ("b", mod.named_buffers())):
        for name, t in items:
            h.update(f"{kind}|{name}|{tuple(t.shape)}|{t.dtype}|{t.device.type}|{t.requires_grad};".encode())
    cls = type(mod)
    return {"module": f"{cls.__module__}.{cls.__qualname__}", "state": h.hexdigest(), "training": mod.training}


def arg_spec(value: Any, *, shapes: bool) -> Any:
    """The key factor of one argument (see the module docstring); containers are walked."""
    if isinstance(value, torch.Tensor):
        spec: dict[str, Any] = {"dtype": str(value.dtype).removeprefix("torch."), "device": value.device.type,
                                "rank": value.dim(), "requires_grad": value.requires_grad}
        if shapes:
            spec["shape"] = list(value.shape)
        return spec
    if isinstance(value, torch.nn.Module):
        return _module_spec(value)
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if isinstance(value, (int, float)):
        return {"type": type(value).__name__}
    if isinstance(value, (list, tuple)):
        return {"seq": type(value).__name__, "items": [arg_spec(v, shapes=shapes) for v in value]}
    if isinstance(value, Mapping):
        return {"map": type(value).__name__,
                "items": {str(k): arg_spec(v, shapes=shapes) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}}
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def _devices(values: list[Any]) -> set[str]:
    found: set[str] = set()

    def visit(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            found.add(v.device.type)
        elif isinstance(v, torch.nn.Module):
            for t in v.parameters():
                found.add(t.device.type)
                break
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, Mapping):
            for x in v.values():
                visit(x)

    for v in values:
        visit(v)
    return found or {"cpu"}


def function_factors(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                     dynamic: bool | None, fullgraph: bool, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The key factors of calling ``fn(*args, **kwargs)`` as a compiled function (module docstring).

    ``fn`` may be a bound method (``module.forward``): its ``self`` counts as the first argument; or a
    ``functools.partial`` (accelerate's hooks set ``module.forward`` to a partial of their wrapper and the module):
    its function is the function, and its arguments count as arguments.

    Raises:
        TypeError: ``options`` holds a value JSON cannot carry.
    """
    while isinstance(fn, functools.partial):
        args, kwargs = (*fn.args, *args), {**fn.keywords, **kwargs}
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    values = ([owner] if owner is not None else []) + list(args) + [kwargs[k] for k in sorted(kwargs)]
    shapes = dynamic is False
    devices = _devices(values)
    ambient = ambient_state(devices, cpp_threads_fixed=False)
    cuda = torch.backends.cuda
    ambient["sdpa_enabled"] = [name for name in ("flash", "mem_efficient", "math", "cudnn")
                               if getattr(cuda, f"{name}_sdp_enabled")()]
    options_json = json.loads(canonical_json(dict(options or {})))
    return {
        "format": config.FORMAT_VERSION,
        "kind": KIND,
        "function": function_identity(fn),
        "args": {"self": arg_spec(owner, shapes=shapes) if owner is not None else None,
                 "positional": [arg_spec(a, shapes=shapes) for a in args],
                 "keyword": {k: arg_spec(kwargs[k], shapes=shapes) for k in sorted(kwargs)}},
        "dynamic": dynamic,
        "fullgraph": fullgraph,
        "options": options_json,
        "ambient": ambient,
        "env": fingerprint.key_fields(fingerprint.environment(devices, full=False)),
    }


def function_key(factors: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``factors``: the artifact key."""
    return compute_key(factors)
