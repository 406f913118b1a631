"""A stored wrapper graph as readable text (``precompile inspect --wrapper``, ``precompile diff``)."""

from __future__ import annotations

from typing import Any

from precompile.manifest.graph_json import decode_arg
from precompile.manifest.wrapper.graph import check


def describe(data: Any) -> str:
    """The checked wrapper graph as readable lines, one per node (``v5 = aten::addmm.out(v2, v0, v4, out=v3)``),
    for ``precompile inspect --wrapper`` and ``diff``; nothing is built or run.

    Raises:
        WrapperGraphError: :func:`check` refused the data.
    """
    check(data)
    names = {i: n["name"] for i, n in enumerate(data["nodes"])}
    params, lines = [], []
    for i, spec in enumerate(data["nodes"]):
        if spec["op"] == "placeholder":
            params.append(spec["name"])
            continue
        args = [_show(v, names) for v in spec["args"]]
        if spec["op"] == "output":
            lines.append(f"return {args[0] if args else 'None'}")
            continue
        (kind, target), = spec["target"].items()
        kwargs = [f"{k}={_show(v, names)}" for k, v in spec["kwargs"].items()]
        lines.append(f"{spec['name']} = {target}({', '.join([*args, *kwargs])})")
    return "\n".join([f"def wrapper({', '.join(params)}):", *("    " + line for line in lines)])


def _show(value: Any, names: dict[int, str]) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v, names) for v in value) + "]"
    (tag, payload), = value.items()
    if tag == "$node":
        return names[payload]
    if tag in ("$tuple", "$size"):
        return "(" + "".join(_show(v, names) + ", " for v in payload) + ")"
    if tag == "$slice":
        return "slice(" + ", ".join(_show(v, names) for v in payload) + ")"
    if tag == "$dict":
        return "{" + ", ".join(f"{_show(k, names)}: {_show(v, names)}" for k, v in payload) + "}"
    return str(decode_arg(value, []))
