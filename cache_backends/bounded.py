"""Bounded, non-blocking reads of untrusted input: files and JSON documents.

Everything read from a cache or an artifact file is untrusted until verified (DESIGN.md, "Trust").  Before it is
verified it must not be able to hang the reader or take its memory: a FIFO planted where a ref was, a symlink to
``/dev/zero`` where a blob was, a part far larger than its manifest says, a JSON document nested 200,000 deep.
These helpers are the one place such reads go through:

- :func:`read_regular` opens without blocking (``O_NONBLOCK``: opening a FIFO with no writer returns at once),
  refuses anything but a regular file (FIFOs, devices, directories, sockets; a symlink is followed and judged by
  what it points to), refuses a file larger than the caller's bound before allocating, and reads at most the bound
  plus one byte, so a file that grows while it is read is refused too;
- :func:`open_regular` is the open behind it, for readers that stream a file (an artifact file, a bundle): the
  same refusals, and the file's size (``os.fstat``) bounds every length read from it;
- :func:`loads_json` parses JSON only when it is no longer than its bound and no deeper than :data:`MAX_JSON_DEPTH`
  (checked by a scan before the parse, so Python's recursive decoder never meets a deep document);
- :func:`inflate` decompresses one zstd frame to at most a bound: a frame whose header states a larger size is
  refused before anything is allocated, and one that states none (zstd frames need not) is decompressed in pieces
  and refused as soon as its output passes the bound, so the header's claim is never what is allocated.

The bounds (docs/format.md, "Bounds"): a manifest is at most :data:`MAX_MANIFEST_BYTES` before it is verified,
a part at most the size its manifest records and never more than :data:`MAX_BLOB_BYTES`.

They raise :class:`~precompile.errors.InputLimitError` (a ``ValueError``) for a bound exceeded and
:class:`~precompile.errors.NotRegularFileError` (an ``OSError``) for a path that is not a regular file; callers
that read a cache treat either as a miss.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import stat
from typing import IO, Any

import zstandard

from precompile.errors import InputLimitError, NotRegularFileError

#: Largest manifest (uncompressed bytes) read before its signature and structure are checked.  Measured: the tests'
#: 2-layer MLP's manifest is 8.8 KB (~0.45 KB per kernel, ~0.15 KB per blob, ~0.2 KB per placeholder), so a graph of
#: 2,000 kernels and 1,000 weights is ~2 MB (an estimate); 16 MiB leaves room for 8x that and bounds what a forged
#: entry can make a worker allocate before anything is verified.
MAX_MANIFEST_BYTES = 16 << 20
#: Largest part (uncompressed bytes) accepted anywhere, whatever a manifest records: the format's bound.  Parts are
#: kernel sources and binaries, wrappers, the engine payload, a Dynamo part (itself bounded to 256 MiB); weights are
#: inputs, never parts.
MAX_BLOB_BYTES = 2 << 30
#: Largest sum of the part sizes one manifest may record, bytes: each part within :data:`MAX_BLOB_BYTES` could
#: still add up past any worker's memory (a real artifact holds kernels and their binaries: megabytes).
MAX_ARTIFACT_BYTES = 8 << 30
#: The most of a ref that is read (bytes): a ref holds one 64-character digest.
MAX_REF_BYTES = 256
#: Largest decompressed/compressed ratio accepted from a frame header (zstd's own bound is ~32768); a header
#: claiming more is corruption, rejected before the output is allocated.
MAX_RATIO = 65536
#: Bytes read (or decompressed) per step of a streamed read.
STEP = 1 << 20

#: Deepest nesting of arrays and objects accepted in any JSON document read from a cache or artifact.  Our own
#: documents nest at most ~12 deep (a graph argument inside a node inside a graph); 64 leaves room.
MAX_JSON_DEPTH = 64

#: errno values of an open that found no file to read: a socket, a symlink refused or looping, a device
#: without a driver, a directory.
NOT_A_FILE = frozenset({errno.ENXIO, errno.ELOOP, errno.ENODEV, errno.EISDIR})

#: The depth scan of a JSON text, three substitutions in C, each one pass (linear time, also for a forged text):
#: escapes removed (a backslash and the character after it: no ``\\"`` is left), then strings (a quote to the next
#: quote; only an unterminated last string scans to the end, once), then all but brackets and quotes.  What is left
#: is the brackets outside strings, and a quote only where a string is not terminated.  (A backslash outside a
#: string is not JSON: the parse fails there, before any bracket it hides.)  It once walked every string token in
#: Python: 2.4 ms of a 2.5 ms read of a 6 KB manifest, the most of ``precompile ls`` over a large cache.
_ESCAPE = re.compile(r"\\.", re.DOTALL)
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r'[^\[\]{}"]+')
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def frame_bound(max_bytes: int) -> int:
    """Largest stored form (a zstd frame, or the raw bytes) of a blob of at most ``max_bytes`` bytes: zstd's own
    ``ZSTD_compressBound`` (input + 1/256 + a block's overhead) with room to spare.  A stored copy larger than this
    cannot decompress to ``max_bytes`` or fewer, so it is refused before it is read."""
    return max_bytes + (max_bytes >> 7) + 4096


def open_regular(path: str | os.PathLike[str], what: str = "file") -> IO[bytes]:
    """``path`` opened for reading (binary, unbuffered), without blocking on open, if it is a regular file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        NotRegularFileError: ``path`` is a FIFO, device, directory or socket (nothing is read from it).
        OSError: any other failure to open it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:  # a socket (ENXIO), a symlink loop (ELOOP), a device with no driver (ENODEV)
        if err.errno in NOT_A_FILE:
            raise NotRegularFileError(f"{what} {os.fspath(path)} cannot be opened as a file "
                                      f"({errno.errorcode.get(err.errno, err.errno)}); refused") from err
        raise
    return regular_file(fd, path, what)


def regular_file(fd: int, path: str | os.PathLike[str], what: str = "file") -> IO[bytes]:
    """Descriptor ``fd`` (opened for reading, without blocking) as a binary, unbuffered file if it is a regular
    file; else it is closed.  ``path`` and ``what`` name it in messages.

    Raises:
        NotRegularFileError: it is a FIFO, device, directory or socket (nothing is read from it).
    """
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{what} {os.fspath(path)} is not a regular file ({describe_mode(mode)}); refused "
                                      "without reading it")
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


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
    with open_regular(path, what) as f:
        return read_bounded(f, max_bytes, f"{what} {os.fspath(path)}")


