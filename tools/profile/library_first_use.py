#!/usr/bin/env python
"""What one library call costs the first time a fresh process makes it, on the GPU: SDPA by backend, cuBLAS and
cuBLASLt matmuls, cuDNN convolution.

Each case runs in its own fresh process (``PYTHONDONTWRITEBYTECODE`` unset).  Before the clock: ``import torch``,
the CUDA context, one elementwise kernel, and the inputs.  Then the call is timed, synced, twice; the table gives
the medians over ``--rounds`` processes of the first and second call.

    python tools/profile/library_first_use.py [--rounds 3] [--cases sdpa-cudnn,mm-bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, child_flag, run_child, self_command  # noqa: E402 - after the path

#: case -> (environment, Python that defines ``call()``; ``torch``, ``F`` and ``dev`` are in scope).
_QKV = "q, k, v = (torch.randn(4, 16, 256, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))\n"
CASES: dict[str, tuple[dict[str, str], str]] = {
    **{f"sdpa-{b.lower()}": ({}, _QKV + (
        "from torch.nn.attention import sdpa_kernel, SDPBackend\n"
        f"def call():\n    with sdpa_kernel([SDPBackend.{b}]):\n"
        "        return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"))
       for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")},
    "sdpa-default": ({}, _QKV + "def call():\n    return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"),
    "mm-bf16": ({}, "a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)\n"
                    "def call():\n    return a @ a\n"),
    "mm-bf16-cublaslt": ({}, "torch.backends.cuda.preferred_blas_library('cublaslt')\n"
                             "a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)\n"
                             "def call():\n    return a @ a\n"),
    "addmm-bf16": ({}, "a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)\n"
                       "b = torch.randn(1024, device=dev, dtype=torch.bfloat16)\n"
                       "def call():\n    return torch.addmm(b, a, a)\n"),
    "mm-fp32": ({}, "a = torch.randn(1024, 1024, device=dev)\ndef call():\n    return a @ a\n"),
    "conv-bf16": ({}, "x = torch.randn(16, 3, 224, 224, device=dev, dtype=torch.bfloat16)\n"
                      "w = torch.randn(64, 3, 7, 7, device=dev, dtype=torch.bfloat16)\n"
                      "def call():\n    return F.conv2d(x, w, stride=2, padding=3)\n"),
}


def _child(case: str) -> dict:
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    t = time.perf_counter()
    (torch.zeros(1, device=dev) + 1).item()
    context_s = time.perf_counter() - t
    scope = {"torch": torch, "F": F, "dev": dev}
    exec(CASES[case][1], scope)  # noqa: S102 - this tool's own case table
    torch.cuda.synchronize()
    times = []
    for _ in range(2):
        t = time.perf_counter()
        scope["call"]()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return {"context_s": context_s, "first_s": times[0], "second_s": times[1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    child_flag(p, "--case")
    a = p.parse_args()
    if a.case:
        print(json.dumps(_child(a.case)))
        return
    cases = a.cases.split(",")
    print("| case | CUDA context s | first call s | second call s |\n|---|---|---|---|")
    for case in cases:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | CASES[case][0]
        rows = []
        for _ in range(a.rounds + 1):  # the first round writes bytecode and is not counted
            try:
                rows.append(run_child(self_command(__file__, "--case", case), case, env=env, timeout=120))
            except ChildFailed as err:
                print(f"| {case} | failed: {(err.stderr.strip().splitlines() or [str(err)])[-1][:100]} | | |")
                break
        else:
            med = {f: statistics.median(r[f] for r in rows[1:]) for f in rows[0]}
            print(f"| {case} | {med['context_s']:.3f} | {med['first_s']:.4f} | {med['second_s']:.4f} |")


if __name__ == "__main__":
    main()
