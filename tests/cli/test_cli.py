"""The ``precompile`` command line, run as a real console script in real processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, python_env

RECIPE = "tests.fixtures_models:tiny_mlp"


def cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which("precompile")
    cmd = [exe] if exe else [sys.executable, "-m", "precompile"]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=REPO, env=python_env(env), timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"precompile {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    url = "file://" + str(tmp_path_factory.mktemp("cli") / "cache")
    first = json.loads(cli("warmup", RECIPE, "--shapes", "1x4,2x4", "--jobs", "2", "--cache", url, "--json").stdout)
    return url, first


def test_warmup_builds_each_shape_then_hits(warmed):
    url, first = warmed
    assert first["failures"] == []
    assert sorted((r["shape"], r["outcome"]) for r in first["rows"]) == [("1x4", "built"), ("2x4", "built")]
    assert len({r["key"] for r in first["rows"]}) == 2
    again = json.loads(cli("warmup", RECIPE, "--shapes", "1x4,2x4", "--cache", url, "--json").stdout)
    assert sorted(r["outcome"] for r in again["rows"]) == ["hit", "hit"]
    assert {r["key"] for r in again["rows"]} == {r["key"] for r in first["rows"]}


def test_warmup_table_and_progress(warmed):
    url, _ = warmed
    proc = cli("warmup", RECIPE, "--shapes", "1x4", "--cache", url)
    assert "hit/built" in proc.stdout and "1 graphs: 0 built, 1 hits" in proc.stdout
    # stderr is a pipe here, not a terminal: no live bar, a line per job as it ends instead
    lines = [line for line in proc.stderr.splitlines() if line.startswith("warmup [")]
    assert len(lines) == 1 and lines[0].startswith(f"warmup [1/1] {RECIPE} 1x4: ") and " hit " in lines[0]


def test_stats_json_counts_hits_misses_builds(warmed):
    url, _ = warmed
    stats = json.loads(cli("stats", "--cache", url, "--json").stdout)
    assert {"hits", "misses", "builds", "hit_rate", "bytes_written", "errors"} <= stats.keys()
    assert stats["builds"] >= 2 and stats["misses"] >= 2 and stats["hits"] >= 2
    assert stats["hit_rate"] == pytest.approx(stats["hits"] / (stats["hits"] + stats["misses"]))


def test_ls_and_inspect(warmed):
    url, first = warmed
    items = json.loads(cli("ls", "--cache", url, "--json").stdout)
    keys = {r["key"] for r in first["rows"]}
    assert keys <= {i["key"] for i in items}
    key = sorted(keys)[0]
    manifest = json.loads(cli("inspect", key, "--cache", url, "--json").stdout)
    assert manifest["key"] == key and manifest["kernels"] and manifest["factors"]["env"]
    text = cli("inspect", key[:12], "--cache", url).stdout
    for heading in ("parts", "kernels", "inputs and alignment", "environment", "key factors"):
        assert heading in text


def test_bad_recipe_and_shapes_are_usage_errors(tmp_path):
    url = "file://" + str(tmp_path / "c")
    bad_shape = cli("warmup", RECIPE, "--shapes", "4by4", "--cache", url, check=False)
    assert bad_shape.returncode == 2 and "4by4" in bad_shape.stderr
    bad_recipe = cli("warmup", "no_such_module:fn", "--shapes", "1x4", "--cache", url, check=False)
    assert bad_recipe.returncode != 0 and "no_such_module" in bad_recipe.stderr
    missing = cli("inspect", "0" * 64, "--cache", url, check=False)
    assert missing.returncode == 1 and f"no artifact {'0' * 64} in {url}" in missing.stderr
