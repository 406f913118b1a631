"""The library calls of a graph, recorded at build and replayed beside a load, so that a first call costs little
more than any other.

A fast load carries every Triton cubin and C++ kernel and loads them itself, so what is left for a first call is
what the libraries the wrapper calls through torch do on their first use: cuBLAS / cuBLASLt create handles and
load, lazily, the kernel each matmul shape picks; the fused attention kernels behind
``aten._scaled_dot_product_*_attention`` are loaded; cuDNN sets up.  On an H100 that is most of a first call:
0.20 s of a Llama's 0.32 s in its 58 ``mm`` calls, 0.11 s in its 8 attention calls (docs/benchmarks.md, time to
first output).  A tiny matmul does not help: each shape loads its own kernel.

So the build records each distinct call of :data:`LIBRARY_OPS` the fast callable makes on the example inputs
(:func:`record`: op, overload, and each argument's shape, stride and dtype, or its value), and a load replays
them on zero-filled tensors in a daemon thread (:func:`start`), started as soon as the cache read has verified the
manifest (:func:`precompile.loader.engine.start_primer`), so that it runs while the load reads and checks blobs, loads
binaries and builds launchers.  The loaded callable waits for the thread before its first call
(:meth:`Primer.wait`), and so does the process's exit (a CUDA op still running in a daemon thread at exit aborts
the process).  torch keeps cuBLAS and cuDNN handles in per-device pools that a thread returns its handles to when
it ends, so the handles the thread created are the ones the first call takes, and the blocks it allocated stay in
the caching allocator for the first call.  Replaying changes no output: the ops are pure functions of fresh
tensors, and a call that would draw random numbers (``dropout_p`` not 0) or return attention's debug mask is never
recorded or replayed.

Recorded calls come from a manifest, so they are checked before anything runs (:func:`check_calls`): only
:data:`LIBRARY_OPS` of ``aten``, known dtypes, at most :data:`MAX_CALLS` calls and :data:`MAX_DIMS` dimensions,
bounded numbers and lists, and at most :data:`MAX_CALL_BYTES` of inputs and outputs per call, by logical size or
storage extent, whichever is larger (outputs by each op's shape rule, :func:`_out_bytes`).  The first call waits
at most :data:`WAIT_S` seconds.  A call that fails is logged at DEBUG and left to the first call: priming never
fails a load.

What it pays (H100, torch 2.11, docs/benchmarks.md): load + first call 0.134 s against 0.192 s without it for a
Llama, 0.143 against 0.176 s for a Qwen2, 0.305-0.336 s against 0.381-0.422 s for resnet18, whose cuDNN
convolution set-up carries over from the thread.  Started later (after the blobs were read) it did not pay, and it
cannot build cuDNN attention's plans, which PyTorch caches per thread: precompile compiles attention to flash or
memory-efficient kernels instead (:mod:`precompile.key.sdpa`).  One thread per library (cuDNN beside cuBLAS) was tried
and paid nothing more.  So it is on for GPU graphs unless ``PRECOMPILE_PRIME`` says otherwise
(:func:`precompile.config.prime_mode`: ``off``; ``all`` primes CPU graphs too, which is not measured to pay).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from precompile.inductor import shim

log = logging.getLogger("precompile")

#: aten ops whose first call sets a library up or loads its kernels: the ones recorded and replayed.
LIBRARY_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "_int_mm", "_scaled_mm", "convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
})
#: Bounds on what a manifest may ask a load to replay: calls, dims of a tensor, bytes of a call's tensors (inputs
#: and outputs, each the larger of its logical size and the storage its strides reach), items of a list argument
#: and the magnitude of a number in it.
MAX_CALLS, MAX_DIMS, MAX_CALL_BYTES, MAX_LIST, MAX_INT = 256, 8, 256 * 1024**2, 16, 1 << 31
#: Seconds the first call waits for the replay before it runs beside it.
WAIT_S = 30.0
_DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64", "bool",
    "float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)}
_NUMBER = (bool, int, float)


def _encode(value: Any) -> Any:
    """A JSON-able stand-in for one argument; raises ValueError for what cannot be replayed."""
    if isinstance(value, torch.Tensor):
        name = str(value.dtype).removeprefix("torch.")
        if name not in _DTYPES or value.dim() > MAX_DIMS:
            raise ValueError(f"tensor of {value.dtype} with {value.dim()} dims")
        return {"t": list(value.shape), "s": list(value.stride()), "d": name}
    if value is None or isinstance(value, (*_NUMBER, str)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("a non-finite number")
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, _NUMBER) for v in value):
        return {"l": list(value)}
    if isinstance(value, torch.dtype) and str(value).removeprefix("torch.") in _DTYPES:
        return {"dtype": str(value).removeprefix("torch.")}
    raise ValueError(f"an argument of type {type(value).__name__}")


def _unreplayable(schema: Any, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """Why a call is neither recorded nor replayed, or None: it draws random numbers (``dropout_p`` not 0), or
    asks for attention's debug mask (an output of batch x heads x L x S, past what the output rule bounds)."""
    for i, arg in enumerate(schema.arguments):
        if arg.name in ("dropout_p", "return_debug_mask"):
            if args[i] if i < len(args) else kwargs.get(arg.name, 0):
                return "it draws random numbers" if arg.name == "dropout_p" else "it returns a debug mask"
    return None