def read_bounded(f: IO[bytes], max_bytes: int, what: str = "file") -> bytes:
    """The bytes of open regular file ``f``, at most ``max_bytes`` of them: one larger (``os.fstat``) is refused
    before anything is allocated, one that grows while it is read when it passes the bound.

    Raises:
        InputLimitError: ``f`` holds more than ``max_bytes`` bytes.
        OSError: a read failed.
    """
    size = os.fstat(f.fileno()).st_size
    if size > max_bytes:
        raise InputLimitError(f"{what} holds {size} bytes, more than the {max_bytes} accepted; refused without "
                              "reading it")
    return read_at_most(f, max_bytes, what, size)


def read_at_most(f: IO[bytes], max_bytes: int, what: str = "file", size: int | None = None) -> bytes:
    """The rest of ``f``, at most ``max_bytes`` bytes of it: a file that grows while it is read, or lies about its
    size, costs ``max_bytes`` + 1 bytes at most.  ``size`` (its ``fstat`` size, already checked against
    ``max_bytes``) is read in one call, one allocation; the rest, if any, in steps.

    Raises:
        InputLimitError: ``f`` holds more than ``max_bytes`` bytes.
        OSError: a read failed.
    """
    chunks: list[bytes] = []
    left = max_bytes + 1
    if size is not None and 0 < size <= max_bytes:
        first = f.read(size + 1)
        if len(first) <= size:
            return first
        chunks.append(first)
        left -= len(first)
    while left > 0:
        chunk = f.read(min(left, STEP))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    if left <= 0:
        raise InputLimitError(f"{what} holds more than the {max_bytes} bytes accepted (it grew while it was "
                              "read); refused")
    return b"".join(chunks)


