"""FX graphs ready to compile: normalization (:func:`normalize_graph`) and placeholder specs, plus
:func:`readable_code`.

:func:`normalize_graph` copies a graph into the form every engine accepts and every key can describe: flat
inputs and outputs, tensor attributes lifted to leading placeholders (:class:`Placeholder`), bound to the
module's own tensors.

The JSON serialized form of a graph, its canonical form and digest encoding live in
:mod:`precompile.manifest.graph_json`; they are re-exported here (``GRAPH_SCHEMA``, :func:`graph_to_json`,
:func:`graph_from_json`, :func:`canonical_graph`, :func:`canonical_json`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.graph import CodeGen, _PyTreeCodeGen
from torch.utils import _pytree as pytree

from precompile.manifest.graph_json import (
    GRAPH_SCHEMA,
    _resolve_attr,
    canonical_graph,
    canonical_json,
    graph_from_json,
    graph_to_json,
)
from precompile.errors import UnserializableGraphError

__all__ = [
    "GRAPH_SCHEMA",
    "NormalizedGraph",
    "Placeholder",
    "canonical_graph",
    "canonical_json",
    "graph_from_json",
    "graph_to_json",
    "normalize_graph",
    "readable_code",
]


# ------------------------------------------------------------------------------------------- normalization


@dataclass
class Placeholder:
    """One input of a normalized graph.

    Attributes:
        name: the placeholder's node name in the normalized graph (e.g. ``l_x_``, ``arg0_1``, ``p_linear_weight``).
        kind: ``"user_input"``, ``"parameter"``, ``"buffer"`` or ``"constant"`` (a lifted tensor attribute).
        fqn: dotted name of the parameter/buffer in the module (``"layers.0.mlp.up_proj.weight"``), or None.
    """

    name: str
    kind: str
    fqn: str | None = None


@dataclass
class NormalizedGraph:
    """A graph ready to compile: flat tensor inputs, tensor attributes lifted to placeholders.

    Attributes:
        gm: the normalized ``GraphModule`` (a copy; the caller's module is never changed).
        placeholders: one :class:`Placeholder` per input of ``gm``, in call order.
        bound: ``{placeholder index: tensor}`` for lifted attributes: the weights the original module held.
        in_spec / out_spec: pytree specs (``treespec_dumps`` strings) of a ``torch.export`` module's call
            signature, or None for graphs that take and return flat sequences.
    """

    gm: torch.fx.GraphModule
    placeholders: list[Placeholder]
    bound: dict[int, torch.Tensor] = field(default_factory=dict)
    in_spec: str | None = None
    out_spec: str | None = None


_DYNAMO_PARAM = re.compile(r"^L_(?:.+?)_(?:modules_(?P<path>.+?)_)?(?P<kind>parameters|buffers)_(?P<leaf>.+?)_?$")


def _dynamo_fqn(name: str) -> tuple[str | None, str | None]:
    """FQN and kind from a Dynamo placeholder name like ``L_self_modules_layers_modules_0_parameters_weight_``.

    Dynamo names a lifted parameter after its source, ``L['self']._modules['layers']._modules['0']
    ._parameters['weight']``: ``modules_`` / ``parameters_`` / ``buffers_`` separate the parts of the path.
    Returns ``(None, None)`` for names of another form (user inputs).
    """
    m = _DYNAMO_PARAM.match(name)
    if m is None:
        return None, None
    path = m.group("path").split("_modules_") if m.group("path") else []
    kind = "parameter" if m.group("kind") == "parameters" else "buffer"
    return ".".join([*path, m.group("leaf")]), kind


def normalize_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[NormalizedGraph, list[Any]]:
    """Copy ``gm`` into a form every engine accepts and every cache key can describe.

    - A ``torch.export(...).module()`` graph (pytree calling convention) gets flat inputs and outputs; its
      specs are kept so the artifact takes and returns the same structures.
    - Tensor attributes read by ``get_attr`` (parameters, buffers, constants) become leading placeholders,
      bound to the module's tensors, so the artifact is keyed on their shapes and dtypes, never their values,
      and one artifact serves every checkpoint of an architecture.

    Args:
        gm: the graph to compile; not modified.
        example_inputs: the inputs ``gm`` is called with (for an export module: its user arguments).

    Returns:
        ``(normalized, flat_inputs)`` where ``flat_inputs`` lines up with ``normalized.placeholders``.

    Raises:
        UnserializableGraphError: a ``get_attr`` reads something that is neither a tensor nor a sub-graph.
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"standalone_compile takes a torch.fx.GraphModule, got {type(gm).__name__}")
    # copy the graph and module structure, not the weights: the artifact binds the caller's own tensors
    memo: dict[int, Any] = {}
    for t in [*gm.parameters(), *gm.buffers()]:
        memo[id(t)] = t
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _resolve_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                memo[id(value)] = value
    new = copy.deepcopy(gm, memo)
    graph = new.graph
    in_spec = out_spec = None
    flat_inputs = list(example_inputs)
    if isinstance(graph._codegen, _PyTreeCodeGen):
        info = graph._codegen.pytree_info
        if info.in_spec is not None:
            in_spec = pytree.treespec_dumps(info.in_spec)
            flat_inputs = list(graph._codegen.process_inputs(*example_inputs))
        if info.out_spec is not None:
            out_spec = pytree.treespec_dumps(info.out_spec)
        graph._codegen = CodeGen()
    _drop_export_guards(new)

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = placeholders[0] if placeholders else next(iter(graph.nodes))
    buffers = {name for name, _ in gm.named_buffers(remove_duplicate=False)}
    lifted: dict[str, torch.fx.Node] = {}
    bound_tensors: list[tuple[str, str, torch.Tensor]] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = _resolve_attr(new, node.target)
        if isinstance(value, torch.fx.GraphModule):
            continue
        if not isinstance(value, torch.Tensor):
            raise UnserializableGraphError(
                f"get_attr node {node.name!r} reads {node.target!r}, a {type(value).__name__}; only tensors and "
                "sub-graphs can be stored in an artifact. Make it a graph input or a buffer."
            )
        ph = lifted.get(node.target)
        if ph is None:
            with graph.inserting_before(first):
                ph = graph.placeholder(_safe_name(node.target))
            ph.meta.update(node.meta)
            lifted[node.target] = ph
            kind = "parameter" if isinstance(value, torch.nn.Parameter) else (
                "buffer" if node.target in buffers else "constant")
            bound_tensors.append((node.target, kind, value))
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
    for target in list(lifted):
        _delete_attr(new, target)
    graph.lint()
    new.recompile()

    infos: list[Placeholder] = []
    bound: dict[int, torch.Tensor] = {}
    n_lifted = len(bound_tensors)
    for i, node in enumerate(n for n in graph.nodes if n.op == "placeholder"):
        if i < n_lifted:
            fqn, kind, value = bound_tensors[i]
            infos.append(Placeholder(node.name, kind, fqn))
            bound[i] = value
            continue
        fqn, kind = _dynamo_fqn(node.target)
        example = flat_inputs[i - n_lifted] if i - n_lifted < len(flat_inputs) else None
        if kind is None and isinstance(example, torch.nn.Parameter):
            kind = "parameter"
        infos.append(Placeholder(node.name, kind or "user_input", fqn))
    flat = [bound[i] for i in range(n_lifted)] + flat_inputs
    return NormalizedGraph(new, infos, bound, in_spec, out_spec), flat


