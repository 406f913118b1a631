"""What a bundle reads from its JSON blobs (:mod:`precompile.ops.bundle`): the digests a blob names, the parts a
manifest lists with their sizes, the key a manifest names.  Every blob is untrusted until checked: each parse is
bounded (:func:`cache_backends.bounded.loads_json`: a manifest at most
:data:`~cache_backends.bounded.MAX_MANIFEST_BYTES`, every document at most the JSON depth bound), so a header or a
blob nested 200,000 deep is an :class:`~precompile.errors.InputLimitError`, never a ``RecursionError``.
"""

from __future__ import annotations

from typing import Any

from cache_backends.base import HEX64
from cache_backends.bounded import MAX_BLOB_BYTES, MAX_MANIFEST_BYTES, loads_json
from precompile.errors import InputLimitError


def parse(data: bytes, max_bytes: int) -> Any:
    """``data`` parsed as JSON (bounded: :func:`cache_backends.bounded.loads_json`), or None when it is not JSON.

    Raises:
        InputLimitError: it is longer than ``max_bytes`` or nested deeper than the JSON bound.
    """
    try:
        return loads_json(data, max_bytes, "bundle blob")
    except InputLimitError:
        raise
    except (ValueError, UnicodeDecodeError):
        return None


def digests_in(data: bytes) -> set[str]:
    """Every 64-hex string in ``data`` when it is a JSON object (keys and values, at any depth), else none (a
    document over the JSON bounds names none)."""
    if not data.lstrip()[:1] == b"{":
        return set()
    try:
        doc = parse(data, MAX_BLOB_BYTES)
    except InputLimitError:
        return set()
    found: set[str] = set()
    stack: list[Any] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.update(k for k in item if isinstance(k, str) and HEX64.match(k))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and HEX64.match(item):
            found.add(item)
    return found


def required_parts(data: bytes) -> dict[str, int]:
    """The parts a manifest says it has (its ``blobs`` object), each with the size it records (else
    :data:`~cache_backends.bounded.MAX_BLOB_BYTES`): these must be in a bundle.

    Raises:
        InputLimitError: the manifest is over :data:`~cache_backends.bounded.MAX_MANIFEST_BYTES` or the JSON depth.
    """
    doc = parse(data, MAX_MANIFEST_BYTES)
    blobs = doc.get("blobs") if isinstance(doc, dict) else None
    if not isinstance(blobs, dict):
        return {}
    sizes = {d: (i.get("size") if isinstance(i, dict) else None) for d, i in blobs.items()
             if isinstance(d, str) and HEX64.match(d)}
    return {d: n if type(n) is int and 0 <= n else MAX_BLOB_BYTES for d, n in sizes.items()}


def manifest_key(data: bytes) -> str | None:
    """The key a manifest names, or None.

    Raises:
        InputLimitError: as :func:`required_parts`.
    """
    doc = parse(data, MAX_MANIFEST_BYTES)
    return doc.get("key") if isinstance(doc, dict) and "schema" in doc and isinstance(doc.get("key"), str) else None
