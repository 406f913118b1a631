"""Hostile wrapper graphs (precompile.manifest.wrapper.graph) for the fuzz tests: random node sequences over the whole
allow-list and over targets outside it, with random sizes, strides, offsets and placeholders, built and run on
tensors whose storages sit between guard regions.

Every graph must either be refused by ``check``/``build`` with ``WrapperGraphError``, or run (a Python exception
from ATen's own checks is a clean outcome too) with: every tensor it returns (it returns every node's result)
inside its storage, no guard region changed (no write past an input's storage), and no float32 output holding the
guard's bit pattern (no read past one).  Run :func:`main` in a fresh process, so that a crash fails the test
instead of killing pytest: ``python -c "import _wrapper_fuzz; _wrapper_fuzz.main()" cpu 400``.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from precompile.manifest.wrapper import ops as wrapper_ops
from precompile.manifest.wrapper.codegen import build
from precompile.manifest.wrapper.ops import WrapperGraphError

#: The guards' float32 bit patterns: quiet NaNs with payloads no ATen op makes, one per arena (so that memory an
#: earlier graph's arena left behind, which a fresh allocation may show, never holds the current one).
CANARY = 0x7FC00000
GUARD = 64  # elements of guard on each side of an input's storage
#: Operators outside the allow-list a hostile graph names (views without checks, storage changes, files, indexing).
HOSTILE_OPS = ["aten::_reshape_alias.default", "aten::set_.source_Tensor", "aten::set_.source_Storage",
               "aten::_unsafe_view.default", "aten::alias.default", "aten::expand.default", "aten::view.default",
               "aten::as_strided_.default", "aten::as_strided.default", "aten::resize_.default",
               "aten::index_put_.default", "aten::from_file.default", "aten::fill_.Scalar", "aten::clone.default",
               "aten::index_select.default", "aten::embedding.default", "prims::view_of.default", "mylib::evil.default"]
HOSTILE_FNS = ["builtins:eval", "os:system", "torch:from_file", "torch:load", "torch.Tensor:set_", "_operator:setitem"]
INTS = [0, 1, 2, 3, 4, 5, 7, 8, 16, 63, 64, 65, 1000, -1, -8, 1 << 31, (1 << 62) + 1, (1 << 63) - 1, 1 << 63, 1 << 70]
DTYPES = ["float32", "float16", "int64", "uint8", "bool"]


class Arena:
    """Inputs whose storages are slices of one guarded buffer: each input's storage is exactly its own elements,
    with :data:`GUARD` canary elements on either side (CPU: a numpy buffer; CUDA: a CUDA tensor, wrapped through
    ``__cuda_array_interface__``), so that a read or write past a storage meets the canary."""

    made = 0

    def __init__(self, numels: list[int], device: str):
        """``numels``: each input's elements; 0 stands for an int input (3), not a tensor."""
        Arena.made += 1
        self.canary = CANARY | (Arena.made % 0x3FFFFF + 1)
        self.spans, at = [], GUARD
        for n in numels:
            self.spans.append((at, at + n))
            at += n + GUARD
        self.device = device
        self.buffer = torch.full((at,), self.canary, dtype=torch.int32, device=device)
        self.inputs = []
        for a, b in self.spans:  # small float values, in the guard's buffer
            if a == b:
                self.inputs.append(3)
                continue
            span = self.buffer[a:b].view(torch.float32)
            span.copy_(torch.arange(b - a, dtype=torch.float32, device=device) - 3)
            if device == "cpu":
                t = torch.from_numpy(self.buffer.numpy().view(np.float32)[a:b])
            else:
                t = torch.as_tensor(_CudaSpan(span), device=device)
            if t.untyped_storage().nbytes() != 4 * (b - a):
                raise RuntimeError(f"an input's storage is {t.untyped_storage().nbytes()} bytes, not {4 * (b - a)}")
            self.inputs.append(t)

    def guards_intact(self) -> bool:
        mask = torch.ones_like(self.buffer, dtype=torch.bool)
        for a, b in self.spans:
            mask[a:b] = False
        return bool((self.buffer[mask] == self.canary).all())


class _CudaSpan:
    """A CUDA tensor's memory as ``__cuda_array_interface__``: ``torch.as_tensor`` wraps it in a storage of exactly
    this size (not resizable)."""

    def __init__(self, t: torch.Tensor):
        self._keep = t
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "<f4", "data": (t.data_ptr(), False),
                                         "version": 2, "strides": None}


