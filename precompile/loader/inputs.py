"""Checking what an artifact is called with: each input against its placeholder's spec, then the size guards.

Static sizes, strides, dtypes, device types (and the CUDA device index an artifact's kernels are loaded for) and
int values are checked per placeholder; symbolic sizes (written as expressions like ``"s0"`` or ``"16*s0"`` in
the spec) are checked by the artifact's size guards (:class:`precompile.key.guards.Guards`), which also bound
each symbol to its range.  A failed check is an :class:`~precompile.errors.InputMismatchError` that names every
placeholder concerned and what was expected, before any kernel runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from precompile.errors import ArtifactFormatError, InputMismatchError
from precompile.key.guards import Guards, GuardSyntaxError, evaluate_size


class InputCheck:
    """The check of one placeholder (built from its spec in the manifest)."""

    __slots__ = ("name", "is_tensor", "dtype", "shape", "stride", "device", "index", "value", "text")

    def __init__(self, name: str, is_tensor: bool, dtype: torch.dtype | None,
                 shape: tuple[int | None, ...] | None, device: str | None,
                 stride: tuple[int | None, ...] | None = None, value: int | float | None = None,
                 index: int | None = None):
        self.name, self.is_tensor = name, is_tensor
        self.dtype, self.shape, self.device, self.stride, self.value = dtype, shape, device, stride, value
        #: the CUDA device index the artifact was compiled for (its kernels are loaded there); None off CUDA
        self.index = index if index is not None else (0 if device == "cuda" else None)
        dims = "x".join("?" if d is None else str(d) for d in (shape or ()))
        where = f"{device}:{self.index}" if self.index else device
        self.text = (f"tensor[{dims}] {str(dtype).removeprefix('torch.')} on {where}" if is_tensor
                     else "a number" if value is None else f"the number {value}")

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> InputCheck:
        """The check for one placeholder spec (see :class:`~precompile.manifest.manifest.Manifest`).

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
        index = spec.get("device_index")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 4096):
            raise ArtifactFormatError(f"placeholder {spec['name']!r} has device index {str(index)[:20]!r}")
        return cls(spec["name"], True, dtype, shape, spec["device"], stride, index=index)

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
        if self.index is not None and value.device.index != self.index:
            return (f"expected {self.text}, got a tensor on {value.device} (the artifact's kernels are compiled and "
                    f"loaded for cuda:{self.index}; a process on another GPU keys and builds its own)")
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
        #: the generated happy-path check per set of skipped (bound) placeholders (:func:`fast_check`)
        self._fast: dict[frozenset[int], Callable[[Sequence[Any]], bool]] = {}
        self._native: set[frozenset[int]] = set()
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
        """Raise :class:`InputMismatchError` naming every problem :meth:`problems` finds.

        The common case costs one call of a function generated for ``skip`` (:func:`fast_check`): it accepts
        exactly what :meth:`problems` accepts in its strictest reading.  Anything else it does not accept - a
        mismatch, or a tolerated difference such as a free stride on a dimension of size 1 - goes through
        :meth:`problems`, which decides and words the error."""
        fast = self._fast.get(skip) if type(skip) is frozenset else None
        if fast is None:
            skip = frozenset(skip)
            fast = self._fast[skip] = fast_check(self.checks, skip, self.guards)
        if fast(flat):
            if skip not in self._native:
                self._upgrade(flat, skip)
            return
        problems = self.problems(flat, skip)
        if problems:
            raise InputMismatchError(f"inputs do not match artifact {key[:12]}:\n" + "\n".join(problems))

    def _upgrade(self, flat: Sequence[Any], skip: frozenset[int]) -> None:
        """After the first call the Python check accepted: the same check with its tensor part in one C++ call
        (:mod:`precompile.inductor.load.tensor_guards`), built from this call's tensors so that their dispatch keys
        (grad or inference mode) are the reference.  Tried once per ``skip``."""
        self._native.add(skip)
        native = fast_check(self.checks, skip, self.guards, examples=flat)
        if native is not None:
            self._fast[skip] = native

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


#: Device types with a tensor property that answers without building a ``torch.device``.
_DEVICE_FLAG = {"cpu": "is_cpu", "cuda": "is_cuda", "meta": "is_meta", "xpu": "is_xpu", "mps": "is_mps"}


def _strides(c: InputCheck) -> tuple[int | None, ...] | None:
    """The strides a fast check compares: the spec's, free (None) where the size is 1 (any stride is valid there)."""
    if c.stride is None or c.shape is None or len(c.stride) != len(c.shape):
        return None
    return tuple(None if n == 1 else st for st, n in zip(c.stride, c.shape))


