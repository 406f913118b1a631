"""The piece map: which precompile artifact each piece of a vLLM model loads, per compile range.

vLLM splits the model's Dynamo graph at its attention ops into pieces and compiles each piece once per compile
range.  A warm start through vLLM's AOT load rebuilds all of that before it can ask for the first piece: it
unpickles the whole Dynamo graph (fake tensors for every node), splits it again, runs it on fake tensors, and keys
every piece (normalizing and hashing its graph).  All of it grows with the model's depth (2 s of a 2.9 s compile
phase at 28 layers on an H200).  Yet the answer never changes while the whole-function artifact's key holds: the
same graph splits into the same pieces, which key to the same artifacts.

So the cold start that stores vLLM's AOT artifact (:mod:`precompile.integrations.vllm.aot`) records the answer
with it, as the function artifact's ``pieces`` part (JSON, signed with the manifest), and a warm start hands vLLM's
runtime its pieces from it (:mod:`precompile.integrations.vllm.direct`):

.. code-block:: json

    {"format": 1, "prefix": "backbone", "is_encoder": false, "rewrites": true,
     "pieces": [{"submod": "submod_0", "index": 0, "sym_shape_indices": [0], "returns_tuple": true,
                 "ranges": [[1, 16384, "<64-hex artifact key>"]]}, ...]}

- ``pieces``: vLLM's compiled pieces (``PiecewiseBackend``), by the split graph's submodule name, their position
  among the compiled pieces (``index``, 0-based; the first and last are wrapped differently for CUDA graphs),
  which inputs carry the number of tokens (``sym_shape_indices``) and whether the graph returns a tuple;
- ``ranges``: each compile range ``[start, end]`` (inclusive, as vLLM's ``Range``) and the precompile artifact
  key of the piece compiled for it;
- ``prefix``, ``is_encoder``: vLLM's for the compiled function; ``rewrites``: whether precompile's graph rewrites
  were on (``PRECOMPILE_REWRITES``), which the keys depend on without it showing in their stored factors.

Everything is bounded and typed on reading (:meth:`PieceMap.from_json`): a map that fails is refused with
:class:`~precompile.errors.ArtifactFormatError` and the start takes vLLM's own path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cache_backends.base import HEX64
from precompile.errors import ArtifactFormatError

#: The piece map's format.
FORMAT = 1
#: Bounds on what a map may list: far above any real model, small enough to parse safely.
MAX_PIECES = 4096
MAX_RANGES = 1024
MAX_SYM_INDICES = 64
MAX_INDEX = 1 << 20
MAX_TOKENS = (1 << 31) - 1
MAX_TEXT = 256
_SUBMOD = re.compile(r"^submod_\d{1,7}\Z")


@dataclass(frozen=True)
class Piece:
    """One compiled piece of a vLLM model.

    Attributes:
        submod: the split graph's submodule name (``"submod_0"``).
        index: its position among the compiled pieces, 0-based.
        sym_shape_indices: the inputs that carry the number of tokens.
        returns_tuple: whether its graph returns a tuple.
        ranges: ``(start, end, key)`` per compile range (tokens, inclusive): the artifact compiled for it.
    """

    submod: str
    index: int
    sym_shape_indices: tuple[int, ...]
    returns_tuple: bool
    ranges: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class PieceMap:
    """A vLLM model's piece map (see the module docstring); ``PieceMap.from_json(m.to_json()) == m``."""

    prefix: str
    is_encoder: bool
    rewrites: bool
    pieces: tuple[Piece, ...]

    def keys(self) -> list[str]:
        """The distinct artifact keys the pieces load, in first-use order."""
        return list(dict.fromkeys(key for p in self.pieces for _, _, key in p.ranges))

    def to_json(self) -> bytes:
        """The map as stored (canonical JSON, UTF-8)."""
        doc = {"format": FORMAT, "prefix": self.prefix, "is_encoder": self.is_encoder, "rewrites": self.rewrites,
               "pieces": [{"submod": p.submod, "index": p.index, "sym_shape_indices": list(p.sym_shape_indices),
                           "returns_tuple": p.returns_tuple, "ranges": [list(r) for r in p.ranges]}
                          for p in self.pieces]}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> PieceMap:
        """Parse and check a stored map.

        Raises:
            ArtifactFormatError: not JSON, not this format, a field missing or mistyped, a count over its bound
                (:data:`MAX_PIECES`, :data:`MAX_RANGES`...), a submodule name not ``submod_<n>``, a key not 64 hex,
                a range not ``0 <= start <= end <= 2**31 - 1``, or the indices not 0..n-1 once each.
        """
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise ArtifactFormatError(f"piece map is not JSON: {err}") from err
        _typed(doc, dict, "the map")
        if doc.get("format") != FORMAT:
            raise ArtifactFormatError(f"piece map format {str(doc.get('format'))[:20]!r} is not {FORMAT}")
        prefix = _typed(doc.get("prefix"), str, "prefix")
        if len(prefix) > MAX_TEXT:
            raise ArtifactFormatError(f"piece map field prefix is over {MAX_TEXT} characters")
        items = _typed(doc.get("pieces"), list, "pieces")
        if not 1 <= len(items) <= MAX_PIECES:
            raise ArtifactFormatError(f"piece map lists {len(items)} pieces (1 to {MAX_PIECES})")
        pieces = tuple(_piece(item, i) for i, item in enumerate(items))
        if sorted(p.index for p in pieces) != list(range(len(pieces))):
            raise ArtifactFormatError("piece map indices are not 0..n-1, once each")
        if len({p.submod for p in pieces}) != len(pieces):
            raise ArtifactFormatError("piece map names a submodule twice")
        return cls(prefix, _typed(doc.get("is_encoder"), bool, "is_encoder"),
                   _typed(doc.get("rewrites"), bool, "rewrites"), tuple(sorted(pieces, key=lambda p: p.index)))


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ArtifactFormatError(f"piece map field {where} is not {kind.__name__} ({type(value).__name__})")
    return value


