"""The manifest of a whole-function artifact (docs/format.md, "Whole-function artifacts").

It is stored like a graph artifact's (``ref/<key>`` -> the manifest blob, signed the same way), and shares the
fields every cache tool reads generically (``schema``, ``key``, ``blobs``, ``signature``), so eviction, tiered
backfill, bundles and ``verify`` treat both alike.  It names itself by ``"kind": "function"``; graph manifests
carry no kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cache_backends.base import HEX64
from precompile import config
from precompile.manifest.manifest import ManifestJSON, load_json
from precompile.errors import ArtifactFormatError, UnsafePathError

#: The kind a function manifest names itself by (graph manifests carry no ``kind``).
KIND = "function"
#: Bounds on what a manifest may list: far above any real function, small enough to parse safely.
MAX_GRAPHS = 4096
MAX_SOURCES = 65536
MAX_GUARDS = 65536
MAX_TEXT = 4096
_BACKEND = re.compile(r"^__compiled_fn_[A-Za-z0-9_]{1,200}\Z")
#: The parts a function manifest may name (``dynamo`` always, but in a manifest stored as refused).
PART_NAMES = ("dynamo", "pieces")
#: A module name in ``sources``: dotted names of letters, digits and underscores, the first starting with no digit
#: (transformers' remote-code modules are ``transformers_modules.<repo>.<commit sha>``: a sha may start with one).
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,31}\Z")


def is_function_doc(doc: object) -> bool:
    """Whether a parsed manifest is a whole-function artifact's."""
    return isinstance(doc, dict) and doc.get("kind") == KIND


@dataclass
class FunctionManifest(ManifestJSON):
    """Parsed whole-function manifest; ``FunctionManifest.from_dict(m.to_dict()) == m``.

    Attributes:
        key: the artifact key (:func:`precompile.function.key.function_key` of ``factors``).
        factors: what the key hashes (:mod:`precompile.function.key`).
        parts: ``{"dynamo": digest}``: Dynamo's record of the function (its guarded bytecode, guards, resume
            functions), a pickle written by torch (:mod:`precompile.inductor.dynamo.pkg`); ``{}`` in a manifest
            stored as refused (``build.refused`` says why the function could not be stored whole).  A vLLM entry
            may add ``"pieces"``: the piece map, JSON (:mod:`precompile.integrations.vllm.pieces`).
        graphs: ``{compiled-graph name: graph artifact key}``: the name the stored bytecode calls each graph by,
            and the precompile artifact that graph loads from.
        sources: the functions Dynamo traced through: ``[{"module", "first", "last", "sha256"}]``
            (:mod:`precompile.function.sources`).
        frames: per compiled frame, in trace order: ``{"code": name, "guards": [text, ...]}``.
        env: the environment fingerprint.
        blobs: ``{digest: {"size": bytes, "role": str}}``.
        build: facts about the build (seconds, created, precompile version, frames traced, ``left_out``: frames
            traced at run time and why, ``refused``: why nothing could be stored); never in the key.
        signature: as a graph manifest's (:mod:`precompile.manifest.trust`).
    """

    key: str
    factors: dict[str, Any]
    parts: dict[str, Any]
    graphs: dict[str, str]
    sources: list[dict[str, Any]]
    frames: list[dict[str, Any]]
    env: dict[str, Any]
    blobs: dict[str, dict[str, Any]]
    build: dict[str, Any] = field(default_factory=dict)
    schema: int = config.FORMAT_VERSION
    kind: str = KIND
    signature: dict[str, Any] | None = None

    _FIELDS = ("schema", "kind", "key", "factors", "parts", "graphs", "sources", "frames", "env", "blobs", "build")

    @property
    def refused(self) -> str | None:
        """Why its builder could not store the function whole (it then names no Dynamo part), or None."""
        why = self.build.get("refused")
        return why if isinstance(why, str) else None

    def total_bytes(self) -> int:
        """Sum of the sizes of its own blobs, bytes (the graph artifacts it names are counted apart)."""
        return sum(int(b["size"]) for b in self.blobs.values())

    @classmethod
    def from_dict(cls, data: object) -> FunctionManifest:
        """Build from a parsed dict, checking its structure, every digest, name and length.

        Raises:
            ArtifactFormatError: not a function manifest of this schema, a field missing or mistyped, a digest
                malformed or not listed in ``blobs``, a list longer than its bound.
            UnsafePathError: a module name in ``sources`` is not a dotted identifier (it would be imported), or
                a graph name is not a Dynamo compiled-graph name (it becomes a module global).
        """
        if not is_function_doc(data):
            raise ArtifactFormatError("not a whole-function manifest (no \"kind\": \"function\")")
        assert isinstance(data, dict)
        cls._check_header(data, "function manifest")
        _check(data)
        return cls(**{f: data[f] for f in cls._FIELDS}, signature=data.get("signature"))

    @classmethod
    def from_json(cls, raw: bytes) -> FunctionManifest:
        """Parse manifest bytes (see :meth:`from_dict`)."""
        return cls.from_dict(load_json(raw))


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ArtifactFormatError(f"function manifest field {where} has the wrong type ({type(value).__name__})")
    return value


