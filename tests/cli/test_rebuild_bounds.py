"""``precompile rebuild`` of planted graphs and specs stays within its bounds (issue 39).

A security probe found that a stored graph computing ``3 ** 10**8`` ran for ever, ``"A" * 2**31`` took 2.4 GB, a
spec of ``[2**24, 16]`` floats made a rebuild peak at 8.57 GB, ``aten::ones([2**28])`` at 1.4 GB, and a spec of
``[2**62, 16]`` ended in a traceback.  Each entry here is planted in a real local cache as a builder of another torch
would have stored it, and rebuilt by ``precompile rebuild`` in a fresh process under a wall-clock deadline: the
outcome is ``refused`` or ``failed`` with a one-line reason naming the bound, no traceback, and the process's peak
resident size stays within the byte budget plus :data:`OVERHEAD` (what a rebuild process holds before it allocates
anything for the artifact: torch, precompile and the fake run).  An honest graph over a low work bound is refused
and rebuilds under the default bounds.
"""

from __future__ import annotations

import json

from test_cli_trust_ops import _graph, plant

from cache_backends.local.cache import LocalCache
from conftest import run_python

#: The byte budget the hostile cases run under (``PRECOMPILE_REBUILD_MAX_BYTES``).
BUDGET = 64 << 20
#: Peak resident bytes of a rebuild process that refuses an artifact before allocating anything for it (measured:
#: about 0.45 GiB with torch, precompile and the fake run), with a margin.
OVERHEAD = 768 << 20
#: Seconds a rebuild may run before the test fails (a loaded CI machine; a bounded rebuild of these takes seconds).
DEADLINE_S = 120
#: Address space a rebuild process may map: a safety net so that a regression fails the test rather than the machine.
ADDRESS_SPACE = 8 << 30

#: Runs ``precompile rebuild ARGS --json`` as its only child, under the deadline and address-space cap; prints one
#: JSON line: its exit status, stdout, stderr and peak resident bytes (``RUSAGE_CHILDREN``: this process has no other
#: child).
RUN = f'''
import json, resource, subprocess, sys

def cap():
    resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))

proc = subprocess.run([sys.executable, "-m", "precompile", "rebuild", *sys.argv[1:], "--json"], capture_output=True,
                      text=True, preexec_fn=cap, timeout={DEADLINE_S})
print(json.dumps({{"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                  "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}}))
'''

OLD = {"torch": "0.0"}


def _spec(name: str, shape: list[int], stride: list[int], dtype: str = "float32") -> dict:
    return {"name": name, "kind": "user_input", "fqn": None, "type": "tensor", "shape": shape, "stride": stride,
            "dtype": dtype, "device": "cpu", "requires_grad": False, "aligned": True}


def _unary(op: str) -> dict:
    """``op(x)``: planted artifacts' keys hash their graph, not their specs, so each case calls another operator."""
    return _graph(("a", "call_function", {"op": f"aten::{op}.default"}, [{"$node": 0}]))


X = [_spec("x", [4], [1])]


def _rebuild(cache: LocalCache, *keys: str, env: dict | None = None, args: tuple[str, ...] = ()
             ) -> tuple[dict[str, dict], dict]:
    """``({old key: row}, run)`` of ``precompile rebuild KEYS --force ARGS`` on ``cache``; asserts the run ended with
    status 0 or 1, one JSON document and no traceback, and every reason is one line."""
    env = {"MALLOC_ARENA_MAX": "2", "PRECOMPILE_VERIFY_KEYS": None, "PRECOMPILE_SIGNING_KEY": None, **(env or {})}
    out = run_python(RUN, *keys, "--force", *args, "--cache", "file://" + str(cache.root), env=env,
                     timeout=DEADLINE_S + 60)
    run = json.loads(out.strip().splitlines()[-1])
    assert run["rc"] in (0, 1) and "Traceback" not in run["stderr"] + run["stdout"], run["stderr"][-3000:]
    rows = {r["old_key"]: r for r in json.loads(run["stdout"].strip().splitlines()[-1])["rows"]}
    assert set(rows) == set(keys)
    assert all("\n" not in r["detail"] for r in rows.values()), rows
    return rows, run


def _within(run: dict, budget: int = BUDGET) -> None:
    assert run["maxrss"] <= budget + OVERHEAD, f"peak resident size {run['maxrss'] / 2**20:.0f} MiB"


