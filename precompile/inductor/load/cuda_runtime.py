"""The fast path's Triton side at load: picked cubins launched by torch's static CUDA launcher, multi-kernels.

Nothing here imports Triton, Inductor or sympy, and nothing is compiled or loaded host-side: a kernel's
``<name>.launch`` blob (:func:`pack_launch`, written at build by :mod:`precompile.inductor.build.cuda_pack`) is data, a
length-prefixed launch record (JSON) followed by the picked cubin; the cubin goes to the CUDA driver, and the record
becomes a small ``run(*params, stream)`` function that computes the grid of the picked config for each call's
sizes, as Inductor's generated launcher does.

Blob layout (all integers little-endian)::

    magic       8 bytes   b"PCLAUNCH"
    format      u32       LAUNCH_FORMAT
    record_len  u32       at most 1 MiB
    record      record_len bytes of UTF-8 JSON: name, params, passed, arg_tys, scratch, num_warps, shared, device,
                grid (lines of plain arithmetic over the params)
    cubin       the rest: the picked variant's cubin, as Triton wrote it
"""

from __future__ import annotations

import ast
import json
import math
import os
import struct
from typing import Any

import torch

from cache_backends.bounded import loads_json
from precompile.manifest.names import ascii_identifier
from precompile.inductor import shim
from precompile.inductor.load.memfd import memfd

#: Version of the ``.launch`` blob layout and its record.
LAUNCH_FORMAT = 2
#: File-name suffix of a packaged Triton kernel.
LAUNCH = ".launch"
_MAGIC = b"PCLAUNCH"
_HEADER = struct.Struct("<8sII")

#: What a grid line may hold (Inductor's ``GridExpr``: ceil-divisions, sums, products, ``max``/``min``, a
#: conditional on ``==``), checked on its syntax tree: no attribute, subscript, comprehension, lambda or string, so
#: nothing reaches an object's attributes or a frame (a regular expression over characters did not stop
#: ``(g.gi_frame.f_back for x in [0])``).
_GRID_NODES = (ast.Module, ast.Assign, ast.Expr, ast.Name, ast.Load, ast.Store, ast.Constant, ast.BinOp, ast.UnaryOp,
               ast.Compare, ast.BoolOp, ast.IfExp, ast.Call, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod,
               ast.USub, ast.UAdd, ast.Not, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or)
_GRID_CALLS = ("min", "max", "int", "abs")
#: Longest grid line and most grid lines a record may hold.
_GRID_LINE_MAX, _GRID_LINES_MAX = 4096, 64
_RECORD_MAX_BYTES = 1 << 20


def _grid_line_ok(line: object) -> bool:
    """True if ``line`` is one assignment ``name = expression`` of plain integer arithmetic (:data:`_GRID_NODES`)
    over ASCII names without ``__``, calling only :data:`_GRID_CALLS`."""
    if not isinstance(line, str) or not line.isascii() or len(line) > _GRID_LINE_MAX or "\n" in line:
        return False
    try:
        tree = ast.parse(line, mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1 \
            or not isinstance(body[0].targets[0], ast.Name):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, _GRID_NODES) or isinstance(node, ast.Expr):
            return False
        if isinstance(node, ast.Name) and "__" in node.id:
            return False
        if isinstance(node, ast.Constant) and (type(node.value) is not int or abs(node.value) >= 1 << 63):
            return False
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.func.id not in _GRID_CALLS
                                           or node.keywords or any(isinstance(a, ast.Starred) for a in node.args)):
            return False
    return True


def pack_launch(record: dict[str, Any], cubin: bytes) -> bytes:
    """A ``<name>.launch`` blob (layout in the module docstring) of ``record`` and ``cubin``.

    Raises:
        ValueError: the record is larger than 1 MiB.
    """
    raw = json.dumps({**record, "format": LAUNCH_FORMAT}, sort_keys=True).encode()
    if len(raw) > _RECORD_MAX_BYTES:
        raise ValueError(f"launch record of {record.get('name')} is {len(raw)} bytes, more than {_RECORD_MAX_BYTES}")
    return _HEADER.pack(_MAGIC, LAUNCH_FORMAT, len(raw)) + raw + cubin


