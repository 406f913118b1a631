"""Helpers for the command-line tests: run ``precompile`` in a real process, and store a variant of an artifact.

A variant is how a test fakes an artifact built elsewhere (another torch, another input dtype) without that
machine: the stored manifest is edited, its key recomputed from its factors (``key = sha256(canonical JSON of the
factors)``), and it is stored under that key, as a builder there would have stored it.  Its blobs are the
original's (content-addressed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from conftest import REPO, python_env

RECIPE = "tests.fixtures_models:tiny_mlp"


def cli(*args: str, env: dict | None = None, check: bool = True, cwd: str | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m precompile ARGS`` in a fresh process (tests/cli/test_cli.py runs the console script)."""
    proc = subprocess.run([sys.executable, "-m", "precompile", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=python_env(env), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"precompile {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def cli_json(*args: str, **kwargs: Any) -> Any:
    """``cli(*args, "--json")`` parsed (the last stdout line)."""
    proc = cli(*args, "--json", **kwargs)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a failed command printed on stderr (asserting it is one line and nothing else)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    assert lines[0].startswith("Error: "), lines[0]
    return lines[0]


def store_variant(url: str, key: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """Store the artifact ``key`` of cache ``url`` again with its manifest changed by ``edit(manifest)``; returns
    the variant's key (computed from its edited factors)."""
    from cache_backends.base import digest_bytes
    from cache_backends.registry import open_cache
    from precompile.key.graph import canonical_json

    cache = open_cache(url)
    manifest = json.loads(cache.get_blob(cache.get_ref(key)))
    edit(manifest)
    manifest["key"] = digest_bytes(canonical_json(manifest["factors"]))
    cache.set_ref(manifest["key"], cache.put_blob(json.dumps(manifest, sort_keys=True, indent=1).encode()))
    return manifest["key"]


def user_input(manifest: dict[str, Any]) -> int:
    """Index of the first user input (not a weight) among the placeholders."""
    return next(i for i, p in enumerate(manifest["placeholders"]) if p["kind"] == "user_input")