def test_size_arithmetic_past_its_bounds_fails_in_a_line(tmp_path):
    cache = LocalCache(tmp_path / "c")
    power = plant(cache, "", OLD, _graph(("a", "call_function", {"fn": "_operator:pow"}, [3, 10**8])), X)
    repeat = plant(cache, "", OLD, _graph(("a", "call_function", {"fn": "_operator:mul"}, ["A", 2**31])), X)
    shift = plant(cache, "", OLD, _graph(("a", "call_function", {"fn": "_operator:lshift"}, [1, 2**40])), X)
    rows, run = _rebuild(cache, power, repeat, shift, env={"PRECOMPILE_REBUILD_MAX_BYTES": str(BUDGET)})
    assert rows[power]["outcome"] == "failed" and "3 ** 100000000 passes 64 bits" in rows[power]["detail"], rows
    assert rows[repeat]["outcome"] == "failed" and "more than 65536" in rows[repeat]["detail"], rows
    assert rows[shift]["outcome"] == "failed" and "1 << 1099511627776" in rows[shift]["detail"], rows
    _within(run)


def test_inputs_over_the_budget_are_refused_before_anything_is_allocated(tmp_path):
    cache = LocalCache(tmp_path / "c")
    gib = plant(cache, "", OLD, _unary("relu"), [_spec("x", [2**24, 16], [16, 1])])  # 1 GiB of floats
    huge = plant(cache, "", OLD, _unary("neg"), [_spec("x", [2**62, 16], [16, 1])])
    overlapping = plant(cache, "", OLD, _unary("abs"), [_spec("x", [2**40], [0])])  # one float stored, 2**40 elements
    rows, run = _rebuild(cache, gib, huge, overlapping, args=("--max-bytes", "64MiB"))  # BUDGET, by the option
    for key in (gib, huge):
        assert rows[key]["outcome"] == "refused", rows[key]
        assert "by input 'x'" in rows[key]["detail"] and f"budget of {BUDGET} bytes" in rows[key]["detail"]
    assert rows[overlapping]["outcome"] == "refused" and f"budget of {BUDGET} bytes" in rows[overlapping]["detail"]
    _within(run)


def test_allocations_of_the_graph_over_the_budget_are_refused_on_fake_tensors(tmp_path):
    cache = LocalCache(tmp_path / "c")
    ones = plant(cache, "", OLD, _graph(("a", "call_function", {"op": "aten::ones.default"}, [[2**28]])), X)
    pieces = plant(cache, "", OLD, _graph(  # a free view split into 2**20 tensors: a million tensor objects
        ("e", "call_function", {"op": "aten::expand.default"}, [{"$node": 0}, [2**20, 4]]),
        ("a", "call_function", {"op": "aten::split.Tensor"}, [{"$node": 1}, 1])), X)
    bulky = plant(cache, "", OLD, _graph(  # 300 KB of JSON, 1/512 of the budget is 128 KiB
        ("a", "call_function", {"fn": "_operator:getitem"}, [[0] * 100_000, 0])), X)
    rows, run = _rebuild(cache, ones, pieces, bulky, env={"PRECOMPILE_REBUILD_MAX_BYTES": str(BUDGET)})
    for key in (ones, pieces):
        assert rows[key]["outcome"] == "refused" and f"budget of {BUDGET} bytes" in rows[key]["detail"], rows[key]
        assert "on fake tensors" in rows[key]["detail"]
    assert rows[bulky]["outcome"] == "refused" and "its stored FX graph is 3" in rows[bulky]["detail"], rows[bulky]
    _within(run)


def test_work_over_the_bound_is_refused_and_an_honest_graph_rebuilds_within_the_defaults(tmp_path):
    cache = LocalCache(tmp_path / "c")
    square = [_spec("x", [256, 256], [256, 1])]
    mm = plant(cache, "", OLD, _graph(("a", "call_function", {"op": "aten::mm.default"}, [{"$node": 0}] * 2)), square)
    # a reduction over a stride-0 view of 2**44 elements: no memory, hours of work
    wide = plant(cache, "", OLD, _graph(
        ("e", "call_function", {"op": "aten::expand.default"}, [{"$node": 0}, [2**42, 4]]),
        ("a", "call_function", {"op": "aten::sum.default"}, [{"$node": 1}])), X)
    rows, run = _rebuild(cache, mm, env={"PRECOMPILE_REBUILD_MAX_FLOPS": str(2 * 10**7)})  # 2 * 256**3 FLOPs: 3.4e7
    assert rows[mm]["outcome"] == "refused" and "more than 20000000 operations" in rows[mm]["detail"], rows
    rows, run = _rebuild(cache, mm, wide)
    assert rows[mm]["outcome"] == "rebuilt", rows
    assert rows[wide]["outcome"] == "refused" and "more than 10000000000000 operations" in rows[wide]["detail"], rows
