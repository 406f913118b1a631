"""Checking what an artifact is called with: each input against its placeholder's spec, then the size guards.

Static sizes, strides, dtypes, device types and int values are checked per placeholder; symbolic sizes (written
as expressions like ``"s0"`` or ``"16*s0"`` in the spec) are checked by the artifact's size guards
(:class:`precompile.guards.Guards`), which also bound each symbol to its range.  A failed check is an
:class:`~precompile.errors.InputMismatchError` that names every placeholder concerned and what was expected,
before any kernel runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from precompile.errors import ArtifactFormatError, InputMismatchError
from precompile.guards import Guards, GuardSyntaxError, evaluate_size


class InputCheck:
    """The check of one placeholder (built from its spec in the manifest)."""

    __slots__ = ("name", "is_tensor", "dtype", "shape", "stride", "device", "value", "text")

    def __init__(self, name: str, is_tensor: bool, dtype: torch.dtype | None,
                 shape: tuple[int | None, ...] | None, device: str | None,
                 stride: tuple[int | None, ...] | None = None, value: int | float | None = None):
        self.name, self.is_tensor = name, is_tensor
        self.dtype, self.shape, self.device, self.stride, self.value = dtype, shape, device, stride, value
        dims = "x".join("?" if d is None else str(d) for d in (shape or ()))
        self.text = (f"tensor[{dims}] {str(dtype).removeprefix('torch.')} on {device}" if is_tensor
                     else "a number" if value is None else f"the number {value}")

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> InputCheck:
        """The check for one placeholder spec (see :class:`~precompile.manifest.Manifest`).

        Raises:
            ArtifactFormatError: the spec names a dtype torch does not have.
        """
        if spec.get("type") != "tensor":
            value = spec.get("value")
            return cls(spec["name"], False, None, None, None, value=value if isinstance(value, (int, float)) else None)
        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ArtifactFormatError(f"placeholder {spec['name']!r} has dtype {spec['dtype']!r}, not a torch dtype")
        shape = tuple(d if isinstance(d, int) else None for d in spec["shape"])
        stride = tuple(d if isinstance(d, int) else None for d in spec.get("stride") or ()) or None
        return cls(spec["name"], True, dtype, shape, spec["device"], stride)

    def problem(self, value: Any) -> str | None:
        """None if ``value`` fits this placeholder, else what is wrong, in words."""
        if not self.is_tensor:
            if isinstance(value, torch.SymInt):
                return None
            if not isinstance(value, (int, float)):
                return f"expected {self.text}, got {type(value).__name__}"
            if self.value is not None and value != self.value:
                return f"expected {self.text} (the compiled code is specialized to it), got {value}"
            return None
        if not isinstance(value, torch.Tensor):
            return f"expected {self.text}, got {type(value).__name__}"
        if value.dtype != self.dtype or value.device.type != self.device or value.dim() != len(self.shape) or any(
                e is not None and e != s for e, s in zip(self.shape, value.shape)):
            got = "x".join(map(str, value.shape))
            return f"expected {self.text}, got tensor[{got}] {str(value.dtype).removeprefix('torch.')} on {value.device.type}"
        if self.stride is not None and len(self.stride) == value.dim() and value.numel() and any(
                e is not None and n > 1 and e != s for e, s, n in zip(self.stride, value.stride(), value.shape)):
            # the compiled code indexes with the example's strides (Inductor asserts them; dims of size 1 are free)
            want = ", ".join("?" if e is None else str(e) for e in self.stride)
            return (f"expected {self.text} with stride ({want}), got stride {tuple(value.stride())} "
                    "(e.g. a transposed or sliced view); pass .contiguous() or a tensor laid out like the example")
        return None


class CallChecks:
    """Every check one call of an artifact makes: per placeholder, then the size guards.

    Args:
        placeholders: the manifest's placeholder specs.
        shapes: the manifest's ``shapes`` (``{"symbols": {...}, "guards": expression or None}``).

    Raises:
        ArtifactFormatError: a spec or the guard expression is malformed (a damaged or hostile manifest).
    """

    def __init__(self, placeholders: list[dict[str, Any]], shapes: dict[str, Any] | None):
        self.checks = [InputCheck.from_spec(spec) for spec in placeholders]
        shapes = shapes or {}
        self.symbols: dict[str, dict[str, Any]] = dict(shapes.get("symbols") or {})
        try:
            self.guards = Guards(shapes["guards"], [s["name"] for s in placeholders]) if shapes.get("guards") else None
        except GuardSyntaxError as err:
            raise ArtifactFormatError(f"the manifest's size guards are not valid: {err}") from err

    def problems(self, flat: Sequence[Any], skip: set[int] | frozenset[int] = frozenset()) -> list[str]:
        """What is wrong with ``flat``, one line per placeholder or broken guard (empty when it fits).

        Args:
            skip: placeholders already checked (bound weights), left out of the per-placeholder checks.
        """
        out = []
        for i, (check, value) in enumerate(zip(self.checks, flat)):
            if i in skip:
                continue
            p = check.problem(value)
            if p:
                out.append(f"  {check.name}: {p}")
        if not out and self.guards is not None:
            broken = self.guards.failures(flat)
            if broken:
                ranges = ", ".join(f"{name} in [{r['range'][0]}, {'inf' if r['range'][1] is None else r['range'][1]}]"
                                   for name, r in self.symbols.items())
                out.append(f"  sizes outside what the artifact was compiled for ({ranges}): " + "; ".join(broken))
        return out

    def check(self, flat: Sequence[Any], key: str, skip: set[int] | frozenset[int] = frozenset()) -> None:
        """Raise :class:`InputMismatchError` naming every problem :meth:`problems` finds."""
        problems = self.problems(flat, skip)
        if problems:
            raise InputMismatchError(f"inputs do not match artifact {key[:12]}:\n" + "\n".join(problems))

    def example_sizes(self) -> dict[str, int] | None:
        """Each symbol's example value (hint) at build, or None when one has none."""
        hints = {name: s.get("hint") for name, s in self.symbols.items()}
        return None if any(not isinstance(v, int) for v in hints.values()) else hints  # type: ignore[return-value]


def size_at(spec_size: int | str, sizes: dict[str, int]) -> int:
    """A spec's size (an int or an expression over symbols) for the given symbol values.

    Raises:
        ArtifactFormatError: the expression is not plain arithmetic over known symbols.
    """
    try:
        return evaluate_size(spec_size, sizes)
    except (GuardSyntaxError, NameError, TypeError, ValueError, ZeroDivisionError) as err:
        raise ArtifactFormatError(f"size expression {spec_size!r} cannot be evaluated: {err}") from err