def fast_check(checks: Sequence[InputCheck], skip: frozenset[int], guards: Guards | None,
               examples: Sequence[Any] | None = None) -> Callable[[Sequence[Any]], bool] | None:
    """A function ``ok(flat) -> bool`` that is True only for inputs every check accepts: per placeholder not in
    ``skip``, a tensor of the exact dtype, device type (and CUDA device index), rank, static sizes and strides (free
    on dimensions of size 1), or a number of the exact type and specialized value; then the size guards.  False
    means "not sure": the caller runs the full check.

    The function is generated once per artifact (and per set of bound placeholders) as straight-line Python, so a
    call pays a few attribute reads and comparisons per input instead of a method call and generator per input.  Its
    text is written here from fixed templates and integers (indices, ranks, static sizes and strides, each passed
    through ``int``); dtypes, device names and specialized numbers are objects in its namespace, never text.

    With ``examples`` (a call's inputs that passed), the tensor part is instead one call of torch's C++ tensor check
    built from them (:func:`precompile.inductor.load.tensor_guards.tensor_check`), which also requires their dispatch
    keys, device index and requires_grad; the function is then None where torch cannot provide that check.
    """
    ns: dict[str, Any] = {"T": torch.Tensor, "isinstance": isinstance, "len": len, "type": type, "int": int,
                          "float": float, "G": guards._all if guards is not None else None}
    lines = ["def ok(flat):", f"    if len(flat) != {len(checks)}:", "        return False"]
    tensors = [i for i, c in enumerate(checks) if c.is_tensor and i not in skip]
    if examples is not None:
        from operator import itemgetter

        from precompile.inductor.load.tensor_guards import tensor_check

        if not tensors or any(not isinstance(examples[i], torch.Tensor) for i in tensors):
            return None
        native = tensor_check([examples[i] for i in tensors], [checks[i].shape or () for i in tensors],
                              [_strides(checks[i]) for i in tensors])
        if native is None:
            return None
        ns["TG"] = native
        if len(tensors) == 1:
            lines += [f"    if not TG(flat[{tensors[0]}]):", "        return False"]
        else:
            ns["PICK"] = itemgetter(*tensors)
            lines += ["    if not TG(*PICK(flat)):", "        return False"]
    for i, c in enumerate(checks):
        if i in skip or (examples is not None and c.is_tensor):
            continue
        lines.append(f"    x = flat[{i}]")
        if not c.is_tensor:
            if c.value is None:
                lines += ["    if type(x) is not int and type(x) is not float:", "        return False"]
            else:
                ns[f"V{i}"], ns[f"VT{i}"] = c.value, type(c.value)
                lines += [f"    if type(x) is not VT{i} or x != V{i}:", "        return False"]
            continue
        assert c.shape is not None
        ns[f"D{i}"] = c.dtype
        conds = ["isinstance(x, T)", f"x.dtype is D{i}"]
        flag = _DEVICE_FLAG.get(str(c.device))
        if flag is not None:
            conds.append(f"x.{flag}")
        else:
            ns[f"DEV{i}"] = c.device
            conds.append(f"x.device.type == DEV{i}")
        if c.index is not None:
            conds.append(f"x.get_device() == {int(c.index)}")
        lines += ["    if not (" + " and ".join(conds) + "):", "        return False", "    s = x.shape"]
        if all(d is not None for d in c.shape):
            ns[f"S{i}"] = tuple(c.shape)
            lines += [f"    if s != S{i}:", "        return False"]
        else:
            static = "".join(f" or s[{j}] != {int(d)}" for j, d in enumerate(c.shape) if d is not None)
            lines += [f"    if len(s) != {len(c.shape)}{static}:", "        return False"]
        strides = _strides(c)
        if strides is not None and any(st is not None for st in strides):
            if all(st is not None for st in strides):
                ns[f"ST{i}"] = strides
                lines += [f"    if x.stride() != ST{i}:", "        return False"]
            else:
                lines += ["    st = x.stride()",
                          "    if " + " or ".join(f"st[{j}] != {int(st)}" for j, st in enumerate(strides)
                                                  if st is not None) + ":",
                          "        return False"]
    if guards is not None:
        lines += ["    try:", "        return bool(G(flat))", "    except Exception:", "        return False"]
    else:
        lines.append("    return True")
    exec(compile("\n".join(lines), "<precompile input check>", "exec"), ns)  # noqa: S102 - text from templates
    return ns["ok"]
