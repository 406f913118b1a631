"""Inductor options as key factors: explicit config patches normalized, and the effective config's digest."""

from __future__ import annotations

import json
from typing import Any

from precompile.inductor import shim


def inductor_config_overrides(options: dict[str, Any] | None) -> dict[str, Any]:
    """Normalized Inductor config patches for the artifact key.

    Entries equal to Inductor's default are dropped (``{"max_autotune": False}`` keys like ``{}``); nested
    dicts are flattened to dotted names.

    Raises:
        KeyError: an option is not an Inductor config name (the message lists close names).
        TypeError: a value is not JSON-representable (bool, int, float, str, None, list, dict).
    """
    entries = shim.config_entries()
    out: dict[str, Any] = {}
    for name, value in _flatten(options or {}).items():
        entry = entries.get(name)
        if entry is None:
            import difflib

            close = difflib.get_close_matches(name, list(entries), n=3)
            raise KeyError(f"{name!r} is not an Inductor config option" + (f"; did you mean {close}?" if close else ""))
        _check_jsonable(name, value)
        default = entry.default
        if _is_real_default(default) and value == default:
            continue
        out[name] = value
    return dict(sorted(out.items()))


def _flatten(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    entries = shim.config_entries()
    flat: dict[str, Any] = {}
    for k, v in options.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and name not in entries:
            flat.update(_flatten(v, name + "."))
        else:
            flat[name] = v
    return flat


def _is_real_default(value: Any) -> bool:
    return type(value) is not object


def _check_jsonable(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"Inductor option {name!r} has value {value!r}, which cannot be stored in a key "
                        "(use bool, int, float, str, None, lists and dicts)") from err



def effective_config(options: dict[str, Any] | None) -> dict[str, Any]:
    """Inductor's whole effective config with ``options`` applied, JSON-ready, sorted by name.

    This is what Inductor's own FX graph cache keys on (``save_config_portable``), so it also catches settings
    that ``options`` does not show: ``TORCHINDUCTOR_*`` environment variables and assignments to
    ``torch._inductor.config`` made by the caller.  A value that JSON cannot hold is named by its importable
    ``module:qualname``, its ``uuid()`` (Inductor's custom passes) or its ``repr``; an unstable repr can only
    cost cache misses, never a wrong hit.

    Raises:
        KeyError / TypeError: as :func:`inductor_config_overrides`.
    """
    patches = inductor_config_overrides(options)
    return {name: _jsonable(value) for name, value in sorted(shim.effective_config(patches).items())}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    uuid = getattr(value, "uuid", None)
    if callable(uuid):
        try:
            return {"uuid": repr(uuid())}
        except Exception:  # noqa: BLE001 - a pass without a usable uuid is named by repr below
            pass
    module, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qual and "<" not in qual:
        return {"fn": f"{module}:{qual}"}
    return {"repr": repr(value)}


def with_workarounds(patches: dict[str, Any]) -> dict[str, Any]:
    """``patches`` plus the patches precompile needs for Inductor to produce a working callable.

    - ``triton.multi_kernel`` on: ``triton.autotune_at_compile_time`` off.  ``standalone_compile`` turns
      autotuning at compile time on, and with it Inductor writes the multi-kernel definitions into the
      compile-time autotuning block only, not into the wrapper, whose call then fails with ``NameError:
      multi_kernel_0`` (torch 2.11 and 2.13, ``PythonWrapperCodegen._write_multi_kernel_defs``).  Kernels then
      autotune, and multi-kernels pick, on the build's first run, which the artifact stores.

    The result is what is compiled and what the key holds, so the patch is visible in ``precompile inspect``.
    """
    effective = shim.effective_config(patches)
    out = dict(patches)
    if effective.get("triton.multi_kernel") and "triton.autotune_at_compile_time" not in patches:
        out["triton.autotune_at_compile_time"] = False
    return dict(sorted(out.items()))
