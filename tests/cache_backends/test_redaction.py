"""The one redaction of cache URLs (cache_backends/redaction.py), on strings alone: what a well-formed URL shows
(everything but its secrets, so that the server it names and its options stay readable), and strings that do not
parse.  What the caches, errors, logs and the command line show is checked in test_url_secrets.py and
tests/cli/test_cli_secrets.py."""

from __future__ import annotations

import pytest

from cache_backends import redaction
from cache_backends.redaction import misread_password, redact_url, scrub, scrub_error


@pytest.mark.parametrize("url, shown", [
    ("redis://alice:pw-1@cache:6379/0?ttl=60&prefix=prod", "redis://alice:***@cache:6379/0?ttl=60&prefix=prod"),
    ("rediss://:pw-2@cache:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_password=pw-3&ssl_keyfile=/k.pem",
     "rediss://:***@cache:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_password=***&ssl_keyfile=/k.pem"),
    ("redis://cache-0:6379/?cluster=1&nodes=cache-1:6379,bob:pw-4@cache-2:6379",
     "redis://cache-0:6379/?cluster=1&nodes=cache-1:6379,bob:***@cache-2:6379"),
    ("redis://h/0?nodes=bob%3Apw-5%40h1%3A1", "redis://h/0?nodes=bob:***@h1:1"),
    ("unix://:pw-6@/run/redis.sock?db=3", "unix://:***@/run/redis.sock?db=3"),
    ("redis://alice:pw-7@[::1]:6379/0", "redis://alice:***@[::1]:6379/0"),
    ("file:///var/cache/p?max_bytes=10&password=pw-8&pasword=pw-9",
     "file:///var/cache/p?max_bytes=10&password=***&pasword=***"),
    ("file:///c?verify_keys=ed25519:ab12,/keys/pub&signing_key=/keys/signer.pem",
     "file:///c?verify_keys=ed25519:ab12,/keys/pub&signing_key=/keys/signer.pem"),
    ("file:///c?signing_key=MC4CAQAwBQYDK2VwBCIEIpw-10", "file:///c?signing_key=***"),
    ("file:///c|redis://u:pw-11@h:1/0?ssl_password=pw-12", "file:///c|redis://u:***@h:1/0?ssl_password=***"),
    ("redis://h:1/0?client_name=me@host", "redis://h:1/0?client_name=me@host"),
    ("redis://worker@h:1/0", "redis://worker@h:1/0"),  # a user name is not a secret
    ("/var/cache/precompile", "/var/cache/precompile"),
    # mistyped: nothing of the password shows, whatever urllib would make of it
    ("redis://alice:pw-13@/0", "redis://alice:***@/0"),
    ("alice:pw-14@cache:6379/0", "alice:***@cache:6379/0"),
    ("redis:/alice:pw-15@cache:6379/0", "redis:/alice:***@cache:6379/0"),
    ("redis://:pw-16@", "redis://:***@"),
    ("  redis://alice:pw-17 @cache/0 ", "  redis://alice:***@cache/0 "),
    ("redis ://alice:pw-18@cache/0", "redis ://alice:***@cache/0"),
    ("redis://alice:pw%2F-19@cache/0", "redis://alice:***@cache/0"),
    ("redis://alice:p@w-20@cache/0", "redis://alice:***@cache/0"),
    ("redis://alice:p/w-21@cache/0", "redis://alice:***@cache/0"),
    ("redis://alice:p?w-22@cache/0", "redis://alice:***@cache/0"),
    ("redis://alice:p#w-23@cache/0", "redis://alice:***@cache/0"),
    ("redis://alice:p|w-24@cache/0", "redis://alice:***@cache/0"),
    ("redis://h/0?ttl=5?password=pw-25", "redis://h/0?ttl=5?password=***"),
    ("redis://h/0;password=pw-26", "redis://h/0;password=***"),
    ("redis://h/0#pw-27", "redis://h/0#***"),
    ("redis://h/0?pw-28", "redis://h/0?***"),
    ("redis://alice:pw-29@[::1:6379/0", "redis://alice:***@[::1:6379/0"),
    ("redis://alice:pw-30/0", "redis://alice:***/0"),  # '@host' forgotten: the "port" is the password
    ("//alice:pw-31@cache/0", "//alice:***@cache/0"),
])
def test_what_a_url_shows(url, shown):
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # redacting twice changes nothing
    assert "pw-" not in shown and "w-" not in shown


def test_lists_and_other_values():
    assert redact_url(["file:///a", "redis://:pw-1@h/0", "x"]) == "file:///a|redis://:***@h/0|x"
    assert redact_url(None) == "None"
    assert redact_url(3) == "3"


def test_every_option_of_every_backend_is_classified():
    """A new option of a backend must be judged public or secret here; unjudged, its value is masked."""
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    from cache_backends.local.url import URL_OPTIONS as LOCAL
    from cache_backends.redis.url import URL_OPTIONS as REDIS
    from precompile.store.opening import TRUST_OPTIONS

    known = redaction.PUBLIC_OPTIONS | redaction.PATH_OPTIONS | redaction.SECRET_OPTIONS
    assert set(LOCAL) | set(REDIS) | set(URL_QUERY_ARGUMENT_PARSERS) | set(TRUST_OPTIONS) <= known
    assert redaction.KNOWN_OPTIONS == known
    # a public option named like a secret is one whose value was checked not to be one
    named_like_secrets = {o for o in redaction.PUBLIC_OPTIONS if redaction.SECRET_NAME.search(o)}
    assert named_like_secrets <= redaction.KEY_NAMING


def test_a_password_urllib_would_cut_short_is_told():
    for url in ("redis://alice:pa/ss@h/0", "redis://alice:pa?ss@h/0", "redis://alice:pa#ss@h/0",
                "redis://h/0?colour=a@b"):
        assert misread_password(url), url
    for url in ("redis://alice:p@ss@h/0", "redis://h:1/0?client_name=me@x", "redis://u:p@h/0?ssl_password=a@b",
                "redis://h/0?cluster=1&nodes=b:p@h:1", "redis://alice:pw@h/0", "file:///a@b/c"):
        assert not misread_password(url), url


def test_scrub_removes_secrets_from_free_text_and_errors():
    url = "redis://alice:long-secret-1@h/0?ttl=5?password=long-secret-2"
    assert scrub("got '5?password=long-secret-2' from long-secret-1", url) == "got '5?password=***' from ***"
    try:
        try:
            raise FileNotFoundError(2, "No such file", "long-secret-1")
        except OSError as inner:
            raise ValueError("cannot read long-secret-2") from inner
    except ValueError as err:
        scrub_error(err, url)
        assert str(err) == "cannot read ***"
        assert err.__cause__.filename == "***"  # type: ignore[union-attr]
    assert scrub("a 0 and a 1", "redis://:0@h/0?ssl_password=1") == "a 0 and a 1"  # too short to look for