def _drop_export_guards(gm: torch.fx.GraphModule) -> None:
    """Remove the ``_guards_fn`` call that ``ExportedProgram.module()`` inserts after the placeholders.

    It is an opaque Python module checking input shapes at call time (not serializable, not compilable);
    ``torch._inductor.aot_compile`` drops it the same way.  The artifact checks its inputs against the
    placeholder specs instead.
    """
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
    still_called = any(n.op == "call_module" and n.target == "_guards_fn" for n in gm.graph.nodes)
    if hasattr(gm, "_guards_fn") and not still_called:
        delattr(gm, "_guards_fn")


def _delete_attr(gm: torch.nn.Module, target: str) -> None:
    *path, leaf = target.split(".")
    owner: Any = gm
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return
    for table in ("_parameters", "_buffers"):
        if leaf in getattr(owner, table, {}):
            del getattr(owner, table)[leaf]
            return
    if hasattr(owner, leaf):
        delattr(owner, leaf)


def _safe_name(target: str) -> str:
    return "p_" + re.sub(r"\W", "_", target)


def readable_code(gm: torch.fx.GraphModule) -> str:
    """The Python source FX generates for ``gm`` (``gm.code``), with sub-graphs appended."""
    parts = [gm.code.strip() + "\n"]
    for name, sub in gm.named_modules():
        if name and isinstance(sub, torch.fx.GraphModule):
            parts.append(f"\n# ---- sub-graph {name}\n" + sub.code.strip() + "\n")
    return "".join(parts)
