"""One trust policy per call (issue 34, item 3): verify keys given only in the cache URL (``cache=``, or the URL in
``PRECOMPILE_CACHE``) protect a ``.pc`` file and an unpacked directory loaded in the same call, as they protect the
cache.  Real files saved by precompile, real Ed25519 keys made by :func:`precompile.manifest.trust.generate_key`."""

from __future__ import annotations

import pytest
from conftest import assert_same_output
from test_security import copy_of, keys  # noqa: F401 - the keys fixture

import precompile
from precompile.manifest import trust
from precompile.errors import CacheURLError, TrustConfigError, UntrustedArtifactError
from precompile.store.opening import policy_for


@pytest.fixture
def saved(artifacts, tmp_path):
    """``(compiled, {"file": unsigned .pc, "directory": unsigned unpacked dir})``."""
    c = artifacts("make_fx")
    art = copy_of(c.art)
    return c, {"file": art.save(tmp_path / "a.pc"), "directory": art.save(tmp_path / "a.d", format="unpacked")}


@pytest.mark.parametrize("form", ["file", "directory"])
def test_keys_only_in_the_cache_url_refuse_an_unsigned_file(form, saved, keys, tmp_path, monkeypatch):
    c, paths = saved
    monkeypatch.delenv("PRECOMPILE_VERIFY_KEYS", raising=False)
    url = f"file://{tmp_path / 'c'}?verify_keys={keys['builder_pub']}"
    before = trust.refused["unsigned"]
    with pytest.raises(UntrustedArtifactError, match="not signed") as info:
        precompile.load(paths[form], cache=url)
    assert info.value.reason == "unsigned" and trust.refused["unsigned"] == before + 1
    assert not (tmp_path / "c").exists(), "the URL was opened (a directory made) to load a path"
    # the same keys in a tiered URL (on the far tier) and in PRECOMPILE_CACHE
    with pytest.raises(UntrustedArtifactError):
        precompile.load(paths[form], cache=f"file://{tmp_path / 'near'}|{url}")
    monkeypatch.setenv("PRECOMPILE_CACHE", url)
    with pytest.raises(UntrustedArtifactError):
        precompile.load(paths[form])
    # without keys anywhere the file loads (what the keys are for)
    monkeypatch.delenv("PRECOMPILE_CACHE")
    assert_same_output(precompile.load(paths[form], cache=f"file://{tmp_path / 'c'}")(*c.inputs), c.expected)


def test_a_file_signed_by_a_url_key_loads(artifacts, keys, tmp_path, monkeypatch):
    c = artifacts("make_fx")
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", keys["builder"])  # the builder saves it signed
    path = copy_of(c.art).save(tmp_path / "signed.pc")
    monkeypatch.delenv("PRECOMPILE_SIGNING_KEY")
    url = f"file://{tmp_path / 'c'}?verify_keys={keys['attacker_pub']},{keys['builder_pub']}"
    art = precompile.load(path, cache=url)
    assert_same_output(art(*c.inputs), c.expected)
    with pytest.raises(UntrustedArtifactError) as info:  # signed, but by a key this URL does not name
        precompile.load(path, cache=f"file://{tmp_path / 'c'}?verify_keys={keys['attacker_pub']}")
    assert info.value.reason == "unknown_key"


def test_a_call_resolves_one_policy_from_the_environment_and_the_url(keys, tmp_path, monkeypatch):
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", keys["attacker_pub"])
    monkeypatch.setenv("PRECOMPILE_REQUIRE_NO_HOST_CODE", "1")
    pol = policy_for(f"{tmp_path}/near|file://{tmp_path}/far?verify_keys={keys['builder_pub']}"
                     f"&signing_key={keys['builder']}")
    ids = {trust.key_id(trust.load_signing_key(keys[who]).public_key()) for who in ("builder", "attacker")}
    assert set(pol.verify) == ids and pol.signer is not None and pol.no_host_code
    assert not (tmp_path / "near").exists() and not (tmp_path / "far").exists()
    with pytest.raises(TrustConfigError, match="verify_keys="):  # a URL key that names no key is an error
        policy_for(f"file://{tmp_path}/c?verify_keys=,")
    monkeypatch.setenv("PRECOMPILE_CACHE", f"file://{tmp_path}/c?verify_keys=1&verify_keys=2")
    with pytest.raises(CacheURLError, match="PRECOMPILE_CACHE"):
        policy_for(None)
