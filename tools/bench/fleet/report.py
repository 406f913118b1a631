"""The storm's tables (rich, to stdout) and its one-line JSON summary."""

from __future__ import annotations


def node_share(storm: dict) -> float | None:
    """The largest node's bytes served over the fair share: all bytes / the nodes that serve reads."""
    served = {port: d["served_bytes"] for port, d in storm["nodes"].items()}
    total = sum(served.values())
    if not total or not storm["serving"]:
        return None
    return max(served.values()) / (total / len(storm["serving"]))


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f}"


def _p99_over_lone(result: dict, storm: dict) -> float | None:
    lone = result["lone"].get(storm["target"], {}).get("ttfo_s")
    return storm["ttfo_p99"] / lone if lone and storm["ttfo_p99"] is not None else None


def print_tables(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200)
    storms = [s for s in result["storms"] if s["storm"] != "lone"]
    for n in sorted({s["workers"] for s in storms}):
        t = Table(title=f"storm, N={n} workers x {result['keys']} keys, {result['cpus']} CPUs "
                        f"(replica reads: {'on' if result['replica_reads'] else 'off'})")
        for col in ("target", "storm", "builds", "builds/key", "outcomes", "p50 s", "p99 s", "max s", "p99/lone",
                    "KiB served", "max node share", "peak clients", "Redis CPU s", "wrong", "crashed"):
            t.add_column(col, justify="right")
        for s in (s for s in storms if s["workers"] == n):
            t.add_row(s["target"], s["storm"], str(s["builds"]), _fmt(s["builds_per_key"]),
                      ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items())),
                      _fmt(s["ttfo_p50"]), _fmt(s["ttfo_p99"]), _fmt(s["ttfo_max"]), _fmt(_p99_over_lone(result, s)),
                      _kib(s["served_bytes"]), _fmt(node_share(s)), str(s["peak_clients"]), _fmt(s["redis_cpu_s"]),
                      str(s["wrong_outputs"]), str(len(s["crashed"])))
        con.print(t)
        _node_table(con, [s for s in storms if s["workers"] == n], f"bytes served per node (KiB), N={n}")
    for s in storms:
        if "near_counters" in s:
            c = s["near_counters"]
            con.print(f"tiered, {s['target']} N={s['workers']}: Redis served {_kib(s['served_bytes'])} KiB to the "
                      f"host; the near tier fetched {c.get('remote_blobs', '?')} blobs, "
                      f"{c.get('remote_bytes', '?')} bytes (one copy of the {s['keys']} artifacts: "
                      f"{s['artifact_bytes']} bytes), near_waits {c.get('near_waits', '?')}")
    lone = result["lone"]
    if lone:
        con.print("lone worker, seconds to first output (median): " + ", ".join(
            f"{k} {v['ttfo_s']:.3f} ({', '.join(f'{r:.3f}' for r in v['runs'])}; peak RSS {v['rss_mib']:.0f} MiB)"
            for k, v in lone.items()))
    for s in result["skipped"]:
        con.print(f"N={s['workers']} skipped: needs about {s['need_gib']:.1f} GiB, {s['available_gib']:.1f} GiB "
                  "available")
    if result["faults"]:
        t = Table(title="faults during a storm")
        for col in ("fault", "N", "what happened", "builds", "outcomes", "p50 s", "max s", "crashed", "wrong",
                    "verify", "survived"):
            t.add_column(col, justify="right")
        for s in result["faults"]:
            what = ", ".join(f"{k} {v}" for k, v in s["fault"].items())
            t.add_row(s["fault_name"], str(s["workers"]), what, str(s["builds"]),
                      ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items())), _fmt(s["ttfo_p50"]),
                      _fmt(s["ttfo_max"]), str(len(s["crashed"])), str(s["wrong_outputs"]),
                      "ok" if s["verify"]["ok"] else "DAMAGED", "yes" if s["survived"] else "NO")
        con.print(t)
        _node_table(con, result["faults"], "bytes served per node during the faults (KiB)")
        for s in result["faults"]:
            for w in s["warnings"]:
                con.print(f"  {s['fault_name']}: {s['warnings'][w]} x {w}")
    con.print(f"1-minute load average {result['loadavg_start']:.2f} at start, {result['loadavg_end']:.2f} at end; "
              f"{result['seconds']:.0f} s in all")


