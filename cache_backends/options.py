"""Parsers for cache URL query options (``?read_only=1&ttl=3600``): each takes the option's name and raw text
and returns the value, or raises :class:`~precompile.errors.CacheURLError` naming the option and what it accepts."""

from __future__ import annotations

import math

from cache_backends.redaction import redact_url
from precompile.errors import CacheURLError


def parse_bool(name: str, raw: str) -> bool:
    """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``/empty."""
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise CacheURLError(f"cache URL option {name}= must be 1/0/true/false, got {raw!r}")


#: Upper bounds of numeric options (each error names its option's range): ages (a TTL, an eviction grace) up to
#: ten years; waits and lease lengths up to a day; socket timeouts and retry windows up to an hour; sizes up to
#: 1 EiB (a cache cap) or 512 MiB (a Redis chunk: Redis's largest string).  Larger values mean nothing more, and
#: overflowed a timeval, a millisecond count or an int conversion (``ttl=1e306``: OverflowError).
AGE_S = 10 * 365 * 86_400.0
WAIT_S = 86_400.0
TIMEOUT_S = 3_600.0
MAX_SIZE = 1 << 60
MAX_CHUNK = 512 << 20
#: zstd's levels (zstandard refuses more than 22; negative levels are its fast modes, down to -131072).
LEVELS = (-(1 << 17), 22)


def _span(seconds: float) -> str:
    for unit, size in (("years", 365 * 86_400), ("day", 86_400), ("hour", 3_600)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _bytes(n: int) -> str:
    for unit, size in (("EiB", 1 << 60), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def parse_positive_int(name: str, raw: str, most: int = MAX_SIZE) -> int:
    """An integer > 0 and at most ``most`` (bytes, counts)."""
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:  # not an integer, or more digits than int() reads
        value = 0
    if not 0 < value <= most:
        raise CacheURLError(f"cache URL option {name}= must be a positive integer (bytes) of at most {most} "
                            f"({_bytes(most)}), got {raw!r}")
    return value


def parse_seconds(name: str, raw: str, most: float = WAIT_S, *, positive: bool = False) -> float:
    """A finite number of seconds >= 0 (> 0 with ``positive``) and at most ``most``; NaN and infinities refused."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not ((value > 0 if positive else value >= 0) and value <= most):
        raise CacheURLError(f"cache URL option {name}= must be a number of seconds {'>' if positive else '>='} 0 and "
                            f"at most {most:.0f} ({_span(most)}), got {raw!r}")
    return value


def parse_positive_seconds(name: str, raw: str, most: float = WAIT_S) -> float:
    """A number of seconds > 0 and at most ``most``."""
    return parse_seconds(name, raw, most, positive=True)


def parse_level(name: str, raw: str) -> int:
    """An integer zstd compression level, from -131072 to 22 (:data:`LEVELS`)."""
    try:
        value = int(raw)
    except ValueError:
        value = LEVELS[1] + 1
    if not LEVELS[0] <= value <= LEVELS[1]:
        raise CacheURLError(f"cache URL option {name}= must be an integer zstd level from {LEVELS[0]} to {LEVELS[1]}, "
                            f"got {raw!r}")
    return value


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


def parse_size(name: str, raw: str, most: int = MAX_CHUNK) -> int:
    """A positive size in bytes, at most ``most``: ``4194304``, ``4MiB``, ``512KiB``, ``1GiB`` (``k``/``m``/``g``
    are binary)."""
    text = raw.strip().lower().replace("_", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    try:
        number = float(digits) * _SIZE_UNITS[unit] if digits else 0.0
    except (KeyError, ValueError):
        number = 0.0
    if not 1 <= number <= most:  # NaN and infinities too
        raise CacheURLError(f"cache URL option {name}= must be a size in bytes from 1 to {most} ({_bytes(most)}), "
                            f"such as 4194304 or 4MiB, got {raw!r}")
    return int(number)


def parse_int_range(name: str, raw: str, lowest: int, most: int) -> int:
    """An integer from ``lowest`` to ``most``."""
    try:
        value = int(raw.strip())
    except ValueError:
        value = lowest - 1
    if not lowest <= value <= most:
        raise CacheURLError(f"cache URL option {name}= must be an integer from {lowest} to {most}, got {raw!r}")
    return value


def parse_prefix(name: str, raw: str) -> str:
    """A key prefix: 1-64 printable characters, without ``{``, ``}`` (hash tags) or whitespace."""
    if not (0 < len(raw) <= 64) or any(c in "{} \t\r\n" or not c.isprintable() for c in raw):
        raise CacheURLError(f"cache URL option {name}= must be 1-64 printable characters without braces or "
                            f"spaces, got {raw!r}")
    return raw


def parse_nodes(name: str, raw: str) -> tuple[tuple[str, int], ...]:
    """Comma-separated ``host:port`` pairs (at most 64; a port in 1-65535), e.g. ``cache-1:6379,cache-2:6379``."""
    nodes = []
    for item in (p.strip() for p in raw.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/?#@ "):
            shown = redact_url(f"?nodes={item}")[len("?nodes="):]  # an entry's password never shows
            raise CacheURLError(f"cache URL option {name}= must list host:port pairs separated by commas, got "
                                f"{shown!r} in {redact_url(f'?nodes={raw}')[len('?nodes='):]!r}")
        nodes.append((host.strip("[]"), int(port)))
    if len(nodes) > 64:
        raise CacheURLError(f"cache URL option {name}= lists {len(nodes)} nodes; at most 64")
    return tuple(nodes)
