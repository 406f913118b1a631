"""Size arithmetic of a stored graph, bounded: what ``precompile rebuild`` runs a stored graph's Python arithmetic
through before it runs anything else of it.

A stored graph's ``{"fn": ...}`` nodes call ``operator``, ``math``, ``builtins.round`` and ``torch.sym_*``
(:func:`precompile.manifest.graph_allow.functions`), on sizes in a real graph: SymInt arithmetic of a few dozen bits,
shape tuples of a few entries.  Planted, the same nodes compute ``3 ** 10**8`` (minutes) or ``"A" * 2**31`` (2 GiB).
:func:`bounded` wraps such a function so that, on plain Python values:

- every int in and out is within :data:`MAX_INT` in magnitude; ``pow`` and ``lshift`` are checked *before* they
  compute, from the operands' bit lengths; ``round`` takes at most :data:`MAX_NDIGITS` digits;
- a str, bytes, tuple, list or ``torch.Size`` made or grown (``+``, ``*``, ``+=``, ``*=``, ``x[i:j] = ...``) holds
  at most :data:`MAX_SEQUENCE` items, checked before it is made, and all such values of one run together at most
  :data:`MAX_SEQUENCE_TOTAL` (:class:`Ledger`);
- ``%`` of a str or bytes (formatting: ``"%0999999999d" % 1``) is refused;

and anything else (an int past the bound, a value of another type) raises :class:`SizeMathError`.  A tensor, a
SymInt, SymFloat or SymBool among the arguments passes the call to the real function unchanged: that is tensor
arithmetic, counted by the rebuild's fake run (:mod:`precompile.ops.rebuild_bounds`).

These wrappers are not put into the graph a rebuild compiles: FX writes a call of an ``operator`` function as Python
syntax (``a ** b``, ``x[0]``), and Inductor's passes match ``operator.getitem`` by identity, so the compiled graph
keeps the real functions.  :func:`bounded_graph` makes a copy whose targets are the wrappers, for the fake run: with
static sizes every int a graph computes is the same there as in the eager run and in Inductor's trace (an int that
depends on a tensor's values does not propagate on fake tensors, and such a graph is refused), so once the copy has
run, the real functions compute nothing larger.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from precompile.errors import InputLimitError

#: Largest magnitude of an int size arithmetic takes or makes: an int64 or uint64 size, stride or offset.
MAX_INT = 1 << 64
#: Most items of one str, bytes, tuple or list size arithmetic makes (a shape has at most 64).
MAX_SEQUENCE = 1 << 16
#: Most items of all sequences made by size arithmetic in one :class:`Ledger`.
MAX_SEQUENCE_TOTAL = 1 << 22
#: Most digits ``round(x, ndigits)`` may take (a float has at most 17 significant digits, an int64 19).
MAX_NDIGITS = 400

_SEQUENCES = (str, bytes, tuple, list)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, slice, type(Ellipsis), torch.dtype,
          torch.device, torch.layout, torch.memory_format)
_SYMBOLIC = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


class SizeMathError(InputLimitError):
    """A stored graph's size arithmetic took or would make a value past its bound (an int past :data:`MAX_INT`,
    a sequence past :data:`MAX_SEQUENCE` items), or a value size arithmetic never holds."""


class Ledger:
    """Items of sequences made by bounded size arithmetic so far: at most :data:`MAX_SEQUENCE_TOTAL` in all."""

    def __init__(self) -> None:
        self.items = 0

    def charge(self, n: int, what: str) -> None:
        """Count ``n`` more items.

        Raises:
            SizeMathError: the total passes :data:`MAX_SEQUENCE_TOTAL`.
        """
        self.items += n
        if self.items > MAX_SEQUENCE_TOTAL:
            raise SizeMathError(f"{what}: the graph's size arithmetic made more than {MAX_SEQUENCE_TOTAL} items of "
                                "sequences in all")


def _check_value(value: Any, what: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
        raise SizeMathError(f"{what}: an int of {value.bit_length()} bits, past the {MAX_INT.bit_length() - 1} "
                            "bits of size arithmetic")
    if isinstance(value, (*_SEQUENCES, torch.Size)) and len(value) > MAX_SEQUENCE:
        raise SizeMathError(f"{what}: a {type(value).__name__} of {len(value)} items, more than {MAX_SEQUENCE}")
    if not isinstance(value, _PLAIN):
        raise SizeMathError(f"{what}: a value of type {type(value).__name__}, which size arithmetic does not take")


def _length(value: Any) -> int | None:
    return len(value) if isinstance(value, (*_SEQUENCES, torch.Size)) else None


def _precheck(name: str, args: tuple[Any, ...], what: str) -> int:
    """Refuse a call whose result would pass a bound, before it is computed; returns the items of the sequence it
    makes (0 when none)."""
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if name in ("pow", "ipow") and len(ints) == 2 and args[1] > 0:
        base, exp = args
        if abs(base) > 1 and (abs(base).bit_length() - 1) * exp > MAX_INT.bit_length():
            raise SizeMathError(f"{what}: {base} ** {exp} passes {MAX_INT.bit_length() - 1} "
                                "bits")
    if name in ("lshift", "ilshift") and len(ints) == 2 and args[1] > 0 and args[0] != 0:
        if abs(args[0]).bit_length() + args[1] > MAX_INT.bit_length():
            raise SizeMathError(f"{what}: {args[0]} << {args[1]} passes {MAX_INT.bit_length() - 1} bits")
    if name in ("mod", "imod") and isinstance(args[0], (str, bytes)):
        raise SizeMathError(f"{what}: formats a {type(args[0]).__name__} with %, which size arithmetic never does")
    if name in ("mul", "imul") and len(args) == 2:
        seq, times = (args if _length(args[0]) is not None else args[::-1])
        if _length(seq) is not None and isinstance(times, int):
            return _items(_length(seq) * max(times, 0), what)
    if name in ("add", "iadd") and len(args) == 2 and _length(args[0]) is not None and _length(args[1]) is not None:
        return _items(_length(args[0]) + _length(args[1]), what)
    if name == "setitem" and len(args) == 3 and isinstance(args[1], slice) and _length(args[0]) is not None:
        return _items(_length(args[0]) + (_length(args[2]) or 0), what)
    return 0


def _items(n: int, what: str) -> int:
    if n > MAX_SEQUENCE:
        raise SizeMathError(f"{what}: would make a sequence of {n} items, more than {MAX_SEQUENCE}")
    return n


def bounded(name: str, fn: Callable[..., Any], ledger: Ledger) -> Callable[..., Any]:
    """``fn`` (the function a stored graph names ``name``, e.g. ``"_operator:pow"``) with the bounds of the module
    docstring on plain values, items of the sequences it makes charged to ``ledger``; calls with a tensor or a
    symbolic value among the arguments go to ``fn`` unchanged.

    The wrapper raises :class:`SizeMathError` where the module docstring says.
    """
    short = name.partition(":")[2]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        values = [*args, *kwargs.values()]
        if any(isinstance(v, _SYMBOLIC) for v in values):
            return fn(*args, **kwargs)
        what = f"size arithmetic {name}"
        for v in values:
            _check_value(v, what)
        if short == "round" and len(args) > 1 and isinstance(args[1], int) and abs(args[1]) > MAX_NDIGITS:
            raise SizeMathError(f"{what}: rounds to {args[1]} digits, more than {MAX_NDIGITS}")
        made = _precheck(short, args, what) if name.startswith("_operator:") else 0
        ledger.charge(made, what)
        try:
            out = fn(*args, **kwargs)
        except (ArithmeticError, TypeError, ValueError, IndexError, KeyError) as err:
            raise SizeMathError(f"{what}: {type(err).__name__}: {err}") from None
        if not isinstance(out, _SYMBOLIC):
            _check_value(out, what)
            if isinstance(out, (*_SEQUENCES, torch.Size)) and not made:
                ledger.charge(len(out), what)
        if short == "setitem" and _length(args[0]) is not None:
            _check_value(args[0], what)
        return out

    call.__module__ = __name__  # not "_operator": FX would write the call as Python syntax, skipping the wrapper
    return call


#: Prefixes of the ``{"fn": ...}`` names :func:`bounded_graph` wraps.
WRAPPED = ("_operator:", "math:", "builtins:round", "builtins:abs", "torch:sym_")


def bounded_graph(gm: torch.fx.GraphModule, ledger: Ledger) -> torch.fx.GraphModule:
    """A copy of ``gm`` (sub-graphs included) whose size-arithmetic targets (``operator``, ``math``, ``round``,
    ``abs``, ``torch.sym_*``: :data:`WRAPPED`) are :func:`bounded` by ``ledger``; every other target is shared."""
    from precompile.manifest.graph_allow import functions

    names = {id(fn): name for name, fn in functions().items() if name.startswith(WRAPPED)}
    wrapped: dict[int, Callable[..., Any]] = {}
    out = copy.deepcopy(gm)  # a GraphModule's deep copy copies its sub-graphs' graphs; targets are shared
    for module in out.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if node.op == "call_function" and id(node.target) in names:
                    fn = node.target
                    node.target = wrapped.setdefault(id(fn), bounded(names[id(fn)], fn, ledger))
            module.recompile()
    return out
