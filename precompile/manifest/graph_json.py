"""FX graphs as data: a JSON serialized form, and its canonical form for the key digest.

The serialized form (``graph_to_json``) is what an artifact stores as its "FX graph" part: every node with its
op, target and arguments, enough to rebuild the ``GraphModule`` (``graph_from_json``) without the model's code.
Its canonical form (``canonical_graph``) drops everything that must never change a key: node names (replaced
by their position), ``meta`` (stack traces, source locations, module stacks) and the order of dict keys.

Targets are stored by name: ``{"op": "aten::mm.default"}`` for an ATen/custom operator overload,
``{"fn": "torch.nn.functional:relu"}`` for a Python callable whose ``module:qualname`` resolves back to the
same object.  Anything else (a lambda, a local function, an opaque object in an argument) raises
:class:`~precompile.errors.UnserializableGraphError` naming the node and the value.

Reading one back (``graph_from_json``) imports nothing: a stored graph comes from a cache, so each target, method
and attribute it names must be on the allow-list of :mod:`precompile.manifest.graph_allow` (ATen, prims and
registered custom operators by qualified name, torch's own tensor functions and size arithmetic from a fixed
table, public tensor methods), every name that reaches the generated code is an identifier, and anything else is
an :class:`~precompile.errors.ArtifactFormatError` naming the node.  A graph calling a module-level function of
its own (stored by name) is still stored, but does not come back.

Normalization (lifting attributes to placeholders) is :mod:`precompile.key.graph`'s concern.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
import re
from typing import Any

import torch
import torch.fx

from precompile.errors import ArtifactFormatError, UnserializableGraphError

GRAPH_SCHEMA = 1
#: Bounds on a stored graph: sub-graphs within sub-graphs, and an argument's nesting.
MAX_GRAPH_DEPTH = 16
MAX_ARG_DEPTH = 64
#: Bounds on a stored argument's literals: an int's magnitude (an int64 or uint64 value; Python's own bound is 4300
#: digits), a string's characters, a list's (tuple's, dict's) items.
MAX_LITERAL_INT = 1 << 64
MAX_LITERAL_STRING = 1 << 16
MAX_LITERAL_ITEMS = 1 << 20
#: Device types a stored argument may name (``torch.device`` of another type may look up a backend module).
DEVICE_TYPES = ("cpu", "cuda", "meta", "mps", "xpu", "hpu", "mtia")
_DEVICE = re.compile(rf"(?:{'|'.join(DEVICE_TYPES)})(?::[0-9]{{1,4}})?\Z")
_OPS = ("placeholder", "call_function", "call_method", "get_attr", "call_module", "output")

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


def _decode_target(op: str, target: Any, where: str, owned: Any) -> Any:
    """A stored node's target, through the allow-list (:mod:`precompile.manifest.graph_allow`); nothing imported."""
    from precompile.manifest import graph_allow  # decoding only: its tables stay off the key and load paths

    if op == "placeholder":
        if not graph_allow.identifier(target):
            raise ArtifactFormatError(f"{where}: placeholder target {target!r:.120} is not an identifier")
        return target
    if op == "output":
        return "output"
    if op in ("get_attr", "call_module"):
        if not isinstance(target, str) or target not in owned:
            raise ArtifactFormatError(f"{where} reads {target!r:.120}, which is not a sub-graph the stored graph holds")
        return target
    if op == "call_method":
        return target  # checked with its receiver (graph_allow.check_method)
    if not isinstance(target, dict) or len(target) != 1:
        raise ArtifactFormatError(f"{where}: target {target!r:.120} is not a stored target ({{\"op\": ...}}, "
                                  "{\"oppacket\": ...}, {\"hop\": ...} or {\"fn\": ...})")
    (kind, name), = target.items()
    if kind == "op" and isinstance(name, str) and "." in name:
        qual, _, overload = name.rpartition(".")
        return graph_allow.lookup_op(qual, overload, where)
    if kind == "oppacket":
        return graph_allow.lookup_op(name, None, where)
    if kind == "hop":
        return graph_allow.lookup_hop(name, where)
    if kind == "fn":
        return graph_allow.lookup_function(name, where)
    raise ArtifactFormatError(f"{where}: target {target!r:.120} is not a stored target")


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


