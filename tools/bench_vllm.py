"""vLLM starts on the tiny Llama: vLLM's own compile cache against precompile's, each start a fresh process.

    python tools/bench_vllm.py [--workdir DIR] [--json-out FILE]

Run with the Python of an environment where vLLM and precompile are installed (``tools/install_vllm_cpu.sh``).
Scenarios, in order, each one fresh ``tools/vllm_tiny.py run`` process (engine processes included):

| scenario | vLLM setting | vLLM + Inductor dirs | precompile cache |
|---|---|---|---|
| eager | ``enforce_eager=True`` (the reference tokens) | fresh | - |
| vLLM cold / warm | vLLM's default (on CPU: ``DYNAMO_TRACE_ONCE`` + Inductor) | fresh / the cold run's | - |
| precompile cold / warm | ``compilation_config={"backend": "precompile"}`` | fresh / the cold run's | fresh / the same |
| precompile new machine | the same | fresh (empty) | the warm run's |

Columns: time to first token (process start to the first generated token), vLLM's engine-init seconds and
compile seconds (both from vLLM's log; vLLM logs compile seconds only in ``VLLM_COMPILE`` mode, so for its
``DYNAMO_TRACE_ONCE`` rows compile is estimated as engine init minus the eager run's engine init, marked ``~``),
precompile's own seconds in the compile phase (the adaptor's key + load or build, summed over the pieces), its
hits / misses / builds (the cache's own counters, before and after), the load engines, and whether the
8 greedy tokens of both prompts equal the eager run's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.vllm_tiny import ENV, make_tiny_llama  # noqa: E402

INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?: \(compilation: ([\d.]+) s)?")
PIECE = re.compile(r"precompile \S+ (\S+) range \((\d+), (\d+)\): (\w+) in ([\d.]+) s \(key (\w+), engine (\w+)\)")
BACKEND = {"compilation_config": {"backend": "precompile"}}


def scenarios(work: Path) -> list[dict]:
    """The runs of the module docstring: name, LLM kwargs, and the dirs each uses."""
    pc = "file://" + str(work / "precompile-cache")
    return [
        {"name": "eager (reference)", "kwargs": {"enforce_eager": True}, "dirs": "eager", "cache": None},
        {"name": "vLLM cache, cold", "kwargs": {}, "dirs": "vllm", "cache": None},
        {"name": "vLLM cache, warm", "kwargs": {}, "dirs": "vllm", "cache": None},
        {"name": "precompile, cold", "kwargs": BACKEND, "dirs": "pc", "cache": pc},
        {"name": "precompile, warm", "kwargs": BACKEND, "dirs": "pc", "cache": pc},
        {"name": "precompile, new machine", "kwargs": BACKEND, "dirs": "pc-new", "cache": pc},
    ]


def counters(url: str | None) -> dict[str, int]:
    if url is None:
        return {}
    from cache_backends.registry import open_cache

    return dict(open_cache(url).counters())


def run_one(model: str, sc: dict, work: Path, timeout: float) -> dict:
    """One fresh vLLM process for scenario ``sc``; returns its parsed numbers.

    Raises:
        RuntimeError: the process failed or printed no result (its log's tail is in the message).
    """
    dirs = work / sc["dirs"]
    env = dict(os.environ, **ENV, VLLM_CACHE_ROOT=str(dirs / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(dirs / "inductor"),
               PRECOMPILE_LOG="INFO", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("PRECOMPILE_CACHE", None)
    if sc["cache"]:
        env["PRECOMPILE_CACHE"] = sc["cache"]
    before = counters(sc["cache"])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "vllm_tiny.py"), "run", model, json.dumps(sc["kwargs"])],
                          env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{sc['name']}: exit {proc.returncode}\n{log[-5000:]}")
    out = json.loads(lines[-1])
    after = counters(sc["cache"])
    m = INIT.search(log)
    pieces = PIECE.findall(log)
    out.update(name=sc["name"], wall_s=round(wall, 2), init_engine_s=float(m.group(1)) if m else None,
               compile_s=float(m.group(2)) if m and m.group(2) else None,
               pc={k: after.get(k, 0) - before.get(k, 0) for k in ("hits", "misses", "builds")} if sc["cache"] else None,
               engines=sorted({p[6] for p in pieces}), pieces=len(pieces),
               pieces_s=round(sum(float(p[4]) for p in pieces), 3) if pieces else None)
    return out


def table(rows: list[dict]) -> tuple[object, str]:
    """(rich table, markdown table) of the results."""
    from rich.table import Table

    eager = rows[0]
    head = ["scenario", "time to first token s", "engine init s", "compile s", "of it precompile s",
            "precompile hits/misses/builds", "load engine", "tokens = eager"]
    t = Table(title="vLLM starts, tiny Llama (fresh processes)")
    for h in head:
        t.add_column(h, justify="left" if h in ("scenario", "load engine") else "right")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["compile_s"] is not None:
            comp = f"{r['compile_s']:.2f}"
        elif r is eager or r["init_engine_s"] is None:
            comp = "-"
        else:
            comp = f"~{r['init_engine_s'] - eager['init_engine_s']:.2f}"
        pc = "-" if r["pc"] is None else "{hits}/{misses}/{builds}".format(**r["pc"])
        ours = "-" if r.get("pieces_s") is None else f"{r['pieces_s']:.2f}"
        cells = [r["name"], f"{r['ttft_s']:.2f}", f"{r['init_engine_s']:.2f}" if r["init_engine_s"] else "?", comp, ours, pc,
                 ", ".join(r["engines"]) or "-", "yes" if r["tokens"] == eager["tokens"] else "NO"]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    return t, "\n".join(md)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="keep the model, dirs and caches here (default: a temporary directory)")
    ap.add_argument("--json-out", help="also write the rows as JSON to this file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per vLLM start (default 900)")
    args = ap.parse_args()
    from rich.console import Console

    console = Console()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = make_tiny_llama(str(work / "tiny-llama"))
        rows = []
        for sc in scenarios(work):
            console.log(f"running: {sc['name']}")
            rows.append(run_one(model, sc, work, args.timeout))
            console.log(json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"}))
        rich_table, md = table(rows)
        console.print(rich_table)
        print(md)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
