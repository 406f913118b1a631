"""The piece map a vLLM function artifact carries (precompile/integrations/vllm/pieces.py): read strictly.

A map is read from a cache, so it is untrusted until parsed: every field typed, every count bounded, every key 64
hex, every submodule name ``submod_<n>``, the indices 0..n-1 once each.  Anything else is an
``ArtifactFormatError`` (the start then takes vLLM's own path), never another exception.  A function manifest names
it as its ``pieces`` part, and no part of another name.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from precompile.errors import ArtifactFormatError
from precompile.integrations.vllm.pieces import MAX_PIECES, MAX_RANGES, MAX_TOKENS, Piece, PieceMap
from precompile.manifest.function_manifest import FunctionManifest

K1, K2 = "a" * 64, "b" * 64


def _map(n: int = 3) -> PieceMap:
    pieces = tuple(Piece(f"submod_{2 * i}", i, (0,) if i else (), i % 2 == 0,
                         ((1, 512, K1 if i in (0, n - 1) else K2), (8, 8, K2))) for i in range(n))
    return PieceMap("backbone", False, True, pieces)


def _doc(**change) -> dict:
    doc = json.loads(_map().to_json())
    doc.update(change)
    return doc


def _piece_doc(**change) -> dict:
    doc = _doc()
    doc["pieces"][0].update(change)
    return doc


def test_a_map_round_trips_and_names_its_distinct_keys_in_order():
    m = _map(5)
    assert PieceMap.from_json(m.to_json()) == m
    assert m.keys() == [K1, K2]
    assert PieceMap.from_json(m.to_json()).to_json() == m.to_json()  # canonical


@pytest.mark.parametrize("doc, why", [
    ("not json", "not JSON"),
    ([1, 2], "the map"),
    (_doc(format=2), "format"),
    (_doc(prefix=7), "prefix"),
    (_doc(prefix="p" * 300), "prefix"),
    (_doc(is_encoder="no"), "is_encoder"),
    (_doc(rewrites=None), "rewrites"),
    (_doc(pieces=[]), "pieces"),
    (_doc(pieces={"submod_0": 1}), "pieces"),
    (_piece_doc(submod="../../etc/passwd"), "submod"),
    (_piece_doc(submod="submod_0; import os"), "submod"),
    (_piece_doc(submod="submod_2"), "twice"),
    (_piece_doc(index=1), "indices"),
    (_piece_doc(index=True), "index"),
    (_piece_doc(index=-1), "index"),
    (_piece_doc(sym_shape_indices=list(range(65))), "sym_shape_indices"),
    (_piece_doc(sym_shape_indices=[1.5]), "sym_shape_indices"),
    (_piece_doc(returns_tuple=1), "returns_tuple"),
    (_piece_doc(ranges=[]), "ranges"),
    (_piece_doc(ranges=[[1, 512]]), "start, end, key"),
    (_piece_doc(ranges=[[1, 512, "A" * 64]]), "64-hex"),
    (_piece_doc(ranges=[[1, 512, "a" * 63]]), "64-hex"),
    (_piece_doc(ranges=[[512, 1, K1]]), "outside"),
    (_piece_doc(ranges=[[-1, 1, K1]]), "outside"),
    (_piece_doc(ranges=[[1, MAX_TOKENS + 1, K1]]), "outside"),
    (_piece_doc(ranges=[[1, 2, K1], [1, 2, K2]]), "twice"),
    (_piece_doc(ranges=[[1, 1, K1]] * (MAX_RANGES + 1)), "ranges"),
])
def test_a_hostile_map_is_refused_with_a_typed_error_naming_the_field(doc, why):
    raw = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
    with pytest.raises(ArtifactFormatError, match=why):
        PieceMap.from_json(raw)


def test_a_map_over_its_piece_bound_is_refused():
    doc = _doc()
    doc["pieces"] = [dict(doc["pieces"][0], submod=f"submod_{i}", index=i) for i in range(MAX_PIECES + 1)]
    with pytest.raises(ArtifactFormatError, match="pieces"):
        PieceMap.from_json(json.dumps(doc).encode())


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                     | st.text(max_size=70), lambda inner: st.lists(inner, max_size=5)
                     | st.dictionaries(st.text(max_size=20), inner, max_size=6), max_leaves=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_any_json_is_a_map_or_an_artifact_format_error(data):
    doc = _doc()
    where = data.draw(st.sampled_from(["top", "piece", "range"]))
    if where == "top":
        doc[data.draw(st.sampled_from(["format", "prefix", "is_encoder", "rewrites", "pieces", "extra"]))] = \
            data.draw(_json)
    elif where == "piece":
        doc["pieces"][data.draw(st.integers(0, 2))][data.draw(st.sampled_from(
            ["submod", "index", "sym_shape_indices", "returns_tuple", "ranges"]))] = data.draw(_json)
    else:
        doc["pieces"][0]["ranges"][0][data.draw(st.integers(0, 2))] = data.draw(_json)
    try:
        m = PieceMap.from_json(json.dumps(doc).encode())
    except ArtifactFormatError:
        return
    assert PieceMap.from_json(m.to_json()) == m


def _function_manifest(parts: dict, blobs: dict) -> dict:
    return {"schema": FunctionManifest.schema, "kind": "function", "key": "c" * 64, "factors": {}, "parts": parts,
            "graphs": {}, "sources": [], "frames": [], "env": {}, "blobs": blobs, "build": {}}


def test_a_function_manifest_names_a_piece_map_part_and_no_unknown_part():
    blobs = {K1: {"size": 10, "role": "vllm aot"}, K2: {"size": 5, "role": "vllm pieces"}}
    m = FunctionManifest.from_dict(_function_manifest({"dynamo": K1, "pieces": K2}, blobs))
    assert m.parts["pieces"] == K2
    with pytest.raises(ArtifactFormatError, match="unknown part"):
        FunctionManifest.from_dict(_function_manifest({"dynamo": K1, "wheel": K2}, blobs))
    with pytest.raises(ArtifactFormatError, match="parts.pieces names a blob not in its blobs"):
        FunctionManifest.from_dict(_function_manifest({"dynamo": K1, "pieces": "d" * 64}, blobs))
