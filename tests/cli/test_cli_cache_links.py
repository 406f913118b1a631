"""``precompile ls`` and ``precompile verify`` over a shared cache where a ref was planted as a link to a file only the
worker can read (issue 34, item 4): the secret appears in no output and no log line, the ref is reported by size and
digest at most, and a write puts a regular file in its place.  Real processes, a real directory and link."""

from __future__ import annotations

import json
import os
import secrets
import stat

from _cli import cli

from cache_backends.base import digest_bytes
from cache_backends.local.cache import LocalCache


def test_a_ref_linked_to_a_secret_reaches_no_output_of_ls_or_verify(tmp_path):
    text = "SECRET-" + secrets.token_urlsafe(24)
    secret = tmp_path / "secret.txt"
    secret.write_text(text + "\n" + "0" * 64 + "\n")
    secret.chmod(0o600)
    root = tmp_path / "c"
    cache = LocalCache(root)
    key = digest_bytes(b"planted")
    os.symlink(secret, cache._ref_path(key))
    garbled = digest_bytes(b"garbled")
    cache._ref_path(garbled).write_text(text)  # a regular ref holding text: described, never quoted
    env = {"PRECOMPILE_LOG": "DEBUG"}
    for args in (("ls",), ("ls", "--json"), ("verify",), ("verify", "--json")):
        proc = cli(*args, "--cache", str(root), env=env, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert text not in proc.stdout and text not in proc.stderr, args
    report = json.loads(cli("verify", "--json", "--cache", str(root), env=env, check=False).stdout.splitlines()[-1])
    problems = {p["name"]: p["detail"] for p in report["tiers"][0]["problems"]}
    assert "not a regular file" in problems[key]
    assert problems[garbled] == f"holds {len(text)} characters (sha256 {digest_bytes(text.encode())[:16]}), not a digest"
    cache.set_ref(key, cache.put_blob(b"manifest"))
    assert stat.S_ISREG(os.lstat(cache._ref_path(key)).st_mode) and secret.read_text().startswith(text)
