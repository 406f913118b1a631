"""Probes of untrusted reads in fresh processes, under a memory limit: what the bounded-read tests share.

A probe is a snippet run by :func:`conftest.run_python` (its own interpreter, killed at a deadline) that calls
:func:`measure` on the one operation under test.  ``measure`` first caps the process's address space
(``RLIMIT_AS``, as ``ulimit -v`` does) at its current size plus :data:`BUDGET` bytes, and resets its peak resident
size (``/proc/self/clear_refs``), then runs the operation and prints one JSON line: the seconds it took, how far its
peak resident size grew (MiB), the exception it raised (its type, its cause's type, its message) or its value.
A read that hangs never prints: the deadline kills it and the test fails.

Budget, measured on the CPU test box (``MALLOC_ARENA_MAX=2``, :data:`ENV`, so that threads do not reserve an arena
each): a process with torch and precompile imported holds 0.61 GiB of address space; after a Dynamo capture and an
Inductor compile of the tests' MLP and a call, 0.86 GiB (peak 0.88 GiB, 0.38 GiB resident).  :data:`BUDGET` (3 GiB)
above what the process holds when ``measure`` starts leaves that rebuild room to spare, and a 1 GiB inflation would
fit in it: what the probes check is the peak resident growth, reported by ``measure``, against the bound.
"""

from __future__ import annotations

import json
from typing import Any

from conftest import run_python

#: Bytes of address space a probe may take above what it holds when :func:`measure` starts.
BUDGET = 3 << 30
#: Environment of every probe.
ENV = {"MALLOC_ARENA_MAX": "2", "PRECOMPILE_VERIFY_KEYS": None, "PRECOMPILE_SIGNING_KEY": None}
#: Seconds a probed read may take: the issue's bound on what used to hang.
DEADLINE_S = 10.0

PRELUDE = f'''
import json, os, resource, sys, time

def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)

def measure(fn, budget={BUDGET}):
    """Run fn() under RLIMIT_AS = address space now + budget; print one JSON line about it."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = _status("VmSize") + budget
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    start = time.monotonic()
    try:
        value, error = fn(), None
    except BaseException as err:  # MemoryError and RecursionError included: the probe reports them
        value, error = None, err
    seconds = time.monotonic() - start
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    out = {{"seconds": seconds, "grew_mib": (_status("VmHWM") - base) / 2**20, "value": value,
           "error": type(error).__name__ if error is not None else None,
           "cause": type(error.__cause__).__name__ if error is not None and error.__cause__ is not None else None,
           "message": str(error)[:400] if error is not None else None}}
    print(json.dumps(out, default=repr), flush=True)
    return value
'''


def probe(code: str, *args: str, env: dict[str, str | None] | None = None, timeout: float = 120) -> list[Any]:
    """Run ``code`` (after :data:`PRELUDE`, so it may call ``measure``) in a fresh process; returns every JSON line
    it printed, in order (one per ``measure``).

    Raises:
        AssertionError: the process failed or ran past ``timeout`` seconds (a read that hangs).
    """
    out = run_python(PRELUDE + code, *args, env={**ENV, **(env or {})}, timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def assert_refused(result: dict[str, Any], error: str | None, *, cause: str | None = None, max_grew_mib: float = 128,
                   what: str = "") -> None:
    """``result`` (a :func:`measure` line) raised ``error`` (a type name; None: returned) with ``cause``, within
    :data:`DEADLINE_S` seconds, and its peak resident size grew by at most ``max_grew_mib`` MiB."""
    assert result["error"] == error, f"{what}: expected {error}, got {result['error']}: {result['message']}"
    if cause is not None:
        assert result["cause"] == cause, f"{what}: expected a cause {cause}, got {result['cause']}: {result['message']}"
    assert result["seconds"] < DEADLINE_S, f"{what}: took {result['seconds']:.1f} s"
    assert result["grew_mib"] <= max_grew_mib, f"{what}: the peak resident size grew by {result['grew_mib']:.0f} MiB"


def zstd_bomb(n: int, *, with_size: bool = True, prefix: bytes = b"") -> bytes:
    """A zstd frame of ``prefix`` and then zero bytes, ``n`` bytes in all (~32 KiB per GiB), its header stating that
    size or none; made in 1 MiB steps, never holding ``n`` bytes."""
    import zstandard

    step = b"\0" * (1 << 20)
    comp = zstandard.ZstdCompressor(write_content_size=with_size).compressobj(size=n if with_size else -1)
    out = [comp.compress(prefix)]
    left = n - len(prefix)
    while left > 0:
        out.append(comp.compress(step[:min(left, len(step))]))
        left -= len(step)
    out.append(comp.flush())
    return b"".join(out)
