"""What a rebuild may cost, checked before it allocates or runs anything: memory, work and the size of the graph.

``precompile rebuild`` runs a stored graph (data from a cache) on example inputs made from stored specs, then compiles
it and runs it again.  Whoever wrote the entry chose every size in it.  So before anything real is made:

1. :func:`check_graph_size`: the stored graph's JSON is at most 1/:data:`GRAPH_BYTES_RATIO` of the byte budget
   (parsing it and building its module holds up to a few hundred bytes per byte).
2. :func:`check_specs`: every int of every tensor spec is checked (rank at most :data:`MAX_RANK`, sizes and strides
   from 0 to 2**62), each input's storage extent (``1 + sum((size - 1) * stride)`` elements, times the dtype's
   item size; 0 for an empty tensor) computed, and their sum held to the budget: more is refused naming the input.
3. :func:`check_run`: the graph runs once on *fake* tensors (``torch._subclasses.FakeTensorMode``, static shapes,
   inputs made from the specs in that mode: nothing real is allocated), its size arithmetic through
   :func:`precompile.manifest.size_math.bounded_graph`.  Every operator's outputs are tracked by storage (views count
   once) until the last tensor on it dies, each tensor object charged :data:`TENSOR_OVERHEAD` bytes; an operator
   that returns a list of tensors is charged its most outputs before it runs.  The peak of that, plus the copies a
   rebuild holds (two clones of the inputs, the eager outputs while the compiled graph runs, and the temporaries of
   comparing the largest tensor compared: :func:`compare_bytes` per element) must be within the byte budget.  Its
   work, the floating-point operations ``torch.utils.flop_counter`` counts plus :data:`ELEMENT_WORK` for every
   element an operator reads or writes (an element of a stride-0 view counts too), must be within the work bound,
   and it may dispatch at most :data:`MAX_OPS` operators.  Higher-order operators run their dense implementation
   under the same count (a ``cond`` runs both branches); a loop whose count depends on values (``while_loop``) does
   not propagate.  The run stops at the first bound passed.

A graph that cannot be propagated on fake tensors (an output size that depends on values: ``nonzero``, ``item()``;
an operator without a fake implementation) is refused with that reason, as is one over a bound
(:class:`Refused`).  A graph that fails otherwise on fake tensors (size arithmetic past its bounds, a malformed call)
is :class:`Failed`.  What compiling itself holds (Inductor, the compiler, the generated code; proportional to the
graph, which (1) bounds) is outside the budget.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from precompile.manifest.graph_json import TORCH_NAMES
from precompile.errors import PrecompileError

#: Bytes a rebuild may hold per byte of the stored graph's JSON: at most 1/512 of the budget is graph.  Measured:
#: reading a graph and running it on fake tensors holds 81 bytes per byte of a chain of 20,000 operators, and
#: building the module of one whose arguments are long literal lists 270 (FX compiles them as Python source).
GRAPH_BYTES_RATIO = 512
#: Most dimensions of an input (torch's own limit on a tensor's rank is 64).
MAX_RANK = 64
#: Largest size or stride of an input.
MAX_DIM = 1 << 62
#: Bytes charged per live tensor object (its TensorImpl and Python object; a fake tensor's is larger than a real one's).
TENSOR_OVERHEAD = 2048
#: Most operators the fake run dispatches (a real graph of 100,000 nodes dispatches a few hundred thousand).
MAX_OPS = 1 << 18
#: Work charged per element an operator reads or writes: a CPU moves 1-4 elements a nanosecond through an elementwise
#: operator or a reduction, and does 50-100 floating-point operations a nanosecond in a matmul.
ELEMENT_WORK = 32
#: Copies of the inputs a rebuild holds besides the inputs themselves: the eager run's and the compiled run's.
INPUT_COPIES = 2


def compare_bytes(itemsize: int) -> int:
    """Bytes ``torch.testing.assert_close`` holds per element compared (measured: 21 for float32, 33 for float64 on
    10**7 elements, equal or not), with a margin."""
    return 4 * max(itemsize, 8) + 16


class Refused(PrecompileError):
    """An artifact precompile cannot rebuild from what it stores, or not within the bounds set here (the message
    says why)."""


class Failed(PrecompileError):
    """The stored graph fails on fake tensors, before anything real runs (the message says how)."""


def dtype_named(name: Any) -> torch.dtype:
    """The dtype a manifest names (``"float32"``), from torch's table of dtypes: never ``getattr(torch, name)``,
    which may import a submodule.

    Raises:
        Refused: no dtype has that name.
    """
    found = TORCH_NAMES["$dtype"].get(name) if isinstance(name, str) else None
    if found is None:
        raise Refused(f"it names dtype {name!r:.40}, which this torch does not have")
    return found


def spec_device(spec: dict[str, Any]) -> torch.device:
    """The device of a tensor placeholder spec: its type, and for CUDA the index it was compiled for (the spec's
    ``device_index``, 0 where absent).  The caller has checked the type is ``cpu`` or ``cuda``."""
    if spec["device"] != "cuda":
        return torch.device(spec["device"])
    index = spec.get("device_index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 4096:
        raise Refused(f"input {spec.get('name')!r:.60} has device index {str(index)[:20]!r}")
    return torch.device("cuda", index)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def check_graph_size(size: int, budget: int) -> None:
    """Refuse a stored graph of ``size`` bytes over 1/:data:`GRAPH_BYTES_RATIO` of ``budget`` bytes, before it is read.

    Raises:
        Refused: it is larger.
    """
    if size * GRAPH_BYTES_RATIO > budget:
        raise Refused(f"its stored FX graph is {size} bytes; a rebuild within {budget} bytes "
                      f"(PRECOMPILE_REBUILD_MAX_BYTES, --max-bytes) reads at most 1/{GRAPH_BYTES_RATIO} of that")


def spec_bytes(spec: dict[str, Any]) -> tuple[int, int]:
    """``(storage bytes, elements)`` of a tensor spec: the bytes its storage extent spans (``1 + sum((size - 1) *
    stride)`` elements times the item size; 0 when a size is 0) and its element count.

    Raises:
        Refused: the spec's shape or stride is not a list of at most :data:`MAX_RANK` ints from 0 to :data:`MAX_DIM`
            of the same length (a symbolic size included), or its dtype is unknown.
    """
    name = spec.get("name")
    shape, stride = spec.get("shape"), spec.get("stride")
    if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride) <= MAX_RANK):
        raise Refused(f"input {name!r:.60} has no shape and stride of the same rank, at most {MAX_RANK}")
    for d in (*shape, *stride):
        if type(d) is not int:
            raise Refused(f"input {name!r:.60} has a symbolic size" if isinstance(d, str) else
                          f"input {name!r:.60} has a size or stride {d!r:.40} that is not an int")
        if not 0 <= d <= MAX_DIM:
            raise Refused(f"input {name!r:.60} has a size or stride of {d}, outside 0 to 2**62")
    itemsize = dtype_named(spec.get("dtype")).itemsize
    elements = 1
    for d in shape:
        elements *= d
    extent = 0 if elements == 0 else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return extent * itemsize, elements


def check_inputs(placeholders: list[dict[str, Any]], budget: int) -> tuple[int, int]:
    """``(bytes of the inputs, bytes of a copy of them)``: their storage extents, summed, and what ``clone()`` of
    each holds (its storage, or its elements where its strides overlap or leave gaps), summed; refused as soon as
    the first sum passes ``budget``, before anything is allocated.

    Raises:
        Refused: a spec is malformed (:func:`spec_bytes`) or the inputs need more than ``budget`` bytes.
    """
    total = copies = 0
    for spec in placeholders:
        if isinstance(spec, dict) and spec.get("type") == "tensor":
            storage, elements = spec_bytes(spec)
            total += storage
            copies += max(storage, elements * dtype_named(spec.get("dtype")).itemsize)
            if total > budget:
                raise Refused(f"its inputs need {_size(total)} by input {spec.get('name')!r:.60}, more than the "
                              f"budget of {budget} bytes (PRECOMPILE_REBUILD_MAX_BYTES, --max-bytes)")
    return total, copies


def check_specs(placeholders: list[Any], budget: int) -> None:
    """Check the placeholder specs before anything is made from them: static sizes within their bounds, known dtypes,
    devices this machine has, numbers with a value, tensors within ``budget`` bytes in all
    (:func:`check_inputs`).

    Raises:
        Refused: naming the input that is not.
    """
    for spec in placeholders:
        if not isinstance(spec, dict):
            raise Refused("a placeholder spec is not an object")
        if spec.get("type") == "tensor":
            spec_bytes(spec)
            device = spec.get("device")
            if device not in ("cpu", "cuda"):
                raise Refused(f"input {spec.get('name')!r:.60} is on device {device!r:.40}, not cpu or cuda")
            if device == "cuda" and not torch.cuda.is_available():
                raise Refused("it was built for CUDA and this machine has no GPU")
        elif spec.get("value") is None:
            raise Refused(f"input {spec.get('name')!r:.60} is a symbolic number")
    check_inputs(placeholders, budget)


@dataclass
class Estimate:
    """What one rebuild of a graph holds and does, from its fake run.

    Attributes:
        input_bytes: the inputs' storages.
        copy_bytes: a clone of the inputs (as big as their storages, or their elements where strides overlap).
        peak_bytes: the fake run's peak of live storages and tensor objects, the inputs included.
        output_bytes: the outputs' storages that are not the inputs'.
        compare_bytes: temporaries of comparing the largest tensor compared (an output or an input).
        work: floating-point operations plus :data:`ELEMENT_WORK` per element read and written, of one run.
        ops: operators dispatched.
    """

    input_bytes: int
    copy_bytes: int
    peak_bytes: int
    output_bytes: int
    compare_bytes: int
    work: int
    ops: int

    @property
    def total_bytes(self) -> int:
        """Bytes a rebuild holds at its peak: the run's peak, the input copies, the eager outputs and a comparison."""
        return self.peak_bytes + INPUT_COPIES * self.copy_bytes + self.output_bytes + self.compare_bytes


