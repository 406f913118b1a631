"""The compiled artifact: a callable with a manifest, saved as one file or a readable directory, or cached.

Loading by path or key is in :mod:`precompile.store.loading`, file formats in :mod:`precompile.manifest.formats`, cache
reads and writes in :mod:`precompile.store.cache_io`, the engine (fast or portable) in :mod:`precompile.loader.engine`,
input checks in :mod:`precompile.loader.inputs`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from cache_backends.base import Cache
from precompile.manifest.manifest import Manifest
from precompile.errors import ArtifactFormatError, ArtifactNotFoundError, InputMismatchError
from precompile.loader.inputs import CallChecks, size_at

log = logging.getLogger("precompile")
_NO_SKIP: frozenset[int] = frozenset()


class Artifact:
    """A compiled FX graph: call it like the graph, inspect its manifest, save or cache it.

    ``art(*inputs)`` takes the same inputs as the graph it was compiled from (for a ``torch.export`` module:
    the module's user arguments) and returns the same structure.  Placeholders that were tensor attributes of
    the module (lifted weights) are *bound*: they need not be passed.  After :func:`load`, such weights are
    not in the artifact (one artifact serves every checkpoint): bind them with :meth:`bind` first.

    Attributes:
        key: the artifact key (64 hex chars).
        manifest: the parsed :class:`~precompile.manifest.manifest.Manifest`.
        source: where it came from: ``"compiled"``, ``"cache"``, or the path it was loaded from.
        load_seconds: seconds the load took (0.0 for a fresh compile).
        outcome: how ``standalone_compile`` got it: ``"hit"``, ``"built"``, ``"waited"`` or ``"takeover"``
            (see :func:`precompile.store.coordination.get_or_build`).
        engine_kind: how the callable was made: ``"compiled"`` (fresh), ``"fast"`` (carried binaries, nothing
            compiled), ``"portable"`` (Inductor's cache entries), or None before the first use.
        cache: the cache it was read from (fast and portable loads are counted there), or None.
        primer: the replay of the graph's library calls a fast load ran beside itself
            (:class:`precompile.inductor.load.prime.Primer`: calls ``done`` and ``failed``, its ``seconds``), or None
            (``PRECOMPILE_PRIME`` off, or nothing to replay).
        no_host_code: whether the engine must be the wrapper graph (no host code runs), as the trust policy of the
            load that made it says (:class:`precompile.manifest.trust.Policy`); None: ``PRECOMPILE_REQUIRE_NO_HOST_CODE``
            is read when the engine is built.

    Raises (on construction):
        ArtifactFormatError: a placeholder spec, a pytree spec (``calling.in_spec``/``out_spec``) or the size guards
            in the manifest are malformed.
    """

    def __init__(self, manifest: Manifest, blobs: Mapping[str, bytes], *, engine: Callable[..., Any] | None = None,
                 bound: dict[int, torch.Tensor] | None = None, source: str = "compiled",
                 blob_reader: Callable[[list[str]], dict[str, bytes]] | None = None, cache: Cache | None = None,
                 calls: CallChecks | None = None):
        self.manifest = manifest
        self.key = manifest.key
        self.source = source
        self.load_seconds = 0.0
        self.outcome = "hit" if source == "cache" else "built"
        self._blobs = dict(blobs)
        self._blob_reader = blob_reader
        self._engine = engine
        self._engine_lock = threading.Lock()
        self._bound: dict[int, torch.Tensor] = dict(bound or {})
        self._bound_idx = frozenset(self._bound)  # the placeholders a call's check skips (checked at binding)
        # the input checks depend on the manifest only (a sibling shares them: guards are compiled once per key)
        self._calls = calls if calls is not None else CallChecks(manifest.placeholders, manifest.shapes)
        self._checks = self._calls.checks
        self.cache = cache
        self._misaligned_warned: set[int] = set()
        self._calls_seen = 0
        self._inference = (manifest.factors.get("ambient") or {}).get("grad_enabled") is False
        self._grad_warned = False
        self._aligned_assumed = {a["index"] for a in manifest.alignment if a.get("inductor_assumes_aligned")}
        calling = manifest.calling or {}
        self._in_spec = _load_spec(calling.get("in_spec"), "in_spec")
        self._out_spec = _load_spec(calling.get("out_spec"), "out_spec")
        self._outputs = calling.get("outputs")
        self.engine_kind: str | None = "compiled" if engine is not None else None
        self.primer: Any = None
        self.no_host_code: bool | None = None
        self.shared_from: Artifact | None = None
        self.shared_cache: Cache | None = None  # the open cache a shared entry came from (precompile.store.shared)

    # -------------------------------------------------------------------------------------------- calling
    @property
    def placeholders(self) -> list[dict[str, Any]]:
        """Input specs, one per placeholder, in call order (see :class:`Manifest`)."""
        return self.manifest.placeholders

    def bind(self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, strict: bool = True) -> Artifact:
        """Bind placeholders that have an FQN (parameters, buffers, lifted constants) to tensors by name.

        Args:
            weights: ``{fqn: tensor}`` (e.g. ``model.state_dict()``) or a module (its named parameters and
                buffers are used).
            strict: raise if a parameter/buffer/constant placeholder finds no tensor of that name.

        Returns:
            ``self``, for chaining.

        Raises:
            InputMismatchError: ``strict`` and names are missing, or a tensor's shape/dtype does not match its
                placeholder (the message lists each).
        """
        if isinstance(weights, torch.nn.Module):
            table = dict(weights.named_parameters(remove_duplicate=False))
            table.update(weights.named_buffers(remove_duplicate=False))
        else:
            table = dict(weights)
        missing, wrong = [], []
        for i, spec in enumerate(self.manifest.placeholders):
            fqn = spec.get("fqn")
            if spec["kind"] == "user_input" or not fqn:
                continue
            tensor = table.get(fqn)
            if tensor is None:
                missing.append(f"{spec['name']} ({spec['kind']} {fqn!r})")
                continue
            problem = self._checks[i].problem(tensor)
            if problem:
                wrong.append(f"{spec['name']} ({fqn!r}): {problem}")
                continue
            self._bound[i] = tensor
            self._bound_idx = frozenset(self._bound)
        if wrong or (strict and missing):
            lines = [f"  missing: {m}" for m in missing] + [f"  mismatched: {w}" for w in wrong]
            raise InputMismatchError("cannot bind weights to artifact %s:\n%s" % (self.key[:12], "\n".join(lines)))
        return self

    def _flat_inputs(self, args: tuple[Any, ...]) -> tuple[list[Any], frozenset[int]]:
        """The flat input list for ``args``, and the indices filled from bound tensors (checked at binding)."""
        if self._in_spec is not None:
            from torch.utils import _pytree as pytree

            args = tuple(pytree.arg_tree_leaves(*args))
        n = len(self._checks)
        if len(args) == n:
            return list(args), _NO_SKIP
        free = [i for i in range(n) if i not in self._bound]
        if len(args) == len(free):
            flat: list[Any] = [None] * n
            for i, t in self._bound.items():
                flat[i] = t
            for i, a in zip(free, args):
                flat[i] = a
            return flat, self._bound_idx
        names = [self.manifest.placeholders[i]["name"] for i in free]
        missing = names[len(args):] if len(args) < len(free) else []
        unbound_w = [f"{s['name']} ({s['kind']} {s['fqn']!r})" for i, s in enumerate(self.manifest.placeholders)
                     if i in free and s["kind"] != "user_input"]
        msg = (f"artifact {self.key[:12]} takes {len(free)} input(s) "
               + (f"({n} placeholders, {len(self._bound)} bound)" if self._bound else f"({n} placeholders)")
               + f", got {len(args)}.")
        if missing:
            msg += f" Missing placeholders: {', '.join(missing[:12])}" + (" ..." if len(missing) > 12 else "") + "."
        else:
            msg += f" It takes: {', '.join(names[:12])}" + (" ..." if len(names) > 12 else "") + "."
        if unbound_w:
            msg += (f" {len(unbound_w)} of them are weights, e.g. {unbound_w[0]}: bind them with "
                    "art.bind(model) or art.bind(state_dict), or pass every placeholder in order.")
        raise InputMismatchError(msg)

    def check_inputs(self, flat: list[Any], skip: set[int] | frozenset[int] = frozenset()) -> None:
        """Check each input against its placeholder's spec (type, dtype, static sizes and strides, device type,
        a specialized int's value), then the size guards of a graph with symbolic sizes.

        Args:
            flat: one value per placeholder.
            skip: placeholders whose per-placeholder check was done already (bound weights).

        Raises:
            InputMismatchError: naming every placeholder that does not match and what was expected, or every
                size guard broken (a size outside the range the artifact was compiled for).
        """
        self._calls.check(flat, self.key, skip)

    def __call__(self, *args: Any) -> Any:
        flat, bound = self._flat_inputs(args)
        self._calls.check(flat, self.key, bound)  # check_inputs, one frame fewer
        self._calls_seen += 1
        if self._aligned_assumed and (self._calls_seen <= 8 or not self._calls_seen & 255):
            self._note_misaligned(flat)  # a warning only (the engine copies misaligned inputs): sampled
        if self._inference and not self._grad_warned and torch.is_grad_enabled():
            self._note_grad(flat)
        out = self.engine(*flat)
        if self._out_spec is not None:
            from torch.utils import _pytree as pytree

            return pytree.tree_unflatten(list(out), self._out_spec)
        kind = self._outputs
        if kind == "tuple":
            return out if type(out) is tuple else tuple(out)
        if kind == "list":
            return out if type(out) is list else list(out)
        if kind == "single" and isinstance(out, (list, tuple)) and len(out) == 1:
            return out[0]
        return out

    def warmup(self) -> bool:
        """Run the compiled graph once on zero-filled user inputs, so that the libraries its kernels call (cuBLAS
        and cuDNN on a GPU, oneDNN on a CPU) set themselves up now instead of on the first real call.  Their
        set-up is most of a first call: 0.2 s against a 2 ms steady call for the GPU Llama of
        docs/benchmarks.md.  Bound placeholders (:meth:`bind`) are used as they are; each user input is a
        tensor of zeros with its recorded shape, stride, dtype and device (zeros are valid token ids and masks),
        symbolic sizes taking their example values.  Inputs the graph writes to are such fresh zeros, so a
        warm-up never changes a caller's tensor.

        Returns:
            True if it ran; False, with the reason logged at INFO and nothing run, when the graph writes to a bound
            tensor (a cache held as a buffer), a parameter or buffer is not bound, or a size has no example value.
        """
        why = ""
        written = set(self.manifest.build.get("mutated_inputs") or [])
        sizes = self._calls.example_sizes()
        if written & set(self._bound):
            why = "the graph writes to a bound tensor"
        elif sizes is None:
            why = "a symbolic size has no example value"
        flat: list[Any] = []
        for i, spec in enumerate(self.manifest.placeholders):
            if why:
                break
            if i in self._bound:
                flat.append(self._bound[i])
            elif spec["kind"] != "user_input":
                why = f"{spec['kind']} {spec.get('fqn')!r} is not bound"
            elif spec.get("type") == "tensor":
                dtype = getattr(torch, spec["dtype"])
                device = spec["device"]
                if device == "cuda":  # the GPU its kernels are compiled for
                    device = torch.device("cuda", int(spec.get("device_index", 0)))
                shape = [size_at(d, sizes) for d in spec["shape"]]
                stride = [size_at(d, sizes) for d in spec["stride"]]
                flat.append(torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_())
            elif spec.get("type") in ("int", "float", "bool") and spec.get("value") is not None:
                flat.append(spec["value"])
            elif spec.get("type") == "int" and isinstance(spec.get("size"), (int, str)):
                flat.append(size_at(spec["size"], sizes))
            else:
                why = f"input {spec['name']} has no fixed shape or value"
        if why:
            log.info("no warm-up for artifact %s: %s", self.key[:12], why)
            return False
        with torch.no_grad():
            self.engine(*flat)
        return True

    def _note_grad(self, flat: list[Any]) -> None:
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat):
            self._grad_warned = True
            log.warning("artifact %s was compiled for inference (grad disabled) and is called with grad enabled on "
                        "inputs that require grad: its outputs do not require grad. Call it under torch.no_grad() "
                        "or torch.inference_mode(), or compile with grad enabled for training.", self.key[:12])

    def _note_misaligned(self, flat: list[Any]) -> None:
        for i in self._aligned_assumed:
            t = flat[i]
            if isinstance(t, torch.Tensor) and t.data_ptr() % 16 and i not in self._misaligned_warned:
                self._misaligned_warned.add(i)
                log.warning("input %s of artifact %s is not 16-byte aligned; Inductor assumed alignment and "
                            "copies it on every call (slow path). Pass an aligned tensor (e.g. .clone()).",
                            self.manifest.placeholders[i]["name"], self.key[:12])

    @property
    def engine(self) -> Callable[..., Any]:
        """The underlying compiled callable (built from the engine payload on first use)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    from precompile.loader.engine import build_engine

                    self._engine = build_engine(self)
        return self._engine

    def sibling(self, *, bound: dict[int, torch.Tensor] | None = None, cache: Cache | None = None) -> Artifact:
        """A new artifact of the same key sharing this one's manifest, blobs and engine (built here if it is not
        yet), with its own bound weights, input checks and call counters: what a second piece of one key gets
        (:mod:`precompile.store.shared`).  Its ``outcome`` is ``"hit"`` and its ``load_seconds`` 0.

        Raises:
            whatever building the engine raises, when it is not built yet.
        """
        twin = Artifact(self.manifest, self._blobs, engine=self.engine, bound=bound, source=self.source,
                        blob_reader=self._blob_reader, cache=cache if cache is not None else self.cache,
                        calls=self._calls)
        twin.engine_kind = self.engine_kind
        twin.no_host_code = self.no_host_code
        twin.outcome = "hit"
        twin.shared_from = self.shared_from or self  # keeps the shared entry alive while any sibling lives
        return twin

    # ------------------------------------------------------------------------------------------- blobs
    def blob(self, digest: str) -> bytes:
        """Bytes of one part by digest, reading them from where the artifact came from if not yet in memory.

        Raises:
            ArtifactNotFoundError: the part is not available (a cache entry lost it).
        """
        data = self._blobs.get(digest)
        if data is None and self._blob_reader is not None:
            self._blobs.update(self._blob_reader([digest]))
            data = self._blobs.get(digest)
        if data is None:
            raise ArtifactNotFoundError(f"part {digest[:12]} of artifact {self.key[:12]} is not available")
        return data

    def all_blobs(self) -> dict[str, bytes]:
        """Every part's bytes, ``{digest: bytes}``, reading missing ones.

        Raises:
            ArtifactNotFoundError: a part cannot be read.
        """
        missing = [d for d in self.manifest.blobs if d not in self._blobs]
        if missing and self._blob_reader is not None:
            self._blobs.update(self._blob_reader(missing))
        for d in self.manifest.blobs:
            self.blob(d)
        return {d: self._blobs[d] for d in self.manifest.blobs}

    # -------------------------------------------------------------------------------------------- saving
    def save(self, path: str | os.PathLike[str], format: str = "binary") -> Path:
        """Write the artifact to ``path``: one file (``"binary"``) or a readable directory (``"unpacked"``).

        The write is atomic: a temporary sibling is renamed into place, so a crash never leaves a partial
        artifact under ``path``.

        Returns:
            the path written.

        With ``PRECOMPILE_SIGNING_KEY`` set, an unsigned manifest is signed first (:mod:`precompile.manifest.trust`).

        Raises:
            ValueError: ``format`` is neither ``"binary"`` nor ``"unpacked"``.
            FileNotFoundError: the directory ``path`` is in does not exist (``"binary"``; ``"unpacked"`` creates it).
            OutputPathError: (``"binary"``) ``path`` names a directory, a device, a FIFO, a socket or a symlink:
                nothing is written or replaced.
            UnsafePathError: (``"unpacked"``) a kernel, wrapper or binary name would be written outside ``path``.
            ArtifactNotFoundError: a part of the artifact could not be read to write it.
            TrustConfigError: a signing or verify key setting is wrong or names no key (nothing is written).
            OSError: the file system refused the write.
        """
        from precompile.manifest import formats, trust

        path = Path(path)
        if format == "binary" and not path.parent.is_dir():
            raise FileNotFoundError(2, f"cannot save artifact {self.key[:12]} to {path}: directory {path.parent} "
                                       "does not exist", str(path.parent))
        blobs = self.all_blobs()
        self.manifest = trust.policy().sign(self.manifest)
        manifest = self.manifest.to_json()
        if format == "binary":
            formats.write_binary(path, manifest, blobs)
        elif format == "unpacked":
            formats.write_unpacked(path, self.manifest, manifest, blobs)
        else:
            raise ValueError(f"format must be 'binary' or 'unpacked', got {format!r}")
        return path

    def __repr__(self) -> str:
        return (f"<precompile.Artifact {self.key[:12]} {len(self.manifest.placeholders)} inputs, "
                f"{len(self.manifest.kernels)} kernels, from {self.source}>")


def _load_spec(text: object, field: str):
    """The pytree spec stored in the manifest's ``calling[field]``, or None when there is none (None or "").

    Raises:
        ArtifactFormatError: the stored value is not a string, or is one that does not load as a pytree spec.
    """
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise ArtifactFormatError(f"manifest field calling.{field} is a {type(text).__name__}, not a pytree spec")
    from torch.utils import _pytree as pytree

    try:
        return pytree.treespec_loads(text)
    except Exception as err:  # noqa: BLE001 - torch's parser of untrusted text raises JSONDecodeError, KeyError,
        # TypeError, NotImplementedError (an unregistered type), AssertionError, RecursionError...: all mean garbled
        raise ArtifactFormatError(f"manifest field calling.{field} is not a valid pytree spec: "
                                  f"{type(err).__name__}: {str(err)[:200]}") from err
