"""``precompile rebuild``: recompile stored FX graphs for this machine's environment, without the model's code.

A fleet upgrading torch (or moving to another GPU) changes the ``env`` key factor of every artifact, so every key
misses.  Each artifact stores everything else its key hashes: the FX graph (``parts.fx_graph.graph``), the input
specs, the compile options and the ambient state (grad mode, autocast, default dtype, matmul precision, CPU
threads...).  :func:`rebuild` rebuilds the ``GraphModule`` from the stored graph
(:func:`precompile.key.graph.graph_from_json`), makes example inputs from the specs (seeded random floats, zeros for
integer and bool tensors), restores the recorded ambient state, compiles with the recorded options, checks the
compiled outputs (and the inputs the graph writes to) against the rebuilt graph run eagerly on the same inputs,
and stores the result under its new key: the key this environment computes for the same graph, inputs, options
and ambient state, so a process here compiling the same model hits it.

The stored graph is data: it comes back through the allow-list of :mod:`precompile.manifest.graph_allow` (ATen,
prims and registered custom operators by qualified name, the ATen ones only from :mod:`precompile.manifest.op_list`'s
list of operators that check their arguments, torch's own tensor functions and size arithmetic, public tensor
methods; nothing stored is imported), and a graph naming anything else is refused.  It runs eagerly first, under
:class:`~precompile.manifest.op_guard.OpGuard`, so that what its Python functions reach passes the same list (an
operator off it is a refusal) and a graph that fails ATen's own checks on these inputs fails before Inductor
compiles and runs it (Inductor's code checks less than ATen's kernels).  The stored options are
data too (:mod:`precompile.inductor.stored_options`): one outside its domain (``cpp.march`` that is not an
architecture name, a path, a program) is refused, logged, and left at this machine's default.

Every size in the entry was chosen by whoever wrote it, so a rebuild is bounded before it allocates or runs
anything (:mod:`precompile.ops.rebuild_bounds`): by a byte budget (``PRECOMPILE_REBUILD_MAX_BYTES``, ``--max-bytes``;
default a quarter of this machine's memory, at most 4 GiB) that the stored graph's size, the inputs' storages
(summed from their specs, every size and stride an int from 0 to 2**62) and then the peak of a run on fake tensors
(intermediates by storage, the copies and comparisons a rebuild makes) must fit, and by a work bound
(``PRECOMPILE_REBUILD_MAX_FLOPS``, ``--max-flops``; default 10**13) on that run's floating-point operations and
elements touched.  The graph's size arithmetic runs through :mod:`precompile.manifest.size_math` in that run (ints
within 64 bits, ``pow`` and ``<<`` checked before they compute, sequences of at most 65,536 items), and its literals
are bounded when it is read (:func:`precompile.manifest.graph_json.decode_arg`).  A rebuild's peak memory is then
within the budget plus a fixed overhead (torch, Inductor, the compiler), and its time within what the work bound and
the graph's size allow.

Refused, with the reason, are: symbolic artifacts (their sizes need symbolic fake values on the rebuilt graph,
which precompile does not make yet: rebuild them by running the model, e.g. ``precompile warmup``), artifacts
whose stored graph does not hash to their graph factor, artifacts for a device this machine lacks, artifacts
whose ambient state cannot be restored here, artifacts over a bound, and graphs that do not propagate on fake
tensors (an output size that depends on values).  Whatever else fails, whatever the exception (an allocation, a
``MemoryError``, size arithmetic past its bounds), is the outcome ``failed`` with a one-line reason, its traceback
logged at DEBUG: never a traceback on the command line.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cache_backends.base import MISS, Cache, digest_bytes
from cache_backends.bounded import MAX_MANIFEST_BYTES, loads_json
from precompile import config
from precompile.manifest.graph_json import DEVICE_TYPES
from precompile.manifest.manifest import Manifest
from precompile.manifest.op_guard import OpGuard, OpRefusedError
from precompile.errors import ArtifactFormatError, CacheUnavailableError, PrecompileError
from precompile.key import fingerprint, sdpa
from precompile.ops import rebuild_bounds
from precompile.ops.rebuild_bounds import Failed, Refused
from precompile.ops.rebuild_bounds import dtype_named as _dtype
from precompile.ops.rebuild_bounds import spec_device

log = logging.getLogger("precompile")


@dataclass
class Outcome:
    """One artifact's rebuild.

    Attributes:
        old_key / new_key: the stored key and the key built here (None when nothing was built).
        outcome: ``"rebuilt"``, ``"present"`` (the new key is stored already), ``"current"`` (built for this
            environment already), ``"refused"`` or ``"failed"``.
        detail: why, for refused and failed; what changed, for rebuilt.
        seconds: wall seconds spent on it.
    """

    old_key: str
    new_key: str | None
    outcome: str
    detail: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"old_key": self.old_key, "new_key": self.new_key, "outcome": self.outcome, "detail": self.detail,
                "seconds": round(self.seconds, 3)}


def example_inputs(manifest: Manifest, seed: int = 0) -> list[Any]:
    """One input per placeholder, as its spec records it: tensors of the recorded shape, stride, dtype and device
    (floats seeded random, integers and bools zero: their storage extent is filled, so an input whose strides
    overlap costs its storage, not its element count), numbers their recorded value.  Check the specs first
    (:func:`precompile.ops.rebuild_bounds.check_specs`): this allocates what they say.

    Raises:
        Refused: a size is symbolic, a number has no recorded value, or the device is not available here.
    """
    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for spec in manifest.placeholders:
        if spec.get("type") == "tensor":
            dims = [*spec["shape"], *spec["stride"]]
            if any(not isinstance(d, int) for d in dims):
                raise Refused(f"input {spec['name']} has a symbolic size")
            device = spec["device"]
            if device not in ("cpu", "cuda"):
                raise Refused(f"input {spec['name']!r:.60} is on device {device!r:.40}, not cpu or cuda")
            if device == "cuda" and not torch.cuda.is_available():
                raise Refused("it was built for CUDA and this machine has no GPU")
            dtype = _dtype(spec["dtype"])
            t = torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype, device=spec_device(spec))
            storage = t.as_strided((rebuild_bounds.spec_bytes(spec)[0] // dtype.itemsize,), (1,))
            if t.is_floating_point() or t.is_complex():
                storage.copy_(torch.randn(storage.shape, generator=gen, dtype=torch.float32).to(dtype))
            else:
                storage.zero_()
            out.append(t.requires_grad_(bool(spec.get("requires_grad"))) if t.is_floating_point() else t)
        elif spec.get("value") is not None:
            out.append(spec["value"])
        else:
            raise Refused(f"input {spec['name']} is a symbolic number")
    return out


def check_ambient(recorded: Any) -> None:
    """Check a manifest's ambient state before :func:`ambient` restores it: dtypes by name, autocast on known
    device types, a CPU thread count of 1 to 4096.

    Raises:
        Refused: naming the value that is outside these.
    """
    if not isinstance(recorded, dict):
        raise Refused("its ambient state is not an object")
    autocast = recorded.get("autocast") or {}
    if not isinstance(autocast, dict) or not set(autocast) <= set(DEVICE_TYPES):
        raise Refused(f"its ambient autocast {autocast!r:.80} is not for device types {', '.join(DEVICE_TYPES)}")
    for dtype in [*autocast.values(), *([recorded["default_dtype"]] if "default_dtype" in recorded else [])]:
        _dtype(dtype)
    threads = recorded.get("cpu_threads", 1)
    if type(threads) is not int or not 1 <= threads <= 4096:
        raise Refused(f"its ambient CPU thread count {threads!r:.40} is not 1 to 4096")


@contextlib.contextmanager
def ambient(recorded: dict[str, Any]) -> Iterator[None]:
    """Run the block under the ambient state a manifest recorded (:mod:`precompile.key.ambient`), restored after."""
    det = torch.utils.deterministic
    saved = (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), bool(det.fill_uninitialized_memory),
             torch.get_float32_matmul_precision(), torch.get_num_threads())
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(bool(recorded.get("grad_enabled", True))))
            for device, dtype in (recorded.get("autocast") or {}).items():
                stack.enter_context(torch.autocast(device, dtype=_dtype(dtype)))
            if "default_dtype" in recorded:
                torch.set_default_dtype(_dtype(recorded["default_dtype"]))
            if "deterministic" in recorded:
                enabled, warn_only, fill = recorded["deterministic"]
                torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
                det.fill_uninitialized_memory = fill
            if "float32_matmul_precision" in recorded:
                torch.set_float32_matmul_precision(recorded["float32_matmul_precision"])
            if "cpu_threads" in recorded:
                torch.set_num_threads(int(recorded["cpu_threads"]))
            stack.enter_context(sdpa.restored(recorded.get("sdpa")))
            if "cuda_matmul" in recorded and torch.cuda.is_available():
                fp32, fp16, bf16 = recorded["cuda_matmul"]
                matmul = torch.backends.cuda.matmul
                if fp32 and hasattr(matmul, "fp32_precision"):
                    matmul.fp32_precision = fp32
                matmul.allow_fp16_reduced_precision_reduction = fp16
                matmul.allow_bf16_reduced_precision_reduction = bf16
            yield
    finally:
        torch.set_default_dtype(saved[0])
        torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
        det.fill_uninitialized_memory = saved[3]
        torch.set_float32_matmul_precision(saved[4])
        torch.set_num_threads(saved[5])


def _compare(got: Any, want: Any) -> str | None:
    """None if the flat outputs match (torch's dtype-aware tolerances, x4), else what differs."""
    from torch.utils import _pytree as pytree

    g, w = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, eager gives {len(w)}"
    for i, (a, b) in enumerate(zip(g, w)):
        if isinstance(b, torch.Tensor):
            try:
                rtol, atol = torch.testing._comparison.default_tolerances(b)
                torch.testing.assert_close(a.detach() if isinstance(a, torch.Tensor) else a, b.detach(),
                                           rtol=4 * rtol, atol=4 * atol, check_device=False)
            except (AssertionError, TypeError, ValueError) as err:
                return f"output {i}: {str(err).splitlines()[0]}"
        elif a != b:
            return f"output {i}: {a!r} != {b!r}"
    return None


def rebuild_one(cache: Cache, key: str, *, force: bool = False, max_bytes: int | None = None,
                max_flops: int | None = None) -> Outcome:
    """Rebuild the artifact stored under ``key`` for this environment and store it (module docstring), holding at
    most ``max_bytes`` bytes for its inputs, intermediates, outputs and their copies, and doing at most ``max_flops``
    operations a run (:mod:`precompile.ops.rebuild_bounds`; None: ``PRECOMPILE_REBUILD_MAX_BYTES`` and
    ``PRECOMPILE_REBUILD_MAX_FLOPS``).

    Never raises for an artifact that cannot be rebuilt, whatever the exception (an allocation that fails, a
    ``MemoryError`` included): that is an outcome, refused or failed, with a one-line reason; the traceback is
    logged at DEBUG.

    Raises:
        CacheUnavailableError: the cache cannot be read.
        ConfigError: a setting read here is malformed (a verify key, the graph allow-list, the bounds).
    """
    from precompile.store.opening import open_with_policy

    start = time.perf_counter()
    cache, policy = open_with_policy(cache)  # before anything is read: a key setting that names no key is an error
    config.graph_op_namespaces()  # likewise a malformed setting of the graph allow-list
    budget = config.rebuild_max_bytes() if max_bytes is None else max_bytes
    work = config.rebuild_max_flops() if max_flops is None else max_flops

    def done(outcome: str, detail: str = "", new_key: str | None = None) -> Outcome:
        if outcome in ("refused", "failed"):  # one line: an exception's message may hold many
            detail = next((x.strip() for x in detail.splitlines() if x.strip()), "")[:500]
        return Outcome(key, new_key, outcome, detail, time.perf_counter() - start)

    try:
        return _rebuild(cache, key, force, policy, budget, work, done)
    except CacheUnavailableError:
        raise
    except Refused as err:
        return done("refused", str(err))
    except Failed as err:
        return done("failed", str(err))
    except Exception as err:  # noqa: BLE001 - whatever a stored artifact makes fail is its outcome, never a traceback
        log.debug("rebuild of %s failed", key[:12], exc_info=True)
        return done("failed", f"{type(err).__name__}: {err}")


def _rebuild(cache: Cache, key: str, force: bool, policy: Any, budget: int, work: int, done: Any) -> Outcome:
    """:func:`rebuild_one` within its bounds; raises what it does not make an outcome itself."""
    from precompile.manifest import trust
    from precompile.builder.standalone import Plan, build, compute_key
    from precompile.key.graph import NormalizedGraph, Placeholder, canonical_graph, canonical_json, graph_from_json
    from precompile.store.cache_io import store

    digest = cache.get_ref(key)
    raw = cache.get_blob(digest, MAX_MANIFEST_BYTES) if digest is not MISS else MISS
    if raw is MISS:
        return done("failed", "no intact manifest stored under this key")
    try:
        from precompile.manifest.function_manifest import is_function_doc
        from precompile.manifest.manifest import load_json

        doc = load_json(raw)  # type: ignore[arg-type]
        verdict = policy.check(doc)
        if not verdict.ok:  # a rebuild runs the stored graph's callables: only a trusted builder's
            trust.note_refused(verdict, f"rebuild of {key[:12]} in {cache.url}")
            raise Refused(f"it is not trusted here ({verdict.status}: {verdict.detail})")
        if is_function_doc(doc):
            raise Refused("it is a whole-function artifact: it is rebuilt by calling the function "
                          "(precompile.compile), which retraces it here")
        manifest = Manifest.from_json(raw)  # type: ignore[arg-type]
        factors = manifest.factors
        if factors.get("dynamic_shapes") != "static":
            raise Refused("it has symbolic sizes: a rebuild from the stored graph needs symbolic fake values, which "
                          "precompile does not make yet; rebuild it by running the model here (precompile warmup)")
        devices = {p["device"] for p in manifest.placeholders if p.get("type") == "tensor"} or {"cpu"}
        env = fingerprint.environment(devices, full=False)
        changed = [f for f, a, b in fingerprint.mismatches(factors["env"], env)]
        if not changed and not force:
            return done("current", "built for this environment")
        graph_digest = manifest.parts["fx_graph"]["graph"]
        graph_size = int(manifest.blobs[graph_digest]["size"])
        rebuild_bounds.check_graph_size(graph_size, budget)
        graph_blob = cache.get_blob(graph_digest, graph_size)
        if graph_blob is MISS:
            return done("failed", "its stored FX graph is missing, damaged or larger than its manifest says")
        graph_json = loads_json(graph_blob, graph_size, "stored FX graph")  # type: ignore[arg-type]
        if digest_bytes(canonical_json(canonical_graph(graph_json))) != factors.get("graph"):
            raise Refused("its stored FX graph does not hash to its graph factor")
        try:  # the allow-list (precompile.manifest.graph_allow): ATen and registered custom ops, torch's own functions
            gm = graph_from_json(graph_json)
        except ArtifactFormatError as err:
            raise Refused(f"its stored graph is refused: {err}") from None
        rebuild_bounds.check_specs(manifest.placeholders, budget)
        check_ambient(factors.get("ambient") or {})
    except Refused:
        raise
    except (PrecompileError, KeyError, TypeError, ValueError) as err:
        return done("failed", f"the stored artifact cannot be read: {type(err).__name__}: {err}")
    in_spec, out_spec = (list(factors.get("calling") or []) + [None, None])[:2]
    norm = NormalizedGraph(gm, [Placeholder(p["name"], p["kind"], p.get("fqn")) for p in manifest.placeholders],
                           {}, in_spec, out_spec)
    from precompile.inductor import options as inductor_options
    from precompile.inductor import shim, stored_options
    from precompile.key.ambient import ambient_state

    stored, refused = stored_options.within_domain(factors.get("options") or {}, shim.config_entries())
    for err in refused:  # data, not settings: what lies outside its domain never reaches Inductor
        log.warning("rebuild of %s: %s; using this machine's default for it", key[:12], err)
    with ambient(factors.get("ambient") or {}):
        try:
            opts = inductor_options.with_workarounds(inductor_options.inductor_config_overrides(stored))
            effective = inductor_options.effective_config(opts)
        except (KeyError, TypeError) as err:
            return done("refused", f"its options are not valid Inductor options here: {err}")
        fixed = int(effective.get("cpp.threads", -1) or -1) >= 1 or bool(effective.get("cpp.dynamic_threads"))
        here = ambient_state(devices, fixed, "sdpa" in (factors.get("ambient") or {}))
        if here != factors.get("ambient"):
            return done("refused", f"its ambient state cannot be restored here (recorded {factors.get('ambient')}, "
                                   f"got {here})")
        inductor_config = canonical_json(effective)
        new_factors = {**factors, "format": config.FORMAT_VERSION, "options": opts,
                       "inductor_config": digest_bytes(inductor_config), "env": fingerprint.key_fields(env)}
        new_key = compute_key(new_factors)
        if not force and cache.get_ref(new_key) is not MISS:
            return done("present", "the new key is stored already", new_key)
        try:  # on fake tensors, before anything real is made (precompile.ops.rebuild_bounds)
            cost = rebuild_bounds.check_run(gm, manifest.placeholders, budget, work)
        except (Refused, Failed) as err:
            return done("refused" if isinstance(err, Refused) else "failed", str(err), new_key)
        log.info("rebuild of %s: about %d bytes at its peak, %d operations a run", key[:12], cost.total_bytes,
                 cost.work)
        inputs = example_inputs(manifest)
        plan = Plan(key=new_key, factors=new_factors, specs=manifest.placeholders, graph_json=graph_json, options=opts,
                    inductor_config=inductor_config, env=env, devices=devices, symbols=None,
                    fake_values=[None] * len(inputs), compile_inputs=inputs, run_inputs=inputs,
                    dynamic_shapes="from_example_inputs")
        try:
            want_inputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            with OpGuard():  # eagerly first, every operator checked (op_guard), before Inductor runs any of it
                want = gm(*want_inputs)
            shim.record_example_values(gm, inputs)
            art = build(norm, plan)
            got_inputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            got = art.engine(*got_inputs)
        except OpRefusedError as err:
            return done("refused", f"its stored graph is refused: {err}", new_key)
        except Exception as err:  # noqa: BLE001 - a failed rebuild is an outcome of this artifact, not of the run
            log.debug("rebuild of %s failed", key[:12], exc_info=True)
            return done("failed", f"{type(err).__name__}: {err}", new_key)
    problem = _compare(got, want) or _compare(got_inputs, want_inputs)
    if problem is not None:
        return done("failed", f"the rebuilt artifact does not match the stored graph run eagerly: {problem}", new_key)
    if not store(cache, art):
        return done("failed", f"could not be stored in {cache.url} (see the log)", new_key)
    what = ", ".join(f"{f} {factors['env'].get(f)!r} -> {env.get(f)!r}" for f in changed) or "forced"
    if refused:
        what += f"; {len(refused)} stored option(s) refused, this machine's defaults used ({refused[0]})"
    return done("rebuilt", what, new_key)


def stale_keys(cache: Cache) -> list[str]:
    """Keys of stored artifacts built for another environment than this one (every key field compared), of those
    whose signature the verify keys configured here accept (every one, with none configured).

    Raises:
        CacheUnavailableError: the cache cannot be read.
        TrustConfigError: a configured key cannot be read, or a key setting names no key.
    """
    from precompile.store.lookup import stored_manifests
    from precompile.store.opening import open_with_policy

    cache, policy = open_with_policy(cache)
    here: dict[frozenset[str], dict[str, Any]] = {}
    out = []
    for key, m in stored_manifests(cache):
        if m is None or not isinstance(m.get("factors"), dict) or m.get("kind") is not None:
            continue  # a whole-function artifact is rebuilt by calling the function
        if not isinstance(m["factors"].get("env"), dict) or not policy.check(m).ok:
            continue  # malformed (the ls/verify commands list it), or not trusted here
        devices = frozenset(p.get("device") for p in m.get("placeholders") or []
                            if isinstance(p, dict) and p.get("type") == "tensor") or frozenset({"cpu"})
        if devices not in here:
            try:
                here[devices] = fingerprint.environment(set(devices), full=False)
            except (RuntimeError, AssertionError):  # e.g. CUDA artifacts on a machine without a GPU
                here[devices] = {}
        if fingerprint.mismatches(m["factors"].get("env") or {}, here[devices]):
            out.append(key)
    return out
