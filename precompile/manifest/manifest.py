"""The manifest: the one JSON document a reader parses first (schema in docs/format.md).

A manifest names every part of an artifact by the sha256 digest of its bytes, records the artifact key and
the factors it was computed from (so two keys can be diffed factor by factor), the placeholders and their
input specs, autotune picks, alignment assumptions, the environment fingerprint and build facts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cache_backends.bounded import MAX_ARTIFACT_BYTES, MAX_MANIFEST_BYTES, loads_json
from precompile import config
from precompile.errors import ArtifactFormatError


def load_json(raw: bytes) -> Any:
    """Parse manifest bytes as JSON (any JSON: :meth:`Manifest.from_dict` checks the shape), when they are at most
    :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES` long and :data:`~cache_backends.bounded.MAX_JSON_DEPTH` deep.

    Raises:
        ArtifactFormatError: not UTF-8 JSON, or longer or deeper than those bounds (chained to the
            :class:`~precompile.errors.InputLimitError`, checked before parsing).
    """
    try:
        return loads_json(raw, MAX_MANIFEST_BYTES, "manifest")
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # InputLimitError is a ValueError
        raise ArtifactFormatError(f"manifest is not valid JSON: {type(err).__name__}: {err}") from err


class ManifestJSON:
    """How a manifest dataclass is written: ``to_dict`` (every field of ``_FIELDS``, ``signature`` only when
    signed, so unsigned manifests keep their bytes) and ``to_json`` (the bytes stored as the manifest blob).
    Shared by :class:`Manifest`, :class:`~precompile.manifest.function_manifest.FunctionManifest` and
    :class:`~precompile.manifest.record_manifest.RecordManifest`."""

    _FIELDS: tuple[str, ...]
    signature: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (``signature`` only when signed)."""
        out = {name: getattr(self, name) for name in self._FIELDS}
        if self.signature is not None:
            out["signature"] = self.signature
        return out

    def to_json(self) -> bytes:
        """UTF-8 JSON, keys sorted, indented: the bytes stored as the manifest blob."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, allow_nan=False).encode()

    @classmethod
    def _check_header(cls, data: dict[str, Any], what: str, hint: str = "") -> None:
        """The checks every manifest kind starts its parse with: this precompile's schema, every field present.

        Raises:
            ArtifactFormatError: naming ``what`` (``"manifest"``, ``"record"``...), ``hint`` appended to the
                schema message.
        """
        if data.get("schema") != config.FORMAT_VERSION:
            raise ArtifactFormatError(f"{what} schema {data.get('schema')!r} is not supported by this precompile "
                                      f"(it reads schema {config.FORMAT_VERSION}){hint}")
        missing = [f for f in cls._FIELDS if f not in data]
        if missing:
            raise ArtifactFormatError(f"{what} is missing fields {missing}")
        blobs = data.get("blobs")
        sizes = [b.get("size") for b in blobs.values() if isinstance(b, dict)] if isinstance(blobs, dict) else []
        total = sum(n for n in sizes if type(n) is int and n > 0)
        if total > MAX_ARTIFACT_BYTES:  # before any part is read: every part within its bound could still add up
            raise ArtifactFormatError(f"{what} records {total} bytes of parts, more than the {MAX_ARTIFACT_BYTES} an "
                                      "artifact may hold")


@dataclass
class Manifest(ManifestJSON):
    """Parsed manifest.  ``to_dict()`` is JSON-ready; ``Manifest.from_dict(m.to_dict()) == m``.

    Attributes:
        key: the artifact key, 64 hex chars: sha256 of the canonical encoding of ``factors``.
        factors: what the key hashes: ``graph`` (digest of the canonical graph), ``inputs`` (input specs
            without names; symbolic sizes as expressions over ``s0``, ``s1``...), ``symbols`` (each size
            symbol's range), ``options`` (normalized Inductor config patches), ``inductor_config`` (digest of
            Inductor's whole effective config, part ``inductor_config``), ``ambient`` (grad mode, autocast,
            deterministic algorithms, default dtype, matmul precision...: :mod:`precompile.key.ambient`), ``env``
            (key fields of the fingerprint), ``dynamic_shapes`` (``"static"`` or ``"symbolic"``), ``calling``
            (pytree specs) and ``format``.
        placeholders: per input: name, kind, fqn, type; tensors: shape, stride (ints or size expressions),
            dtype, device, requires_grad, aligned; numbers: ``value`` (specialized) or ``size`` (an expression).
        parts: digests of the graph, wrapper modules, engine payload, effective Inductor config
            (``{"fx_graph": {...}, ...}``), and ``fast``: what a fast load needs (``wrapper``, ``source``,
            ``extern``, ``ops``, ``multi_kernel``, ``mutated``, ``defers_alignment``), or None when the artifact
            loads through the portable path only (``build["fast_off"]`` says why).
        kernels: per kernel: name, lang, source digest, binaries ``{file: digest}``, relpaths, config.
        autotune: autotune picks: ``{"kernels": {name: config}, "other": {best_config file: config},
            "multi_kernel": {name: index}, "tuned": [record per GEMM/convolution op max_autotune benchmarked:
            candidates with kind, config and ms, and the chosen one (precompile.inductor.build.picks)],
            "benchmark_leftovers": count of configs of benchmark-only kernels, not stored}``.
        alignment: per input: whether it was 16-byte aligned at build, and whether Inductor assumed so.
        env: the full environment fingerprint (key fields and recorded-only fields).
        blobs: ``{digest: {"size": bytes, "role": str}}`` for every blob the artifact references.
        build: facts about the build (seconds, created, precompile version, mutated inputs, ``fast_off``: why
            there is no fast path, or None); never part of the key.
        calling: ``{"in_spec", "out_spec"}`` pytree specs for export modules, else None values.
        shapes: ``{"symbols": {name: {"range": [lower, upper], "hint": example value}}, "guards": expression
            over ``L['t<i>']`` or None}`` (:mod:`precompile.key.guards`); empty for static graphs.
        schema: the format version.
        signature: ``{"alg": "ed25519", "key_id", "public_key", "value"}``: a builder's Ed25519 signature over
            every other field (:mod:`precompile.manifest.trust`), or None when unsigned.  Not part of the key.
    """

    key: str
    factors: dict[str, Any]
    placeholders: list[dict[str, Any]]
    parts: dict[str, Any]
    kernels: list[dict[str, Any]]
    autotune: dict[str, Any]
    alignment: list[dict[str, Any]]
    env: dict[str, Any]
    blobs: dict[str, dict[str, Any]]
    build: dict[str, Any] = field(default_factory=dict)
    calling: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, Any] = field(default_factory=dict)
    schema: int = config.FORMAT_VERSION
    signature: dict[str, Any] | None = None

    _FIELDS = ("schema", "key", "factors", "placeholders", "parts", "kernels", "autotune", "alignment", "env",
               "blobs", "build", "calling", "shapes")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Build from a parsed dict, checking its structure and every name that becomes a path or an import
        (:func:`precompile.manifest.names.check_manifest`).

        Raises:
            ArtifactFormatError: the schema version is unknown, a field is missing or has the wrong type.
            UnsafePathError: a name in it would become an unsafe path or import.
        """
        if not isinstance(data, dict):
            raise ArtifactFormatError("manifest is not a JSON object")
        cls._check_header(data, "manifest", "; rebuild the artifact with this version")
        from precompile.manifest.names import check_manifest

        check_manifest(data)
        return cls(**{f: data[f] for f in cls._FIELDS}, signature=data.get("signature"))

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Parse manifest bytes.

        Raises:
            ArtifactFormatError: not JSON (or nested too deep to parse), or not a manifest of a supported schema.
            UnsafePathError: a name in it would become an unsafe path or import.
        """
        return cls.from_dict(load_json(raw))

    # -------------------------------------------------------------------------------------- conveniences
    def part_digests(self) -> list[str]:
        """Every blob digest the artifact references (the manifest's own digest excluded)."""
        return list(self.blobs)

    def load_digests(self) -> list[str]:
        """The blobs a load needs: kernel binaries, plus the fast wrapper when the artifact offers the fast path,
        else the engine payload (a fast load that fails reads the payload then).  Not sources, not the graph."""
        out = [d for k in self.kernels for d in k["binaries"].values()]
        fast = self.parts.get("fast")
        if fast:
            out.append(fast["source"] if "source" in fast else self.parts["wrappers"][fast["wrapper"]])
        else:
            out.append(self.parts["engine_payload"])
        return out

    def total_bytes(self) -> int:
        """Sum of the uncompressed sizes of all referenced blobs, bytes."""
        return sum(int(b["size"]) for b in self.blobs.values())