def _int(value: Any, lo: int, hi: int, where: str) -> int:
    _typed(value, int, where)
    if not lo <= value <= hi:
        raise ArtifactFormatError(f"piece map field {where} = {value} is outside {lo}..{hi}")
    return value


def _piece(item: Any, i: int) -> Piece:
    where = f"pieces[{i}]"
    _typed(item, dict, where)
    submod = _typed(item.get("submod"), str, f"{where}.submod")
    if not _SUBMOD.match(submod):
        raise ArtifactFormatError(f"piece map field {where}.submod {submod[:40]!r} is not submod_<n>")
    sym = _typed(item.get("sym_shape_indices"), list, f"{where}.sym_shape_indices")
    if len(sym) > MAX_SYM_INDICES:
        raise ArtifactFormatError(f"piece map field {where}.sym_shape_indices lists {len(sym)} (at most "
                                  f"{MAX_SYM_INDICES})")
    ranges = _typed(item.get("ranges"), list, f"{where}.ranges")
    if not 1 <= len(ranges) <= MAX_RANGES:
        raise ArtifactFormatError(f"piece map field {where}.ranges lists {len(ranges)} (1 to {MAX_RANGES})")
    out = []
    for j, r in enumerate(ranges):
        w = f"{where}.ranges[{j}]"
        if not isinstance(r, list) or len(r) != 3:
            raise ArtifactFormatError(f"piece map field {w} is not [start, end, key]")
        start = _int(r[0], 0, MAX_TOKENS, f"{w}[0]")
        end = _int(r[1], start, MAX_TOKENS, f"{w}[1]")
        key = _typed(r[2], str, f"{w}[2]")
        if not HEX64.fullmatch(key):
            raise ArtifactFormatError(f"piece map field {w}[2] is not a 64-hex artifact key")
        out.append((start, end, key))
    if len({(s, e) for s, e, _ in out}) != len(out):
        raise ArtifactFormatError(f"piece map field {where}.ranges names a range twice")
    return Piece(submod, _int(item.get("index"), 0, MAX_INDEX, f"{where}.index"),
                 tuple(_int(v, 0, MAX_INDEX, f"{where}.sym_shape_indices") for v in sym),
                 _typed(item.get("returns_tuple"), bool, f"{where}.returns_tuple"), tuple(out))


def record(compiled_fn: Any) -> tuple[PieceMap | None, str]:
    """The piece map of vLLM's compiled function (its ``VllmSerializableFunction``, compiled or loaded through
    vLLM's own path, so its ``vllm_backend`` holds the pieces), or ``(None, why not)``.

    There is no map when a piece did not come from precompile's cache (vLLM's own adaptor compiled it after
    precompile could not, or vLLM's cache is disabled), binds weights of its own (a map has only the key, not the
    graph they come from), or a compile range has no compiled runnable.
    """
    from precompile import config
    from precompile.integrations.vllm import shim
    from precompile.loader.artifact import Artifact

    backends = shim.piecewise_backends(compiled_fn)
    if not backends:
        return None, "vLLM's compiled function holds no pieces"
    pieces = []
    for name, backend in backends:
        ranges = []
        for rng, entry in backend.range_entries.items():
            art = entry.runnable if entry.compiled else None
            if not isinstance(art, Artifact):
                return None, f"piece {name} range {rng} was not compiled by precompile"
            if art.outcome == "uncached":
                return None, "vLLM's compile cache is disabled"
            if any(p.get("kind") != "user_input" for p in art.manifest.placeholders):
                return None, f"piece {name} binds weights of its own"
            ranges.append((int(rng.start), int(rng.end), art.key))
        pieces.append(Piece(name, int(backend.piecewise_compile_index),
                            tuple(int(i) for i in backend.sym_shape_indices), bool(backend.returns_tuple),
                            tuple(ranges)))
    return PieceMap(str(compiled_fn.prefix), bool(compiled_fn.is_encoder), config.rewrites_enabled(),
                    tuple(sorted(pieces, key=lambda p: p.index))), ""
