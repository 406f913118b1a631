"""tools/bench_fleet.py measures what Redis served: its sampler's byte accounting, against a real redis-server.

The storm's bytes per node are ``total_net_output_bytes`` deltas less replication and less the sampler's own INFO
replies (:class:`tools.fleet.targets.Sampler`); the fairness figure of the issue (``max_node_share``) rests on
them, so they are checked here against bytes a client counted itself.
"""

from __future__ import annotations

import os
import time

import pytest

from tools.fleet.report import node_share
from tools.fleet.targets import Sampler, start_single


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