def read_exact(f: IO[bytes], n: int) -> bytes:
    """The next ``n`` bytes of ``f``, fewer only at its end; read in steps, so a caller that checked ``n`` against
    what the file holds (``os.fstat``) never allocates more than the file has.

    Raises:
        OSError: a read failed.
    """
    chunks: list[bytes] = []
    left = n
    while left > 0:
        chunk = f.read(min(left, STEP))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def loads_json(data: bytes | str, max_bytes: int, what: str = "document", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)``, for a document of at most ``max_bytes`` bytes nested at most ``max_depth`` deep.

    Raises:
        InputLimitError: the document is longer or deeper than its bounds (nothing is parsed).
        ValueError: it is not JSON (``json.JSONDecodeError``), or bytes that are not UTF-8
            (``UnicodeDecodeError``).
    """
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise InputLimitError(f"{what} is {size} bytes, more than the {max_bytes} accepted")
    # Bytes are decoded here, strictly, and the text is scanned and parsed: json.loads(bytes) would guess UTF-16 or
    # UTF-32 from the first bytes, and a depth scan of the bytes would miss the brackets that decoding makes.
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", _ESCAPE.sub("", text)))
    if '"' in brackets:
        raise ValueError(f"{what} is not JSON: a string is not terminated")
    if max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) > max_depth:
        raise InputLimitError(f"{what} nests deeper than {max_depth} levels; refused before parsing")
    return json.loads(text)


def inflate(frame: bytes | memoryview, max_bytes: int, what: str = "blob") -> bytes:
    """The bytes zstd frame ``frame`` decompresses to, when they are at most ``max_bytes``.

    A frame whose header states its size (every frame precompile writes) is refused before anything is allocated
    when the size is over ``max_bytes`` or implausible for the frame's length (a ratio above
    :data:`MAX_RATIO`), and otherwise decompressed in one call; zstd fails a frame that yields another size than
    its header states.  A frame that states no size is decompressed :data:`STEP` bytes at a time and refused as
    soon as it passes ``max_bytes``.  Only the first frame is decoded.

    Raises:
        InputLimitError: the frame decompresses (or says it does) to more than ``max_bytes`` bytes, or it cannot be
            allocated (``MemoryError``: a process under a memory limit).
        ValueError: truncated or garbled data.
    """
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as err:
        raise ValueError(f"not a zstd frame ({err})") from err
    if size > max_bytes:
        raise InputLimitError(f"{what}'s zstd frame says it holds {size} bytes, more than the {max_bytes} accepted; "
                              "refused before decompressing it")
    if size > len(frame) * MAX_RATIO + (1 << 20):
        raise ValueError(f"frame header claims {size} bytes for {len(frame)} bytes of input")
    try:
        if size >= 0:
            return zstandard.ZstdDecompressor().decompress(frame)
        reader = zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=False)
        pieces: list[bytes] = []
        total = 0
        while True:
            piece = reader.read(STEP)
            if not piece:
                break
            total += len(piece)
            if total > max_bytes:
                raise InputLimitError(f"{what} decompresses to more than the {max_bytes} bytes accepted; refused "
                                      "before the rest was decompressed")
            pieces.append(piece)
        return b"".join(pieces)
    except zstandard.ZstdError as err:
        raise ValueError(f"ZstdError: {err}") from err
    except MemoryError as err:
        raise InputLimitError(f"{what} of {size if size >= 0 else 'unstated'} bytes could not be allocated "
                              f"(MemoryError); refused") from err


def describe_mode(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``"a symbolic link"``, ``"a FIFO"``...), for messages."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return f"mode {oct(mode)}"
