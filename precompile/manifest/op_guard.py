"""A guard on what a stored graph runs: a ``TorchDispatchMode`` under which only the operators of the allow-list reach
their kernels (:mod:`precompile.manifest.op_list` for ``aten``/``prims``, :mod:`precompile.manifest.graph_allow` for
the other namespaces and the higher-order operators).

The allow-list checks a stored graph's own targets when it is decoded, but a graph may call Python functions too
(``torch.nn.functional.*``, tensor methods, composite operators), and what they call inside is not in the graph.
Run under :class:`OpGuard`, every operator they reach passes the same list, whatever called it.  A dispatch mode sees
operators below autograd: a ``CompositeImplicitAutograd`` operator (``aten::linear``, ``aten::scaled_dot_product_
attention``) is seen as what it decomposes into (``aten::addmm``, ``aten::_scaled_dot_product_flash_attention_for_
cpu``), so the list holds those too.  A higher-order operator on the list runs its sub-graphs under the guard again.

``precompile rebuild`` runs a rebuilt graph eagerly under it before compiling it (:mod:`precompile.ops.rebuild`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from precompile.manifest import graph_allow, op_list
from precompile.errors import ArtifactFormatError


class OpRefusedError(ArtifactFormatError):
    """A stored graph, run, reached an operator the allow-list does not admit (the message names it)."""


class _Guarded(torch.nn.Module):
    """A higher-order operator's sub-graph, run under ``guard`` (the operator's kernel runs with no mode set)."""

    def __init__(self, sub: torch.nn.Module, guard: OpGuard):
        super().__init__()
        self.sub, self.guard = sub, guard

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.guard:
            return self.sub(*args, **kwargs)


def _guard_subgraphs(value: Any, guard: OpGuard) -> Any:
    if isinstance(value, torch.fx.GraphModule):
        return _Guarded(value, guard)
    if isinstance(value, (list, tuple)):
        return type(value)(_guard_subgraphs(v, guard) for v in value)
    return value


def _bound(func: Any, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``{argument name: value}`` of a call of operator overload ``func``, from its schema."""
    return {**dict(zip((a.name for a in func._schema.arguments), args)), **kwargs}


def _missing_tensor(func: Any, bound: dict[str, Any]) -> str | None:
    """A tensor argument the schema requires, given None: ``torch.ops`` passes it on as an undefined tensor, which
    some kernels dereference (``aten::copy(None, x)``: a segfault, found by the fuzz)."""
    for arg in func._schema.arguments:
        kind, value = str(arg.type), bound.get(arg.name)
        if (kind == "Tensor" and value is None and arg.name in bound) or (
                kind == "List[Tensor]" and isinstance(value, (list, tuple)) and any(v is None for v in value)):
            return f"its tensor argument {arg.name} is None"
    return None


class OpGuard(TorchDispatchMode):
    """``with OpGuard(): gm(*inputs)``: every ATen, prims or custom operator the block reaches must be admitted
    (:func:`precompile.manifest.op_list.is_admitted`, :func:`precompile.manifest.graph_allow.allowed_namespace`),
    every higher-order operator one of :data:`precompile.manifest.graph_allow.HIGHER_ORDER`.

    Raises (from the block):
        OpRefusedError: naming the first operator that is not, before it runs, or one called with arguments
            :data:`precompile.manifest.op_list.PRECONDITIONS` refuses.
        ConfigError: ``PRECOMPILE_GRAPH_OP_NAMESPACES`` is malformed.
    """

    supports_higher_order_operators = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            if func.name() not in graph_allow.HIGHER_ORDER:
                raise OpRefusedError(f"the stored graph reached higher-order operator {func.name()!r}, which a "
                                     "stored graph may not call")
            return func.dispatch(torch._C.DispatchKey.CompositeExplicitAutograd, *_guard_subgraphs(args, self),
                                 **{k: _guard_subgraphs(v, self) for k, v in kwargs.items()})
        name = func._schema.name if isinstance(func, torch._ops.OpOverload) else str(func)
        ns = name.partition("::")[0]
        if ns in ("aten", "prims"):
            if not op_list.is_admitted(name):
                why = op_list.denial(name) or "it is not on the list of operators known to check their arguments"
                raise OpRefusedError(f"the stored graph reached operator {name!r:.120}, which a stored graph may "
                                     f"not call: {why}")
            bound = _bound(func, args, kwargs)
            check = op_list.PRECONDITIONS.get(name)
            why = _missing_tensor(func, bound) or (check(bound) if check is not None else None)
            if why:
                raise OpRefusedError(f"the stored graph calls operator {name!r:.120} with arguments it may not "
                                     f"take: {why}")
        elif not graph_allow.allowed_namespace(ns):
            raise OpRefusedError(f"the stored graph reached operator {name!r:.120}, of namespace {ns!r:.60}, which "
                                 "a stored graph may not call (see PRECOMPILE_GRAPH_OP_NAMESPACES)")
        return func(*args, **kwargs)