def decode_arg(value: Any, nodes: list[torch.fx.Node], _depth: int = 0) -> Any:
    """One stored argument (the form :func:`graph_to_json` writes) as a value; ``{"$node": i}`` is ``nodes[i]``.

    Raises:
        ArtifactFormatError: an unknown tag or a malformed payload, a reference to a node that is not an earlier
            one, a dtype, layout or memory format this torch lacks, a device of another type than
            :data:`DEVICE_TYPES`, nesting deeper than :data:`MAX_ARG_DEPTH`, or an int, string or list past its
            bound (:data:`MAX_LITERAL_INT`, :data:`MAX_LITERAL_STRING`, :data:`MAX_LITERAL_ITEMS`).
    """
    if _depth > MAX_ARG_DEPTH:
        raise ArtifactFormatError(f"a stored argument nests deeper than {MAX_ARG_DEPTH}")
    _check_literal(value)
    if isinstance(value, list):
        return [decode_arg(v, nodes, _depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ArtifactFormatError(f"stored argument {value!r:.80} is not a value, a list or one tagged value")
    (tag, payload), = value.items()
    _check_literal(payload)
    items = ([decode_arg(v, nodes, _depth + 1) for v in payload]
             if tag in ("$complex", "$size", "$slice", "$tuple") and isinstance(payload, list) else None)
    if tag == "$node" and type(payload) is int and 0 <= payload < len(nodes):
        return nodes[payload]
    if tag == "$float" and payload in ("nan", "inf", "-inf"):
        return float(payload)
    if tag == "$complex" and items is not None and len(items) == 2 and all(_real(v) for v in items):
        return complex(items[0], items[1])
    if tag in TORCH_NAMES and isinstance(payload, str) and payload in TORCH_NAMES[tag]:
        return TORCH_NAMES[tag][payload]
    if tag == "$device" and isinstance(payload, str) and _DEVICE.match(payload):
        return torch.device(payload)
    if tag == "$size" and items is not None and all(type(v) is int for v in items):
        return torch.Size(items)
    if tag == "$slice" and items is not None and len(items) == 3:
        return slice(*items)
    if tag == "$ellipsis" and payload is True:
        return Ellipsis
    if tag == "$tuple" and items is not None:
        return tuple(items)
    if tag == "$dict" and isinstance(payload, list) and all(isinstance(p, list) and len(p) == 2 for p in payload):
        pairs = [(decode_arg(k, nodes, _depth + 1), decode_arg(v, nodes, _depth + 1)) for k, v in payload]
        if all(k is None or isinstance(k, (bool, int, float, str)) for k, _ in pairs):
            return dict(pairs)
    raise ArtifactFormatError(f"stored argument {value!r:.80} is not a valid {tag!r:.40} value")


def _check_literal(value: Any) -> None:
    """Raise :class:`ArtifactFormatError` for an int, string or list past its bound (:data:`MAX_LITERAL_INT`...)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_LITERAL_INT <= value <= MAX_LITERAL_INT:
        raise ArtifactFormatError(f"a stored argument holds an int of {value.bit_length()} bits, more than the "
                                  f"{MAX_LITERAL_INT.bit_length() - 1} of an int64 or uint64")
    if isinstance(value, str) and len(value) > MAX_LITERAL_STRING:
        raise ArtifactFormatError(f"a stored argument holds a string of {len(value)} characters, more than "
                                  f"{MAX_LITERAL_STRING}")
    if isinstance(value, list) and len(value) > MAX_LITERAL_ITEMS:
        raise ArtifactFormatError(f"a stored argument holds a list of {len(value)} items, more than "
                                  f"{MAX_LITERAL_ITEMS}")


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def graph_from_json(data: Any, _depth: int = 0) -> torch.fx.GraphModule:
    """Rebuild a ``GraphModule`` from :func:`graph_to_json` output (inverse up to ``meta``), calling only what the
    allow-list allows (:mod:`precompile.manifest.graph_allow`); nothing stored is imported or looked up by an
    attribute walk, and every name that reaches the generated code is an ASCII identifier.

    Raises:
        ArtifactFormatError: the data is not a serialized graph of a known schema, or a node (named in the message
            with its op and target) calls, reads or passes something the allow-list does not allow, or is malformed.
        ConfigError: ``PRECOMPILE_GRAPH_OP_NAMESPACES`` is malformed.
    """
    from precompile.manifest import graph_allow
    from precompile.manifest.graph_allow import identifier

    if not isinstance(data, dict) or data.get("schema") != GRAPH_SCHEMA:
        raise ArtifactFormatError(f"a stored FX graph must be an object of schema {GRAPH_SCHEMA}")
    if _depth > MAX_GRAPH_DEPTH:
        raise ArtifactFormatError(f"a stored FX graph nests sub-graphs deeper than {MAX_GRAPH_DEPTH}")
    subs, specs = data.get("submodules", {}), data.get("nodes")
    if not isinstance(subs, dict) or not isinstance(specs, list) or not specs:
        raise ArtifactFormatError("a stored FX graph needs a list of nodes and an object of sub-graphs")
    root = torch.nn.Module()
    for name, sub in subs.items():
        parts = name.split(".") if isinstance(name, str) else [None]
        if not all(identifier(p) and not p.startswith("_") for p in parts):
            raise ArtifactFormatError(f"sub-graph name {name!r:.120} is not a dotted name of identifiers")
        owner = root
        for part in parts[:-1]:
            if part not in owner._modules:
                _add_module(owner, part, torch.nn.Module(), name)
            owner = owner._modules[part]
        _add_module(owner, parts[-1], graph_from_json(sub, _depth + 1), name)
    graph = torch.fx.Graph()
    nodes: list[torch.fx.Node] = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or set(spec) != {"name", "op", "target", "args", "kwargs"}:
            raise ArtifactFormatError(f"node {i} of a stored FX graph is not a node (name, op, target, args, kwargs)")
        name, op = spec["name"], spec["op"]
        where = f"node {i} ({name!r:.60}, {op!r:.20})"
        if not identifier(name) or op not in _OPS:
            raise ArtifactFormatError(f"{where}: the name must be an identifier and the op one of {', '.join(_OPS)}")
        raw_args, raw_kwargs = spec["args"], spec["kwargs"]
        if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict) or not all(map(identifier, raw_kwargs)):
            raise ArtifactFormatError(f"{where}: args must be a list and kwargs an object keyed by identifiers")
        target = _decode_target(op, spec["target"], where, subs)
        if op == "call_method":
            graph_allow.check_method(target, raw_args, where)
        elif op == "call_function" and spec["target"] == {"fn": "builtins:getattr"}:
            graph_allow.check_getattr(raw_args, raw_kwargs, where)
        elif op == "placeholder" and (raw_args or raw_kwargs):
            raise ArtifactFormatError(f"{where}: a stored placeholder takes no default value")
        try:
            args = tuple(decode_arg(raw_args, nodes))
            kwargs = {k: decode_arg(v, nodes) for k, v in raw_kwargs.items()}
        except ArtifactFormatError as err:
            raise ArtifactFormatError(f"{where}: {err}") from None
        if op == "output":
            if i != len(specs) - 1 or len(args) != 1 or kwargs:
                raise ArtifactFormatError(f"{where}: the one output node comes last and takes one argument")
            node = graph.output(args[0])
        else:
            node = graph.create_node(op, target, args, kwargs, name=name)
        nodes.append(node)
    if nodes[-1].op != "output":
        raise ArtifactFormatError("a stored FX graph must end with its output node")
    try:
        return torch.fx.GraphModule(root, graph)
    except Exception as err:  # noqa: BLE001 - FX's code generation of a graph it was not meant to see, any way it fails
        raise ArtifactFormatError(f"a stored FX graph does not make a module: {type(err).__name__}: {err}") from None


def _add_module(owner: torch.nn.Module, part: str, module: torch.nn.Module, name: str) -> None:
    try:
        owner.add_module(part, module)
    except KeyError as err:  # a name torch.nn.Module uses itself: "forward", "training"...
        raise ArtifactFormatError(f"sub-graph name {name!r:.120} is taken by the module itself: {err}") from None


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
