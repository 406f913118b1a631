"""The wrapper as data: an FX graph of allow-listed targets, stored as JSON and rebuilt into a callable without
importing, executing or loading anything the artifact names.

Inductor's FX wrapper (``torch._inductor.config.fx_wrapper``, ``WrapperFxCodegen`` + ``FxConverter``; the seed
``wrapper_fxir.py``) emits the host side of a compiled GPU graph as an FX graph: buffers allocated with
``torch.empty_strided``, views with ``torch.as_strided``, library calls as ATen ``.out`` overloads, each Triton
kernel as ``triton_kernel_wrapper_mutation(kernel_idx=..., constant_args_idx=..., grid=[(x, y, z)], kwargs={...})``
with the kernel in a side table.  Stored as data, such a graph carries no host code: this module is its format.

Format: :func:`precompile.manifest.graph_json.graph_to_json`'s (``{"schema", "nodes": [{"name", "op", "target", "args",
"kwargs"}], "submodules": {}}``, nodes referenced by position), restricted by :func:`check`:

- ops: ``placeholder``, ``call_function``, ``output`` (exactly one, last); no submodules, attributes or methods;
- targets: a positive allow-list (:mod:`precompile.manifest.wrapper.ops`, each entry with why it stays inside
  the storages it is given): the ATen overloads of :data:`ALLOWED_OPS` (``{"op": "aten::addmm.out"}``; looked up
  on ``torch.ops``, nothing imported), the functions of :data:`ALLOWED_FUNCTIONS` (``{"fn": "torch:empty_strided"}``,
  ``torch:as_strided``, ``getitem``, size arithmetic), and ``{"hop": "triton_kernel_wrapper_mutation"}``, which the
  loader binds to its own launcher of the artifact's cubins (:func:`precompile.manifest.wrapper.codegen.build`'s
  ``launch``);
- arguments: JSON values, references to earlier nodes, dtypes, devices, layouts, memory formats, sizes, slices,
  tuples and dicts with string or int keys; nothing else; each function's arguments in the form the converter
  writes them (:mod:`precompile.manifest.wrapper.bounds`);
- bounds: at most :data:`MAX_NODES` nodes, nesting depth :data:`MAX_DEPTH`, :data:`MAX_ITEMS` items per list or
  dict, strings of at most :data:`MAX_STRING` characters, node and placeholder names that are identifiers; every
  view inside the storage it views and every allocation's sizes non-negative and within int64
  (:mod:`precompile.manifest.wrapper.bounds`: at load where the values are constants, else once per call).

What a graph like this still does: allocate memory, call the listed ATen kernels, and launch the artifact's cubins
with tensors of the graph as their pointers; a malicious cubin's effects on the GPU are not contained
(docs/format.md, "Trust").
"""

from __future__ import annotations

import keyword
import math
from typing import Any

import torch
import torch.fx

from precompile.manifest.graph_json import GRAPH_SCHEMA, TORCH_NAMES, graph_to_json
from precompile.manifest.names import ascii_identifier
from precompile.manifest.wrapper.bounds import Value, analyze
from precompile.manifest.wrapper.ops import (ALLOWED_FUNCTIONS, ALLOWED_OPS, ARITHMETIC, TRITON_LAUNCH,
                                             WrapperGraphError, lookup_op)

__all__ = ["ALLOWED_FUNCTIONS", "ALLOWED_OPS", "MAX_DEPTH", "MAX_ITEMS", "MAX_NODES", "MAX_STRING", "TRITON_LAUNCH",
           "WrapperGraphError", "check", "to_data"]

MAX_NODES = 100_000
MAX_DEPTH = 8
MAX_ITEMS = 4096
MAX_STRING = 256

