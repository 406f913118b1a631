"""The fast path's Triton side at load: picked cubins launched by torch's static CUDA launcher, multi-kernels.

Nothing here imports Triton, Inductor or sympy, and nothing is compiled: a kernel's ``<name>.launch.so``
(:mod:`precompile.inductor.cuda_pack`) is loaded from memory, its cubin goes to the CUDA driver, and its launch
record becomes a small ``run(*params, stream)`` function that computes the grid of the picked config for each
call's sizes, as Inductor's generated launcher does.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
from typing import Any

import torch

from precompile.inductor import shim
from precompile.inductor.memfd import memfd

#: Version of the launch record a ``.launch.so`` carries.
LAUNCH_FORMAT = 1
#: File-name suffix of a packaged Triton kernel.
LAUNCH_SO = ".launch.so"

_GRID_LINE = re.compile(r"^[\w\s()+\-*/%<>=!,.\[\]]*$")
_RECORD_MAX_BYTES = 1 << 20


def read_launch_so(so: bytes, digest: str) -> tuple[dict[str, Any], bytes]:
    """``(launch record, cubin bytes)`` from a ``<kernel>.launch.so`` (see ``cuda_pack.build_launch_so``).

    Raises:
        ValueError: the record is of another format, is larger than 1 MiB, or names parameters that are not
            identifiers or grid lines that are not arithmetic.
        OSError / AttributeError: the shared object does not load or lacks the symbols.
    """
    _, path = memfd(so, f"pc-{digest[:16]}.launch.so")
    lib = ctypes.CDLL(path)
    start = ctypes.addressof(ctypes.c_char.in_dll(lib, "pc_cubin"))
    end = ctypes.addressof(ctypes.c_char.in_dll(lib, "pc_cubin_end"))
    if not 0 <= end - start <= len(so):
        raise ValueError(f"launch binary {digest[:12]} declares a cubin of {end - start} bytes in {len(so)}")
    raw = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "pc_record")))
    if len(raw) > _RECORD_MAX_BYTES:
        raise ValueError(f"launch record of {digest[:12]} is {len(raw)} bytes, more than {_RECORD_MAX_BYTES}")
    record = json.loads(raw)
    if record.get("format") != LAUNCH_FORMAT:
        raise ValueError(f"launch record format {record.get('format')!r}, this precompile reads {LAUNCH_FORMAT}")
    if not all(isinstance(a, str) and a.isidentifier() for a in record["params"] + record["passed"]):
        raise ValueError("launch record names parameters that are not identifiers")
    if not all(isinstance(line, str) and _GRID_LINE.match(line) for line in record["grid"]):
        raise ValueError("launch record has grid lines that are not plain arithmetic")
    return record, ctypes.string_at(start, end - start)


class TritonKernel:
    """A Triton kernel's picked cubin, loaded into the current CUDA context and launched by torch's static
    launcher; ``run(*params, stream=...)`` as the wrapper calls Inductor's ``CachingAutotuner.run``."""

    def __init__(self, record: dict[str, Any], cubin: bytes):
        launcher = shim.static_cuda_launcher()
        torch.cuda.init()
        fd, path = memfd(cubin, record["name"] + ".cubin", keep=False)
        try:
            self.handles = launcher._load_kernel(path, record["name"], record["shared"], record["device"])
        finally:
            os.close(fd)
        self.name = record["name"]
        self.run = launcher_function(record, launcher._launch_kernel, shim.launcher_function_handle(self.handles))


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