def _node_table(con, storms: list[dict], title: str) -> None:
    from rich.table import Table

    names = []
    for s in storms:
        names += [v for v in s["node_names"].values() if v not in names]
    if not names:
        return
    t = Table(title=title)
    for col in ("target", "storm", *names):
        t.add_column(col, justify="right")
    for s in storms:
        by_name = {s["node_names"][p]: d for p, d in s["nodes"].items() if p in s["node_names"]}
        cells = []
        for name in names:
            d = by_name.get(name)
            cells.append("" if d is None else _kib(d["served_bytes"]) + (" (killed)" if d["dead"] else ""))
        t.add_row(s["target"], s.get("fault_name", s["storm"]), *cells)
    con.print(t)


def summary_line(result: dict) -> dict:
    """The last line's JSON, for the largest N measured: on the cluster when there is one, else on the single
    server."""
    storms = [s for s in result["storms"] if s["storm"] != "lone"]
    if not storms:
        return {"workers": 0, "faults_survived": sum(f["survived"] for f in result["faults"]),
                "faults_run": len(result["faults"]), "wrong_outputs": sum(f["wrong_outputs"] for f in result["faults"])}
    kind = "cluster" if any(s["target"] == "cluster" for s in storms) else "redis"
    n = max(s["workers"] for s in storms if s["target"] == kind)
    pick = {s["storm"]: s for s in storms if s["target"] == kind and s["workers"] == n}
    cold, warm = pick.get("cold"), pick.get("warm")
    line = {"workers": n,
            "builds_per_key": round(cold["builds_per_key"], 3) if cold else None,
            "p99_over_lone": round(_p99_over_lone(result, warm), 2) if warm else None,
            "max_node_share": round(node_share(warm), 3) if warm and node_share(warm) else None,
            "faults_survived": sum(f["survived"] for f in result["faults"]),
            "wrong_outputs": sum(s["wrong_outputs"] for s in result["storms"] + result["faults"]),
            "faults_run": len(result["faults"]), "target": kind, "replica_reads": result["replica_reads"]}
    tiered = pick.get("tiered")
    if tiered and tiered.get("near_counters", {}).get("remote_bytes") is not None and tiered["artifact_bytes"]:
        line["downloads_per_host"] = round(tiered["near_counters"]["remote_bytes"] / tiered["artifact_bytes"], 2)
    return line


# ------------------------------------------------------------------------------------------ fetch-only storms
def _fetch_over_lone(result: dict, storm: dict) -> float | None:
    lone = result["lone"].get(f"{storm['target']}/{storm['artifacts']}", {}).get("seconds")
    return storm["p99"] / lone if lone and storm["p99"] is not None else None


