"""Redis targets started by the benchmark on loopback ports: one ``redis-server``, or a Redis Cluster of masters
with replicas (``redis-cli --cluster create ... --cluster-replicas 1``), and a sampler of their INFO.

Every node runs without persistence in its own directory and is killed (SIGCONT first, in case a fault stopped
it) when its target closes.  Per node the benchmark reads ``INFO stats`` (``total_net_output_bytes`` less
``total_net_repl_output_bytes``: bytes sent to clients; Redis 7.0 counts the replication stream in both), ``INFO cpu``
(``used_cpu_sys + used_cpu_user``) and ``INFO clients`` (``connected_clients``, which excludes replicas' links).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tools._common import free_port

log = logging.getLogger("bench_fleet")


def require(exe: str) -> str:
    path = shutil.which(exe)
    if path is None:
        raise SystemExit(f"{exe} not found (apt-get install redis-server)")
    return path


class Node:
    """One redis-server process on 127.0.0.1:``port``."""

    def __init__(self, workdir: Path, *extra: str):
        self.workdir = workdir
        self.port = free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.role = "master"
        self.dead = False
        self.stopped = False

    @property
    def name(self) -> str:
        return f"{self.role}:{self.port}"

    def start(self) -> Node:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [require("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "no", "--loglevel", "warning",
             "--logfile", str(self.workdir / "redis.log"), "--maxclients", "10000", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server on port {self.port} did not start: "
                                     f"{(self.workdir / 'redis.log').read_text()[-2000:]}") from None
                time.sleep(0.02)

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def info(self, *sections: str, timeout: float = 2.0) -> dict:
        c = self.client(timeout)
        try:
            return c.info(*sections) if sections else c.info()
        finally:
            c.close()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        self.dead = self.dead or sig == signal.SIGKILL
        self.stopped = sig == signal.SIGSTOP
        if sig == signal.SIGKILL:
            self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


@dataclass
class Target:
    """A started target: ``kind`` is ``"redis"`` (one node) or ``"cluster"``."""

    kind: str
    nodes: list[Node]
    workdir: Path
    options: dict = field(default_factory=dict)
    first_masters: set[int] = field(default_factory=set)  # the masters' ports when it was started

    def url(self, **options: object) -> str:
        """The cache URL of this target, with the benchmark's options and ``options``; its host is the first node
        that is alive and not stopped (the seed a cluster client asks for the slot map)."""
        opts = {**({"cluster": 1} if self.kind == "cluster" else {}), **self.options, **options}
        query = "&".join(f"{k}={v}" for k, v in opts.items())
        seed = next((n for n in self.nodes if not n.dead and not n.stopped), self.nodes[0])
        return f"redis://127.0.0.1:{seed.port}/{'' if self.kind == 'cluster' else '0'}" + \
            (f"?{query}" if query else "")

    def live(self) -> list[Node]:
        return [n for n in self.nodes if not n.dead]

    def masters(self) -> list[Node]:
        """The nodes that are masters now (roles are re-read: a failover promotes a replica)."""
        self.refresh_roles()
        return [n for n in self.live() if n.role == "master"]

    def refresh_roles(self) -> None:
        for n in self.live():
            if n.stopped:
                continue
            try:
                n.role = "master" if n.info("replication")["role"] == "master" else "replica"
            except redis.RedisError:
                pass

    def wait_ok(self, timeout: float = 60) -> float:
        """Wait until every live node says ``cluster_state:ok`` and every replica's link is up; the seconds it took."""
        start = time.monotonic()
        if self.kind != "cluster":
            return 0.0
        while True:
            try:
                states = [n.client().execute_command("CLUSTER INFO") for n in self.live() if not n.stopped]
                ok = all(str(s.get("cluster_state") if isinstance(s, dict) else s) in ("ok", "b'ok'")
                         or "cluster_state:ok" in str(s) for s in states)
                self.refresh_roles()
                links = [n.info("replication").get("master_link_status") for n in self.live() if n.role == "replica"]
                if ok and all(link == "up" for link in links):
                    return time.monotonic() - start
            except redis.RedisError:
                pass
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"cluster not ok after {timeout:.0f} s")
            time.sleep(0.1)

    def node_names(self) -> dict[str, str]:
        """Port -> a short name by the role each node had at the start: m0.. for masters, r0.. for replicas (one
        server: ``redis``)."""
        if self.kind != "cluster":
            return {str(self.nodes[0].port): "redis"}
        names, counts = {}, {"master": 0, "replica": 0}
        for n in self.nodes:
            role = "master" if n.port in self.first_masters else "replica"
            names[str(n.port)] = f"{role[0]}{counts[role]}"
            counts[role] += 1
        return names

    def serving(self, replica_reads: bool) -> list[str]:
        """The ports of the nodes that serve reads: every master (at the start), and every replica with replica
        reads."""
        if self.kind != "cluster":
            return [str(self.nodes[0].port)]
        return [str(n.port) for n in self.nodes if replica_reads or n.port in self.first_masters]

    def close(self) -> None:
        for n in self.nodes:
            n.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_single(workdir: Path, *extra: str) -> Target:
    node = Node(workdir / "node0", *extra).start()
    return Target("redis", [node], workdir, first_masters={node.port})


