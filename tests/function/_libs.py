"""What ``tests/function/test_libs.py`` and ``test_vision.py`` share: a group of library cases (:mod:`tools.cases.libs`)
run by one cold and one warm fresh process, and the assertions issue 28 asks of every family.

The cold process starts from an empty Inductor cache directory and an empty precompile cache, compiles each case
with ``precompile.compile`` and stores it; the warm process starts from another empty Inductor directory and the
same precompile cache, as a new worker does.  Cases that compile the same library's models in one process share
that library's decorator code with each other, so only cases that do not meet in Dynamo's cache (different
families, or one model each) share a group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import run_python

RUN = "import sys; from tools.cases.run_libs import main; main(sys.argv[1:])"


@dataclass
class GroupRun:
    """A group's two processes: their JSON reports (:mod:`tools.cases.run_libs`) and their outputs (``{case: {name:
    tensor}}``)."""

    cold: dict[str, Any]
    warm: dict[str, Any]
    cold_out: dict[str, Any]
    warm_out: dict[str, Any]


def run_group(cases: list[str], work: Path, timeout: float = 900) -> GroupRun:
    """Run ``cases`` in a cold, then a warm fresh process over one precompile cache under ``work``."""
    import torch

    cache = f"file://{work / 'cache'}"
    got = {}
    for tag in ("cold", "warm"):
        inductor = work / f"inductor-{tag}"
        inductor.mkdir(parents=True)
        text = run_python(RUN, "ours", "--cases", ",".join(cases), "--work", str(work), "--cache", cache,
                          "--tag", tag, env={"TORCHINDUCTOR_CACHE_DIR": str(inductor)}, timeout=timeout)
        got[tag] = json.loads(text.strip().splitlines()[-1])
    return GroupRun(got["cold"], got["warm"], torch.load(work / "ours-cold.pt"), torch.load(work / "ours-warm.pt"))


def assert_warm_hits(run: GroupRun) -> None:
    """Every case of the warm process is a hit that never traced, with no reason to miss."""
    for case, row in run.warm["cases"].items():
        assert run.cold["cases"][case]["outcome"] == "built", (case, run.cold["cases"][case])
        assert (row["outcome"], row["miss_reason"], row["retraces"]) == ("hit", None, 0), (case, row)
    assert run.warm["frames"] == 0, run.warm  # over all the warm process's calls


def assert_outputs_equal(run: GroupRun) -> None:
    """Each output of the warm process equals the cold process's bit for bit."""
    import torch

    assert set(run.warm_out) == set(run.cold_out)
    for case, outs in run.cold_out.items():
        assert set(run.warm_out[case]) == set(outs), case
        for name, ref in outs.items():
            assert torch.equal(run.warm_out[case][name], ref), f"{case} {name} differs from the cold process's"


def assert_equal_to_eager(run: GroupRun) -> None:
    """Cases compared with eager (generated tokens) equal eager's in both processes."""
    compared = [(tag, case) for tag, rep in (("cold", run.cold), ("warm", run.warm))
                for case, row in rep["cases"].items() if row["eager_equal"] is not None]
    assert compared, "no case of this group is compared with eager"
    for tag, case in compared:
        assert (run.cold if tag == "cold" else run.warm)["cases"][case]["eager_equal"], f"{tag} {case}: tokens"
