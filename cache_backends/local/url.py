"""``file://`` cache URLs: parsing them into a directory and options, and writing them back."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from cache_backends.options import AGE_S, MAX_SIZE, WAIT_S, parse_bool, parse_level, parse_positive_int, parse_seconds
from cache_backends.redaction import redact_url
from precompile.errors import CacheURLError

#: Query options of a ``file://`` URL and their parsers; each number is finite and bounded
#: (:mod:`cache_backends.options`).
URL_OPTIONS: dict[str, Callable[[str, str], object]] = {
    "max_bytes": functools.partial(parse_positive_int, most=MAX_SIZE),
    "read_only": parse_bool,
    "grace_s": functools.partial(parse_seconds, most=AGE_S),
    "level": parse_level,
    "fetch_wait": functools.partial(parse_seconds, most=WAIT_S),
}


def parse_file_url(url: str) -> tuple[str, dict[str, object]]:
    """``(absolute directory, {LocalCache keyword: value})`` of
    ``file:///abs/dir[?max_bytes=N&read_only=1&grace_s=S&level=L&fetch_wait=S]``.

    The path is percent-decoded; ``max_bytes`` is in bytes, ``grace_s`` and ``fetch_wait`` (``fetch_wait_s``) in
    seconds, ``read_only`` takes 1/0/true/false.

    Raises:
        CacheURLError: the scheme is not ``file``, the URL names a host, the path is not absolute, an option is
            unknown, given twice, malformed or out of its range, or the URL has a fragment.
    """
    if not isinstance(url, str):
        raise CacheURLError(f"a cache URL must be a string such as 'file:///var/cache/precompile', got "
                            f"{redact_url(url)!r}")
    shown = redact_url(url)  # every message shows the URL redacted (cache_backends/redaction.py)
    try:
        parts = urlsplit(url.strip())
    except ValueError as err:  # "Invalid IPv6 URL"
        raise CacheURLError(f"malformed cache URL {shown!r}: {err}") from None
    if parts.scheme.lower() != "file":
        raise CacheURLError(f"LocalCache opens file:// URLs only, got {shown!r}")
    if parts.netloc not in ("", "localhost"):
        host = redact_url(parts.netloc)
        raise CacheURLError(
            f"file URL {shown!r} names host {host!r}; a local cache URL needs an absolute path and three "
            f"slashes, e.g. {redact_url(f'file:///{parts.netloc}{parts.path}')!r}"
        )
    if parts.fragment:
        raise CacheURLError(f"file URL {shown!r} has a fragment (#...); a cache URL takes none")
    path = unquote(parts.path)
    if not path or not os.path.isabs(path):
        raise CacheURLError(
            f"file URL {shown!r} needs an absolute directory path, e.g. 'file:///var/cache/precompile'"
        )
    try:
        options = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as err:
        raise CacheURLError(f"malformed query in cache URL {shown!r}: {err}") from err
    kwargs: dict[str, object] = {}
    for name, raw in options:
        parse = URL_OPTIONS.get(name)
        if parse is None:
            raise CacheURLError(f"unknown option {name!r} in cache URL {shown!r}; known: {', '.join(URL_OPTIONS)}")
        if name in kwargs:
            raise CacheURLError(f"option {name!r} given twice in cache URL {shown!r}")
        kwargs[name] = parse(name, raw)
    if "fetch_wait" in kwargs:
        kwargs["fetch_wait_s"] = kwargs.pop("fetch_wait")
    return path, kwargs


def make_file_url(root: str, options: dict[str, object]) -> str:
    """The ``file://`` URL of directory ``root`` with ``options`` (``{name: value}``, in order) as its query."""
    url = "file://" + quote(root, safe="/")
    return url + ("?" + "&".join(f"{k}={v}" for k, v in options.items()) if options else "")
