"""A symbolic artifact at build: the size guards it will check on every call, and other sizes to validate on.

After Inductor compiled a graph with symbolic sizes, the guards are read from the ShapeEnv
(:func:`precompile.inductor.shapes.guards`), narrowed to a caller's ``size_range`` where given, parsed by
:class:`precompile.key.guards.Guards` (which refuses anything but arithmetic), and checked against the example
inputs; one more input set, at other sizes inside the guards, lets the fast path be validated where the sizes
really vary.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from precompile.errors import BuildError
from precompile.key.plan import Plan

log = logging.getLogger("precompile")


def shapes_after_compile(plan: Plan) -> tuple[dict[str, Any], list[list[Any]]]:
    """The manifest's ``shapes`` (each symbol's range after the compile and example value, and the size guards)
    and input sets at other sizes inside the guards to validate the fast path on; empty for a static graph.

    Raises:
        BuildError: the guards cannot be written down or do not hold for the example inputs.
    """
    if plan.symbols is None:
        return {}, []
    from precompile.inductor import shapes, shim
    from precompile.key.guards import Guards, GuardSyntaxError, with_range

    try:
        text = shapes.guards(plan.symbols, plan.fake_values)
        if plan.size_range is not None:
            for name in plan.symbols.ranges:
                sources = _sources(plan.specs, name)
                if sources:  # a symbol only inside expressions (16*s1) is bounded through the others
                    text = with_range(text, sources, *plan.size_range)
        guards = Guards(text, [s["name"] for s in plan.specs]) if text else None
    except (ValueError, GuardSyntaxError) as err:
        raise BuildError(f"the size guards of this symbolic graph cannot be stored ({err}); compile it with "
                         "dynamic_shapes='from_example_inputs' for one size") from err
    if guards is not None and guards.failures(plan.run_inputs):
        raise BuildError(f"the size guards do not hold for the example inputs: {guards.failures(plan.run_inputs)}")
    ranges = shim.symbol_ranges(plan.symbols.shape_env)
    symbols = {name: {"range": list(plan.size_range or ranges.get(orig, plan.symbols.ranges[name])),
                      "hint": plan.symbols.hints.get(name)}
               for orig, name in plan.symbols.names.items()}
    return {"symbols": symbols, "guards": text}, _other_sizes(plan, guards, symbols)


def _sources(specs: list[dict[str, Any]], name: str) -> list[str]:
    """How the guards name size symbol ``name``: ``L['t<i>']`` for a size placeholder, ``L['t<i>'].size()[d]``
    for a tensor dim that is exactly the symbol."""
    out = [f"L['t{i}']" for i, s in enumerate(specs) if s.get("size") == name]
    out += [f"L['t{i}'].size()[{d}]" for i, s in enumerate(specs) if s.get("type") == "tensor"
            for d, n in enumerate(s["shape"]) if n == name]
    return out


def _other_sizes(plan: Plan, guards: Any, symbols: dict[str, Any]) -> list[list[Any]]:
    """One input set at other symbol values inside the guards, or none.

    Candidates, in order: hint+1, 2*hint, hint+7, hint-1, hint//2, the lower bound.  Float tensors of the new sizes
    get seeded random values.  An integer or bool tensor (token ids, slot indices, masks) gets the first values of
    the example's own tensor, so its values stay valid: in range for a gather, unique where the example's were (a
    scatter such as ``index_copy_`` with repeated indices has no defined result on a GPU, so a validation on them
    would compare noise).  The first candidate whose integer tensors all fit in the example's values is taken; if
    none does (every candidate is larger), the first that passes the guards, with such tensors zero-filled.
    """
    from precompile.inductor import shapes

    hints = {n: s["hint"] for n, s in symbols.items()}
    if any(not isinstance(h, int) for h in hints.values()):
        return []
    fallback = None
    steps = (lambda h: h + 1, lambda h: 2 * h, lambda h: h + 7, lambda h: h - 1, lambda h: h // 2, None)
    for step in steps:
        gen = torch.Generator().manual_seed(0)
        at = {}
        for name, h in hints.items():
            lo, hi = symbols[name]["range"]
            v = step(h) if step else (lo if lo is not None else h)
            at[name] = min(max(v, lo if lo is not None else v), hi if hi is not None else v)
        if at == hints:
            continue
        try:
            inputs, exact = _inputs_at(plan, shapes.sizes_at(plan.fake_values, plan.symbols, at), gen)
        except (RuntimeError, ValueError, TypeError) as err:  # e.g. sizes an overlapping layout cannot take
            log.debug("no validation inputs at sizes %s: %s", at, err)
            continue
        if guards is None or not guards.failures(inputs):
            if exact:
                return [inputs]
            fallback = fallback or inputs
    return [fallback] if fallback is not None else []


def _inputs_at(plan: Plan, sizes: list[Any], gen: torch.Generator) -> tuple[list[Any], bool]:
    """The inputs at ``sizes``, and whether every integer tensor among them took the example's values."""
    inputs: list[Any] = []
    exact = True
    for value, size in zip(plan.run_inputs, sizes):
        if size is None:
            inputs.append(value)
        elif isinstance(size, int):
            inputs.append(size)
        else:
            shape, stride = size
            t = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
            if t.is_floating_point() or t.is_complex():
                t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
            elif isinstance(value, torch.Tensor) and value.numel() >= t.numel():
                t.copy_(value.reshape(-1)[:t.numel()].reshape(t.shape))
            else:
                t.zero_()
                exact = exact and t.numel() == 0
            inputs.append(t)
    return inputs, exact
