"""The tables and the JSON line of ``tools/bench/vllm.py``: one row per scenario, medians over its starts."""

from __future__ import annotations

import json
from typing import Any

NUMBERS = ("ready_s", "ttft_s", "init_engine_s", "compile_s", "capture_s", "vllm_compile_s", "pieces_s", "frames",
           "dynamo_s", "backend_s")
WARM_IDS = ("pc-warm", "pc-new", "pc-new-info", "pc-new-redis")


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def summarize(rows: list[dict]) -> list[dict]:
    """One row per scenario: numbers are medians over its starts; tokens must be equal in every start."""
    out: list[dict] = []
    for name in dict.fromkeys(r["name"] for r in rows):
        group = [r for r in rows if r["name"] == name]
        row = dict(group[0], runs=len(group))
        for k in NUMBERS:
            vals = [r[k] for r in group if r.get(k) is not None]
            row[k] = _median(vals) if vals and len(vals) == len(group) else None
        if row.get("pc") is not None:
            row["pc"] = {k: sum(r["pc"][k] for r in group) for k in row["pc"]}
        row["tokens"] = group[0]["tokens"] if all(r["tokens"] == group[0]["tokens"] for r in group) else None
        out.append(row)
    return out


def table(rows: list[dict], device: str) -> tuple[Any, str]:
    """(rich table, markdown table) of the summarized results."""
    from rich.table import Table

    eager = next((r for r in rows if r.get("id", "eager") == "eager"), rows[0])
    # bf16 with random weights: compiled and eager kernels may part at a near tie; vLLM's own compile is the reference
    compiled = next((r for r in rows if r.get("id") in ("vllm-cold", "vllm-warm")), None)
    head = ["scenario", "starts", "engine up s", "time to first token s", "compile phase s",
            "of it Dynamo / AOT load s", "of it pieces s", "of it precompile s", "CUDA graph capture s", "Dynamo frames", "pieces hits/misses/builds", "functions hits/misses/builds",
            "load engine", "tokens = eager", "tokens = vLLM compiled"]
    t = Table(title=f"vLLM starts, tiny Llama on {device} (fresh processes; medians over the starts)")
    for h in head:
        t.add_column(h, justify="left" if h in ("scenario", "load engine") else "right")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def num(v: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    for r in rows:
        pc = "-" if r.get("pc") is None else "{hits}/{misses}/{builds}".format(**r["pc"])
        fn = "-" if r.get("pc") is None else "{function_hits}/{function_misses}/{function_builds}".format(**r["pc"])
        cells = [r["name"], str(r["runs"]), num(r.get("ready_s")), num(r.get("ttft_s")), num(r.get("compile_s")),
                 num(r.get("dynamo_s")), num(r.get("backend_s")), num(r.get("pieces_s")), num(r.get("capture_s")), num(r.get("frames"), "{:.0f}"), pc, fn,
                 ", ".join(r.get("engines") or []) or "-",
                 "yes" if r["tokens"] is not None and r["tokens"] == eager["tokens"] else "NO",
                 "-" if compiled is None or r.get("id") == "eager" else
                 "yes" if r["tokens"] is not None and r["tokens"] == compiled["tokens"] else "NO"]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    return t, "\n".join(md)


def goals(rows: list[dict], device: str, shape: dict | None = None) -> dict[str, Any]:
    """The JSON line: the numbers the issue's goals name, from the summarized rows (None where not run), led by the
    model's ``shape`` (``layers``, ``hidden``)."""
    by = {r.get("id", r["name"]): r for r in rows}
    eager_tokens = by.get("eager", rows[0])["tokens"]

    def get(sid: str, key: str) -> Any:
        return by[sid].get(key) if sid in by else None

    warm = [by[s] for s in WARM_IDS if s in by]
    builds = sum((r["pc"] or {}).get("builds", 0) + (r["pc"] or {}).get("function_builds", 0) for r in warm)
    new, vllm_warm = get("pc-new", "ttft_s"), get("vllm-warm", "ttft_s")
    cold, vllm_cold = get("pc-cold", "compile_s"), get("vllm-cold", "compile_s")
    out = {**(shape or {}), "device": device, "starts": sum(r["runs"] for r in rows),
           "tokens_equal": all(r["tokens"] == eager_tokens for r in rows if r["tokens"] is not None)
           and all(r["tokens"] is not None for r in rows),
           "tokens_equal_vllm_compiled": None if "vllm-cold" not in by else
           all(r["tokens"] == by["vllm-cold"]["tokens"] for r in rows if r.get("id", "eager") != "eager"),
           "builds_warm": builds, "compile_phase_s": get("pc-warm", "compile_s"),
           "compile_phase_new_machine_s": get("pc-new", "compile_s"),
           "compile_phase_new_machine_redis_s": get("pc-new-redis", "compile_s"),
           "vllm_warm_compile_phase_s": get("vllm-warm", "compile_s"),
           "pieces_warm_s": get("pc-warm", "pieces_s"), "pieces_new_machine_s": get("pc-new", "pieces_s"),
           "aot_load_warm_s": get("pc-warm", "dynamo_s"), "vllm_warm_aot_load_s": get("vllm-warm", "dynamo_s"),
           "cold_compile_phase_s": cold, "vllm_cold_compile_phase_s": vllm_cold,
           "cold_over_vllm_cold": round(cold / vllm_cold, 3) if cold and vllm_cold else None,
           "capture_s": get("pc-warm", "capture_s"), "vllm_warm_capture_s": get("vllm-warm", "capture_s"),
           "frames_traced_warm": get("pc-warm", "frames"), "frames_traced_new_machine": get("pc-new", "frames"),
           "ttft_new_machine_s": new, "ttft_new_machine_redis_s": get("pc-new-redis", "ttft_s"),
           "ttft_vllm_warm_s": vllm_warm,
           "new_machine_over_vllm_warm": round(new / vllm_warm, 3) if new and vllm_warm else None,
           "flip_builds": (get("flip", "pc") or {}).get("builds"), "flip_explain": get("flip", "explain")}
    return out


def report(rows: list[dict], device: str, console: Any, shape: dict | None = None) -> dict[str, Any]:
    """Print the rich table (to ``console``), the markdown table and the JSON line (to stdout); return the JSON.
    ``shape``: the model's ``layers`` and ``hidden``, put first in the JSON line."""
    if not rows:
        print(json.dumps({"device": device, "starts": 0}))
        return {}
    summary = summarize(rows)
    rich_table, md = table(summary, device)
    console.print(rich_table)
    print(md)
    line = goals(summary, device, shape)
    print(json.dumps(line))
    return line