def read_launch(blob: bytes, digest: str) -> tuple[dict[str, Any], bytes]:
    """``(launch record, cubin bytes)`` from a verified ``<kernel>.launch`` blob (:func:`pack_launch`).

    Nothing in it is executed host-side: the record's grid lines must be plain arithmetic and its names
    identifiers before :func:`launcher_function` turns them into a launcher.

    Raises:
        ValueError: not a launch blob, another format, a record longer than 1 MiB or than the blob, a record that
            is not a JSON object with the expected fields, parameters that are not identifiers, or grid lines
            that are not arithmetic.
    """
    if len(blob) < _HEADER.size:
        raise ValueError(f"launch blob {digest[:12]} is {len(blob)} bytes, shorter than its header")
    magic, fmt, n = _HEADER.unpack_from(blob)
    if magic != _MAGIC:
        raise ValueError(f"blob {digest[:12]} is not a Triton launch blob (magic {magic!r})")
    if fmt != LAUNCH_FORMAT:
        raise ValueError(f"launch blob format {fmt}, this precompile reads {LAUNCH_FORMAT}")
    if n > _RECORD_MAX_BYTES or _HEADER.size + n > len(blob):
        raise ValueError(f"launch blob {digest[:12]} declares a record of {n} bytes in {len(blob)}")
    try:
        record = loads_json(blob[_HEADER.size:_HEADER.size + n], _RECORD_MAX_BYTES, f"launch record of {digest[:12]}")
    except ValueError as err:
        raise ValueError(f"launch record of {digest[:12]} is not JSON: {err}") from err
    fields = {"name": str, "params": list, "passed": list, "grid": list, "arg_tys": str, "scratch": int,
              "num_warps": int, "shared": int, "device": int}
    if not isinstance(record, dict) or record.get("format") != LAUNCH_FORMAT or \
            any(not isinstance(record.get(f), t) for f, t in fields.items()):
        raise ValueError(f"launch record of {digest[:12]} lacks a field or has one of the wrong type")
    if not ascii_identifier(record["name"], None) or \
            not all(ascii_identifier(a, None) for a in record["params"] + record["passed"]):
        raise ValueError("launch record names parameters that are not ASCII identifiers")
    if len(record["grid"]) > _GRID_LINES_MAX or not all(_grid_line_ok(line) for line in record["grid"]):
        raise ValueError("launch record has grid lines that are not plain arithmetic")
    tys = record["arg_tys"]
    if not (tys.isascii() and tys.isalpha() and len(tys) == len(record["passed"]) + record["scratch"]
            and 0 <= record["scratch"] <= 2):
        raise ValueError(f"launch record of {digest[:12]} has type codes {tys[:40]!r} that do not match its "
                         f"{len(record['passed'])} arguments")
    return record, blob[_HEADER.size + n:]


class TritonKernel:
    """A Triton kernel's picked cubin, loaded into the current CUDA context and launched by torch's static
    launcher; ``run(*params, stream=...)`` as the wrapper calls Inductor's ``CachingAutotuner.run``."""

    def __init__(self, record: dict[str, Any], cubin: bytes, *, grid_launcher: bool = True):
        launcher = shim.static_cuda_launcher()
        torch.cuda.init()
        fd, path = memfd(cubin, record["name"] + ".cubin", keep=False)
        try:
            self.handles = launcher._load_kernel(path, record["name"], record["shared"], record["device"])
        finally:
            os.close(fd)
        self.name = record["name"]
        self.record = record
        self.function = shim.launcher_function_handle(self.handles)
        # a wrapper graph's launches carry their grids: no launcher is generated from the record for them
        self.run = launcher_function(record, launcher._launch_kernel, self.function) if grid_launcher else None


