"""Fixtures shared by the test suite: an isolated environment, fresh-process helpers, compiled artifacts.

- Every environment variable precompile, Inductor and Triton read for a location points into a temporary
  directory (``XDG_CACHE_HOME``, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``; ``PRECOMPILE_CACHE`` unset), for
  the whole session (module- and session-scoped fixtures compile before function-scoped fixtures run) and, for
  ``XDG_CACHE_HOME``, per test.
- :func:`run_python` / :func:`spawn_python` run a snippet in a fresh interpreter (this venv, ``tests/`` importable)
  with a given environment and working directory: fresh-process loads and key stability use real processes.
- :func:`artifacts` compiles each graph kind of ``tests/_graphs.py`` once per session (an Inductor CPU compile
  costs seconds) through a session cache, so that cache tests start from stored entries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

if str(TESTS) not in sys.path:  # ``import _graphs`` in test modules, as in their subprocesses
    sys.path.insert(0, str(TESTS))
# the per-package folders too, so that a test module borrowing from another (``from test_sdpa import Attention``)
# imports it whichever tests run; test file names are unique across folders
for _folder in sorted(TESTS.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


# ---------------------------------------------------------------------------------------------- environment
@pytest.fixture(scope="session")
def session_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("env")
    dirs = {name: root / name for name in ("xdg", "inductor", "triton", "cache")}
    for d in dirs.values():
        d.mkdir()
    return dirs


@pytest.fixture(scope="session", autouse=True)
def _isolated_session_environment(session_dirs):
    """Caches and Inductor's files go to a session temp dir; nothing reads ``PRECOMPILE_CACHE`` from the caller."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(session_dirs["xdg"]))
        mp.delenv("PRECOMPILE_CACHE", raising=False)
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(session_dirs["inductor"]))
        mp.setenv("TRITON_CACHE_DIR", str(session_dirs["triton"]))
        yield


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch, tmp_path):
    """Per test: the default local cache (``$XDG_CACHE_HOME/precompile``) is the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PRECOMPILE_CACHE", raising=False)


# ------------------------------------------------------------------------------------------ fresh processes
def python_env(env: dict[str, str | None] | None = None) -> dict[str, str]:
    """``os.environ`` with ``tests/`` and the repository on ``PYTHONPATH``, then ``env`` applied (None unsets)."""
    out = dict(os.environ)
    paths = [str(TESTS), str(REPO)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    out.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    for name, value in (env or {}).items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


@dataclass
class Proc:
    """A running snippet; :meth:`wait` returns its stdout and fails the test on a non-zero exit."""

    popen: subprocess.Popen
    what: str
    timeout: float
    stdout: str = ""
    stderr: str = field(default="", repr=False)

    def wait(self) -> str:
        try:
            self.stdout, self.stderr = self.popen.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.stdout, self.stderr = self.popen.communicate()
            raise AssertionError(f"{self.what} timed out after {self.timeout} s\n--- stderr:\n{self.stderr[-4000:]}")
        if self.popen.returncode != 0:
            raise AssertionError(f"{self.what} exited with {self.popen.returncode}\n--- stdout:\n"
                                 f"{self.stdout[-2000:]}\n--- stderr:\n{self.stderr[-6000:]}")
        return self.stdout

    def json(self) -> Any:
        """The last stdout line, parsed as JSON (after :meth:`wait`)."""
        lines = [line for line in (self.stdout or self.wait()).splitlines() if line.strip()]
        assert lines, f"{self.what} printed nothing; stderr:\n{self.stderr[-4000:]}"
        return json.loads(lines[-1])


def spawn_python(code: str, *args: str, env: dict[str, str | None] | None = None, cwd: str | Path | None = None,
                 prefix: list[str] | tuple[str, ...] = (), timeout: float = 300) -> Proc:
    """Start ``python -c code args...`` (this interpreter) in a fresh process; see :func:`run_python`."""
    cmd = [*prefix, sys.executable, "-c", code, *map(str, args)]
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env(env),
                             cwd=str(cwd) if cwd is not None else None)
    return Proc(popen, f"subprocess {' '.join(cmd[:len(prefix) + 1])} -c <snippet> {' '.join(map(str, args))}",
                timeout)


def run_python(code: str, *args: str, env: dict[str, str | None] | None = None, cwd: str | Path | None = None,
               prefix: list[str] | tuple[str, ...] = (), timeout: float = 300) -> str:
    """Run ``code`` in a fresh Python process and return its stdout.

    Args:
        code: the snippet (``sys.argv[1:]`` are ``args``); ``tests/`` is importable (``import _graphs``).
        env: changes to this process's environment (a None value unsets the variable).
        cwd: working directory (default: this process's).
        prefix: command prefix, e.g. ``["setpriv", "--reuid=nobody", ...]`` or ``["unshare", "--uts", ...]``.
        timeout: seconds before the process is killed and the test fails.

    Raises:
        AssertionError: the process failed or timed out (its stderr is in the message).
    """
    return spawn_python(code, *args, env=env, cwd=cwd, prefix=prefix, timeout=timeout).wait()


# ----------------------------------------------------------------------------------------------- privileges
def without_root_powers() -> list[str] | None:
    """Command prefix under which a process is subject to file permissions: ``[]`` when not root, a ``setpriv``
    prefix dropping CAP_DAC_OVERRIDE & co. when root, None when neither is possible here."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "pass"], capture_output=True)
    return prefix if probe.returncode == 0 else None


# --------------------------------------------------------------------------------------- outputs compared
def assert_same_output(got: Any, want: Any, *, rtol: float = 1e-4, atol: float = 1e-5, where: str = "output") -> None:
    """``got`` has the structure of ``want`` (same container types and lengths) and allclose tensors."""
    import torch

    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: expected a tensor, got {type(got).__name__}"
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{where}: {tuple(got.shape)} {got.dtype} != {tuple(want.shape)} {want.dtype}"
        torch.testing.assert_close(got.detach(), want.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{where}: {m}")
        return
    assert type(got) is type(want), f"{where}: expected a {type(want).__name__}, got a {type(got).__name__}"
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: {len(got)} elements, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_output(g, w, rtol=rtol, atol=atol, where=f"{where}[{i}]")
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_same_output(got[k], want[k], rtol=rtol, atol=atol, where=f"{where}[{k!r}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


# ------------------------------------------------------------------------------------ compiled artifacts
@dataclass
class Compiled:
    """One graph kind compiled once: the graph, its example inputs, eager outputs and the artifact."""

    kind: str
    gm: Any
    inputs: list[Any]
    expected: Any
    art: Any
    model: Any


class Artifacts:
    """Session-wide, compile-on-first-use store of :class:`Compiled` per graph kind (see module docstring)."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir
        self.cache_url = "file://" + str(cache_dir)
        self._done: dict[str, Compiled] = {}

    def cache_dir_for(self, kind: str) -> Path:
        """The session cache a kind is built through.  ``export_no_grad`` has its own: its graph (and so its key)
        may equal ``export``'s, and through a shared cache it would be a hit, never compiled."""
        if kind == "export_no_grad":
            return self.cache_dir.with_name(self.cache_dir.name + "-no-grad")
        return self.cache_dir

    def cache_url_for(self, kind: str) -> str:
        return "file://" + str(self.cache_dir_for(kind))

    def __call__(self, kind: str) -> Compiled:
        if kind not in self._done:
            import torch

            import _graphs
            import precompile

            model = _graphs.mlp()
            gm, inputs = _graphs.graph(kind, model)
            with torch.no_grad():
                expected = gm(*inputs)
            art = precompile.standalone_compile(gm, inputs, cache=self.cache_url_for(kind))
            self._done[kind] = Compiled(kind, gm, inputs, expected, art, model)
        return self._done[kind]


@pytest.fixture(scope="session")
def artifacts(session_dirs, _isolated_session_environment) -> Artifacts:
    """``artifacts(kind)``: the session's compiled artifact of a ``tests/_graphs.py`` graph kind.

    Each was built through the session cache ``artifacts.cache_url`` (a get-or-build miss that stored it); tests
    that damage a cache work on a copy (:func:`cache_copy`).
    """
    return Artifacts(session_dirs["cache"])


@pytest.fixture
def cache_copy(artifacts, tmp_path):
    """A copy of the session cache directory holding one ref, the ``"dynamo"`` artifact's, for tests that damage
    it (other tests' artifacts in the session cache are unreferenced there; their blobs stay)."""

    def copy() -> Path:
        from cache_backends.local.cache import LocalCache

        key = artifacts("dynamo").art.key
        dest = tmp_path / "cache-copy"
        shutil.copytree(artifacts.cache_dir, dest)
        cache = LocalCache(dest)
        for other in [k for k, _ in cache.iter_refs() if k != key]:
            cache.delete_ref(other)
        cache.close()
        return dest

    return copy


def pytest_configure(config):
    # torch's own deprecation noise when a GraphModule with pytree specs is deep-copied (torch 2.13)
    config.addinivalue_line("filterwarnings", "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


# ------------------------------------------------------------------------------------------------- Redis
@pytest.fixture
def redis_server(tmp_path):
    """A fresh real redis-server on a free loopback port (and a unix socket), stopped after the test."""
    from _redis import RedisServer

    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real Redis Cluster of 3 masters with one replica each, shared by the session (tests use distinct key
    prefixes, and none stops a node: tests/store/test_cluster_faults.py starts its own)."""
    from _redis import RedisCluster

    cluster = RedisCluster(tmp_path_factory.mktemp("cluster"), replicas=1).start()
    yield cluster
    cluster.stop()
