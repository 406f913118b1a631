"""A checked wrapper graph (:mod:`precompile.artifact.wrapper_graph`) turned into its callable: Python generated here,
from the checked data, as FX's own code generation would write it; nothing of the stored text is executed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from precompile.artifact.graph_json import decode_arg
from precompile.artifact.wrapper_graph import WrapperGraphError, _target, check


def build(data: Any, launch: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """The callable of a stored wrapper graph: ``fn(*placeholders) -> the graph's output``.

    The function is generated here, from the checked data, as FX's own code generation would write it: one
    line per node calling its allowed target (bound by position, never by a stored name), constants bound as
    values, and each intermediate released after its last use, so buffers are freed as early as in Inductor's
    Python wrapper.  Nothing of the stored text is executed.

    Args:
        launch: what a ``triton_kernel_wrapper_mutation`` node calls, with that node's keyword arguments
            (``kernel_idx``, ``constant_args_idx``, ``grid``, ``tma_descriptor_metadata``, ``kwargs``).

    Raises:
        WrapperGraphError: :func:`check` refused the data, or it launches Triton kernels and ``launch`` is None.
    """
    check(data)
    nodes = data["nodes"]
    scope: dict[str, Any] = {"__builtins__": {}}
    last_use: dict[int, int] = {}
    for i, spec in enumerate(nodes):
        for j in _refs([*spec["args"], *spec["kwargs"].values()]):
            last_use[j] = i
    released: dict[int, list[int]] = {}  # node -> the intermediates whose last use it is
    for j, last in last_use.items():
        if nodes[j]["op"] != "placeholder":
            released.setdefault(last, []).append(j)
    params, body, streams = [], [], {}
    for i, spec in enumerate(nodes):
        if spec["op"] == "placeholder":
            params.append(f"v{i}")
            continue
        args = [_render(v, scope) for v in spec["args"]]
        if spec["op"] == "output":
            body.append(f"    return {args[0] if args else 'None'}")
            break
        target, bound = _target(spec["target"], f"node {i}"), None
        if target is None:  # a Triton launch
            if launch is None:
                raise WrapperGraphError(f"node {i} ({spec['name']}) launches a Triton kernel and no launcher was given")
            target, bound = launch, _bind(spec, launch, scope, streams, f"node {i} ({spec['name']})")
        if bound is not None:
            body.append(f"    v{i} = {bound}")
        else:
            # an aten overload's __call__ is ``return self._op(*args, **kwargs)``: call its C++ entry directly
            op = getattr(target, "_op", None) if type(target) is torch._ops.OpOverload else None
            scope[f"t{i}"] = op if callable(op) else target
            kwargs = [f"{k}={_render(v, scope)}" for k, v in spec["kwargs"].items()]
            body.append(f"    v{i} = t{i}({', '.join([*args, *kwargs])})")
        dead = released.get(i, []) + ([i] if i not in last_use else [])
        if dead:
            body.append("    " + " = ".join(f"v{j}" for j in dead) + " = None")
    # each device's current stream, read once per call (as Inductor's Python wrapper does)
    head = [f"    s{d} = {name}({d})" for d, name in streams.items()]
    code = "\n".join([f"def wrapper({', '.join(params)}):", *head, *body])
    exec(compile(code, "<precompile wrapper graph>", "exec"), scope)  # noqa: S102 - generated here from checked data
    return scope["wrapper"]


def _bind(spec: dict[str, Any], launch: Any, scope: dict[str, Any], streams: dict[int, str],
          where: str) -> str | None:
    """A launch node as one direct call, ``k<n>(s<device>, grid_x, grid_y, grid_z, *cubin arguments)``, where the
    launcher offers ``bind(kernel_idx) -> (names of the arguments the cubin takes, the names among them that are
    pointers, run(stream, x, y, z, *args), device index)`` and ``stream(device) -> the raw current stream``, and
    the node is plain (one grid, no side-table constants or TMA descriptors); else None (the generic keyword call).
    ``streams`` collects ``{device: name of the stream function in scope}`` for the wrapper's first lines."""
    if not hasattr(launch, "bind"):
        return None
    kw = spec["kwargs"]
    grid, named, idx = kw.get("grid"), kw.get("kwargs"), kw.get("kernel_idx")
    if not (isinstance(idx, int) and isinstance(grid, list) and len(grid) == 1 and isinstance(grid[0], dict)
            and "$tuple" in grid[0] and len(grid[0]["$tuple"]) == 3 and isinstance(named, dict) and "$dict" in named
            and kw.get("tma_descriptor_metadata") in ({"$dict": []}, None)):
        return None
    try:
        passed, pointers, run, device = launch.bind(idx)
    except KeyError:
        raise WrapperGraphError(f"{where} launches kernel {idx}, which has no launch record") from None
    values = {k: v for k, v in named["$dict"]}
    missing = [a for a in passed if a not in values]
    if missing:
        raise WrapperGraphError(f"{where} does not pass the kernel's arguments {missing}")
    # a pointer argument is a tensor the graph holds (or None), never an address the stored graph makes up
    bad = [a for a in pointers if not (values[a] is None or isinstance(values[a], dict) and "$node" in values[a])]
    if bad:
        raise WrapperGraphError(f"{where} passes {bad} as pointers, which are not tensors of the graph")
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise WrapperGraphError(f"{where}: the launcher names device {device!r}, not an index")
    if device not in streams:
        streams[device] = f"g{len(scope)}"
        scope[streams[device]] = launch.stream
    name = f"k{len(scope)}"
    scope[name] = run
    args = [_render(v, scope) for v in grid[0]["$tuple"]] + [_render(values[a], scope) for a in passed]
    return f"{name}({', '.join([f's{device}', *args])})"


def _refs(values: list[Any]) -> list[int]:
    """Indices of the nodes a checked argument list references."""
    out: list[int] = []
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            (tag, payload), = v.items()
            if tag == "$node":
                out.append(payload)
            elif tag == "$dict":
                stack.extend(pv for _, pv in payload)
            elif isinstance(payload, list):
                stack.extend(payload)
    return out


def _render(value: Any, scope: dict[str, Any]) -> str:
    """Python source for one checked argument: node references as ``v<i>``, plain values by ``repr``, tagged
    values (dtypes, devices, non-finite floats...) bound in ``scope`` as ``c<n>``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_render(v, scope) for v in value) + "]"
    (tag, payload), = value.items()
    if tag == "$node":
        return f"v{payload}"
    if tag == "$tuple":
        return "(" + "".join(_render(v, scope) + ", " for v in payload) + ")"
    if tag == "$dict":
        return "{" + ", ".join(f"{_render(k, scope)}: {_render(v, scope)}" for k, v in payload) + "}"
    if tag in ("$size", "$slice"):
        name = f"c{len(scope)}"
        scope[name] = torch.Size if tag == "$size" else slice
        inner = ", ".join(_render(v, scope) for v in payload)
        return f"{name}([{inner}])" if tag == "$size" else f"{name}({inner})"
    name = f"c{len(scope)}"
    scope[name] = decode_arg(value, [])
    return name
