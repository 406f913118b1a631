"""FX graphs as data: a JSON serialized form, and its canonical form for the key digest.

The serialized form (``graph_to_json``) is what an artifact stores as its "FX graph" part: every node with its
op, target and arguments, enough to rebuild the ``GraphModule`` (``graph_from_json``) without the model's code.
Its canonical form (``canonical_graph``) drops everything that must never change a key: node names (replaced
by their position), ``meta`` (stack traces, source locations, module stacks) and the order of dict keys.

Targets are stored by importable name: ``{"op": "aten::mm.default"}`` for an ATen/custom operator overload,
``{"fn": "torch.nn.functional:relu"}`` for a Python callable whose ``module:qualname`` resolves back to the
same object.  Anything else (a lambda, a local function, an opaque object in an argument) raises
:class:`~precompile.errors.UnserializableGraphError` naming the node and the value.

Normalization (lifting attributes to placeholders) is :mod:`precompile.key.graph`'s concern.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
from typing import Any

import torch
import torch.fx

from precompile.errors import UnserializableGraphError

GRAPH_SCHEMA = 1

#: Tagged torch enums by tag, then by name, read once from ``vars(torch)``: a stored name is looked up here, never
#: through ``getattr(torch, name)``, which may import a submodule.
TORCH_NAMES: dict[str, dict[str, Any]] = {
    tag: {n: v for n, v in vars(torch).items() if isinstance(v, kind)}
    for tag, kind in (("$dtype", torch.dtype), ("$layout", torch.layout), ("$memory_format", torch.memory_format))}

# ------------------------------------------------------------------------------------------ serialization


def _resolve_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


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


def decode_arg(value: Any, nodes: list[torch.fx.Node]) -> Any:
    """One stored argument (the form :func:`graph_to_json` writes) as a value; ``{"$node": i}`` is ``nodes[i]``.

    Raises:
        ValueError: an unknown tag.  KeyError: a dtype, layout or memory format this torch lacks.
    """
    if isinstance(value, list):
        return [decode_arg(v, nodes) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, payload), = value.items()
    if tag == "$node":
        return nodes[payload]
    if tag == "$float":
        return float(payload)
    if tag == "$complex":
        return complex(payload[0], payload[1])
    if tag in TORCH_NAMES:
        return TORCH_NAMES[tag][payload]
    if tag == "$device":
        return torch.device(payload)
    if tag == "$size":
        return torch.Size(decode_arg(payload, nodes))
    if tag == "$slice":
        return slice(*decode_arg(payload, nodes))
    if tag == "$ellipsis":
        return Ellipsis
    if tag == "$tuple":
        return tuple(decode_arg(v, nodes) for v in payload)
    if tag == "$dict":
        return {decode_arg(k, nodes): decode_arg(v, nodes) for k, v in payload}
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
        args = tuple(decode_arg(spec["args"], nodes))
        kwargs = {k: decode_arg(v, nodes) for k, v in spec["kwargs"].items()}
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