class GraphLaunch:
    """What a stored wrapper graph's ``triton_kernel_wrapper_mutation`` nodes call
    (:mod:`precompile.manifest.wrapper.graph`): the kernel of ``kernel_idx`` (a :class:`TritonKernel` from its
    ``.launch`` blob) launched on the node's grid with the arguments it names, on the current stream, through torch's
    static launcher.

    Raises (per call):
        KeyError: a kernel index or an argument the record names is missing.
        ValueError: the node carries side-table constants or TMA descriptors (not stored), or a grid that is not
            one ``(x, y, z)``.
    """

    def __init__(self, kernels: dict[int, TritonKernel]):
        self._launch = shim.static_cuda_launcher()._launch_kernel
        #: ``stream(device index) -> the device's current raw stream``: a wrapper call reads it once per device.
        self.stream = shim.current_raw_stream()
        self._kernels = {i: (k.function, int(k.record["num_warps"]), int(k.record["shared"]), k.record["arg_tys"],
                             tuple(k.record["passed"]), int(k.record["scratch"]), int(k.record["device"]))
                         for i, k in kernels.items()}

    def bind(self, kernel_idx: int) -> tuple[tuple[str, ...], tuple[str, ...], Any, int]:
        """``(names of the arguments the cubin takes, those of them that are pointers, run(stream, x, y, z,
        *args), device index)`` for kernel ``kernel_idx``: what :func:`precompile.manifest.wrapper.codegen.build` calls
        a launch node with directly (no keyword dicts per call; the arguments' tuple goes to the launcher as it
        comes, padded only for a kernel with scratch memory).

        Raises:
            KeyError: no such kernel.
        """
        function, warps, shared, tys, passed, scratch, device = self._kernels[kernel_idx]
        launch, pad = self._launch, (None,) * scratch

        if scratch:
            def run(stream: int, x: int, y: int, z: int, *args: Any) -> None:
                launch(function, x, y, z, warps, shared, tys, args + pad, stream)
        else:
            def run(stream: int, x: int, y: int, z: int, *args: Any) -> None:
                launch(function, x, y, z, warps, shared, tys, args, stream)

        return passed, tuple(a for a, t in zip(passed, tys) if t == "O"), run, device

    def __call__(self, *, kernel_idx: int, constant_args_idx: int, grid: list[Any],
                 tma_descriptor_metadata: dict[str, Any], kwargs: dict[str, Any]) -> None:
        function, warps, shared, tys, passed, scratch, device = self._kernels[kernel_idx]
        if tma_descriptor_metadata:
            raise ValueError("a kernel launch with TMA descriptors is not supported")
        if len(grid) != 1 or len(grid[0]) != 3:
            raise ValueError(f"kernel {kernel_idx}: grid {grid!r} is not one (x, y, z)")
        x, y, z = grid[0]
        args = tuple(kwargs[a] for a in passed) + (None,) * scratch
        if any(t == "O" and a is not None and not isinstance(a, torch.Tensor) for a, t in zip(args, tys)):
            raise ValueError(f"kernel {kernel_idx}: a pointer argument is not a tensor of the graph")
        self._launch(function, int(x), int(y), int(z), warps, shared, tys, args,
                     self.stream(device))


def launcher_function(record: dict[str, Any], launch: Any, function: Any) -> Any:
    """``run(*params, stream)``: computes the grid for the picked config as Inductor's generated launcher does
    and calls ``launch(function, grid_0, grid_1, grid_2, num_warps, shared, arg_tys, args, stream)``."""
    passed = [*record["passed"], *["None"] * record["scratch"]]
    call = (f"    launch(function, grid_0, grid_1, grid_2, {int(record['num_warps'])}, {int(record['shared'])}, "
            f"{record['arg_tys']!r}, ({''.join(a + ', ' for a in passed)}), stream)")
    lines = [f"def run({', '.join([*record['params'], 'stream'])}):", *[f"    {line}" for line in record["grid"]], call]
    scope = {"launch": launch, "function": function, "__builtins__": {"min": min, "max": max, "int": int, "abs": abs}}
    exec(compile("\n".join(lines), f"<precompile launcher {record['name']}>", "exec"), scope)  # noqa: S102
    return scope["run"]


class MultiKernel:
    """Inductor's ``MultiKernelCall`` with its pick made at build: runs sub-kernel ``picked`` with its share of
    the arguments (``arg_index[picked]``: slices of the full argument list), benchmarking nothing."""

    def __init__(self, name: str, kernels: list[Any], arg_index: dict[int, list[slice]], picked: int):
        if not 0 <= picked < len(kernels):
            raise ValueError(f"multi-kernel {name}: pick {picked} of {len(kernels)} sub-kernels")
        self.name, self.picked = name, picked
        self._run = kernels[picked].run
        self._slices = arg_index[picked]

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(*[a for s in self._slices for a in args[s]], **kwargs)


class SizeHintMultiKernel:
    """Inductor's ``SizeHintMultiKernelCall``: picks, per call shapes, the sub-kernel tuned for the nearest size
    hint (sum of |log2| distances over every tensor argument's dims), as Inductor's runtime does."""

    def __init__(self, name: str, kernels: dict[Any, Any], arg_index: dict[int, list[slice]]):
        self.name = name
        self._kernels = list(kernels.values())
        self._hints = list(kernels.keys())
        self._arg_index = arg_index
        self._choice: dict[tuple[Any, ...], int] = {}

    @staticmethod
    def _distance(shapes: tuple[Any, ...], hint: Any) -> float:
        def d(x: int, y: int) -> float:
            return abs((math.log2(x) if x > 0 else -1) - (math.log2(y) if y > 0 else -1))

        return sum(sum(d(x, y) for x, y in zip(s1, s2)) for s1, s2 in zip(shapes, hint))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        shapes = tuple(tuple(a.shape) for a in args if hasattr(a, "shape"))
        picked = self._choice.get(shapes)
        if picked is None:
            dists = [self._distance(shapes, h) if h is not None else 2**62 for h in self._hints]
            picked = self._choice[shapes] = dists.index(min(dists))
        run = self._kernels[picked].run
        return run(*[a for s in self._arg_index[picked] for a in args[s]], **kwargs)