class _Recorder(shim.dispatch_mode_class()):  # type: ignore[misc] - torch's TorchDispatchMode
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ns, _, rest = func.name().partition("::")
        op, _, overload = rest.partition(".")
        if ns == "aten" and op in LIBRARY_OPS and len(self.calls) < MAX_CALLS:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            try:
                if why := _unreplayable(func._schema, list(args), kwargs):
                    raise ValueError(why)
                call = {"op": op, "overload": overload or "default", "device": tensors[0].device.type,
                        "args": [_encode(a) for a in args], "kwargs": {k: _encode(v) for k, v in kwargs.items()}}
            except Exception as err:  # noqa: BLE001 - recording never changes the run it watches
                log.debug("library call %s not recorded for priming: %s", func.name(), err)
            else:
                if call not in self.calls:
                    self.calls.append(call)
        return out


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Record, while the block runs, the distinct :data:`LIBRARY_OPS` calls made in this thread, into the list it
    yields: each ``{"op", "overload", "device": "cuda"|"cpu", "args": [...], "kwargs": {...}}`` with tensors as
    ``{"t": shape, "s": stride, "d": dtype}``.  Every op still runs as it would without the recording."""
    recorder = _Recorder()
    with recorder:
        yield recorder.calls


def record(fn: Any, inputs: list[Any]) -> list[dict[str, Any]]:
    """Call ``fn(*inputs)`` once (under ``no_grad``) and return its distinct library calls (see
    :func:`recording`).  ``inputs`` may be written to (pass copies)."""
    with torch.no_grad(), recording() as calls:
        fn(*inputs)
    return calls


def _decode(value: Any, device: torch.device) -> tuple[Any, int]:
    """``(argument, bytes of tensors)`` for one encoded argument (a tensor stays a spec); ValueError if it breaks a
    bound (the bytes are bounded per call, by :func:`check_calls`)."""
    if isinstance(value, dict) and "t" in value:
        shape, stride, dtype = value["t"], value["s"], _DTYPES.get(value["d"])
        if (dtype is None or not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride)
                or len(shape) > MAX_DIMS or not all(type(n) is int and 0 <= n < 2**40 for n in shape + stride)):
            raise ValueError(f"tensor spec {str(value)[:80]}")
        # the larger of the logical size (a 0 stride does not make it small) and the storage the strides reach
        # (what empty_strided allocates: a 2**37 stride on a 2x2 tensor is 512 GiB)
        extent = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        nbytes = max(math.prod(shape), extent) * dtype.itemsize
        return ("tensor", shape, stride, dtype, device), nbytes
    if (isinstance(value, dict) and "l" in value and isinstance(value["l"], list) and len(value["l"]) <= MAX_LIST
            and all(type(v) in _NUMBER and abs(v) <= MAX_INT for v in value["l"])):
        return list(value["l"]), 0
    if isinstance(value, dict) and value.get("dtype") in _DTYPES:
        return _DTYPES[value["dtype"]], 0
    if value is None or type(value) in (bool, str) or (type(value) in (int, float) and abs(value) <= MAX_INT):
        return value, 0
    raise ValueError(f"argument {str(value)[:80]}")


def check_calls(calls: Any, device_index: int | None = None) -> list[tuple[Any, list[Any], dict[str, Any]]]:
    """The replayable ``(op overload, args, kwargs)`` of a manifest's recorded calls (tensors still as specs);
    a call that breaks a bound or names another op is left out (logged at DEBUG).

    Raises:
        nothing.
    """
    out: list[tuple[Any, list[Any], dict[str, Any]]] = []
    if not isinstance(calls, list):
        return out
    for call in calls[:MAX_CALLS]:
        try:
            op, overload = call["op"], call["overload"]
            if op not in LIBRARY_OPS or not isinstance(overload, str) or not overload.isascii() \
                    or not overload.isidentifier():
                raise ValueError(f"op {str(op)[:40]}.{str(overload)[:40]}")
            if call["device"] == "cuda":
                device = torch.device("cuda", torch.cuda.current_device() if device_index is None else device_index)
            elif call["device"] == "cpu":
                device = torch.device("cpu")
            else:
                raise ValueError(f"device {str(call['device'])[:20]}")
            args = [_decode(a, device) for a in call["args"]]
            kwargs = {str(k): _decode(v, device) for k, v in dict(call["kwargs"]).items()}
            if sum(n for _, n in args) + sum(n for _, n in kwargs.values()) > MAX_CALL_BYTES:
                raise ValueError("more tensor bytes than a call may replay")
            fn = getattr(getattr(torch.ops.aten, op), overload)
            plain_args, plain_kwargs = [a for a, _ in args], {k: v for k, (v, _) in kwargs.items()}
            if why := _unreplayable(fn._schema, plain_args, plain_kwargs):
                raise ValueError(why)
            total = sum(n for _, n in args) + sum(n for _, n in kwargs.values()) + _out_bytes(op, plain_args)
            if total > MAX_CALL_BYTES:
                raise ValueError(f"inputs and outputs of {total} bytes")
            out.append((fn, plain_args, plain_kwargs))
        except Exception as err:  # noqa: BLE001 - a call that cannot be replayed is left to the first call
            log.debug("recorded library call not replayed: %s: %s", type(err).__name__, err)
    return out


def _out_bytes(op: str, args: list[Any]) -> int:
    """Bytes of the outputs of ``op`` on decoded ``args``, from the op's own shape rule (no meta kernel: that
    would import sympy); ValueError when the arguments are not laid out as the op takes them."""
    def shape(i: int) -> list[int]:
        if i >= len(args) or not (isinstance(args[i], tuple) and args[i][0] == "tensor"):
            raise ValueError(f"argument {i} of {op} is not a tensor")
        return args[i][1]

    itemsize = max(4, args[0][3].itemsize) if args and isinstance(args[0], tuple) else 4
    if op in ("mm", "_int_mm", "_scaled_mm"):
        numel = shape(0)[0] * shape(1)[-1]
    elif op == "addmm":
        numel = shape(1)[0] * shape(2)[-1]
    elif op == "bmm":
        numel = math.prod(shape(0)[:2]) * shape(1)[-1]
    elif op == "baddbmm":
        numel = math.prod(shape(1)[:2]) * shape(2)[-1]
    elif op.startswith("_scaled_dot_product_"):  # out [..., L, Ev], logsumexp [..., L] and a few scalars
        numel = math.prod(shape(0)[:-1]) * (shape(2)[-1] + 1)
    elif op == "convolution":  # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        x, w = shape(0), shape(1)
        stride, padding, dilation, transposed, out_pad, groups = args[3:9]
        if transposed:
            channels = w[1] * groups
            spatial = [(n - 1) * st - 2 * p + d * (k - 1) + op_ + 1
                       for n, k, st, p, d, op_ in zip(x[2:], w[2:], stride, padding, dilation, out_pad)]
        else:
            channels = w[0]
            spatial = [(n + 2 * p - d * (k - 1) - 1) // st + 1
                       for n, k, st, p, d in zip(x[2:], w[2:], stride, padding, dilation)]
        numel = x[0] * channels * math.prod(max(0, n) for n in spatial)
    else:
        raise ValueError(f"no output rule for {op}")
    return numel * itemsize


def _materialize(value: Any) -> Any:
    if isinstance(value, tuple) and value and value[0] == "tensor":
        _, shape, stride, dtype, device = value
        return torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()
    return value


class Primer:
    """A daemon thread replaying checked library calls; :meth:`wait` joins it.

    ``done`` and ``failed`` count the calls replayed and those that raised (each logged at DEBUG); ``seconds``
    is the thread's run time (None until it ends).
    """

    def __init__(self, calls: list[tuple[Any, list[Any], dict[str, Any]]]):
        self.calls = calls
        self.done = 0
        self.failed = 0
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="precompile-prime", daemon=True)
        # a process that exits while the replay runs CUDA ops in a daemon thread aborts in C++ (std::terminate, seen
        # on an H100): the exit waits for the replay instead (bounded: at most WAIT_S), until it has ended
        atexit.register(self.wait)
        self._thread.start()

    def _run(self) -> None:
        start = time.perf_counter()
        cuda = False
        with torch.no_grad():
            for fn, args, kwargs in self.calls:
                try:
                    fn(*[_materialize(a) for a in args], **{k: _materialize(v) for k, v in kwargs.items()})
                    self.done += 1
                    cuda = cuda or any(isinstance(a, tuple) and a and a[0] == "tensor" and a[4].type == "cuda"
                                       for a in args)
                except Exception as err:  # noqa: BLE001 - the first call sets it up instead
                    self.failed += 1
                    log.debug("priming %s failed (%s: %s); the first call sets it up", fn, type(err).__name__, err)
            try:
                if cuda:
                    torch.cuda.synchronize()
            except Exception as err:  # noqa: BLE001 - the first call's own synchronization reports it
                log.debug("priming: synchronize failed (%s: %s)", type(err).__name__, err)
        self.seconds = time.perf_counter() - start
        atexit.unregister(self.wait)

    def wait(self, timeout_s: float = WAIT_S) -> None:
        """Block until the thread has ended (at once if it has), at most ``timeout_s`` seconds: then log a
        warning and return, the replay going on beside the caller (torch's libraries are thread-safe).
        Safe to call from several threads at once."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("priming is still running after %.0f s; the first call goes on beside it", timeout_s)


def start(calls: Any, on_cpu: bool = False) -> Primer | None:
    """Start replaying a manifest's recorded library ``calls`` (those on a CPU only if ``on_cpu``) in a daemon
    thread; None when there is nothing to replay.

    Raises:
        nothing: a call that cannot be replayed is left to the first call.
    """
    if not isinstance(calls, list):
        return None
    wanted = [c for c in calls if isinstance(c, dict) and (c.get("device") == "cuda" or on_cpu)]
    if any(c.get("device") == "cuda" for c in wanted) and not torch.cuda.is_available():
        return None
    checked = check_calls(wanted)
    return Primer(checked) if checked else None