def _digest(value: Any, where: str) -> str:
    if not isinstance(value, str) or not HEX64.match(value):
        raise ArtifactFormatError(f"function manifest field {where} is not a sha256 digest: {str(value)[:80]!r}")
    return value


def _bounded(items: Any, kind: type, bound: int, where: str) -> Any:
    _typed(items, kind, where)
    if len(items) > bound:
        raise ArtifactFormatError(f"function manifest field {where} lists {len(items)} entries (at most {bound})")
    return items


def _check(doc: dict[str, Any]) -> None:
    _digest(doc["key"], "key")
    for name in ("factors", "parts", "env", "build"):
        _typed(doc[name], dict, name)
    blobs = _bounded(doc["blobs"], dict, 16, "blobs")
    for d, info in blobs.items():
        _digest(d, "blobs")
        size = _typed(_typed(info, dict, f"blobs[{d[:12]}]").get("size"), int, f"blobs[{d[:12]}].size")
        if size < 0:
            raise ArtifactFormatError(f"function manifest field blobs[{d[:12]}].size is negative")
    refused = doc["build"].get("refused")
    if refused is not None:  # stored as refused: the reason, and nothing to load
        if not isinstance(refused, str) or len(refused) > MAX_TEXT or doc["parts"] or blobs:
            raise ArtifactFormatError("function manifest field build.refused must be a reason (a string of at most "
                                      f"{MAX_TEXT} characters) on a manifest with no parts or blobs")
    elif _digest(doc["parts"].get("dynamo"), "parts.dynamo") not in blobs:
        raise ArtifactFormatError("function manifest field parts.dynamo names a blob not in its blobs")
    for name, part in doc["parts"].items():
        if name not in PART_NAMES:
            raise ArtifactFormatError(f"function manifest field parts names an unknown part {str(name)[:80]!r} "
                                      f"(known: {', '.join(PART_NAMES)})")
        if _digest(part, f"parts.{name}") not in blobs:
            raise ArtifactFormatError(f"function manifest field parts.{name} names a blob not in its blobs")
    for name, key in _bounded(doc["graphs"], dict, MAX_GRAPHS, "graphs").items():
        if not isinstance(name, str) or not _BACKEND.match(name):
            raise UnsafePathError(f"graphs: {str(name)[:80]!r} is not a Dynamo compiled-graph name", "graphs", name)
        _digest(key, f"graphs[{name}]")
    for i, s in enumerate(_bounded(doc["sources"], list, MAX_SOURCES, "sources")):
        _typed(s, dict, f"sources[{i}]")
        module = s.get("module")
        if not isinstance(module, str) or not _MODULE.match(module):
            raise UnsafePathError(f"sources[{i}].module: {str(module)[:80]!r} is not a dotted module name",
                                  f"sources[{i}].module", module)
        first, last = _typed(s.get("first"), int, f"sources[{i}].first"), _typed(s.get("last"), int, f"sources[{i}].last")
        if not 1 <= first <= last:
            raise ArtifactFormatError(f"function manifest field sources[{i}] spans lines {first}-{last}")
        _digest(s.get("sha256"), f"sources[{i}].sha256")
    guards = 0
    for i, f in enumerate(_bounded(doc["frames"], list, MAX_GRAPHS, "frames")):
        _typed(f, dict, f"frames[{i}]")
        _typed(f.get("code"), str, f"frames[{i}].code")
        for g in _typed(f.get("guards", []), list, f"frames[{i}].guards"):
            if not isinstance(g, str) or len(g) > MAX_TEXT:
                raise ArtifactFormatError(f"function manifest field frames[{i}].guards holds a bad entry")
            guards += 1
    if guards > MAX_GUARDS:
        raise ArtifactFormatError(f"function manifest lists {guards} guards (at most {MAX_GUARDS})")
