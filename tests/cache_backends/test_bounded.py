"""cache_backends.bounded: reads of untrusted files and JSON that can neither hang nor take unbounded memory."""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_backends.bounded import MAX_JSON_DEPTH, loads_json, read_regular
from precompile.errors import InputLimitError, NotRegularFileError


def test_a_fifo_is_refused_at_once_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "ref")
    start = time.monotonic()
    with pytest.raises(NotRegularFileError, match="FIFO"):
        read_regular(tmp_path / "ref", 1 << 20, "cache ref")
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/"])
def test_a_symlink_to_a_device_or_directory_is_refused(tmp_path, target):
    (tmp_path / "blob").symlink_to(target)
    with pytest.raises(NotRegularFileError):
        read_regular(tmp_path / "blob", 1 << 20)


def test_a_file_over_its_bound_is_refused_and_one_at_it_is_read(tmp_path):
    (tmp_path / "part").write_bytes(b"x" * 1001)
    with pytest.raises(InputLimitError, match="1001 bytes, more than the 1000"):
        read_regular(tmp_path / "part", 1000)
    (tmp_path / "part").write_bytes(b"y" * 1000)
    assert read_regular(tmp_path / "part", 1000) == b"y" * 1000


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "nothing", 10)


def test_json_deeper_than_the_bound_is_refused_before_parsing():
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(InputLimitError, match="deeper"):
        loads_json(deep, 1 << 20)
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_json(ok, 1 << 20) == json.loads(ok)


def test_brackets_inside_strings_do_not_count_and_escapes_are_honoured():
    doc = {"a": "[[[[{{{{", "b": [1, {"c": '"]]]}}\\'}]}
    assert loads_json(json.dumps(doc), 1 << 10, max_depth=3) == doc


_TEXT = st.text(alphabet='[]{}"\\/ab\u00e9\u2028\n', max_size=8)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                     max_leaves=12)


def _depth(doc) -> int:
    if isinstance(doc, list):
        return 1 + max(map(_depth, doc), default=0)
    if isinstance(doc, dict):
        return 1 + max(map(_depth, doc.values()), default=0)
    return 0


@settings(max_examples=150, deadline=None)
@given(doc=_JSON, ascii_only=st.booleans())
def test_the_depth_scan_counts_exactly_the_brackets_outside_strings(doc, ascii_only):
    """Strings full of brackets, quotes and backslashes: the scan finds the document's true depth, no more."""
    text = json.dumps(doc, ensure_ascii=ascii_only)
    depth = _depth(doc)
    assert loads_json(text, 1 << 20, max_depth=depth) == doc
    if depth:
        with pytest.raises(InputLimitError, match="deeper"):
            loads_json(text, 1 << 20, max_depth=depth - 1)


def test_json_longer_than_its_bound_is_refused():
    with pytest.raises(InputLimitError, match="more than the 10"):
        loads_json(b'{"a": "0123456789"}', 10)


def test_an_unterminated_string_of_escaped_quotes_is_refused_in_linear_time():
    # b'"\\"\\"...': a depth scan that retried from every quote took 40 s on 64 KB (quadratic); a forged manifest
    # of this shape must cost one pass, in every mode, since manifests are parsed before their signature is checked
    for n in (32_000, 2_000_000):
        start = time.monotonic()
        with pytest.raises(ValueError, match="not terminated"):
            loads_json(b'"' + b'\\"' * n, 1 << 24)
        assert time.monotonic() - start < 10.0, n  # a hang check, not a speed claim


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
def test_json_in_another_encoding_cannot_hide_its_depth(encoding):
    """json.loads(bytes) would guess UTF-16/32, where a character like U+2200 holds a '"' byte: a byte scan then
    took 5000 brackets for a string's contents and json.loads raised RecursionError."""
    deep = ('["\u2200", ' + "[" * 5000 + "]" * 5000 + ', "\u2200", "a"]').encode(encoding)
    with pytest.raises(ValueError):  # not UTF-8: refused, never parsed
        loads_json(deep, 1 << 20)
    with pytest.raises(InputLimitError, match="nests deeper"):
        loads_json(deep.decode(encoding).encode("utf-8"), 1 << 20)


def test_a_socket_or_a_symlink_loop_is_not_a_regular_file(tmp_path):
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(NotRegularFileError, match="ENXIO"):
            read_regular(tmp_path / "sock", 10)
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(NotRegularFileError, match="ELOOP"):
        read_regular(tmp_path / "loop", 10)
