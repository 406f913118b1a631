"""``python -m tools.bench.fleet`` measures what Redis served: its sampler's byte accounting, against a real
redis-server.

The storm's bytes per node are ``total_net_output_bytes`` deltas less replication and less the sampler's own INFO
replies (:class:`tools.bench.fleet.targets.Sampler`); the fairness figure of the issue (``max_node_share``) rests on
them, so they are checked here against bytes a client counted itself.
"""

from __future__ import annotations

import os
import time

import pytest

from tools.bench.fleet.report import node_share
from tools.bench.fleet.targets import Sampler, start_single


@pytest.fixture
def server(tmp_path):
    from _redis import require_redis

    require_redis()
    target = start_single(tmp_path / "redis")
    yield target
    target.close()


def test_the_sampler_counts_what_clients_received_and_not_its_own_replies(server):
    node = server.nodes[0]
    client = node.client()
    value = os.urandom(1 << 20)
    client.set("v", value)
    with Sampler(server.live(), period=0.01) as idle:
        time.sleep(0.5)  # ~50 INFO replies of its own, ~2 KB each
    assert 0 <= idle.deltas()[node.port]["served_bytes"] < 200
    with Sampler(server.live(), period=0.01) as busy:
        for _ in range(3):
            assert client.get("v") == value
        time.sleep(0.2)
    served = busy.deltas()[node.port]["served_bytes"]
    reply = len(value) + len(f"${len(value)}\r\n\r\n")
    assert 3 * reply <= served < 3 * reply + 200
    assert busy.deltas()[node.port]["peak_clients"] == 0  # the client connected before sampling began
    client.close()


def test_max_node_share_is_the_busiest_node_over_an_even_split():
    storm = {"nodes": {"1": {"served_bytes": 300}, "2": {"served_bytes": 100}, "3": {"served_bytes": 200}},
             "serving": ["1", "2", "3"]}
    assert node_share(storm) == pytest.approx(1.5)
    storm["serving"] = ["1", "2", "3", "4", "5", "6"]  # replicas serving too: the fair share halves
    assert node_share(storm) == pytest.approx(3.0)


def test_a_fetch_only_storm_reads_verifies_and_counts_everything_against_a_real_redis(artifacts, tmp_path):
    """``--fetch-only`` at N=3 on one real redis-server, with a real compiled artifact (and its GPU-size copy): every
    client reads and verifies every byte of every signed artifact; the JSON's figures come from what was measured."""
    import json
    import subprocess
    import sys

    from _redis import require_redis
    from conftest import REPO, python_env

    require_redis()
    artifacts("make_fx")
    out = tmp_path / "all.json"
    res = subprocess.run([sys.executable, "-m", "tools.bench.fleet", "--fetch-only", "--workers", "3", "--keys", "1",
                          "--seed-cache", artifacts.cache_url_for("make_fx"), "--gpu-mb", "0.5", "--lone-repeat",
                          "1", "--procs", "2", "--json", "--json-out", str(out)],
                         cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    line = json.loads(res.stdout.strip().splitlines()[-1])
    assert (line["workers"], line["target"], line["errors"], line["builds"]) == (3, "redis", 0, 0), line
    assert line["timeouts"] == 0 and line["breaker_trips"] == 0
    assert line["peak_connections_per_node"] >= 3  # every client holds its connection until the storm ends
    full = json.loads(out.read_text())
    assert full["signed"] and set(full["sets"]) == {"cpu", "gpu"}
    for name, by in line["by_artifacts"].items():
        storm = next(s for s in full["storms"] if s["artifacts"] == name)
        assert storm["outcomes"] == {"hit": 3}, storm["outcomes"]
        assert by["verified_bytes"] == 3 * full["sets"][name]["read_bytes"] > 0  # every byte read and hashed
        assert by["served_bytes"] >= 3 * full["sets"][name]["stored_bytes"] * 0.9, by  # Redis sent them
        assert by["p99_over_lone"] > 0 and by["max_node_share"] == 1.0  # one server serves all
    assert full["sets"]["gpu"]["stored_bytes"] > 5 * full["sets"]["cpu"]["stored_bytes"]
