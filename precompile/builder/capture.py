"""``torch.compile`` integration: a Dynamo backend that compiles through precompile's cache.

>>> compiled = torch.compile(model, backend=precompile.backend(cache="file:///var/cache/pc"))  # doctest: +SKIP

Dynamo traces the model, hands each graph (parameters lifted as inputs) to the backend, and the backend returns
a cached artifact or builds one: the same way vLLM captures graphs with its own backend.  Every graph the
backend saw is recorded in :attr:`Backend.records` (key, hit or built, seconds), which ``precompile warmup``
turns into its summary table.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cache_backends.base import Cache

log = logging.getLogger("precompile")


@dataclass
class GraphRecord:
    """What happened to one graph Dynamo captured.

    Attributes:
        index: order in which Dynamo produced the graph (0-based) within this backend.
        key: artifact key.
        outcome: ``"hit"`` (loaded from the cache), ``"built"`` (compiled with Inductor), ``"waited"`` (loaded
            after waiting for another worker's build) or ``"takeover"`` (built after another worker's build
            lease expired unfinished); see :func:`precompile.store.coordination.get_or_build`.
        seconds: wall seconds of the load (hit) or of the compile and store (built).
        compile_seconds: Inductor compile seconds recorded in the artifact at build time.
        bytes: total size of the artifact's parts, bytes.
        kernels: number of generated kernels.
    """

    index: int
    key: str
    outcome: str
    seconds: float
    compile_seconds: float
    bytes: int
    kernels: int


@dataclass
class Backend:
    """A ``torch.compile`` backend that returns precompile artifacts (see module docstring).

    Attributes:
        cache: cache URL or open cache (None: ``$PRECOMPILE_CACHE`` or the local default).
        options: Inductor config patches for every graph.
        dynamic_shapes: passed to :func:`precompile.standalone_compile`; None (the default) picks per graph:
            ``"from_tracing_context"`` for a graph Dynamo captured with symbolic sizes (``mark_dynamic``, or
            automatic dynamic shapes after a recompile), so the artifact serves every size Dynamo will call it
            with, else ``"from_example_inputs"``.
        records: one :class:`GraphRecord` per graph compiled or loaded, in order.
    """

    cache: str | Cache | None = None
    options: dict[str, Any] | None = None
    dynamic_shapes: str | None = None
    records: list[GraphRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        from precompile.store.opening import open_cache
        from precompile.errors import CacheError, CacheURLError

        try:
            self.cache = open_cache(self.cache)
        except CacheURLError:
            raise  # a typo must not silently cost the cache
        except CacheError as err:  # an outage at start: compile uncached
            log.warning("cache %s cannot be opened (%s); graphs are compiled without it", self.cache, err)
            self.cache = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]):
        from precompile.builder.standalone import standalone_compile
        from precompile.errors import ConfigError, InputMismatchError, OptionsError, PrecompileError

        start = time.perf_counter()
        try:
            mode = self.dynamic_shapes or _mode_for(gm, example_inputs)
            art = standalone_compile(gm, example_inputs, dynamic_shapes=mode, options=self.options, cache=self.cache)
        except (OptionsError, InputMismatchError, ConfigError):
            raise  # the caller's mistake (a bad key setting among them): the same with or without precompile
        except PrecompileError as err:
            # a graph precompile cannot store (or an Inductor failure) must not break the user's torch.compile:
            # hand it to Inductor directly, uncached, as torch.compile's own backend would
            log.warning("precompile cannot cache graph %d (%s: %s); compiling it with Inductor directly, uncached",
                        len(self.records), type(err).__name__, err)
            from precompile.inductor.shim import compile_uncached

            return compile_uncached(gm, example_inputs, self.options)
        seconds = time.perf_counter() - start
        self.records.append(GraphRecord(
            index=len(self.records), key=art.key, outcome=art.outcome,
            seconds=seconds, compile_seconds=float(art.manifest.build.get("seconds", 0.0)),
            bytes=art.manifest.total_bytes(), kernels=len(art.manifest.kernels)))
        return art


def _mode_for(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> str:
    """``"from_tracing_context"`` if the graph has symbolic sizes, else ``"from_example_inputs"``."""
    from precompile.inductor import shapes

    symbolic = any(isinstance(x, torch.SymInt) for x in example_inputs) or \
        shapes.symbols_of(shapes.fake_values(gm)) is not None
    return "from_tracing_context" if symbolic else "from_example_inputs"


def backend(cache: str | Cache | None = None, *, options: dict[str, Any] | None = None,
            dynamic_shapes: str | None = None) -> Backend:
    """A ``torch.compile`` backend compiling through ``cache``: ``torch.compile(m, backend=backend(...))``.

    Raises:
        CacheURLError: ``cache`` is not a valid cache URL.
    """
    return Backend(cache=cache, options=options, dynamic_shapes=dynamic_shapes)


def capture_graphs(model: torch.nn.Module, inputs: tuple[Any, ...]) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    """The FX graphs Dynamo produces for ``model(*inputs)``, each with its example inputs, without compiling.

    Runs under ``torch.no_grad()`` with ``dynamic=False``; graph breaks give several graphs.
    """
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def grab(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=grab, dynamic=False)(*inputs)
    return graphs
