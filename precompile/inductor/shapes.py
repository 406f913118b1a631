"""Symbolic shapes at build: canonical size symbols, their ranges, the guards a compile relies on, other sizes.

A graph captured with dynamic sizes (``mark_dynamic``, Dynamo's automatic dynamic shapes, vLLM's ``num_tokens``)
has placeholders whose fake values carry SymInts over one ShapeEnv.  For the key, sizes are written as sympy
expressions over canonical symbol names (``s0``, ``s1``... in order of first appearance among the placeholders),
so that the numbering Dynamo, export or make_fx happen to give never changes a key; each symbol's range
(``mark_dynamic(min=, max=)``, Dynamo's ``[2, inf)``) is a key factor too.  After the compile, the guards are
what the compiled code relies on (:func:`guards`); the artifact checks them on every call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from precompile.inductor import shim

_SYMBOL = re.compile(r"\b[a-z]+\d+\b")


@dataclass
class Symbols:
    """The size symbols of a graph's placeholders.

    Attributes:
        names: ``{symbol as the ShapeEnv names it: canonical name}``.
        ranges: ``{canonical name: [lower, upper]}``, None for an unbounded end.
        hints: ``{canonical name: example value}``.
        shape_env: the ShapeEnv the placeholders' sizes live in.
    """

    names: dict[str, str] = field(default_factory=dict)
    ranges: dict[str, list[int | None]] = field(default_factory=dict)
    hints: dict[str, int] = field(default_factory=dict)
    shape_env: Any = None

    def text(self, size: Any) -> int | str:
        """An int size as it is; a SymInt size as its expression over canonical names (``"16*s0"``)."""
        if not isinstance(size, torch.SymInt):
            return int(size)
        expr = size.node.expr
        if expr.is_number:
            return int(expr)
        return _SYMBOL.sub(lambda m: self.names.get(m.group(0), m.group(0)), str(expr))


def fake_values(gm: torch.fx.GraphModule) -> list[Any]:
    """The fake value of every placeholder of ``gm`` (None where the graph recorded none)."""
    return [shim.fake_value(n) for n in gm.graph.nodes if n.op == "placeholder"]


def symbols_of(values: list[Any]) -> Symbols | None:
    """The :class:`Symbols` of placeholders whose fake values are ``values``, or None if every size is static.

    Symbols are numbered in order of first appearance: placeholder by placeholder, a SymInt placeholder's own
    symbol, else a tensor's sizes then strides.
    """
    shape_env = shim.shape_env_of(values)
    if shape_env is None:
        return None
    order: list[Any] = []
    for v in values:
        sizes = [v] if isinstance(v, torch.SymInt) else [*v.shape, *v.stride()] if isinstance(v, torch.Tensor) else []
        for s in sizes:
            if isinstance(s, torch.SymInt):
                for sym in sorted(s.node.expr.free_symbols, key=str):
                    if sym not in order:
                        order.append(sym)
    if not order:
        return None
    ranges = shim.symbol_ranges(shape_env)
    out = Symbols(shape_env=shape_env)
    for i, sym in enumerate(order):
        name = f"s{i}"
        out.names[str(sym)] = name
        out.ranges[name] = list(ranges.get(str(sym), (None, None)))
        hint = shape_env.backed_var_to_val.get(sym) if hasattr(shape_env, "backed_var_to_val") else \
            shape_env.var_to_val.get(sym)
        if hint is not None:
            out.hints[name] = int(hint)
    return out


def guards(symbols: Symbols, values: list[Any]) -> str | None:
    """The guards of the compiled code over the placeholders (``L['t<i>']`` is the i-th), after the compile.

    Every placeholder must have a fake value (or be an int); otherwise no expression can name it.

    Raises:
        ValueError: a placeholder has no fake value.
    """
    if any(v is None for v in values):
        raise ValueError("a placeholder has no recorded fake value, so the size guards cannot name it")
    return shim.guards_expression(symbols.shape_env, values)


def sizes_at(values: list[Any], symbols: Symbols, at: dict[str, int]) -> list[Any]:
    """Per placeholder, its concrete sizes when the canonical symbols take the values ``at``: ``(shape, stride)``
    for a tensor, an int for a SymInt, None for anything static."""
    by_name = {sym_name: at[name] for sym_name, name in symbols.names.items() if name in at}

    def value(size: Any) -> int:
        if not isinstance(size, torch.SymInt):
            return int(size)
        expr = size.node.expr
        return int(expr.xreplace({s: by_name[str(s)] for s in expr.free_symbols if str(s) in by_name}))

    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.SymInt):
            out.append(value(v))
        elif isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in [*v.shape, *v.stride()]):
            out.append(([value(s) for s in v.shape], [value(s) for s in v.stride()]))
        else:
            out.append(None)
    return out
