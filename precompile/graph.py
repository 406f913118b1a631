"""FX graphs as data: normalization, a JSON serialized form, its canonical digest, and placeholder specs.

The serialized form (``graph_to_json``) is what an artifact stores as its "FX graph" part: every node with its
op, target and arguments, enough to rebuild the ``GraphModule`` (``graph_from_json``) without the model's code.
Its canonical form (``canonical_graph``) drops everything that must never change a key: node names (replaced
by their position), ``meta`` (stack traces, source locations, module stacks) and the order of dict keys.

Targets are stored by importable name: ``{"op": "aten::mm.default"}`` for an ATen/custom operator overload,
``{"fn": "torch.nn.functional:relu"}`` for a Python callable whose ``module:qualname`` resolves back to the
same object.  Anything else (a lambda, a local function, an opaque object in an argument) raises
:class:`~precompile.errors.UnserializableGraphError` naming the node and the value.
"""

from __future__ import annotations

import copy
import enum
import importlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.graph import CodeGen, _PyTreeCodeGen
from torch.utils import _pytree as pytree

from precompile.errors import UnserializableGraphError

GRAPH_SCHEMA = 1

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


def _resolve_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


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


# ------------------------------------------------------------------------------------------ serialization


def _encode_target(node: torch.fx.Node) -> Any:
    target = node.target
    if node.op in ("placeholder", "output", "call_method", "get_attr", "call_module"):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return {"op": f"{target._schema.name}.{target._overloadname}"}
    if isinstance(target, torch._ops.OpOverloadPacket):
        return {"oppacket": target._qualified_op_name}
    if isinstance(target, torch._ops.HigherOrderOperator):
        return {"hop": target.name()}
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if module is None and hasattr(target, "__self__") and isinstance(target.__self__, type(torch)):
        module = target.__self__.__name__
    names = [qualname, getattr(target, "__name__", None)]
    for name in dict.fromkeys(n for n in names if n and "<" not in n):
        if not module:
            break
        try:
            if _resolve_fn(module, name) is target:
                return {"fn": f"{module}:{name}"}
        except Exception:  # noqa: BLE001 - any import failure means "not resolvable by name"
            continue
    raise UnserializableGraphError(
        f"node {node.name!r} calls {target!r}, which cannot be stored by name (it is not importable as "
        f"{module}:{qualname}). Use an operator registered with torch.library or a module-level function."
    )