def violations(outputs: Any, arena: Arena) -> list[str]:
    """What is wrong with a graph's outputs: a tensor reaching past its storage, or a float32 one holding the
    ``arena``'s guard pattern."""
    found = []
    for t in _leaves(outputs):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            continue
        reach = t.storage_offset() if 0 in t.shape else t.storage_offset() + 1 + sum(
            (s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
        if any(st < 0 for st in t.stride()) or reach * t.element_size() > t.untyped_storage().nbytes():
            found.append(f"a tensor {tuple(t.shape)}/{t.stride()}+{t.storage_offset()} reaches past its storage of "
                         f"{t.untyped_storage().nbytes()} bytes")
        elif t.dtype == torch.float32 and t.numel() and bool((t.view(torch.int32) == arena.canary).any()):
            found.append(f"a tensor {tuple(t.shape)} holds the guard's pattern: a read past a storage")
    return found


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]


class Launcher:
    """A stand-in for the cubin launcher (``bind`` as ``cuda_runtime.GraphLaunch`` offers it): kernel 0 takes two
    pointers and a count, and adds 0 to its first pointer's tensor in place; it notes any pointer that is not a
    tensor."""

    def __init__(self):
        self.bad: list[str] = []

    def stream(self, device: int) -> int:
        return 0

    def bind(self, kernel_idx: int) -> Any:
        if kernel_idx != 0:
            raise KeyError(kernel_idx)

        def run(stream: int, x: int, y: int, z: int, out: Any, inp: Any, n: Any) -> None:
            for p in (out, inp):
                if p is not None and not isinstance(p, torch.Tensor):
                    self.bad.append(f"a {type(p).__name__} reached the launcher as a pointer")
            if isinstance(out, torch.Tensor):
                out.add_(0)

        return ("in_out_ptr0", "in_ptr1", "xnumel"), ("in_out_ptr0", "in_ptr1"), run, 0


# ----------------------------------------------------------------------------------------------- strategies
def _ref(draw: Any, i: int) -> Any:
    return {"$node": draw(st.integers(0, i - 1))} if i else 0


def _int(draw: Any, i: int) -> Any:
    """Mostly a small int, sometimes an extreme one, sometimes a node (an int, a tensor or anything else)."""
    pick = draw(st.integers(0, 19))
    return _ref(draw, i) if pick == 0 else draw(st.sampled_from(INTS)) if pick < 5 else draw(st.integers(0, 9))


def _ints(draw: Any, i: int, n: int | None = None) -> list[Any]:
    return [_int(draw, i) for _ in range(draw(st.integers(0, 3)) if n is None else n)]


def _arg(draw: Any, kind: str, i: int) -> Any:
    """A value for a schema argument of type ``kind`` (mostly well-typed, sometimes not)."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([None, 1, -1, 2.5, "x", [0, 1], {"$dtype": "float32"}]))
    if "Tensor" in kind:
        return [_ref(draw, i) for _ in range(draw(st.integers(0, 2)))] if "[]" in kind else (
            None if "?" in kind and draw(st.booleans()) else _ref(draw, i))
    if "[]" in kind:
        return _ints(draw, i)
    if "int" in kind.lower():
        return _int(draw, i)
    if "float" in kind or "Scalar" in kind:
        return draw(st.sampled_from([0.0, 1.0, -2.0, 0.5, 3]))
    if "bool" in kind:
        return draw(st.booleans())
    if "ScalarType" in kind:
        return {"$dtype": draw(st.sampled_from(DTYPES))}
    return None


def _op_node(draw: Any, name: str, i: int) -> dict[str, Any]:
    qual, _, overload = name.rpartition(".")
    ns, _, op = qual.partition("::")
    schema = getattr(getattr(getattr(torch.ops, ns, None), op, None), overload, None)
    args, kwargs = [], {}
    for a in (schema._schema.arguments if schema is not None else []):
        if a.has_default_value() and draw(st.booleans()):
            continue
        value = _arg(draw, str(a.type), i)
        if a.kwarg_only:
            kwargs[a.name] = value
        else:
            args.append(value)
    if schema is None:
        args = [_ref(draw, i), _int(draw, i)]
    return {"target": {"op": name}, "args": args, "kwargs": kwargs}


@st.composite
def node(draw: Any, i: int, hostile: bool) -> dict[str, Any]:
    """One call_function node that may refer to nodes before ``i`` (a target outside the allow-list if
    ``hostile``)."""
    choice = draw(st.sampled_from(["view", "view", "empty", "getitem", "arith", "op", "op", "op", "launch"]
                                  + ["hostile_op", "hostile_fn"] * hostile))
    if choice == "view":
        n = draw(st.integers(0, 3))
        extra = [_int(draw, i)] if draw(st.integers(0, 29)) == 0 else []
        return {"target": {"fn": "torch:as_strided"}, "kwargs": {},
                "args": [_ref(draw, i), _ints(draw, i, n), _ints(draw, i, n + (draw(st.integers(0, 11)) == 0)),
                         _int(draw, i), *extra]}
    if choice == "empty":
        n = draw(st.integers(0, 3))
        return {"target": {"fn": "torch:empty_strided"}, "args": [_ints(draw, i, n), _ints(draw, i, n)],
                "kwargs": {"dtype": {"$dtype": draw(st.sampled_from(DTYPES))}, "device": _DEVICE[0]}}
    if choice == "getitem":
        return {"target": {"fn": "_operator:getitem"}, "args": [_ref(draw, i), draw(st.integers(-2, 9))],
                "kwargs": {}}
    if choice == "arith":
        fn = draw(st.sampled_from(sorted(wrapper_ops.ARITHMETIC)))
        return {"target": {"fn": fn}, "args": [_int(draw, i) for _ in range(1 if fn.endswith("neg") else 2)],
                "kwargs": {}}
    if choice in ("op", "hostile_op"):
        names = sorted(wrapper_ops.ALLOWED_OPS) if choice == "op" else HOSTILE_OPS
        return _op_node(draw, draw(st.sampled_from(names)), i)
    if choice == "hostile_fn":
        return {"target": {"fn": draw(st.sampled_from(HOSTILE_FNS))}, "args": [_ref(draw, i)], "kwargs": {}}
    pointers = {"in_out_ptr0": _ref(draw, i) if draw(st.integers(0, 9)) else _int(draw, i),
                "in_ptr1": _ref(draw, i) if draw(st.integers(0, 4)) else None, "xnumel": _int(draw, i)}
    return {"target": {"hop": wrapper_ops.TRITON_LAUNCH}, "args": [],
            "kwargs": {"kernel_idx": draw(st.sampled_from([0, 0, 0, 1])), "constant_args_idx": 0,
                       "grid": [{"$tuple": [1, 1, 1]}], "tma_descriptor_metadata": {"$dict": []},
                       "kwargs": {"$dict": [[k, v] for k, v in pointers.items()]}}}


_DEVICE = ["cpu"]
REASONS: dict[str, int] = {}


@st.composite
def graph(draw: Any) -> tuple[dict[str, Any], list[int]]:
    """``(wrapper graph data, numels of its placeholders)``: 1 to 3 placeholders (float32 tensors, or an int where
    the numel is 0), then up to 10 random nodes, then an output returning every node."""
    numels = draw(st.lists(st.sampled_from([0, 1, 2, 4, 6, 16, 16, 64]), min_size=1, max_size=3))
    nodes = [{"name": f"x{j}", "op": "placeholder", "target": f"x{j}", "args": [], "kwargs": {}}
             for j in range(len(numels))]
    hostile = draw(st.integers(0, 3)) == 0
    for _ in range(draw(st.integers(1, 10))):
        nodes.append({"name": f"n{len(nodes)}", "op": "call_function", **draw(node(len(nodes), hostile))})
    nodes.append({"name": "output", "op": "output", "target": "output", "kwargs": {},
                  "args": [[{"$node": j} for j in range(len(numels), len(nodes))]]})
    return {"schema": 1, "nodes": nodes, "submodules": {}}, numels


def run_one(data: dict[str, Any], numels: list[int], device: str, tally: dict[str, int]) -> None:
    """Build and run one graph; raise AssertionError on anything but a clean refusal or a bounded run."""
    launcher = Launcher()
    try:
        fn = build(data, launcher)
    except WrapperGraphError as err:
        tally["refused"] += 1
        why = str(err).split(": ", 1)[-1][:50]
        REASONS[why] = REASONS.get(why, 0) + 1
        return
    arena = Arena(numels, device)
    try:
        out = fn(*arena.inputs)
    except WrapperGraphError:
        tally["refused_at_call"] += 1
        out = None
    except Exception:  # noqa: BLE001 - ATen's own checks (RuntimeError, TypeError, IndexError...) are clean
        tally["aten_error"] += 1
        out = None
    else:
        tally["ran"] += 1
    if device != "cpu":
        torch.cuda.synchronize()
    bad = violations(out, arena) + launcher.bad + ([] if arena.guards_intact() else ["a guard region changed"])
    assert not bad, f"{bad}\n{json.dumps(data)}"


def main() -> None:
    """``argv: device max_examples``; prints the tally as JSON (refused / refused_at_call / aten_error / ran)."""
    faulthandler.enable()
    device, examples = sys.argv[1], int(sys.argv[2])
    _DEVICE[0] = device
    tally = {"refused": 0, "refused_at_call": 0, "aten_error": 0, "ran": 0}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(graph())
    def fuzz(case: tuple[dict[str, Any], list[int]]) -> None:
        run_one(*case, device, tally)

    fuzz()
    print(sorted(REASONS.items(), key=lambda kv: -kv[1])[:12], file=sys.stderr)
    print(json.dumps(tally))
