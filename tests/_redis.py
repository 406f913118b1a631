"""Real ``redis-server`` processes for the tests: a standalone server on a free loopback port (and a unix
socket), and a 3-master Redis Cluster.  No fakes: the tests talk to Debian's redis-server (``.ci/run`` installs
it).  Each server lives in a temporary directory and is stopped (SIGKILL if need be) by its fixture."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tools._common import free_port  # the tools' search: each port handed out once per process

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def require_redis() -> str:
    """The redis-server path; fails (not skips) the test when it is missing, so CI cannot pass without it."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.fail("redis-server/redis-cli not found: install Debian's redis-server (apt-get install redis-server); "
                    ".ci/run does")
    return REDIS_SERVER


def make_tls_files(workdir: Path) -> dict[str, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 (openssl), for a TLS redis-server."""
    files = {name: workdir / f"{name}.pem" for name in ("ca", "ca_key", "cert", "key")}
    csr = workdir / "server.csr"
    ext = workdir / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *args: subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=precompile-test-ca",
        "-keyout", files["ca_key"], "-out", files["ca"])
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", files["key"], "-out", csr)
    run("x509", "-req", "-in", csr, "-CA", files["ca"], "-CAkey", files["ca_key"], "-CAcreateserial", "-days", "2",
        "-extfile", ext, "-out", files["cert"])
    return files


class RedisServer:
    """One redis-server process: TCP on 127.0.0.1:``port`` and a unix socket ``sock``; no persistence.  With
    ``tls=True`` the TCP port speaks TLS only (certificates from :func:`make_tls_files`, CA in ``tls_ca``)."""

    def __init__(self, workdir: Path, *extra: str, port: int | None = None, tls: bool = False):
        require_redis()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.sock = self.workdir / "redis.sock"
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.tls_ca: Path | None = None
        if tls:
            files = make_tls_files(self.workdir)
            self.tls_ca = files["ca"]
            self.extra += ["--tls-port", str(self.port), "--tls-cert-file", str(files["cert"]), "--tls-key-file",
                           str(files["key"]), "--tls-ca-cert-file", str(files["ca"]), "--tls-auth-clients", "no"]

    def start(self) -> RedisServer:
        cmd = [REDIS_SERVER, "--port", "0" if self.tls_ca else str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(self.workdir), "--unixsocket", str(self.sock), "--unixsocketperm", "700",
               "--protected-mode", "no", "--loglevel", "warning", "--logfile", str(self.workdir / "redis.log"),
               *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                log = (self.workdir / "redis.log").read_text() if (self.workdir / "redis.log").exists() else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log[-2000:]}")
            try:
                if self.client().ping():
                    return self
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    def url(self, path: str = "/0", **options: object) -> str:
        """``redis://127.0.0.1:port/db?options``."""
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"redis://127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    def client(self, **kwargs):
        import redis

        if self.tls_ca is not None:
            kwargs.update(ssl=True, ssl_ca_certs=str(self.tls_ca))
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)

    def pause(self) -> None:
        """SIGSTOP: the server holds its connections but answers nothing (a stalled Redis)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGKILL (after SIGCONT in case it was paused) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


class RedisCluster:
    """A Redis Cluster of real redis-server processes joined by ``redis-cli --cluster create``: ``masters`` masters
    with ``replicas`` replicas each (nodes ``0..masters-1`` start as masters), ``cluster-node-timeout`` of
    ``node_timeout_ms`` (a master silent that long is failed over to its replica)."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                 extra: tuple[str, ...] = ()):
        self.masters, self.replicas = masters, replicas
        self.nodes: list[RedisServer] = []
        ports: set[int] = set()
        for i in range(masters * (1 + replicas)):
            port = free_port()
            while port in ports or port + 10000 in ports or port - 10000 in ports:
                port = free_port()
            ports.add(port)
            d = Path(workdir) / f"node{i}"
            self.nodes.append(RedisServer(d, "--cluster-enabled", "yes", "--cluster-config-file",
                                          str(d / "nodes.conf"), "--cluster-node-timeout", str(node_timeout_ms),
                                          "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1", *extra,
                                          port=port))

    def start(self) -> RedisCluster:
        for n in self.nodes:
            n.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run([REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas),
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        self.wait_ok(60)
        return self

    def alive(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def info(self, node: RedisServer, section: str) -> dict:
        return node.client().info(section)

    def wait_ok(self, timeout_s: float = 30, replicas: int | None = None) -> None:
        """Until every live node says ``cluster_state:ok`` and every replica's link to its master is up (so that a
        blob written now reaches the replicas), with ``replicas`` replicas (default: as many as were created)."""
        want = self.masters * self.replicas if replicas is None else replicas
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                alive = self.alive()
                ok = all(self._field(n.client().execute_command("CLUSTER INFO"), "cluster_state") == "ok"
                         for n in alive)
                repl = [self.info(n, "replication") for n in alive]
                slaves = [r for r in repl if r.get("role") == "slave"]
                linked = all(r.get("master_link_status") == "up" for r in slaves)
                # and every node's slot map names the replicas (a client reads replicas from it)
                per_range = [len(r) - 2 for n in alive for r in n.client().execute_command("CLUSTER SLOTS")]
                if ok and len(slaves) >= want and linked and min(per_range, default=0) >= 1 + want // self.masters:
                    return
            except Exception:  # noqa: BLE001 - a node still starting
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ok after {timeout_s} s")
            time.sleep(0.1)

    @staticmethod
    def _field(info: object, name: str) -> str:
        if isinstance(info, dict):
            return str(info.get(name))
        text = info.decode() if isinstance(info, bytes) else str(info)
        for line in text.splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
        return ""

    def role(self, node: RedisServer) -> str:
        """``"master"`` or ``"slave"`` (as INFO replication says)."""
        return str(self.info(node, "replication").get("role"))

    def master_of(self, replica: RedisServer) -> RedisServer:
        port = int(self.info(replica, "replication")["master_port"])
        return next(n for n in self.nodes if n.port == port)

    def masters_now(self) -> list[RedisServer]:
        return [n for n in self.alive() if self.role(n) == "master"]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        return [n for n in self.alive() if self.role(n) == "slave" and self.master_of(n) is master]

    def node_of(self, key: str) -> RedisServer:
        """The live master serving ``key``'s slot now."""
        slot = int(self.alive()[0].client().execute_command("CLUSTER KEYSLOT", key))
        for n in self.masters_now():
            for start, end, *_ in n.client().execute_command("CLUSTER SLOTS"):
                if start <= slot <= end and _[0][1] == n.port:
                    return n
        raise RuntimeError(f"no master serves slot {slot}")

    def url(self, via: RedisServer | None = None, **options: object) -> str:
        """``redis://127.0.0.1:<port of node 0, or of via>/?cluster=1&options``."""
        query = "&".join(f"{k}={v}" for k, v in {"cluster": 1, **options}.items())
        return f"redis://127.0.0.1:{(via or self.nodes[0]).port}/?{query}"

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
