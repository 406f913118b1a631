"""A cache shared for real: read-only cache URLs and directories (a cache that cannot be written still compiles,
never writes, and says so once), and several processes building into one cache at once."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import _graphs
import pytest
import torch
from conftest import assert_same_output, spawn_python, without_root_powers

import precompile
from cache_backends.local.cache import LocalCache


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of every file under ``root``."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------------ read-only cache
def test_read_only_cache_url(artifacts, cache_copy, caplog):
    """``file:///dir?read_only=1``: a hit still loads; a miss compiles, returns correct output, stores nothing,
    and the failed store is logged once for the cache, not once per artifact."""
    c = artifacts("dynamo")
    root = cache_copy()
    url = f"file://{root}?read_only=1"
    before = tree(root)
    with caplog.at_level(logging.INFO, logger="precompile"):
        hit = precompile.standalone_compile(c.gm, c.inputs, cache=url)
        assert hit.source == "cache"
        assert_same_output(hit(*c.inputs), c.expected)
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("precompile")]
        assert warned == [], [r.getMessage() for r in warned]

        model = _graphs.mlp()
        for batch in (_graphs.BATCH + 2, _graphs.BATCH + 3):
            x = _graphs.example(batch=batch)
            gm, inputs = _graphs.graph("make_fx", model, x)
            cache = precompile.open_cache(url)
            start = cache.counters()
            art = precompile.standalone_compile(gm, inputs, cache=cache)
            assert art.source == "compiled"
            with torch.no_grad():
                assert_same_output(art(*inputs), gm(*inputs))
            counters = cache.counters()  # kept in memory: the directory is not touched
            delta = {k: counters[k] - start[k] for k in ("builds", "errors", "misses", "hits")}
            assert delta == {"builds": 1, "errors": 1, "misses": 1, "hits": 0}, delta
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("precompile")]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    msg = warned[0].getMessage()
    assert warned[0].name.startswith("precompile") and "could not store" in msg and "read-only" in msg, msg
    assert tree(root) == before, "a read-only cache directory was modified"


def test_a_damaged_entry_in_a_read_only_cache_is_left_in_place_and_the_message_says_so(artifacts, cache_copy,
                                                                                        caplog):
    """A reader that finds an entry unusable drops its ref so that it is rebuilt; a read-only one cannot, and its
    warning says that the entry stays (it once said "dropping it")."""
    root = cache_copy()
    key = artifacts("dynamo").art.key
    other = "ab" * 32  # a ref to a valid manifest that names another key
    (root / "ref" / other).write_text((root / "ref" / key).read_text())
    for query, kept, said in (("?read_only=1", True, "a miss, left in place (read-only cache)"),
                              ("", False, "dropping it so it is rebuilt")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="precompile"), pytest.raises(precompile.ArtifactNotFoundError):
            precompile.load(other, cache=f"file://{root}{query}")
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and f"{other[:12]}" in warned[0] and said in warned[0], warned
        assert (root / "ref" / other).exists() is kept


READ_ONLY_SNIPPET = r"""
import json, logging, sys, torch, precompile, _graphs
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
url, out_path = sys.argv[1:3]
model = _graphs.mlp()
outs, sources = [], []
for batch in (2, 3):
    gm, inputs = _graphs.graph("export", model, _graphs.example(batch=batch))
    art = precompile.standalone_compile(gm, inputs, cache=url)
    sources.append(art.source)
    outs.append((art(*inputs), model(*inputs)))
    print(f"LOG MARK call {batch} done", file=sys.stderr, flush=True)