class _Tracker(TorchDispatchMode):
    """Above fake tensors and the FLOP counter: tracks live storages and tensors, elements touched, operators."""

    supports_higher_order_operators = True

    def __init__(self, budget: int, max_work: int, flops: Any, reserved: int) -> None:
        super().__init__()
        self.budget, self.max_work, self.flops, self.reserved = budget, max_work, flops, reserved
        self.live = self.peak = self.elements = self.ops = 0
        self.storages: dict[int, list[int]] = {}  # storage id -> [tensors on it, bytes]
        self.tensors: set[int] = set()

    @property
    def work(self) -> int:
        return ELEMENT_WORK * self.elements + self.flops.get_total_flops()

    def note(self, t: torch.Tensor) -> None:
        if id(t) in self.tensors:
            return
        try:
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without a storage (sparse, nested): its elements
            key, nbytes = -id(t), t.numel() * t.element_size()
        self.tensors.add(id(t))
        entry = self.storages.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.live += nbytes
        entry[0] += 1
        self.live += TENSOR_OVERHEAD
        self.peak = max(self.peak, self.live)
        weakref.finalize(t, self._dead, id(t), key).atexit = False

    def _dead(self, ident: int, key: int) -> None:
        self.tensors.discard(ident)
        self.live -= TENSOR_OVERHEAD
        entry = self.storages[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.storages[key]

    def check(self, extra: int = 0) -> None:
        if self.live + extra + self.reserved > self.budget:
            raise Refused(f"running it needs more than the budget of {self.budget} bytes (PRECOMPILE_REBUILD_MAX_BYTES,"
                          f" --max-bytes): {_size(self.live + extra)} live at operator {self.ops} on fake tensors, "
                          f"{_size(self.reserved)} of copies of its inputs")
        work = self.work
        if work > self.max_work:
            raise Refused(f"one run of it does more than {self.max_work} operations (PRECOMPILE_REBUILD_MAX_FLOPS, "
                          f"--max-flops): {work} by operator {self.ops} on fake tensors")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        if self.ops > MAX_OPS:
            raise Refused(f"running it dispatches more than {MAX_OPS} operators")
        if isinstance(func, torch._ops.HigherOrderOperator):
            return self._higher_order(func, args, kwargs)
        self.check(_most_outputs(func, args, kwargs) * TENSOR_OVERHEAD)
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.note(t)
        self.elements += sum(t.numel() for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))
        self.check()
        return out

    def _higher_order(self, func: Any, args: Any, kwargs: Any) -> Any:
        if func is torch.ops.higher_order.cond:  # both branches, as the flop counter does: the predicate is fake
            _, true_fn, false_fn, operands = args
            with self:
                out = true_fn(*operands)
                false_fn(*operands)
            return out
        kernel = func.py_kernels.get(torch._C.DispatchKey.CompositeExplicitAutograd)
        if kernel is None:
            raise Refused(f"its higher-order operator {func.name()} has no eager implementation to follow on fake "
                          "tensors")
        with self:
            return kernel(*args, **kwargs)


