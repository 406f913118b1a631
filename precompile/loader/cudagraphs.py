"""CUDA graphs over a loaded graph artifact: ``mode="reduce-overhead"`` after a warm load.

``torch.compile(mode="reduce-overhead")`` records each compiled graph into a CUDA graph (Inductor's cudagraph
trees) and replays it, so a call costs one graph launch instead of one launch per kernel.  A graph precompile
loads runs its kernels from its own wrapper, not from Inductor's compiled callable, so the recording is done here,
with the public ``torch.cuda.CUDAGraph`` API, in the same way:

- per distinct call signature (each tensor input's shape, stride, dtype and device, the other inputs' values, and
  the address of each static input) the first call runs as it is (a warm-up: lazy library set-up, allocations)
  and the second records a CUDA graph; later calls replay it.  At most :data:`MAX_GRAPHS` are recorded per graph
  (a server's set of batch sizes); past that, calls run without one, as Inductor's trees fall back;
- a *static* input — a parameter, or a tensor Dynamo was told has a fixed address
  (``torch._dynamo.mark_static_address``, as transformers' ``StaticCache`` marks its key/value tensors) — is used
  in place, so writes into a KV cache land in it; any other tensor input is copied into the graph's own buffer
  before a replay, and copied back after it where the graph writes to it (the manifest's ``mutated_inputs``);
- outputs are copied out of the graph's memory pool before they are returned, so a later replay never overwrites
  a tensor the caller holds (Inductor's trees instead return the pool's tensors and fail on a stale access).

Inputs on the CPU, a call while another stream is being captured, and a graph that cannot be captured (it
synchronizes: logged once) run without a graph.  A capture that fails leaves the process as it was
(:func:`capture`): the CUDA generator's seed and offset, the caching allocator's pool and the caller's current
stream.  Calls from several threads take turns on a recorded graph (its buffers serve one call at a time).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("precompile")

#: Most CUDA graphs recorded per graph artifact (one per call signature).
MAX_GRAPHS = 64


def is_static(t: torch.Tensor) -> bool:
    """True for a tensor whose address stays fixed from call to call: a parameter, or one marked with
    ``torch._dynamo.mark_static_address`` (Dynamo's attribute, read without importing Dynamo)."""
    return isinstance(t, torch.nn.Parameter) or getattr(t, "_dynamo_static_input_type", None) is not None


class _Recorded:
    """One recorded CUDA graph: its static input buffers and its outputs (in the graph's pool)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[Any], outputs: Any, copied: list[int],
                 mutated: frozenset[int]):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.copied = copied  # the inputs copied into the graph's buffers before each replay
        self.copied_back = [i for i in copied if i in mutated]  # and out of them after it


class CudaGraphRunner:
    """``fn`` (a loaded graph: ``fn(*inputs) -> tuple/list of tensors or a tensor``), replayed from CUDA graphs
    (module docstring).

    Args:
        fn: the callable; it must launch only on the current stream and never synchronize (a precompile
            artifact's fast engine does neither).
        mutated: indices of the inputs ``fn`` writes to.
        name: for logs.
    """

    def __init__(self, fn: Callable[..., Any], mutated: Sequence[int] = (), name: str = "graph"):
        self.fn, self.mutated, self.name = fn, frozenset(mutated), name
        self._graphs: dict[tuple[Any, ...], _Recorded] = {}
        self._warmed: set[tuple[Any, ...]] = set()
        self._failed: set[tuple[Any, ...]] = set()
        self._failed_graphs: list[torch.cuda.CUDAGraph] = []
        self._lock = threading.Lock()
        self._pool: Any = None
        self._stream: Any = None
        self.replays = 0

    def __call__(self, *args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or any(t.device.type != "cuda" for t in tensors) or torch.cuda.is_current_stream_capturing():
            return self.fn(*args)
        key = tuple(_signature(a) for a in args)
        with self._lock:  # one graph's buffers serve one call at a time (threads would mix their inputs)
            recorded = self._graphs.get(key)
            if recorded is None:
                if key in self._failed or key not in self._warmed or len(self._graphs) >= MAX_GRAPHS:
                    if len(self._warmed) < 4 * MAX_GRAPHS:  # a bounded memory of signatures seen once
                        self._warmed.add(key)
                    return self.fn(*args)
                recorded = self._record(key, args)
                if recorded is None:
                    return self.fn(*args)
            for i in recorded.copied:
                recorded.inputs[i].copy_(args[i])
            recorded.graph.replay()
            self.replays += 1
            for i in recorded.copied_back:
                args[i].copy_(recorded.inputs[i])
            return _clone(recorded.outputs)

    def _record(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> _Recorded | None:
        """Record the graph of one call signature, or None (logged, never again for this signature) when ``fn``
        cannot be captured (it synchronizes, or copies to the host): then it runs without a graph, as Inductor's
        trees fall back."""
        copied = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and not is_static(a)]
        inputs = [a.clone() if i in copied else a for i, a in enumerate(args)]
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        try:
            outputs = capture(graph, self.fn, inputs, pool=self._pool, stream=self._stream)
        except Exception as err:  # noqa: BLE001 - a graph that cannot be captured still runs, uncaptured
            self._failed.add(key)
            # the allocator may free the failed capture's pool (its last reference is gone) but not reuse it:
            # later captures take a new one
            self._pool = None
            # kept alive: torch 2.13's pinned-memory allocator may still hold a filter that reads this graph (its
            # routing is ended only by a capture that ended, and Python cannot end it); one per failed signature
            if len(self._failed_graphs) < 4 * MAX_GRAPHS:
                self._failed_graphs.append(graph)
            log.warning("%s cannot be recorded as a CUDA graph (%s: %s); it runs without one", self.name,
                        type(err).__name__, err)
            return None
        recorded = self._graphs[key] = _Recorded(graph, inputs, outputs, copied, self.mutated)
        log.info("%s: recorded CUDA graph %d for inputs %s", self.name, len(self._graphs),
                 [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)][:4])
        return recorded


def capture(graph: torch.cuda.CUDAGraph, fn: Callable[..., Any], inputs: list[Any], *, pool: Any,
            stream: torch.cuda.Stream) -> Any:
    """Record ``fn(*inputs)`` into ``graph`` on ``stream`` (a side stream, as ``torch.cuda.graph`` uses) sharing
    ``pool``; returns ``fn``'s outputs (tensors in the graph's pool).

    Unlike ``torch.cuda.graph``, a capture that fails (``fn`` synchronizes, copies to the host, or raises) leaves
    the process as it was before the call: ``torch.cuda.graph``'s exit raises out of ``capture_end`` before it
    restores the caller's stream, the CUDA generator's state stays in capture mode (torch 2.11: every later random
    op, and every replay of a graph captured earlier, which holds the same state, fails with "Offset increment
    outside graph capture encountered unexpectedly"), and the caching allocator keeps recording the capturing
    stream into ``pool``.  Here the caller's stream is restored by the stream context; the generator's state is
    taken out of capture mode by one trivial capture that ends (:func:`_end_generator_capture`: its prologue and
    epilogue run on the same state, seed and offset untouched); and the allocator's part is undone
    (:func:`precompile.inductor.shim.abandon_pool_capture`).  The capture's error mode is ``thread_local``: another
    thread's CUDA work during the capture is not an error of this capture.

    Raises:
        RuntimeError (or whatever ``fn`` raised): the capture failed; the state above is restored first.
    """
    from precompile.inductor import shim

    device = torch.cuda.current_device()
    rng = torch.cuda.default_generators[device].clone_state()
    caller = torch.cuda.current_stream()
    torch.cuda.synchronize()
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                outputs = fn(*inputs)
            finally:
                graph.capture_end()
    except BaseException:
        shim.abandon_pool_capture(device, pool)  # a no-op where the capture got as far as ending it
        _end_generator_capture(device, stream, rng)
        raise
    caller.wait_stream(stream)
    return outputs


def _end_generator_capture(device: int, stream: torch.cuda.Stream, rng: torch.Generator) -> None:
    """After a failed capture on ``device``: take the default CUDA generator's state out of capture mode.

    One trivial capture on ``stream`` (a kernel on a scratch tensor, into a pool of its own) that ends: torch 2.11
    registers the default generator's state with every capture, runs its capture prologue at the start and its
    epilogue at the end (aten/src/ATen/cuda/CUDAGraph.cpp), so the same state object, held by the generator and by
    the graphs captured before, leaves capture mode with its seed and offset as they were.  Then a random draw
    checks it (and the generator's seed and offset are set back after it).  Should either fail, the generator
    gets ``rng`` (a copy of its state taken before the capture, not capturing) in place of its state: eager random
    ops work again, though graphs captured before keep the stuck one."""
    generator = torch.cuda.default_generators[device]
    try:
        scratch = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=torch.cuda.graph_pool_handle(), capture_error_mode="thread_local")
            try:
                scratch.add_(1)
            finally:
                graph.capture_end()
        del graph
        state = generator.get_state()
        torch.rand(1, device=device)
        generator.set_state(state)
    except Exception as err:  # noqa: BLE001 - the fallback below still makes random ops work
        log.warning("the CUDA generator could not be taken out of capture mode (%s: %s); it gets a fresh copy of "
                    "its state", type(err).__name__, err)
        generator.graphsafe_set_state(rng)


def _signature(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype, a.device, a.data_ptr() if is_static(a) else None)
    return (type(a), a) if isinstance(a, (int, float, bool, str, type(None))) else (type(a), id(a))


def _clone(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(_clone(o) for o in out)
    return out
