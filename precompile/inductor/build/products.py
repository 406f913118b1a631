"""What one Inductor compile produced, as precompile harvests it: kernels, wrappers, binaries, picks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Kernel:
    """One generated kernel.

    Attributes:
        name: the name the wrapper binds it to (``cpp_fused_add_0``, ``triton_poi_fused_add_0``).
        lang: ``"cpp"`` or ``"triton"``.
        source: the kernel source text as Inductor generated it.
        binaries: ``{file name: bytes}`` built from it (``x.so``; ``x.cubin`` + ``x.json``...).
        config: the autotune pick for it (block sizes, num_warps, num_stages...), or None.
        relpaths: ``{file name: path relative to the Inductor cache dir}`` where Inductor stored each file.
    """

    name: str
    lang: str
    source: str
    binaries: dict[str, bytes] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    relpaths: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildResult:
    """What one Inductor compile produced.

    Attributes:
        compiled_fn: the live callable (flat list of inputs in, tuple of outputs out).
        engine_payload: bytes that :func:`load_engine` turns back into a callable.
        wrappers: ``{name: python source}`` of each wrapper module (``forward``, and ``backward`` if any).
        kernels: every generated kernel with its binaries.
        autotune: autotune picks not attached to one kernel (``{"file": config}``), e.g. GEMM choices.
        inputs_to_check: indices of inputs Inductor assumed 16-byte aligned and checks (clones if not) per call.
        mutated_inputs: indices of inputs the graph writes to.
        defers_alignment: the wrapper clones its misaligned inputs that it does not write to itself (torch
            2.13); else every input of ``inputs_to_check`` is its caller's to align.
        compile_seconds: wall time of the Inductor compile, seconds.
        cache_files: ``{relpath: size in bytes}`` of every file in the private cache dir (for inspection).
        fast_off: why the fast path cannot be offered, as found while compiling (e.g. a Triton kernel that
            Inductor does not launch statically), or None.
        multi_kernel: ``{multi-kernel name: index of the sub-kernel picked at build}`` (``triton.multi_kernel``).
        tuned: one record per op ``max_autotune`` benchmarked (GEMM, convolution): its candidates, their times
            and the choice taken (:mod:`precompile.inductor.build.picks`).
        benchmark_leftovers: ``.best_config`` files of kernels only a benchmark compiled (not picks).
        cache_dir: the compile's private Inductor + Triton cache dir while it lives (a GPU build's, kept until the
            process ends: it holds the first compile's on-disk autotune results for a second compile), else None.
        phase_seconds: wall seconds of each step of the build after Inductor's compile (``settle``: the run that
            settles autotuning; ``harvest``: reading the products; ``package``: packaging kernels for the fast
            engine), for the build's log line.
    """

    compiled_fn: Any
    engine_payload: bytes
    wrappers: dict[str, str]
    kernels: list[Kernel]
    autotune: dict[str, Any]
    inputs_to_check: list[int]
    mutated_inputs: list[int]
    compile_seconds: float
    cache_files: dict[str, int]
    defers_alignment: bool = False
    fast_off: str | None = None
    multi_kernel: dict[str, int] = field(default_factory=dict)
    tuned: list[dict[str, Any]] = field(default_factory=list)
    benchmark_leftovers: int = 0
    cache_dir: str | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)


class NotSaveableError(RuntimeError):
    """Inductor compiled the graph but produced no cache entry to save (something in it is not cacheable)."""

