"""Key settings fail closed (issue 30, finding 1): a verify-key setting that names no key, a key file line that is
not exactly one key, a blank signing key or a key file that is not a regular file is a
:class:`~precompile.errors.TrustConfigError` (a ``ConfigError``) at first use, never "nothing is checked".

Each case plants an unsigned artifact whose fast wrapper writes a marker file: a setting that turned verification
off would run it.  Real files, FIFOs and devices; fresh processes where the environment is the point.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from conftest import assert_same_output, run_python
from test_security import copy_of, evil_wrapper, plant

import precompile
from cache_backends import open_cache
from precompile.manifest import trust, trust_keys
from precompile.errors import ConfigError, PrecompileError, TrustConfigError


@pytest.fixture
def builder(tmp_path) -> tuple[str, str]:
    """``(private key path, public key text)`` of a builder."""
    path = tmp_path / "builder.pem"
    return str(path), trust.generate_key(path)


def _clear_caches() -> None:
    trust_keys._parse_verify_keys.cache_clear()
    trust_keys._load_signing_key.cache_clear()


def empty_settings(tmp: Path) -> dict[str, str]:
    """Verify-key settings that name no key, by what they are."""
    (tmp / "empty.keys").write_text("")
    (tmp / "comments.keys").write_text("# the builders' keys\n\n   \n# (none yet)\n")
    (tmp / "blank.keys").write_text("\n\n\n")
    return {"comma": ",", "commas and blanks": " , , ", "empty": "", "blank": "   ",
            "empty file": str(tmp / "empty.keys"), "comments only": str(tmp / "comments.keys"),
            "blank lines only": str(tmp / "blank.keys"), "two empty files": f"{tmp / 'empty.keys'},{tmp / 'blank.keys'}"}


EMPTY = ["comma", "commas and blanks", "empty", "blank", "empty file", "comments only", "blank lines only",
         "two empty files"]


@pytest.mark.parametrize("case", EMPTY)
def test_a_verify_key_setting_that_names_no_key_is_a_config_error(case, tmp_path, monkeypatch):
    _clear_caches()
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", empty_settings(tmp_path)[case])
    with pytest.raises(TrustConfigError, match="PRECOMPILE_VERIFY_KEYS .*names no key") as info:
        trust.policy()
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    with pytest.raises(ConfigError):  # through a cache too, before anything is read
        precompile.load("ab" * 32, cache=f"file://{tmp_path / 'cache'}")


def _not_regular(tmp: Path) -> dict[str, str]:
    os.mkfifo(tmp / "fifo")
    (tmp / "dir").mkdir()
    (tmp / "huge").write_bytes(b"#" * ((1 << 20) + 1))
    return {"/dev/null": os.devnull, "/dev/zero": "/dev/zero", "fifo": str(tmp / "fifo"), "directory": str(tmp / "dir"),
            "over 1 MiB": str(tmp / "huge"), "missing": str(tmp / "nope")}


@pytest.mark.parametrize("case, says", [("/dev/null", "not a regular file"), ("/dev/zero", "not a regular file"),
                                        ("fifo", "not a regular file"), ("directory", "not a regular file"),
                                        ("over 1 MiB", "more than the 1048576"), ("missing", "does not exist")])
def test_a_key_file_that_is_not_a_small_regular_file_is_refused_unread(case, says, tmp_path, monkeypatch):
    _clear_caches()
    path = _not_regular(tmp_path)[case]
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", path)
    with pytest.raises(TrustConfigError, match=says):
        trust.policy()
    monkeypatch.delenv("PRECOMPILE_VERIFY_KEYS")
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", path)  # a signing key is read the same way
    with pytest.raises(TrustConfigError, match=says):
        trust.policy()


def bad_lines(pub: str) -> dict[str, str]:
    """Key-file lines that are not exactly one key: each must be refused, naming its line."""
    hexkey = pub.removeprefix(trust.PUBLIC_PREFIX)
    return {"no prefix": hexkey, "8 junk chars then the key": "deadbeef" + hexkey,
            "junk prefix of prefix length": "xxxxxxxx" + hexkey, "63 hex": pub[:-1], "65 hex": pub + "a",
            "two keys": f"{pub} {pub}", "two keys with a comma": f"{pub},{pub}", "a trailing comment": f"{pub} # b",
            "spaces inside": pub[:20] + " " + pub[20:], "uppercase prefix": "ED25519:" + hexkey,
            "not ascii": pub[:-1] + "\u00e9", "ssh form": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI"}


@pytest.mark.parametrize("case", ["no prefix", "8 junk chars then the key", "junk prefix of prefix length", "63 hex",
                                  "65 hex", "two keys", "two keys with a comma", "a trailing comment",
                                  "spaces inside", "uppercase prefix", "not ascii", "ssh form"])
def test_a_key_file_line_is_exactly_one_key_or_an_error_naming_file_and_line(case, builder, tmp_path, monkeypatch):
    """Before issue 30 a line without ``ed25519:`` lost its first 8 characters: ``deadbeef<the builder's key>``
    was taken for the builder's key."""
    _clear_caches()
    _, pub = builder
    keys = tmp_path / "workers.keys"
    keys.write_text(f"# rotation\n{pub}\n\n{bad_lines(pub)[case]}\n", encoding="utf-8")
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", str(keys))
    with pytest.raises(TrustConfigError, match=f"{keys}, line 4 is not 'ed25519:' followed by exactly 64 hex"):
        trust.policy()


