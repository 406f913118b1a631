"""What the scripts of ``tools/`` share: a fresh child process that answers with one JSON line, waiting for the
GPU before a clock is read, and a free loopback port.

A benchmark measures in fresh processes: it runs itself (or ``python -c CODE``) again with a hidden option that
names the child's part (:func:`child_flag`: ``--phase build``, ``--scenario plain``...); the child prints its
result as the last line of its stdout that starts with ``{``, which :func:`run_child` parses.

Nothing here imports torch until :func:`sync` is called: the fetch-only clients of ``tools/bench/fleet/`` and the
parents of most benchmarks never import it.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Ports :func:`free_port` handed out already in this process.  One is never handed out twice: a cache keeps a
#: server's circuit breaker by address (cache_backends/redis/health.py), so a fresh server on the port of one stopped
#: earlier in the process would be failed fast as "down" for ``down_s``.
_HANDED_OUT: set[int] = set()


def free_port(below: int = 55000) -> int:
    """A TCP port free on 127.0.0.1 now and not handed out before by this process, below ``below``, with
    ``port + 10000`` free too (a Redis Cluster node's bus port).

    Raises:
        RuntimeError: 200 ports the kernel offered were all unfit.
    """
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= below or port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port pair found")


def sync(device: str | None = None) -> None:
    """Wait until the GPU has run the work queued so far, so that a clock read next counts it: on ``device``'s
    kind (nothing for ``"cpu"``, which returns before any import), or with ``device=None`` wherever this process
    has initialized CUDA."""
    if device is not None and not device.startswith("cuda"):
        return
    import torch

    if device is not None or torch.cuda.is_initialized():
        torch.cuda.synchronize()


def child_flag(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """Add the option ``flags`` by which a script tells a fresh process of itself which part to run, hidden from
    ``--help`` (``kwargs`` as for ``add_argument``; the default value is None)."""
    parser.add_argument(*flags, default=kwargs.pop("default", None), help=argparse.SUPPRESS, **kwargs)


class ChildFailed(RuntimeError):
    """A child process exited with a non-zero status or printed no JSON line; ``str()`` says which, in one line.

    Attributes:
        returncode: its exit status.
        stdout, stderr: all it printed (callers show a tail).
    """

    def __init__(self, what: str, returncode: int, stdout: str, stderr: str) -> None:
        why = f"failed with exit code {returncode}" if returncode else "printed no JSON line"
        super().__init__(f"{what} {why}")
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def self_command(script: str, *args: str) -> list[str]:
    """The command that runs ``script`` (a ``__file__``) again in a fresh process with ``args``."""
    return [sys.executable, str(Path(script).resolve()), *args]


def start_child(cmd: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None) -> subprocess.Popen:
    """Start ``cmd``, its stdout and stderr piped as text; :func:`finish_child` reads its answer."""
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def answer(what: str, returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """A finished child's answer: the JSON object of the last line of its ``stdout`` that starts with ``{``.

    Raises:
        ChildFailed: ``returncode`` is not 0, or there is no such line (``what`` names the child in the message).
    """
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        raise ChildFailed(what, returncode, stdout, stderr)
    return json.loads(lines[-1])


def finish_child(proc: subprocess.Popen, what: str, timeout: float | None = None) -> dict[str, Any]:
    """Wait for ``proc`` (from :func:`start_child`) and return its :func:`answer`.

    Raises:
        ChildFailed: as :func:`answer`.
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds; it is killed first.
    """
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return answer(what, proc.returncode, out, err)


def run_child(cmd: list[str], what: str, env: dict[str, str] | None = None, timeout: float | None = None,
              cwd: str | Path | None = None) -> dict[str, Any]:
    """Run ``cmd`` in a fresh process and return its answer: :func:`finish_child` of :func:`start_child`, with the
    same errors."""
    return finish_child(start_child(cmd, env, cwd), what, timeout)
