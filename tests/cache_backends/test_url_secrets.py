"""A cache URL's secrets never show (issue 39, part 3): not in the opened cache's ``url``, ``str``, ``repr``, stats
or metrics labels, not in the error of a URL that does not open or of a cache that fails on use (nor in the errors
it was raised from), not in a log record.  Each form of tests/_secret_urls.py is opened against one real
redis-server (TLS, plain and unix socket) whose passwords they carry: a form that ``"works"`` got in with them."""

from __future__ import annotations

import hashlib
import json
import logging
import traceback

import pytest
from _secret_urls import forms, names, start_secured

from cache_backends import MISS
from cache_backends.registry import open_cache
from precompile.errors import CacheError, PrecompileError


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """``(secured server, {form name: Form})``: one redis-server for the module."""
    secured = start_secured(tmp_path_factory.mktemp("secured"))
    try:
        yield secured, {f.name: f for f in forms(secured, tmp_path_factory.mktemp("near"))}
    finally:
        secured.server.stop()


def _told(err: BaseException) -> str:
    """Everything a traceback of ``err`` prints: its message and those of the errors it was raised from."""
    return "".join(traceback.format_exception(err))


@pytest.mark.parametrize("name", names())
def test_no_secret_in_what_a_cache_shows(table, name, caplog):
    secured, by_name = table
    form = by_name[name]
    key = hashlib.sha256(name.encode()).hexdigest()
    admin = secured.admin()
    for prefix in ("precompile", "dflt"):  # a ref that holds no digest: reading it logs a warning naming the cache
        admin.set(f"{prefix}:ref:{key}", b"not a digest")
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    try:
        cache = open_cache(form.url)
    except PrecompileError as err:
        assert form.outcome == "refused", _told(err)
        shown.append(_told(err))
    else:
        assert form.outcome != "refused", f"{form.url} opened"
        shown += [cache.url, str(cache), repr(cache)]
        try:
            assert cache.get_ref(key) is MISS
            digest = cache.put_blob(b"a blob " + name.encode())
            assert cache.get_blob(digest) == b"a blob " + name.encode()
            stats = cache.stats()
        except CacheError as err:
            assert form.outcome == "fails on use", _told(err)
            shown.append(_told(err))
        else:
            # a tiered cache whose remote fails serves from its local tier, with a warning
            assert form.outcome == "works" or "tiered" in name, f"{form.url} worked"
            shown.append(json.dumps(stats, default=str))
            from precompile.metrics import cache_exposition

            shown.append(cache_exposition(cache).decode())
            if form.outcome == "works":
                assert "does not hold a digest" in caplog.text  # a record naming the cache was logged
        cache.close()
    shown += [r.getMessage() for r in caplog.records] + [caplog.text]
    text = "\n".join(shown)
    for secret in form.secrets:
        assert secret not in text, f"{secret!r} of {form.name!r} shown:\n{text}"
    assert "***" in text, text  # the URL was shown, redacted
