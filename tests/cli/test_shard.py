"""``precompile warmup --shard I/N`` and Kubernetes Indexed Job variables: a deterministic split of the job list,
and shards running at once into one real Redis build the union once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, python_env
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import RECIPE, cli

from cache_backends import open_cache
from precompile.ops.warmup import Job, make_jobs, parse_shard, select_shard, shard_from_env

SHAPES = "1x4,1x8,2x4,2x8"


@settings(deadline=None)
@given(recipes=st.lists(st.sampled_from(["a", "b", "c", "m:f"]), min_size=1, max_size=3, unique=True),
       shapes=st.lists(st.sampled_from(["1x4", "2x8", "4x16", "8x32", "1x1"]), min_size=1, max_size=5, unique=True),
       count=st.integers(min_value=1, max_value=9))
def test_shards_partition_the_jobs_whatever_the_argument_order(recipes, shapes, count):
    jobs = make_jobs(recipes, ",".join(shapes), None, "file:///c", "cpu", None, None)
    shuffled = make_jobs(list(reversed(recipes)), ",".join(reversed(shapes)), None, "file:///c", "cpu", None, None)
    parts = [select_shard(jobs, i, count) for i in range(count)]
    assert sorted(map(repr, (j for p in parts for j in p))) == sorted(map(repr, jobs))  # each job exactly once
    assert all(len(p) in (len(jobs) // count, -(-len(jobs) // count)) for p in parts)  # balanced
    assert parts == [select_shard(shuffled, i, count) for i in range(count)]  # same split on every machine


@pytest.mark.parametrize("text", ["2/2", "-1/3", "1", "a/b", "0/0", "1/2/3"])
def test_bad_shards_are_rejected(text):
    with pytest.raises(ValueError, match="INDEX/COUNT"):
        parse_shard(text)


def test_shard_from_kubernetes_indexed_job_variables():
    assert shard_from_env({}) is None
    assert shard_from_env({"JOB_COMPLETION_INDEX": "2", "JOB_COMPLETIONS": "4"}) == (2, 4)
    with pytest.raises(ValueError, match="JOB_COMPLETIONS"):
        shard_from_env({"JOB_COMPLETION_INDEX": "2"})
    assert select_shard([Job("r", "1x1", None, "c")], 0, 1) == [Job("r", "1x1", None, "c")]


def test_cli_dry_run_flag_and_env_agree(tmp_path):
    url = f"file://{tmp_path}/cache"
    by_flag = json.loads(cli("warmup", RECIPE, "--shapes", SHAPES, "--cache", url, "--shard", "1/3", "--dry-run",
                             "--json").stdout)
    by_env = json.loads(cli("warmup", RECIPE, "--shapes", SHAPES, "--cache", url, "--dry-run", "--json",
                            env={"JOB_COMPLETION_INDEX": "1", "JOB_COMPLETIONS": "3"}).stdout)
    assert by_flag == by_env and by_flag["shard"] == [1, 3] and by_flag["total_jobs"] == 4
    assert len(by_flag["jobs"]) == 1
    bad = cli("warmup", RECIPE, "--cache", url, "--shard", "3/3", check=False)
    assert bad.returncode == 2 and "INDEX/COUNT" in bad.stderr


def test_shards_at_once_into_one_redis_build_the_union_once(redis_server):
    url = redis_server.url()
    cmd = [sys.executable, "-m", "precompile", "warmup", RECIPE, "--shapes", SHAPES, "--cache", url, "--json"]
    procs = [subprocess.Popen([*cmd, "--shard", f"{i}/2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env=python_env()) for i in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-4000:]
        outs.append(json.loads(stdout))
    keys = [{r["key"] for r in o["rows"]} for o in outs]
    assert all(len(k) == 2 for k in keys) and not keys[0] & keys[1]
    assert all(r["outcome"] == "built" for o in outs for r in o["rows"] + o["functions"])
    functions = {r["key"] for o in outs for r in o["functions"]}
    assert len(functions) == 4  # one whole-function artifact per job
    cache = open_cache(url)
    assert {k for k, _ in cache.iter_refs()} == keys[0] | keys[1] | functions
    assert cache.counters()["builds"] == 4 and cache.counters()["function_builds"] == 4
    everything = json.loads(cli("warmup", RECIPE, "--shapes", SHAPES, "--cache", url, "--json").stdout)
    assert sorted(r["outcome"] for r in everything["rows"] + everything["functions"]) == ["hit"] * 8
    stats = json.loads(cli("stats", "--cache", url, "--json").stdout)  # fleet-wide, from any machine
    assert stats["builds"] == 4 and stats["hits"] == 4 and stats["backend"] == "RedisCache"
    assert stats["function_builds"] == 4 and stats["function_hits"] == 4