@pytest.mark.parametrize("entry", ["ed25519:", "ed25519:" + "0" * 63, "ed25519:" + "g" * 64, "ed25519:" + "a" * 64 + " x"])
def test_an_inline_key_that_is_not_exactly_one_key_is_an_error(entry, monkeypatch):
    _clear_caches()
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", entry)
    with pytest.raises(TrustConfigError, match="PRECOMPILE_VERIFY_KEYS"):
        trust.policy()


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_a_blank_signing_key_is_an_error_not_no_signer(value, monkeypatch):
    _clear_caches()
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", value)
    with pytest.raises(TrustConfigError, match="PRECOMPILE_SIGNING_KEY is set to"):
        trust.policy()


@pytest.mark.parametrize("query", ["verify_keys=", "verify_keys=,", "verify_keys=%20,%20", "verify_keys={empty}",
                                   "verify_keys={comments}", "verify_keys=/dev/null", "verify_keys={fifo}",
                                   "signing_key=", "signing_key=%20", "signing_key={fifo}"])
@pytest.mark.parametrize("where", ["plain", "near tier", "far tier"])
def test_a_cache_url_key_option_that_names_no_key_is_a_config_error(query, where, tmp_path):
    _clear_caches()
    files = empty_settings(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    q = query.format(empty=files["empty file"], comments=files["comments only"], fifo=tmp_path / "fifo")
    a, b = f"file://{tmp_path / 'near'}", f"file://{tmp_path / 'far'}"
    url = {"plain": f"{a}?{q}", "near tier": f"{a}?{q}|{b}", "far tier": f"{a}|{b}?{q}"}[where]
    with pytest.raises(TrustConfigError, match=r"(verify_keys|signing_key)= of cache URL file://") as info:
        precompile.open_cache(url)
    assert isinstance(info.value, ConfigError)
    with pytest.raises(ConfigError):
        precompile.load("ab" * 32, cache=url)


def test_key_files_with_comments_blank_lines_and_pem_still_verify(artifacts, builder, tmp_path, monkeypatch):
    """What is accepted: a key file of comments, blank lines and one key a line, a PEM public key file, inline
    keys, any of them with stray commas around; a signed artifact then loads with the right output."""
    from cryptography.hazmat.primitives import serialization

    _clear_caches()
    c = artifacts("make_fx")
    key_path, pub = builder
    attacker = trust.generate_key(tmp_path / "attacker.pem")
    listed = tmp_path / "workers.keys"
    listed.write_text(f"# builders\n\n  {attacker}  \n{pub}\r\n# end\n")
    pem = tmp_path / "builder.pub.pem"
    pem.write_bytes(trust.load_signing_key(key_path).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    signed = copy_of(c.art)
    signed.manifest = trust.Policy(signer=trust.load_signing_key(key_path)).sign(signed.manifest)
    path = signed.save(tmp_path / "signed.pc")
    for setting in (str(listed), f",{pem},", f"{attacker}, {pub}", f" {pub} "):
        monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", setting)
        assert trust.policy().required
        assert_same_output(precompile.load(path)(*c.inputs), c.expected)
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", attacker)
    with pytest.raises(precompile.UntrustedArtifactError):
        precompile.load(path)


def test_a_key_removed_from_a_key_file_is_not_trusted_from_the_next_load_on(artifacts, builder, tmp_path,
                                                                            monkeypatch):
    """Revoking a builder's key by editing the workers' key file takes effect without a restart (the parsed keys
    were cached by the setting's text, so a revoked key stayed trusted until the process ended)."""
    c = artifacts("make_fx")
    key_path, pub = builder
    other = trust.generate_key(tmp_path / "other.pem")
    signed = copy_of(c.art)
    signed.manifest = trust.Policy(signer=trust.load_signing_key(key_path)).sign(signed.manifest)
    path = signed.save(tmp_path / "signed.pc")
    listed = tmp_path / "workers.keys"
    listed.write_text(f"{pub}\n{other}\n")
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", str(listed))
    assert_same_output(precompile.load(path)(*c.inputs), c.expected)
    listed.write_text(f"{other}\n")  # the builder's key revoked, in place
    with pytest.raises(precompile.UntrustedArtifactError, match="not a configured verify key"):
        precompile.load(path)
    replacement = tmp_path / "workers.keys.new"
    replacement.write_text(f"{other}\n{pub}\n")
    replacement.replace(listed)  # and trusted again, by an atomic rename
    assert_same_output(precompile.load(path)(*c.inputs), c.expected)


FRESH_LOAD = textwrap.dedent("""
    import json, sys, torch, precompile, _graphs
    from precompile.errors import ConfigError
    gm, inputs = _graphs.graph("make_fx", _graphs.mlp())
    try:
        precompile.load(sys.argv[1], cache=sys.argv[2])
        print(json.dumps({"outcome": "loaded"}))
    except ConfigError as err:
        print(json.dumps({"outcome": "ConfigError", "message": str(err)}))
""")


@pytest.mark.parametrize("case", ["comma", "empty", "comments only", "/dev/null", "fifo", "signing blank"])
def test_a_worker_with_an_empty_key_setting_never_runs_a_planted_entry(case, artifacts, tmp_path):
    """A fresh worker process with the setting in its environment: the planted unsigned entry is never run, and
    the outcome is a ConfigError, and the process ends (a FIFO key file never hangs it: opened, it would block
    forever).  The limit is generous, for a loaded CI machine: the process's own start (importing torch) is not what
    the test checks."""
    c = artifacts("make_fx")
    marker = tmp_path / "marker"
    doc, blobs = evil_wrapper(c.art, marker)
    url = f"file://{tmp_path / 'cache'}"
    plant(open_cache(url), c.art.key, doc, blobs)
    settings = {**empty_settings(tmp_path), **_not_regular(tmp_path)}
    env = {"PRECOMPILE_SIGNING_KEY": " "} if case == "signing blank" else {"PRECOMPILE_VERIFY_KEYS": settings[case]}
    out = run_python(FRESH_LOAD, c.art.key, url, env=env, timeout=180)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["outcome"] == "ConfigError", report
    assert not marker.exists(), "the planted wrapper ran"


def test_a_builder_with_a_blank_signing_key_stores_nothing(artifacts, tmp_path, monkeypatch):
    from precompile.store.cache_io import store

    _clear_caches()
    c = artifacts("make_fx")
    monkeypatch.setenv("PRECOMPILE_SIGNING_KEY", "  ")
    cache = open_cache(f"file://{tmp_path / 'cache'}")
    with pytest.raises(TrustConfigError) as info:
        store(cache, copy_of(c.art))
    assert isinstance(info.value, PrecompileError)
    assert list(cache.iter_refs()) == []
    with pytest.raises(TrustConfigError):
        copy_of(c.art).save(tmp_path / "a.pc")
    assert not (tmp_path / "a.pc").exists()


@pytest.mark.parametrize("extra", ["second key", "a line before", "a line after"])
def test_a_pem_key_file_holds_one_key_and_nothing_else(extra, builder, tmp_path, monkeypatch):
    """cryptography's PEM reader takes the first block and ignores the rest: a second key (a rotation) or a stray
    line would be dropped without a word, so such a file is an error naming it."""
    from cryptography.hazmat.primitives import serialization

    _clear_caches()
    key_path, _ = builder
    one = trust.load_signing_key(key_path).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    trust.generate_key(tmp_path / "other.pem")
    other = trust.load_signing_key(str(tmp_path / "other.pem")).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    data = {"second key": one + other, "a line before": b"ed25519:" + b"a" * 64 + b"\n" + one,
            "a line after": one + b"garbage\n"}[extra]
    path = tmp_path / "keys.pem"
    path.write_bytes(data)
    monkeypatch.setenv("PRECOMPILE_VERIFY_KEYS", str(path))
    with pytest.raises(TrustConfigError, match="exactly one PEM public key and nothing else"):
        trust.policy()
