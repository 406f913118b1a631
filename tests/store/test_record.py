"""Records (precompile.store.record): small signed JSON facts in a real file cache, read back verified; the cache tools
(ls, inspect, verify) list and check them beside the artifacts.  Their first user is vLLM's model-registry facts
(tests/integrations/test_vllm.py::test_registry_modelinfo_travels_through_the_cache)."""

from __future__ import annotations

import json

import pytest
from _cli import cli, cli_json

from cache_backends.base import MISS
from cache_backends.registry import open_cache
from precompile.manifest import trust
from precompile.errors import ArtifactFormatError
from precompile.store import record


def _record(about: str = "m.Cls", data: dict | None = None) -> record.RecordManifest:
    factors = {"format": 3, "kind": "record", "purpose": "test_fact", "about": about}
    return record.RecordManifest(key=record.record_key(factors), purpose="test_fact", factors=factors,
                                 data=data if data is not None else {"answer": [True, "yes"]},
                                 build={"created": "2026-11-25T00:00:00+00:00"})


def _plant(cache, key: str, doc: dict) -> None:
    cache.set_ref(key, cache.put_blob(json.dumps(doc).encode()))


def test_a_record_round_trips_and_the_cache_tools_know_it(tmp_path):
    url = "file://" + str(tmp_path / "c")
    cache = open_cache(url)
    rec = _record()
    assert record.write(cache, rec) is not None
    got = record.read(open_cache(url), rec.key, "test_fact")
    assert got == rec
    assert record.read(cache, rec.key, "other_purpose") is None  # another purpose under this key: dropped
    assert cache.get_ref(rec.key) is MISS
    record.write(cache, rec)
    items = cli_json("ls", "--cache", url)
    assert items == [{"key": rec.key, "kind": "record", "purpose": "test_fact", "about": "m.Cls",
                      "created": "2026-11-25T00:00:00+00:00"}]
    assert "1 records" in cli("ls", "--cache", url).stdout
    assert '"answer"' in cli("inspect", rec.key[:16], "--cache", url).stdout
    report = cli_json("verify", "--cache", url)
    assert report["ok"] and report["tiers"][0]["refs_checked"] == 1, report


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(blobs={"a" * 64: {"size": 1}}), "lists blobs"),
    (lambda d: d.update(purpose="Not-An-Identifier"), "lowercase identifier"),
    (lambda d: d["factors"].update(purpose="another"), "kind and purpose"),
    (lambda d: d.update(data={"big": "x" * (record.MAX_RECORD_BYTES + 1)}), "over"),
    (lambda d: d.update(data=[1, 2]), "not an object"),
    (lambda d: d.pop("factors"), "missing fields"),
    (lambda d: d.update(schema=2), "schema"),
    (lambda d: d.update(data={"x": float("nan")}), "cannot carry"),
])
def test_a_malformed_record_is_refused_by_name_and_dropped(tmp_path, change, words):
    cache = open_cache("file://" + str(tmp_path / "c"))
    doc = _record().to_dict()
    change(doc)
    with pytest.raises(ArtifactFormatError, match=words):
        record.RecordManifest.from_dict(doc)
    _plant(cache, _record().key, doc)
    assert record.read(cache, _record().key, "test_fact") is None
    assert cache.get_ref(_record().key) is MISS  # dropped, so that the next writer replaces it


def test_oversized_data_is_not_written(tmp_path):
    cache = open_cache("file://" + str(tmp_path / "c"))
    with pytest.raises(ValueError, match="over"):
        record.write(cache, _record(data={"big": "x" * (record.MAX_RECORD_BYTES + 1)}))
    # small as compact JSON, large as the stored (indented) manifest: refused at write, not dropped at every read
    with pytest.raises(ValueError, match="manifest is"):
        record.write(cache, _record(data={"x": [[[[[[[[[[0]]]]]]]]]] * 2000}))  # 46 KB compact, 370 KB stored
    assert list(cache.iter_refs()) == []


def test_with_verify_keys_only_a_record_signed_by_a_trusted_key_is_read(tmp_path, monkeypatch):
    builder, attacker = tmp_path / "builder.pem", tmp_path / "attacker.pem"
    builder_pub, _ = trust.generate_key(builder), trust.generate_key(attacker)
    url = "file://" + str(tmp_path / "c")
    cache = open_cache(url)
    rec = _record()
    record.write(cache, rec)  # unsigned
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", builder_pub)
    assert record.read(cache, rec.key, "test_fact") is None  # unsigned: refused
    assert cache.counters().get("untrusted_unsigned") == 1
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", str(attacker))
    record.write(cache, rec)
    monkeypatch.delenv("PRECOMPILE_SIGNING_KEY")  # the reader: a worker with the verify key only
    assert record.read(cache, rec.key, "test_fact") is None  # signed by a key nobody trusts
    assert record.write(cache, rec) is None  # verify keys and no signing key: nothing unsigned is stored
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", str(builder))
    signed = record.write(cache, rec)
    assert signed is not None and signed.signature is not None
    monkeypatch.delenv("PRECOMPILE_SIGNING_KEY")
    assert record.read(cache, rec.key, "test_fact") == signed
    tampered = signed.to_dict()
    tampered["data"]["answer"] = [False]
    _plant(cache, rec.key, tampered)
    assert record.read(cache, rec.key, "test_fact") is None  # the signature no longer holds
