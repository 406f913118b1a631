"""Anonymous in-memory files, so that carried binaries are loaded without ever being written to a path."""

from __future__ import annotations

import os

_OPEN: list[int] = []


def memfd(data: bytes, label: str, keep: bool = True) -> tuple[int, str]:
    """``(fd, /proc/self/fd path)`` of an anonymous in-memory file (``memfd_create``) holding ``data``.

    A ``keep`` fd stays open for the life of the process: dlopen() recognizes an already loaded library by its
    path string, so a closed and reused /proc/self/fd/N would hand back another library.

    Raises:
        OSError: the kernel refused (no memfd support, out of memory).
    """
    fd = os.memfd_create(label, getattr(os, "MFD_CLOEXEC", 0))
    if keep:
        _OPEN.append(fd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return fd, f"/proc/self/fd/{fd}"
