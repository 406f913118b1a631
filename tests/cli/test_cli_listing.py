"""``precompile ls --json`` is written as it is read (issue 34: 100,000 refs took 78.6 s and 3.69 GB, every manifest
kept): one JSON array, byte for byte what ``json.dumps`` of the whole list wrote, in key order, with malformed
entries in their place.  Its time and memory are measured by tools/bench/ls.py, not here."""

from __future__ import annotations

import json

from _cli import cli
from test_cli_hostile import good_manifest, plant

from cache_backends.local.cache import LocalCache
from precompile.store import lookup


def test_ls_json_is_one_array_in_key_order_as_json_dumps_wrote_it(cache_copy, monkeypatch):
    d = cache_copy()
    good, doc = good_manifest(d)
    planted = [plant(d, {**doc, "build": {**doc["build"], "created": f"copy {i}"}}, f"copy {i}") for i in range(4)]
    planted += [plant(d, b"{not json", "garbled"), plant(d, {**doc, "placeholders": {}}, "malformed")]
    out = cli("ls", "--json", "--cache", f"file://{d}").stdout
    items = json.loads(out)
    assert out == json.dumps(items) + "\n"  # the format consumers parse, unchanged
    assert [it["key"] for it in items] == sorted([good, *planted])
    assert {it["key"] for it in items if "error" in it} == set(planted[4:])
    assert [it["created"] for it in items if it["key"] in planted[:4]] == [
        f"copy {i}" for i in sorted(range(4), key=lambda i: planted[i])]
    # read in batches smaller than the cache: the same entries, in the same order
    monkeypatch.setattr(lookup, "ENTRY_BATCH", 2)
    entries = list(lookup.iter_entries(LocalCache(d)))
    assert [(e.key, e.problem is None) for e in entries] == [(it["key"], "error" not in it) for it in items]
