"""Inductor's effective config, computed once per state of its config module.

``save_config_portable()`` walks every Inductor option (~17 ms on a 2-core CPU); keying a graph asks for it twice
(:mod:`precompile.inductor.options`), so a process keying many graphs under one configuration (vLLM's pieces: 29
at 28 layers) spent most of each piece's key on it.  :func:`remembered` computes it once per *state*: every option
the caller set (each ``user_override``; an alias by the value it reads) and the patches, by value, which is all
that decides it besides the defaults and ``TORCHINDUCTOR_*`` variables, both read once when torch imports the
config module (``torch/utils/_config_module.py``: ``_ConfigEntry``).  Where the config module is not the one this
reads, nothing is remembered and every call computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def remembered(config: Any, patches: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` (the effective config of ``config`` with ``patches``), or a copy of what it returned for the
    same state (:func:`_config_state`) among the last :data:`_EFFECTIVE_MEMO_SIZE` states."""
    state = _config_state(config, patches)
    found = _effective_memo.get(state) if state is not None else None
    if found is not None:
        return dict(found[0])
    out = compute()
    if state is not None:
        if len(_effective_memo) >= _EFFECTIVE_MEMO_SIZE:
            _effective_memo.clear()
        _effective_memo[state] = (dict(out), state)
    return out


#: States of Inductor's config remembered by :func:`effective_config`.
_EFFECTIVE_MEMO_SIZE = 32
#: ``{config state: (effective config, the state itself, which holds the objects named by id alive)}``.
_effective_memo: dict[tuple[Any, ...], tuple[dict[str, Any], tuple[Any, ...]]] = {}


def _config_state(config: Any, patches: dict[str, Any]) -> tuple[Any, ...] | None:
    """What decides ``save_config_portable()`` besides the defaults and the environment (both read once, when torch
    imports the config module): each option the caller set (its ``user_override``; an alias by the value it
    reads) and ``patches``, values by value (lists, dicts and sets included, which may be changed in place) and
    other objects by identity.  None where the config module is not the one this reads (``_config`` entries with
    ``user_override``), or a value cannot be frozen."""
    from torch.utils import _config_module as cm

    unset = getattr(cm, "_UNSET_SENTINEL", None)
    entries = getattr(config, "_config", None)
    if unset is None or not isinstance(entries, dict):
        return None
    try:
        state: list[Any] = []
        for name, entry in entries.items():
            if getattr(entry, "alias", None):
                state.append((name, _frozen(getattr(config, name))))
                continue
            override = entry.user_override
            value = override.get() if hasattr(override, "get") and not isinstance(override, dict) else override
            if value is not unset:
                state.append((name, _frozen(value)))
        state.append(("<patches>", _frozen(patches)))
        return tuple(state)
    except (TypeError, AttributeError, RecursionError):
        return None


def _frozen(value: Any, depth: int = 0) -> Any:
    """A hashable stand-in for ``value``: plain values and containers by value, anything else by identity (the
    object itself is kept with the state, so its id is not reused while the state is remembered).

    Raises:
        TypeError: a container nested deeper than 8 levels.
    """
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return (type(value).__name__, value)
    if depth > 8:
        raise TypeError("config value nested too deep to remember")
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v, depth + 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(_frozen(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), _frozen(v, depth + 1)) for k, v in value.items()), key=lambda kv: kv[0])))
    return ("id", id(value), _Held(value))


class _Held:
    """An object held by a remembered config state, equal to any other holder (the state compares it by id)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Held)

    def __hash__(self) -> int:
        return 0
