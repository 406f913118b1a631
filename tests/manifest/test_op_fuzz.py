"""Every operator a stored graph may call, fuzzed (tests/_op_fuzz.py): stored graphs calling each admitted ATen and
prims overload with extreme ints, NaN and infinities, indices just and far past their tensor, empty, 0-d, expanded
and odd-dtype inputs, then hypothesis-drawn graphs of one to three such nodes, decoded through ``graph_from_json``
and run eagerly under the guard, in two fresh processes (the two cores of CI) bounded in memory and time.

Each graph must run inside the storages of its inputs or raise a Python exception (which ``precompile rebuild``
turns into "failed"): a crash or a hang kills the process and fails the test naming the operator, and a write,
read or view past an input's storage is listed.  Derandomized, so CI runs the same graphs every time.  What the
fuzz found is on the denial rules of precompile.manifest.op_list (``DENIED``, ``PRECONDITIONS``).
"""

from __future__ import annotations

import json
import subprocess

from conftest import run_python, spawn_python

from precompile.manifest import op_list

SHARDS = 2
#: Hypothesis graphs per shard, after the sweep (about a minute a shard on one core).
EXAMPLES = 4000


def _dispatchable() -> set[str]:
    """The admitted operators with an overload in the dispatcher's table: all but TorchScript-only ones, which a
    stored graph cannot call (``aten::element_size``: on the list for the tensor method of its name)."""
    import torch
    import torch._inductor.inductor_prims  # noqa: F401 - registers prims::inductor_*
    import torch._prims  # noqa: F401

    def registered(name: str) -> bool:
        for overload in torch._C._jit_get_operation(name)[1] or [""]:
            try:
                torch._C._dispatch_find_schema_or_throw(name, overload)
                return True
            except RuntimeError:
                continue
        return False

    found = {n for n in op_list.admitted() if registered(n)}
    assert len(found) > 0.95 * len(op_list.admitted())
    return found


def _last_run(stdout: str) -> str:
    runs = [line for line in stdout.splitlines() if line.startswith("RUN ")]
    return runs[-1] if runs else "(before the first operator)"


def test_every_admitted_operator_stays_inside_its_inputs_with_extreme_arguments():
    procs = [spawn_python("import _op_fuzz; _op_fuzz.main()", str(i), str(SHARDS), str(EXAMPLES), timeout=900)
             for i in range(SHARDS)]
    reports = []
    for proc in procs:
        try:
            out, err = proc.popen.communicate(timeout=proc.timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            out, err = proc.popen.communicate()
        assert proc.popen.returncode == 0, (
            f"the fuzz died (exit {proc.popen.returncode}: -11 a segfault, -14 a hang past its alarm, -6 an abort) "
            f"at {_last_run(out)}\n--- stderr:\n{err[-3000:]}")
        reports.append(json.loads(out.splitlines()[-1]))
    violations = [v for r in reports for v in r["violations"]]
    assert not violations, "\n".join(violations[:20])
    covered = set().union(*(r["covered"] for r in reports))
    assert covered == _dispatchable(), sorted(_dispatchable() ^ covered)[:20]
    tally = {k: sum(r["tally"][k] for r in reports) for k in reports[0]["tally"]}
    ran = set().union(*(r["ran_ops"] for r in reports))
    print(tally, f"{len(ran)} of {len(covered)} operators ran at least once")
    # not vacuous: most operators ran, ATen's checks and the guard refused some calls, the format none
    assert len(ran) >= 0.7 * len(covered) and tally["error"] > tally["ran"] // 4 and tally["guard"] > 0
    assert tally["refused"] <= 5, tally


def test_the_fuzz_sees_a_write_a_read_and_a_view_past_a_storage_and_names_a_crash():
    """The harness's own check, with operators off the list run without the guard."""
    out = run_python("import _op_fuzz, sys; _op_fuzz.unguarded(sys.argv[1])",
                     "aten._reshape_alias(x, [8], [1]).clone()")  # x holds 6 floats: a read of 2 past it
    assert "holds the canary: a read past a storage" in json.loads(out.splitlines()[-1])["violations"][1]
    out = run_python("import _op_fuzz, sys; _op_fuzz.unguarded(sys.argv[1])", "aten._reshape_alias(x, [9], [1])")
    assert "view past its storage of 24 bytes" in json.loads(out.splitlines()[-1])["violations"][0]
    out = run_python("import _op_fuzz, sys; _op_fuzz.unguarded(sys.argv[1])",
                     "aten._reshape_alias(x, [8], [1]).fill_(1.0)")
    assert "a canary changed: a write past a storage" in json.loads(out.splitlines()[-1])["violations"][1]
    crash = spawn_python("import _op_fuzz, sys; _op_fuzz.unguarded(sys.argv[1])",
                         "aten._sparse_coo_tensor_unsafe(torch.tensor([[2 ** 40]]), x.new_ones(1), [4]).to_dense()")
    out, _ = crash.popen.communicate(timeout=120)
    assert crash.popen.returncode < 0 and "_sparse_coo_tensor_unsafe" in "\n".join(out.splitlines()[-2:]), out