def _resolve_fn(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode_target(op: str, target: Any) -> Any:
    if not isinstance(target, dict):
        return target
    if "op" in target:
        qual, _, overload = target["op"].rpartition(".")
        ns, _, name = qual.partition("::")
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    if "oppacket" in target:
        ns, _, name = target["oppacket"].partition("::")
        return getattr(getattr(torch.ops, ns), name)
    if "hop" in target:
        return getattr(torch.ops.higher_order, target["hop"])
    module, _, qualname = target["fn"].partition(":")
    return _resolve_fn(module, qualname)


def _encode_arg(value: Any, node: torch.fx.Node, index: dict[torch.fx.Node, int]) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"$node": index[value]}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, complex):
        return {"$complex": [_encode_arg(value.real, node, index), _encode_arg(value.imag, node, index)]}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.layout):
        return {"$layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"$memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Size):
        return {"$size": [_encode_arg(v, node, index) for v in value]}
    if isinstance(value, slice):
        return {"$slice": [_encode_arg(v, node, index) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"$ellipsis": True}
    if isinstance(value, tuple):
        return {"$tuple": [_encode_arg(v, node, index) for v in value]}
    if isinstance(value, list):
        return [_encode_arg(v, node, index) for v in value]
    if isinstance(value, dict):
        return {"$dict": [[_encode_arg(k, node, index), _encode_arg(v, node, index)] for k, v in value.items()]}
    raise UnserializableGraphError(
        f"node {node.name!r} ({node.op} {getattr(node.target, '__name__', node.target)}) has an argument of type "
        f"{type(value).__module__}.{type(value).__qualname__} ({value!r:.80}) that an artifact cannot store; "
        "pass it as a tensor input or a plain Python value instead."
    )


def _decode_arg(value: Any, nodes: list[torch.fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode_arg(v, nodes) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, payload), = value.items()
    if tag == "$node":
        return nodes[payload]
    if tag == "$float":
        return float(payload)
    if tag == "$complex":
        return complex(payload[0], payload[1])
    if tag in ("$dtype", "$layout", "$memory_format"):
        return getattr(torch, payload)
    if tag == "$device":
        return torch.device(payload)
    if tag == "$size":
        return torch.Size(_decode_arg(payload, nodes))
    if tag == "$slice":
        return slice(*_decode_arg(payload, nodes))
    if tag == "$ellipsis":
        return Ellipsis
    if tag == "$tuple":
        return tuple(_decode_arg(v, nodes) for v in payload)
    if tag == "$dict":
        return {_decode_arg(k, nodes): _decode_arg(v, nodes) for k, v in payload}
    raise ValueError(f"unknown tag {tag!r} in a serialized graph")


def graph_to_json(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """The serialized form of ``gm``: ``{"schema", "nodes": [...], "submodules": {name: graph}}``.

    Each node is ``{"name", "op", "target", "args", "kwargs"}`` with nodes referenced by position.

    Raises:
        UnserializableGraphError: a target or argument cannot be stored by value or importable name; the
            message names the node.
    """
    index: dict[torch.fx.Node, int] = {}
    nodes = []
    submodules: dict[str, Any] = {}
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "get_attr":
            sub = _resolve_attr(gm, node.target)
            if isinstance(sub, torch.fx.GraphModule):
                submodules[node.target] = graph_to_json(sub)
        if node.op == "call_module":
            sub = _resolve_attr(gm, node.target)
            if not isinstance(sub, torch.fx.GraphModule):
                raise UnserializableGraphError(
                    f"node {node.name!r} calls module {node.target!r} ({type(sub).__name__}), which an artifact "
                    "cannot store; trace through it (Dynamo and make_fx inline modules)."
                )
            submodules[node.target] = graph_to_json(sub)
        nodes.append({
            "name": node.name,
            "op": node.op,
            "target": _encode_target(node),
            "args": _encode_arg(tuple(node.args), node, index)["$tuple"],
            "kwargs": {k: _encode_arg(v, node, index) for k, v in node.kwargs.items()},
        })
    return {"schema": GRAPH_SCHEMA, "nodes": nodes, "submodules": submodules}


def graph_from_json(data: dict[str, Any]) -> torch.fx.GraphModule:
    """Rebuild a ``GraphModule`` from :func:`graph_to_json` output (inverse up to ``meta``).

    Raises:
        ValueError: the data is not a serialized graph of a known schema.
        AttributeError / ImportError: a stored target no longer exists in this torch.
    """
    if data.get("schema") != GRAPH_SCHEMA:
        raise ValueError(f"serialized graph schema {data.get('schema')!r} is not {GRAPH_SCHEMA}")
    root = torch.nn.Module()
    for name, sub in data.get("submodules", {}).items():
        *path, leaf = name.split(".")
        owner = root
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.add_module(leaf, graph_from_json(sub))
    graph = torch.fx.Graph()
    nodes: list[torch.fx.Node] = []
    for spec in data["nodes"]:
        op = spec["op"]
        target = _decode_target(op, spec["target"])
        args = tuple(_decode_arg(spec["args"], nodes))
        kwargs = {k: _decode_arg(v, nodes) for k, v in spec["kwargs"].items()}
        if op == "output":
            node = graph.output(args[0])
        else:
            node = graph.create_node(op, target, args, kwargs, name=spec["name"])
        nodes.append(node)
    return torch.fx.GraphModule(root, graph)


def canonical_graph(data: dict[str, Any]) -> dict[str, Any]:
    """:func:`graph_to_json` output without node names: what the artifact key hashes.

    Placeholders keep their position only (their target is the argument's name, e.g. ``L_x_`` or ``x_1``, so it
    is dropped too); the output node and every reference are positional already.
    """
    return {
        "schema": data["schema"],
        "nodes": [_canonical_node(n) for n in data["nodes"]],
        "submodules": {k: canonical_graph(v) for k, v in sorted(data.get("submodules", {}).items())},
    }


def _canonical_node(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k != "name"}
    if node["op"] == "placeholder":
        out["target"] = None
    return out


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, ASCII.  The encoding every key digest uses."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def readable_code(gm: torch.fx.GraphModule) -> str:
    """The Python source FX generates for ``gm`` (``gm.code``), with sub-graphs appended."""
    parts = [gm.code.strip() + "\n"]
    for name, sub in gm.named_modules():
        if name and isinstance(sub, torch.fx.GraphModule):
            parts.append(f"\n# ---- sub-graph {name}\n" + sub.code.strip() + "\n")
    return "".join(parts)
