"""A checked wrapper graph (:mod:`precompile.manifest.wrapper.graph`) turned into its callable: Python generated here,
from the checked data, as FX's own code generation would write it; nothing of the stored text is executed.  Views,
allocations and size arithmetic whose bounds the graph does not fix are checked once per call
(:mod:`precompile.manifest.wrapper.bounds`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from precompile.manifest.wrapper import bounds
from precompile.manifest.graph_json import decode_arg
from precompile.manifest.wrapper.graph import WrapperGraphError, _target, check


def build(data: Any, launch: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """The callable of a stored wrapper graph: ``fn(*placeholders) -> the graph's output``.

    The function is generated here, from the checked data, as FX's own code generation would write it: one
    line per node calling its allowed target (bound by position, never by a stored name), constants bound as
    values, and each intermediate released after its last use, so buffers are freed as early as in Inductor's
    Python wrapper.  Nothing of the stored text is executed.  A view, allocation or size computation that
    :func:`check` could not prove in bounds calls its checked form (:mod:`precompile.manifest.wrapper.bounds`),
    and a placeholder a kernel takes as a pointer is checked to be a tensor, once per call; those checks raise
    :class:`WrapperGraphError` from the call.

    Args:
        launch: what a ``triton_kernel_wrapper_mutation`` node calls, with that node's keyword arguments
            (``kernel_idx``, ``constant_args_idx``, ``grid``, ``tma_descriptor_metadata``, ``kwargs``).

    Raises:
        WrapperGraphError: :func:`check` refused the data, or it launches Triton kernels and ``launch`` is None.
    """
    values, checks = check(data)
    nodes = data["nodes"]
    scope: dict[str, Any] = {"__builtins__": {"__import__": _import_loaded}}
    last_use: dict[int, int] = {}
    for i, spec in enumerate(nodes):
        for j in _refs([*spec["args"], *spec["kwargs"].values()]):
            last_use[j] = i
    released: dict[int, list[int]] = {}  # node -> the intermediates whose last use it is
    for j, last in last_use.items():
        if nodes[j]["op"] != "placeholder":
            released.setdefault(last, []).append(j)
    params, body, streams, pointers = [], [], {}, set()
    placeholders = {i for i, spec in enumerate(nodes) if spec["op"] == "placeholder"}
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
            target, bound = launch, _bind(spec, launch, scope, streams, f"node {i} ({spec['name']})", values,
                                          pointers, placeholders)
        if bound is not None:
            body.append(f"    v{i} = {bound}")
        elif i in checks:
            body.append(f"    v{i} = {_checked(i, checks[i], spec, target, scope)}")
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
    if pointers:  # placeholders a kernel takes as pointers: tensors, checked once per call
        scope["_tensors"] = _tensors
        head.insert(0, f"    _tensors({', '.join(f'v{j}' for j in sorted(pointers))})")
    code = "\n".join([f"def wrapper({', '.join(params)}):", *head, *body])
    exec(compile(code, "<precompile wrapper graph>", "exec"), scope)  # noqa: S102 - generated here from checked data
    return scope["wrapper"]


#: The modules the C code run by a wrapper graph's calls imports through the wrapper's builtins (CPython's
#: ``PyImport_Import``: pybind11's ``module_::import``, ``PyImport_ImportModule``), and nothing else: ``torch``,
#: which torch's argument parser imports on first use for ``torch.SymInt``/``SymBool``/``SymFloat``
#: (torch/csrc/utils/python_symnode.cpp; recorded by running tests/manifest/test_wrapper_graph*.py and
#: test_no_host_code.py, the only name asked), and ``torch.cuda``, which ``torch::utils::device_lazy_init``
#: (torch/csrc/utils/device_lazy_init.cpp) imports for ``_lazy_init`` at a process's first CUDA allocation
#: (``empty_strided`` on a GPU graph; read from the source, not recorded here: no GPU).
WRAPPER_IMPORTS = frozenset({"torch", "torch.cuda"})


def _import_loaded(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),  # noqa: A002
                   level: int = 0) -> Any:
    """The one builtin the generated wrapper's globals hold, for the C code its calls run, never for the wrapper.

    CPython's ``PyImport_Import`` (pybind11's ``module_::import``) takes ``__import__`` from the builtins of the
    calling frame's globals, and the calling frame is the generated wrapper.  Torch's argument parser imports
    ``torch`` that way on first use (``torch.SymBool`` for a ``bool`` argument, ``torch.SymInt``...), so without
    this the first such call in a process, ``aten::convolution``'s ``transposed``, raised
    ``KeyError: '__import__'``.  The generated code never names it (its names are ``v<i>``, ``t<i>``, ``c<n>``...
    bound by :func:`build`, and stored strings are ``repr``'d).

    It imports (or hands out, when loaded) only the modules of :data:`WRAPPER_IMPORTS`, as ``__import__`` returns
    them (the top package, or the module itself with a ``fromlist``, whose names it never imports).

    Raises:
        ImportError: ``name`` is not on :data:`WRAPPER_IMPORTS` (``os``, ``builtins``, ``torch.utils.cpp_extension``:
            loaded or not), or the import is relative (``level`` > 0); the error names the module.
    """
    if level != 0 or name not in WRAPPER_IMPORTS:
        raise ImportError(f"a wrapper graph's call imports only {', '.join(sorted(WRAPPER_IMPORTS))}, not "
                          f"{name!r}{' (relative)' if level else ''}", name=name)
    module = importlib.import_module(name)
    return module if fromlist else sys.modules[name.partition(".")[0]]


def _checked(i: int, how: tuple[Any, ...], spec: dict[str, Any], target: Any, scope: dict[str, Any]) -> str:
    """The call of node ``i`` in its checked form (:func:`precompile.manifest.wrapper.bounds.analyze`'s ``how``)."""
    args = [_render(v, scope) for v in spec["args"]]
    kwargs = [f"{k}={_render(v, scope)}" for k, v in spec["kwargs"].items()]
    if how[0] == "view":
        base, size, stride, offset = args
        if how[1] is not None:  # constant sizes: their extent computed once, here; the storage checked per call
            scope[f"t{i}"] = _view_of(*how[2:], how[1])
            return f"t{i}({base})"
        scope["_view"] = bounds.checked_view
        return f"_view({base}, {size}, {stride}, {offset})"
    if how[0] == "empty":
        scope["_empty"] = bounds.checked_empty
        return f"_empty({', '.join([*args, *kwargs])})"
    scope[f"t{i}"] = bounds.checked_int(target)
    return f"t{i}({', '.join(args)})"


def _view_of(size: list[int], stride: list[int], offset: int, need: int) -> Any:
    """``view(base)``: :func:`~precompile.manifest.wrapper.bounds.checked_view` with constant values."""
    def view(base: Any) -> torch.Tensor:
        return bounds.checked_view(base, size, stride, offset, need)

    return view


def _tensors(*values: Any) -> None:
    """Raises WrapperGraphError unless every value is a tensor (or None): a kernel's pointer arguments."""
    for v in values:
        _tensor(v)


def _tensor(value: Any) -> Any:
    """``value``, a kernel's pointer argument; raises WrapperGraphError unless it is a tensor (or None)."""
    if value is not None and not isinstance(value, torch.Tensor):
        raise WrapperGraphError(f"a kernel's pointer argument is a {type(value).__name__}, not a tensor")
    return value


def _bind(spec: dict[str, Any], launch: Any, scope: dict[str, Any], streams: dict[int, str],
          where: str, values: list[Any], pointers: set[int], placeholders: set[int]) -> str | None:
    """A launch node as one direct call, ``k<n>(s<device>, grid_x, grid_y, grid_z, *cubin arguments)``, where the
    launcher offers ``bind(kernel_idx) -> (names of the arguments the cubin takes, the names among them that are
    pointers, run(stream, x, y, z, *args), device index)`` and ``stream(device) -> the raw current stream``, and
    the node is plain (one grid, no side-table constants or TMA descriptors); else None (the generic keyword call).
    ``streams`` collects ``{device: name of the stream function in scope}`` for the wrapper's first lines, and
    ``pointers`` the ``placeholders`` passed as pointers (``values``: :func:`check`'s), checked once per call to be
    tensors; another node that may not be a tensor is checked where it is passed.

    Raises:
        WrapperGraphError: a kernel without a launch record, an argument it takes missing, or a pointer that is not
            a tensor of the graph (a constant, or a node whose result is an integer or nothing).
    """
    if not hasattr(launch, "bind"):
        return None
    kw = spec["kwargs"]
    grid, named, idx = kw.get("grid"), kw.get("kwargs"), kw.get("kernel_idx")
    if not (isinstance(idx, int) and isinstance(grid, list) and len(grid) == 1 and isinstance(grid[0], dict)
            and "$tuple" in grid[0] and len(grid[0]["$tuple"]) == 3 and isinstance(named, dict) and "$dict" in named
            and kw.get("tma_descriptor_metadata") in ({"$dict": []}, None)):
        return None
    try:
        passed, pointer_names, run, device = launch.bind(idx)
    except KeyError:
        raise WrapperGraphError(f"{where} launches kernel {idx}, which has no launch record") from None
    given = {k: v for k, v in named["$dict"]}
    missing = [a for a in passed if a not in given]
    if missing:
        raise WrapperGraphError(f"{where} does not pass the kernel's arguments {missing}")
    # a pointer argument is a tensor the graph holds (or None), never an address the stored graph makes up
    refs = {a: (given[a]["$node"] if isinstance(given[a], dict) and "$node" in given[a] else None)
            for a in pointer_names}
    bad = [a for a, j in refs.items() if not (given[a] is None or j is not None and values[j].kind in ("tensor", "any"))]
    if bad:
        raise WrapperGraphError(f"{where} passes {bad} as pointers, which are not tensors of the graph")
    unsure = {j for j in refs.values() if j is not None and values[j].kind == "any"}  # checked per call
    pointers.update(unsure & placeholders)
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise WrapperGraphError(f"{where}: the launcher names device {device!r}, not an index")
    if device not in streams:
        streams[device] = f"g{len(scope)}"
        scope[streams[device]] = launch.stream
    name = f"k{len(scope)}"
    scope[name] = run
    args = [_render(v, scope) for v in grid[0]["$tuple"]] + [
        f"_tensor({_render(given[a], scope)})" if refs.get(a) in unsure - placeholders else _render(given[a], scope)
        for a in passed]
    if unsure - placeholders:
        scope["_tensor"] = _tensor
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