torch.save(outs, out_path)
print(json.dumps({"sources": sources}))
"""


@pytest.mark.slow
def test_read_only_directory(tmp_path):
    """A cache directory this process may not write (mode 0o555, CAP_DAC_OVERRIDE dropped when root): compiles
    still work, and the failure is reported once, not on every compile."""
    prefix = without_root_powers()
    if prefix is None:
        pytest.skip("running as root without a working setpriv: chmod 0o555 does not stop root from writing, so a "
                    "real read-only directory cannot be made here (the read_only=1 URL is tested separately)")
    root = tmp_path / "ro-cache"
    LocalCache(root).incr(hits=0)  # creates blob/, ref/, locks/, tmp/
    dirs = [d for d in [root, *root.rglob("*")] if d.is_dir()]
    before = tree(root)
    for d in dirs:
        d.chmod(0o555)
    try:
        proc = spawn_python(READ_ONLY_SNIPPET, "file://" + str(root), str(tmp_path / "out.pt"), prefix=prefix)
        report = proc.json()
    finally:
        for d in dirs:
            d.chmod(0o755)
    assert report["sources"] == ["compiled", "compiled"]
    for got, want in torch.load(tmp_path / "out.pt", weights_only=False):
        assert_same_output(got, want)
    logs = [line for line in proc.stderr.splitlines() if line.startswith("LOG ")]
    split = logs.index("LOG MARK call 2 done")  # the first compile (batch 2) is done
    warnings = [line for line in logs if line.startswith("LOG WARNING precompile")]
    assert warnings, "the failure to store was not reported"
    assert len(set(warnings)) == len(warnings), "a warning was repeated:\n" + "\n".join(warnings)
    assert sum("could not store" in w for w in warnings) == 1, "\n".join(warnings)
    assert all("read-only" in w or "cannot persist cache counters" in w for w in warnings), "\n".join(warnings)
    second = [line for line in logs[split + 1:] if line.startswith("LOG WARNING precompile")]
    assert second == [], "the second compile reported the read-only cache again:\n" + "\n".join(second)
    assert tree(root) == before, "the read-only directory was modified"


# --------------------------------------------------------------------------------------------- concurrency
CONCURRENT_SNIPPET = r"""
import json, os, sys, time, torch, precompile, _graphs
url, go, out_path = sys.argv[1:4]
model = _graphs.mlp()
gm, inputs = _graphs.graph("export", model, _graphs.example(batch=6))
deadline = time.monotonic() + 120
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("the go file never appeared")
    time.sleep(0.01)
art = precompile.standalone_compile(gm, inputs, cache=url)
torch.save({"got": art(*inputs), "want": model(*inputs)}, out_path)
print(json.dumps({"key": art.key, "source": art.source}))
"""


@pytest.mark.slow
def test_concurrent_builds_into_one_cache(tmp_path):
    """Three processes get-or-build the same graph into one local cache at the same moment: one builds under the
    key's build lease (a ``flock``), the others wait for its ref and load it."""
    root = tmp_path / "shared-cache"
    go = tmp_path / "go"
    url = "file://" + str(root)
    # Inductor's CPU ISA probe (gcc + dlopen of test programs, ~15 s per fresh process) is not what this tests:
    # trust the ISA the CPU reports, so that three first compiles fit on a 2-core runner
    env = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}
    procs = [spawn_python(CONCURRENT_SNIPPET, url, str(go), str(tmp_path / f"out{i}.pt"), env=env)
             for i in range(3)]
    time.sleep(1.0)
    go.touch()
    reports = [p.json() for p in procs]
    keys = {r["key"] for r in reports}
    assert len(keys) == 1
    for i in range(3):
        out = torch.load(tmp_path / f"out{i}.pt", weights_only=False)
        assert_same_output(out["got"], out["want"], where=f"process {i}")
    cache = LocalCache(root)
    report = cache.verify()
    assert report["ok"], report
    refs = dict(cache.iter_refs())
    assert list(refs) == list(keys), refs
    counters = cache.counters()
    assert counters["builds"] == 1 and counters["errors"] == 0, counters
    assert counters["builds"] == sum(r["source"] == "compiled" for r in reports)
    assert not list((root / "locks" / "lease").glob("*.lock"))  # the builder gave its lease back and removed it
    assert not list(root.rglob("*.incomplete"))
    art = precompile.load(next(iter(keys)), cache=url, weights=_graphs.mlp())
    out = torch.load(tmp_path / "out0.pt", weights_only=False)
    assert_same_output(art(_graphs.example(batch=6)), out["want"])
