"""Parsers for cache URL query options (``?read_only=1&ttl=3600``): each takes the option's name and raw text
and returns the value, or raises :class:`~precompile.errors.CacheURLError` naming the option and what it accepts."""

from __future__ import annotations

from precompile.errors import CacheURLError


def parse_bool(name: str, raw: str) -> bool:
    """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``/empty."""
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise CacheURLError(f"cache URL option {name}= must be 1/0/true/false, got {raw!r}")


def parse_positive_int(name: str, raw: str) -> int:
    """An integer > 0 (bytes, counts)."""
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise CacheURLError(f"cache URL option {name}= must be a positive integer (bytes), got {raw!r}")
    return value


def parse_seconds(name: str, raw: str) -> float:
    """A finite number of seconds >= 0."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise CacheURLError(f"cache URL option {name}= must be a number of seconds >= 0, got {raw!r}")
    return value


def parse_level(name: str, raw: str) -> int:
    """An integer zstd compression level."""
    try:
        return int(raw)
    except ValueError:
        raise CacheURLError(f"cache URL option {name}= must be an integer zstd level, got {raw!r}") from None


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


def parse_size(name: str, raw: str) -> int:
    """A positive size in bytes: ``4194304``, ``4MiB``, ``512KiB``, ``1GiB`` (``k``/``m``/``g`` are binary)."""
    text = raw.strip().lower().replace("_", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    try:
        value = int(float(digits) * _SIZE_UNITS[unit]) if digits else 0
    except (KeyError, ValueError):
        value = 0
    if value <= 0:
        raise CacheURLError(f"cache URL option {name}= must be a positive size in bytes such as 4194304 or 4MiB, "
                            f"got {raw!r}")
    return value


def parse_positive_seconds(name: str, raw: str) -> float:
    """A number of seconds > 0."""
    value = parse_seconds(name, raw)
    if value <= 0:
        raise CacheURLError(f"cache URL option {name}= must be a number of seconds > 0, got {raw!r}")
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
            raise CacheURLError(f"cache URL option {name}= must list host:port pairs separated by commas, got "
                                f"{item!r} in {raw!r}")
        nodes.append((host.strip("[]"), int(port)))
    if len(nodes) > 64:
        raise CacheURLError(f"cache URL option {name}= lists {len(nodes)} nodes; at most 64")
    return tuple(nodes)