def start_cluster(workdir: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> Target:
    """``masters`` masters with ``replicas`` replicas each; ``cluster-node-timeout`` ``node_timeout_ms``, so that a
    lost master's replica is promoted about one to two timeouts later."""
    nodes = [Node(workdir / f"node{i}", "--cluster-enabled", "yes", "--cluster-config-file",
                  str(workdir / f"node{i}" / "nodes.conf"), "--cluster-node-timeout", str(node_timeout_ms))
             for i in range(masters * (1 + replicas))]
    target = Target("cluster", nodes, workdir)
    try:
        for n in nodes:
            n.start()
        subprocess.run([require("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
                        "--cluster-replicas", str(replicas), "--cluster-yes"], check=True, capture_output=True,
                       timeout=60)
        target.wait_ok()
    except BaseException:
        target.close()
        raise
    target.nodes.sort(key=lambda n: (n.role != "master", n.port))
    target.first_masters = {n.port for n in target.nodes if n.role == "master"}
    return target


# ------------------------------------------------------------------------------------------------- sampling
STAT_FIELDS = ("total_net_output_bytes", "total_net_repl_output_bytes", "total_net_input_bytes")


def _raw_info(client: redis.Redis) -> tuple[dict[str, str], int]:
    """``INFO stats cpu clients`` as ``({field: value}, bytes of the reply on the wire)``."""
    client.set_response_callback("INFO", lambda raw, **_: raw)  # the reply's bytes, unparsed
    raw = client.execute_command("INFO", "stats", "cpu", "clients")
    wire = 1 + len(str(len(raw))) + 2 + len(raw) + 2  # RESP bulk string: $<len>\r\n<data>\r\n
    fields = dict(line.split(":", 1) for line in raw.decode().splitlines() if ":" in line)
    return fields, wire


class Sampler:
    """Samples every node's ``INFO stats cpu clients`` every ``period`` seconds in a thread, from the moment it is
    entered to the moment it exits.  Keeps each node's first and last answer, its peak ``connected_clients``
    above the first answer's (the sampler's own connection and a replica's link to its master are there already)
    and the bytes of its own INFO replies, which :meth:`deltas` takes off the bytes served.  A node that stops
    answering (killed, stopped) keeps its last answer."""

    def __init__(self, nodes: list[Node], period: float = 0.1):
        self.nodes, self.period = nodes, period
        self.roles = {n.port: n.role for n in nodes}  # at the start: a failover may change them
        self.first: dict[int, dict] = {}
        self.last: dict[int, dict] = {}
        self.peak: dict[int, int] = {n.port: 0 for n in nodes}
        self._own: dict[int, int] = {n.port: 0 for n in nodes}  # INFO reply bytes counted in last - first
        self._pending: dict[int, int] = {n.port: 0 for n in nodes}  # the last reply: counted from the next answer on
        self._clients = {n.port: n.client(timeout=0.5) for n in nodes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def _sample(self) -> None:
        for n in self.nodes:
            if n.dead or n.stopped:
                continue
            try:
                info, wire = _raw_info(self._clients[n.port])
            except (redis.RedisError, OSError, ValueError):
                continue
            s = {f: int(info.get(f, 0)) for f in STAT_FIELDS}
            s["cpu_s"] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
            s["connected_clients"] = int(info["connected_clients"])
            if n.port in self.first:
                self._own[n.port] += self._pending[n.port]
            else:
                self.first[n.port] = s
            self._pending[n.port] = wire
            self.last[n.port] = s
            self.peak[n.port] = max(self.peak[n.port], s["connected_clients"] - self.first[n.port]["connected_clients"])

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        for c in self._clients.values():
            c.close()

    def deltas(self) -> dict[int, dict]:
        """Per node port: bytes served to clients (the sampler's own replies taken off), replication bytes, bytes
        received, CPU seconds, peak clients, role and whether a fault killed it."""
        out = {}
        for n in self.nodes:
            a, b = self.first.get(n.port), self.last.get(n.port)
            if a is None or b is None:
                continue
            out_bytes = b["total_net_output_bytes"] - a["total_net_output_bytes"]  # replication included (7.0)
            out[n.port] = {"served_bytes": out_bytes - (b["total_net_repl_output_bytes"]
                                                        - a["total_net_repl_output_bytes"]) - self._own[n.port],
                           "repl_bytes": b["total_net_repl_output_bytes"] - a["total_net_repl_output_bytes"],
                           "received_bytes": b["total_net_input_bytes"] - a["total_net_input_bytes"],
                           "cpu_s": b["cpu_s"] - a["cpu_s"], "peak_clients": self.peak[n.port],
                           "role": self.roles[n.port], "dead": n.dead}
        return out