def to_data(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """``gm`` (Inductor's FX wrapper graph) as data, checked as a load would check it.

    Raises:
        WrapperGraphError: ``gm`` uses something the format does not allow (the message names the node); then the
            artifact keeps the Python wrapper and says why.
        UnserializableGraphError: an argument cannot be stored at all.
    """
    data = graph_to_json(gm)
    check(data)
    return data


def check(data: Any) -> tuple[list[Value], dict[int, Any]]:
    """Check a stored wrapper graph against the format (module docstring) without building anything.

    Returns:
        :func:`precompile.manifest.wrapper.bounds.analyze`'s ``(values, checks)``: what each node's result is,
        and the nodes to check at call time (what :func:`precompile.manifest.wrapper.codegen.build` generates).

    Raises:
        WrapperGraphError: naming the first node or value that is not allowed, and why (a target outside the
            allow-list, arguments not in the form its target takes, a view that reaches past a storage the graph
            fixes, a negative or overflowing size, stride or offset...).
    """
    if not isinstance(data, dict) or data.get("schema") != GRAPH_SCHEMA:
        raise WrapperGraphError(f"not a wrapper graph of schema {GRAPH_SCHEMA}")
    if data.get("submodules"):
        raise WrapperGraphError("a wrapper graph has no submodules")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise WrapperGraphError("a wrapper graph needs a list of nodes")
    if len(nodes) > MAX_NODES:
        raise WrapperGraphError(f"{len(nodes)} nodes, more than {MAX_NODES}")
    for i, node in enumerate(nodes):
        where = f"node {i}"
        if not isinstance(node, dict) or set(node) != {"name", "op", "target", "args", "kwargs"}:
            raise WrapperGraphError(f"{where} is not a node (name, op, target, args, kwargs)")
        name, op = node["name"], node["op"]
        if not _identifier(name):
            raise WrapperGraphError(f"{where}'s name {str(name)[:40]!r} is not an identifier")
        where = f"node {i} ({name})"
        if not isinstance(node["args"], list) or not isinstance(node["kwargs"], dict):
            raise WrapperGraphError(f"{where}: args must be a list and kwargs an object")
        if op == "placeholder":
            if not _identifier(node["target"]) or node["args"] or node["kwargs"]:
                raise WrapperGraphError(f"{where}: a placeholder takes an identifier and no arguments")
        elif op == "call_function":
            found = _target(node["target"], where)
            fn = node["target"].get("fn")
            if fn in ARITHMETIC and not all(
                    isinstance(a, int) or isinstance(a, dict) and set(a) == {"$node"} for a in node["args"]):
                raise WrapperGraphError(f"{where}: size arithmetic takes integers and nodes only")
            if found is None and not (isinstance(node["kwargs"].get("kernel_idx"), int)
                                      and not isinstance(node["kwargs"]["kernel_idx"], bool)):
                raise WrapperGraphError(f"{where}: a kernel launch needs an integer kernel_idx")
        elif op == "output":
            if i != len(nodes) - 1:
                raise WrapperGraphError(f"{where}: the output node must be the last")
        else:
            raise WrapperGraphError(f"{where}: op {str(op)[:40]!r} is not allowed (placeholder, call_function, "
                                    "output)")
        for value in [*node["args"], *node["kwargs"].values()]:
            _value(value, i, where, 0)
        if any(not _identifier(k) for k in node["kwargs"]):
            raise WrapperGraphError(f"{where}: keyword names must be ASCII identifiers")
    if nodes[-1]["op"] != "output":
        raise WrapperGraphError("the last node must be the output")
    return analyze(nodes)


def _identifier(value: Any) -> bool:
    # ASCII: Python folds other identifier characters to NFKC when it compiles, so two different stored names
    # could become one keyword (a SyntaxError at build, not a WrapperGraphError)
    return ascii_identifier(value, MAX_STRING) and not keyword.iskeyword(value)


def _target(target: Any, where: str) -> Any:
    """The allowed callable ``target`` names (None for a Triton launch), or :class:`WrapperGraphError`."""
    if isinstance(target, dict) and len(target) == 1:
        (kind, name), = target.items()
        if not isinstance(name, str):
            raise WrapperGraphError(f"{where}: target {str(target)[:80]} is not in the wrapper allow-list")
        if kind == "fn" and name in ALLOWED_FUNCTIONS:
            return ALLOWED_FUNCTIONS[name]
        if kind == "hop" and name == TRITON_LAUNCH:
            return None
        if kind == "op":
            try:
                found = lookup_op(name)
            except WrapperGraphError as err:
                raise WrapperGraphError(f"{where}: {err}") from None
            if found is not None:
                return found
    raise WrapperGraphError(f"{where}: target {str(target)[:80]} is not in the wrapper allow-list")


def _value(value: Any, index: int, where: str, depth: int) -> None:
    """Check one stored argument (see the module docstring)."""
    if depth > MAX_DEPTH:
        raise WrapperGraphError(f"{where}: arguments nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise WrapperGraphError(f"{where}: a non-finite float must be stored tagged")
        return
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise WrapperGraphError(f"{where}: a string of {len(value)} characters, more than {MAX_STRING}")
        return
    if isinstance(value, list):
        if len(value) > MAX_ITEMS:
            raise WrapperGraphError(f"{where}: a list of {len(value)} items, more than {MAX_ITEMS}")
        for v in value:
            _value(v, index, where, depth + 1)
        return
    if not isinstance(value, dict) or len(value) != 1:
        raise WrapperGraphError(f"{where}: an argument of type {type(value).__name__} is not allowed")
    (tag, payload), = value.items()
    if tag == "$node":
        if not isinstance(payload, int) or isinstance(payload, bool) or not 0 <= payload < index:
            raise WrapperGraphError(f"{where}: a reference to node {str(payload)[:20]} (only earlier nodes)")
    elif tag == "$float":
        if payload not in ("inf", "-inf", "nan"):
            raise WrapperGraphError(f"{where}: tagged float {str(payload)[:20]!r}")
    elif tag in TORCH_NAMES:
        if not (isinstance(payload, str) and payload in TORCH_NAMES[tag]):
            raise WrapperGraphError(f"{where}: {tag[1:]} {str(payload)[:40]!r} is not one of torch's")
    elif tag == "$device":
        try:
            torch.device(payload if isinstance(payload, str) and len(payload) <= 32 else "?")
        except (RuntimeError, TypeError) as err:
            raise WrapperGraphError(f"{where}: device {str(payload)[:40]!r}: {err}") from None
    elif tag in ("$size", "$tuple", "$slice"):
        if not isinstance(payload, list) or (tag == "$slice" and len(payload) != 3):
            raise WrapperGraphError(f"{where}: a malformed {tag[1:]}")
        _value(payload, index, where, depth + 1)
    elif tag == "$dict":
        if not isinstance(payload, list) or len(payload) > MAX_ITEMS or not all(
                isinstance(kv, list) and len(kv) == 2 and (isinstance(kv[0], int) and not isinstance(kv[0], bool)
                                                           or isinstance(kv[0], str) and len(kv[0]) <= MAX_STRING)
                for kv in payload):
            raise WrapperGraphError(f"{where}: a malformed dict (pairs with string or int keys)")
        for _, v in payload:
            _value(v, index, where, depth + 1)
    else:
        raise WrapperGraphError(f"{where}: tag {str(tag)[:20]!r} is not allowed")
