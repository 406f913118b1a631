"""What every command shares: sizes in words, consoles, tables and text that never read cache contents as markup,
the ``--cache`` option, opening a cache."""

from __future__ import annotations

import functools
import json
import re
import shutil
from typing import Any

import click

from precompile.errors import ArtifactFormatError


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def console():
    """A rich console on stdout, at least 100 columns wide (tables are not squeezed in a narrow pipe)."""
    from rich.console import Console

    return Console(soft_wrap=False, width=max(100, shutil.get_terminal_size((140, 40)).columns))


def console_err():
    """A rich console on stderr (progress bars)."""
    from rich.console import Console

    return Console(stderr=True)


#: Characters that could drive a terminal (C0 and C1 controls, DEL), and lone surrogates (``"\udc80"`` in stored
#: JSON): shown escaped, never written as they are.  A surrogate cannot be encoded as UTF-8 (a strict stdout raised
#: UnicodeEncodeError for the whole listing), and ``surrogateescape`` would write it as a raw byte (``\udc9b`` as
#: 0x9b, an 8-bit terminal's CSI).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def clean(text: str) -> str:
    """``text`` with its control characters (but newlines and tabs) and lone surrogates shown escaped (``\\x1b``,
    ``\\udc80``): stored text written to a terminal never drives it, and always encodes."""
    return _CONTROLS.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: Any, limit: int | None = None):
    """``value`` (a string as is, anything else as ``str``) as rich text that is never read as markup or emoji
    codes, control characters shown escaped (``\\x1b``), cut to ``limit`` characters: how stored text (cache
    contents, an artifact's fields) is printed."""
    from rich.text import Text

    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        text = text[:max(0, limit - 3)] + "..."
    return Text(clean(text))


@functools.lru_cache(maxsize=1)
def _plain_table():
    from rich.table import Table

    class PlainTable(Table):
        """A rich table whose string cells are :func:`plain` text (they hold cache contents); cells that should
        be styled are given as ``rich.text.Text``."""

        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            super().add_row(*(plain(r) if isinstance(r, str) else r for r in renderables), **kwargs)

    return PlainTable


def table(title: Any, columns: list[str], right: tuple[str, ...] = (), caption: str | None = None):
    """A rich table with ``columns`` (those in ``right`` right-aligned) whose string cells and title are plain
    text, never markup (:func:`plain`)."""
    t = _plain_table()(title=plain(title) if isinstance(title, str) else title, caption=caption)
    for col in columns:
        t.add_column(col, justify="right" if col in right else "left")
    return t


def echo_json(value: Any) -> None:
    """Print ``value`` as one line of JSON on stdout."""
    click.echo(json.dumps(value, sort_keys=True))


cache_option = click.option("--cache", "cache_url", default=None, metavar="URL",
                            help="Cache URL (default: $PRECOMPILE_CACHE, else the local cache under $XDG_CACHE_HOME).")


def open_existing(url: str | None):
    """Open a cache that must exist already and answer (for commands that read or tidy it): nothing is created,
    and an unreachable tier is an error now rather than an empty answer.

    Raises:
        CacheURLError: the URL is malformed.
        TrustConfigError: a verify or signing key setting (the environment's or the URL's) is wrong or names no key.
        CacheUnavailableError: the directory does not exist, or a tier does not answer.
    """
    from cache_backends.registry import probe
    from precompile.store.opening import open_with_policy

    cache, _ = open_with_policy(url, create=False)  # a key setting that is wrong fails every command, before a read
    probe(cache)
    return cache


def open_for_write(url: str | None):
    """Open (and create where needed) a cache a command writes into, checking that every tier answers.

    Raises:
        CacheURLError: the URL is malformed.
        TrustConfigError: a verify or signing key setting (the environment's or the URL's) is wrong or names no key.
        CacheUnavailableError: a tier does not answer.
    """
    from cache_backends.registry import probe
    from precompile.store.opening import open_with_policy

    cache, _ = open_with_policy(url)
    probe(cache)
    return cache


def progress_bar(label: str, disable: bool = False, transient: bool = False):
    """A rich progress bar on stderr: ``with progress_bar("verify") as (bar, task): bar.update(task, ...)``; a
    ``transient`` one is erased when it ends."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(f"[bold]{escape(label)}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}", markup=False), console=console_err(), disable=disable, transient=transient)


def checked_source(source: Any) -> Any:
    """``source`` (a :class:`precompile.store.lookup.Source`) if its manifest is well formed.

    Raises:
        ArtifactFormatError: it is malformed (``inspect`` shows what it holds).
    """
    if source.problem is not None:
        raise ArtifactFormatError(f"artifact {source.key} ({source.where}) is malformed: {source.problem}; "
                                  "precompile inspect shows what it holds")
    return source


def lazy_opener(cache_url: str | None):
    """A function that opens the cache ``cache_url`` names (:func:`open_existing`) on its first call, once."""
    opened: list[Any] = []

    def get():
        if not opened:
            opened.append(open_existing(cache_url))
        return opened[0]

    return get
