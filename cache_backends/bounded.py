"""Bounded, non-blocking reads of untrusted input: files and JSON documents.

Everything read from a cache or an artifact file is untrusted until verified (DESIGN.md, "Trust").  Before it is
verified it must not be able to hang the reader or take its memory: a FIFO planted where a ref was, a symlink to
``/dev/zero`` where a blob was, a part far larger than its manifest says, a JSON document nested 200,000 deep.
These helpers are the one place such reads go through:

- :func:`read_regular` opens without blocking (``O_NONBLOCK``: opening a FIFO with no writer returns at once),
  refuses anything but a regular file (FIFOs, devices, directories, sockets; a symlink is followed and judged by
  what it points to), refuses a file larger than the caller's bound before allocating, and reads at most the bound
  plus one byte, so a file that grows while it is read is refused too;
- :func:`loads_json` parses JSON only when it is no longer than its bound and no deeper than :data:`MAX_JSON_DEPTH`
  (checked by a scan before the parse, so Python's recursive decoder never meets a deep document).

Both raise :class:`~precompile.errors.InputLimitError` (a ``ValueError``) for a bound exceeded and
:class:`~precompile.errors.NotRegularFileError` (an ``OSError``) for a path that is not a regular file; callers
that read a cache treat either as a miss.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from precompile.errors import InputLimitError, NotRegularFileError

#: Deepest nesting of arrays and objects accepted in any JSON document read from a cache or artifact.  Our own
#: documents nest at most ~12 deep (a graph argument inside a node inside a graph); 64 leaves room.
MAX_JSON_DEPTH = 64

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def read_regular(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The bytes of regular file ``path``, at most ``max_bytes`` of them, read without blocking on open.

    Args:
        path: the file; a symlink is followed and the file it names is judged.
        max_bytes: the largest size accepted (bytes); a larger file is refused before anything is allocated.
        what: what the file is, for messages ("cache ref", "artifact part 'graph'").

    Raises:
        FileNotFoundError: ``path`` does not exist.
        NotRegularFileError: ``path`` is a FIFO, device, directory or socket (nothing is read from it).
        InputLimitError: the file holds more than ``max_bytes`` bytes.
        OSError: any other failure to open or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{what} {os.fspath(path)} is not a regular file "
                                      f"({_kind(st.st_mode)}); refused without reading it")
        if st.st_size > max_bytes:
            raise InputLimitError(f"{what} {os.fspath(path)} holds {st.st_size} bytes, more than the "
                                  f"{max_bytes} accepted; refused without reading it")
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise InputLimitError(f"{what} {os.fspath(path)} grew past the {max_bytes} bytes accepted while it "
                                  "was read; refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def loads_json(data: bytes | str, max_bytes: int, what: str = "document", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)``, for a document of at most ``max_bytes`` bytes nested at most ``max_depth`` deep.

    Raises:
        InputLimitError: the document is longer or deeper than its bounds (nothing is parsed).
        ValueError: it is not JSON (``json.JSONDecodeError``), or not UTF-8.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise InputLimitError(f"{what} is {len(raw)} bytes, more than the {max_bytes} accepted")
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', raw)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > deepest:
            deepest = depth
            if deepest > max_depth:
                raise InputLimitError(f"{what} nests deeper than {max_depth} levels; refused before parsing")
    return json.loads(raw)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return f"mode {oct(mode)}"