def _most_outputs(func: Any, args: Any, kwargs: Any) -> int:
    """The most tensors ``func`` returns, when it returns a list of them (0 otherwise): for ``split``,
    ``split_with_sizes``, ``tensor_split``, ``chunk`` and ``unbind`` from their arguments, else the largest int, list
    length or tensor dimension among its arguments."""
    schema = getattr(func, "_schema", None)
    if schema is None or not any(isinstance(r.type, torch.ListType) for r in schema.returns):
        return 0
    named = dict(zip((a.name for a in schema.arguments), args))
    named.update(kwargs)
    for listed in ("split_sizes", "indices"):
        if isinstance(named.get(listed), (list, tuple)):
            return len(named[listed]) + 1
    for count in ("sections", "chunks"):
        if isinstance(named.get(count), int):
            return max(named[count], 1)
    this, dim = named.get("self"), named.get("dim", 0)
    if isinstance(this, torch.Tensor) and isinstance(dim, int) and -this.dim() <= dim < max(this.dim(), 1):
        size = this.shape[dim] if this.dim() else 1
        if "split_size" in named and isinstance(named["split_size"], int) and named["split_size"] > 0:
            return -(-size // named["split_size"])
        if schema.name.startswith("aten::unbind"):
            return size
    sizes = [1]
    for v in pytree.tree_leaves((args, kwargs)):
        if isinstance(v, torch.Tensor):
            sizes.extend(v.shape)
        elif isinstance(v, int):
            sizes.append(v)
    lists = [len(v) for v in (*args, *kwargs.values()) if isinstance(v, (list, tuple))]
    return max(*sizes, *lists)


def check_run(gm: torch.fx.GraphModule, placeholders: list[dict[str, Any]], budget: int, max_work: int) -> Estimate:
    """Run ``gm`` once on fake tensors made from ``placeholders`` (the module docstring) and check what a rebuild
    of it would hold and do; call it under the ambient state the rebuild restores (grad mode, autocast).

    Raises:
        Refused: over ``budget`` bytes or ``max_work`` operations, or the graph does not propagate on fake tensors.
        Failed: the graph fails on fake tensors otherwise (its size arithmetic past its bounds included).
    """
    from torch._subclasses import fake_tensor
    from torch.utils.flop_counter import FlopCounterMode

    from precompile.manifest import size_math

    input_bytes, copy_bytes = check_inputs(placeholders, budget)
    bounded = size_math.bounded_graph(gm, size_math.Ledger())
    fake = fake_tensor.FakeTensorMode(allow_fallback_kernels=False)
    flops = FlopCounterMode(display=False)
    tracker = _Tracker(budget, max_work, flops, INPUT_COPIES * copy_bytes)
    try:
        with fake, flops, tracker:
            inputs = [_fake_input(spec) for spec in placeholders]
            out = bounded(*inputs)
            compared = [t for t in pytree.tree_leaves((out, inputs)) if isinstance(t, torch.Tensor)]
            ins = {k for k in map(_storage_key, inputs) if k is not None}
            outs = {k: tracker.storages[k][1] for k in map(_storage_key, pytree.tree_leaves(out))
                    if k is not None and k not in ins and k in tracker.storages}
    except (Refused, Failed):
        raise
    except (fake_tensor.DataDependentOutputException, fake_tensor.DynamicOutputShapeException,
            fake_tensor.UnsupportedOperatorException, fake_tensor.UnsupportedFakeTensorException) as err:
        raise Refused(f"it does not propagate on fake tensors, so its cost cannot be bounded before it runs: "
                      f"{type(err).__name__}: {_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - a stored graph may fail in any way; nothing real has run
        raise Failed(f"it fails on fake tensors, before anything real runs: {type(err).__name__}: "
                     f"{_line(err)}") from None
    compare = max((t.numel() * compare_bytes(t.element_size()) for t in compared), default=0)
    estimate = Estimate(input_bytes, copy_bytes, tracker.peak, sum(outs.values()), compare,
                        tracker.work, tracker.ops)
    if estimate.total_bytes > budget:
        raise Refused(f"a rebuild of it needs {_size(estimate.total_bytes)} ({_size(estimate.peak_bytes)} at the "
                      f"peak of a run, {_size(estimate.output_bytes)} of outputs, {_size(estimate.compare_bytes)} to "
                      f"compare them, {INPUT_COPIES} copies of {_size(copy_bytes)} of inputs), more than the budget "
                      f"of {budget} bytes (PRECOMPILE_REBUILD_MAX_BYTES, --max-bytes)")
    return estimate


def _fake_input(spec: dict[str, Any]) -> Any:
    if spec.get("type") != "tensor":
        if spec.get("value") is None:
            raise Refused(f"input {spec.get('name')!r:.60} is a symbolic number")
        return spec["value"]
    t = torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype_named(spec["dtype"]), device=spec_device(spec))
    return t.requires_grad_(bool(spec.get("requires_grad"))) if t.is_floating_point() else t


def _storage_key(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "")[:300]
