"""What every library case is (:mod:`tools.cases.libs`, :mod:`tools.cases.vision`): a :class:`Case` in a table
builds a :class:`Setup`, the calls a user of its library makes.  Its own module, so that the vision cases, which
:mod:`tools.cases.libs` lists, need not import that module back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: A compiler as a case calls it: ``compiler(target, dynamic=...)`` -> a callable used in ``target``'s place.
Compiler = Callable[..., Callable[..., Any]]


@dataclass
class Setup:
    """A built case: what to compile, and the calls a user of the library makes with it.

    Attributes:
        target: what the user hands to the compiler (a module, or a bound ``forward`` for ``generate``).
        dynamic: the ``dynamic=`` the user passes (None: torch.compile's automatic dynamic shapes).
        run: ``run(fn)`` puts ``fn`` (the compiled target, or ``target`` itself for eager) where the library calls
            it, makes the user's calls, and returns ``{name: tensor}`` (moved to the CPU).
        call: ``call(fn, i)``: the ``i``-th call of a server's mix, sizes alternating from call to call (timing).
        eager_equal: the outputs must equal eager's bit for bit too (greedy token ids).
    """

    target: Any
    dynamic: bool | None
    run: Callable[[Callable[..., Any]], dict[str, torch.Tensor]]
    call: Callable[[Callable[..., Any], int], Any]
    eager_equal: bool = False


@dataclass(frozen=True)
class Case:
    """One case: its family (tests share one cold build per family), the Python package it needs, its builder."""

    name: str
    family: str
    needs: str
    make: Callable[..., Setup]
    defaults: dict[str, Any] = field(default_factory=dict)