def print_fetch_tables(result: dict) -> None:
    """The fetch-only storms: per target and artifact set a row per N, then bytes and peak connections per node."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=220)
    for name, d in result["sets"].items():
        con.print(f"artifact set {name}: {d['artifacts']} artifacts, {d['load_blobs']} blobs a load reads; a worker "
                  f"reads {d['read_bytes'] / 1e6:.2f} MB ({d['stored_bytes'] / 1e6:.2f} MB as stored)")
    groups = sorted({(s["target"], s["artifacts"]) for s in result["storms"]})
    for target, name in groups:
        storms = [s for s in result["storms"] if (s["target"], s["artifacts"]) == (target, name)]
        lone = result["lone"][f"{target}/{name}"]
        t = Table(title=f"fetch-only, {target}, {name} artifacts, {result['cpus']} CPUs, {result['procs']} client "
                        f"processes (lone client {lone['seconds']:.3f} s; replica reads "
                        f"{'on' if result['replica_reads'] and target == 'cluster' else 'off'}; signed "
                        f"{'yes' if result['signed'] else 'no'})")
        for col in ("N", "p50 s", "p99 s", "max s", "p99/lone", "CPU floor s", "p99/floor", "open p50 s", "hits", "builds", "errors", "timeouts",
                    "breakers", "MB served", "max node share", "peak conns/node", "conns/client", "Redis CPU s",
                    "CPU s/GB", "client CPU s", "client RSS MiB", "wall s"):
            t.add_column(col, justify="right")
        for s in storms:
            t.add_row(str(s["workers"]), _fmt(s["p50"], ".3f"), _fmt(s["p99"], ".3f"), _fmt(s["max"], ".3f"),
                      _fmt(_fetch_over_lone(result, s)), _fmt(s["cpu_floor_s"]),
                      _fmt(s["p99"] / s["cpu_floor_s"] if s["p99"] and s["cpu_floor_s"] else None),
                      _fmt(s["open_p50"], ".3f"), str(s["outcomes"].get("hit", 0)),
                      str(s["builds"]), str(s["errors"]), str(s["timeouts"]), str(s["breakers_tripped"]),
                      f"{s['served_bytes'] / 1e6:,.1f}", _fmt(node_share(s)), str(s["peak_connections_per_node"]),
                      _fmt(s["peak_connections"] / s["workers"], ".1f"), _fmt(s["redis_cpu_s"]),
                      _fmt(s["redis_cpu_s_per_gb"], ".1f"), _fmt(s["client_cpu_s"], ".1f"), _fmt(s["client_rss_mib"], ",.0f"),
                      _fmt(s["wall_s"], ".1f"))
        con.print(t)
        if target == "cluster":
            _fetch_node_table(con, storms, f"cluster, {name} artifacts: MB served / peak connections per node")
        for s in storms:
            for e in ([s["aborted"]] if s.get("aborted") else []) + s["error_samples"]:
                con.print(f"  {s['label']}: {e}")
    con.print(f"1-minute load average {result['loadavg_start']:.2f} at start, {result['loadavg_end']:.2f} at end; "
              f"{result['seconds']:.0f} s in all")


def _fetch_node_table(con, storms: list[dict], title: str) -> None:
    from rich.table import Table

    names = list(dict.fromkeys(v for s in storms for v in s["node_names"].values()))
    t = Table(title=title)
    for col in ("N", *names):
        t.add_column(col, justify="right")
    for s in storms:
        by_name = {s["node_names"][p]: d for p, d in s["nodes"].items() if p in s["node_names"]}
        t.add_row(str(s["workers"]), *(f"{by_name[m]['served_bytes'] / 1e6:,.1f} / {by_name[m]['peak_clients']}"
                                       if m in by_name else "" for m in names))
    con.print(t)


def fetch_summary_line(result: dict) -> dict:
    """The last line's JSON: the largest N on the cluster (else the single server); each field the worst over the
    artifact sets, and each set's own under ``by_artifacts``."""
    storms = result["storms"]
    if not storms:
        return {"workers": 0, "errors": None, "builds": None}
    kind = "cluster" if any(s["target"] == "cluster" for s in storms) else "redis"
    n = max(s["workers"] for s in storms if s["target"] == kind)
    by = {}
    for s in (s for s in storms if s["target"] == kind and s["workers"] == n):
        over, share = _fetch_over_lone(result, s), node_share(s)
        by[s["artifacts"]] = {"errors": s["errors"], "builds": s["builds"], "timeouts": s["timeouts"],
                              "breaker_trips": s["breakers_tripped"],
                              "p99_over_lone": round(over, 2) if over is not None else None,
                              "max_node_share": round(share, 3) if share is not None else None,
                              "peak_connections_per_node": s["peak_connections_per_node"],
                              "p99_s": round(s["p99"], 3) if s["p99"] is not None else None,
                              "cpu_floor_s": round(s["cpu_floor_s"], 3),
                              "served_bytes": s["served_bytes"], "verified_bytes": s["verified_bytes"],
                              "redis_cpu_s_per_gb": round(s["redis_cpu_s_per_gb"], 2)
                              if s["redis_cpu_s_per_gb"] is not None else None}

    def worst(field: str, combine=max):
        values = [v[field] for v in by.values() if v[field] is not None]
        return combine(values) if values else None

    return {"workers": n, "errors": worst("errors", sum), "builds": worst("builds", sum),
            "p99_over_lone": worst("p99_over_lone"), "max_node_share": worst("max_node_share"),
            "peak_connections_per_node": worst("peak_connections_per_node"), "timeouts": worst("timeouts", sum),
            "breaker_trips": worst("breaker_trips", sum), "target": kind, "replica_reads": result["replica_reads"],
            "by_artifacts": by}
