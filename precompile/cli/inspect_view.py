"""``precompile inspect``: one artifact's manifest, readably.  Every value read from the manifest is printed as plain
text (:func:`precompile.cli.common.plain`), never as markup; a malformed manifest is shown as far as it can be and
the command fails with one line, never a traceback."""

from __future__ import annotations

import json
from typing import Any

from precompile.cli.common import console, human_bytes, plain, table
from precompile.errors import ArtifactFormatError, PrecompileError


def show(source: Any, *, wrapper: bool = False, summary: bool = True, policy: Any = None) -> None:
    """Print ``source`` (a :class:`precompile.store.lookup.Source`): a graph artifact, a whole-function artifact, a
    record, or (``wrapper``) its wrapper graph; with ``summary`` False only check it (``inspect --json``).  Its
    signature is judged under ``policy`` (the command's :class:`~precompile.manifest.trust.Policy`; default: the
    environment's).

    Raises:
        TrustConfigError: the configured verify or signing keys cannot be read, or a key setting names no key.
        ArtifactFormatError: the manifest is malformed (:attr:`Source.problem`, or a field a view reads has a shape
            no check foresaw); what could be shown was printed first.
    """
    from precompile.manifest import trust

    pol = policy or trust.policy()  # a wrong key setting is an error here too, before anything is shown
    m, where = source.manifest, source.where
    if source.problem is not None:
        if summary:
            _show_malformed(source, pol)
        raise ArtifactFormatError(f"artifact {source.key} ({where}) is malformed: {source.problem}")
    if not summary:
        return
    try:
        if wrapper:
            from precompile.cli.wrapper_view import show_wrapper_graph

            show_wrapper_graph(source, m)
        elif m.get("kind") == "function":
            from precompile.cli.function_view import show_function

            show_function(m, where, trust.describe(m, pol))
        elif m.get("kind") == "record":
            _show_record(m, where, trust.describe(m, pol))
        else:
            show_graph(m, where, trust.describe(m, pol))
    except PrecompileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:  # stored data a check let through
        raise ArtifactFormatError(f"artifact {source.key} ({where}) is malformed: {type(err).__name__}: {err}") from err


def _show_malformed(source: Any, pol: Any) -> None:
    """What can be said of a malformed manifest: where it is, why it is malformed, its signature, its fields."""
    from rich.text import Text

    from precompile.manifest import trust

    con = console()
    con.print(Text.assemble(("artifact", "bold"), " ", plain(source.key), " (from ", plain(source.where), ")"))
    con.print(Text.assemble(("malformed", "bold red"), ": ", plain(source.problem, 400)))
    con.print(plain(trust.describe(source.manifest, pol)))
    t = table("its fields, as stored", ["field", "type", "value"])
    for name, value in sorted(source.manifest.items(), key=lambda kv: str(kv[0])):
        t.add_row(str(name), type(value).__name__, _short(value, 100))
    con.print(t)


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _show_record(m: dict[str, Any], where: str, signature: str) -> None:
    import click

    con = console()
    con.print(plain(f"record {m.get('key')} (from {where}): {m.get('purpose')}, written {m['build'].get('created')}"))
    con.print(plain(signature))
    click.echo(json.dumps({"factors": m.get("factors"), "data": m.get("data")}, indent=1, sort_keys=True))


def show_graph(m: dict[str, Any], where: str, signature: str) -> None:
    """Print a (checked) graph manifest: build, load path, host code, parts, kernels, picks, inputs, env, factors."""
    from rich.text import Text

    con = console()
    blobs, build, parts = m["blobs"], m["build"], m["parts"]
    con.print(Text.assemble(("artifact", "bold"), " ", plain(m["key"]), " (from ", plain(where), ")"))
    con.print(plain(f"built {build.get('created')} in {build.get('seconds')} s by precompile {build.get('precompile')}; "
                    f"{len(blobs)} blobs, {human_bytes(sum(b['size'] for b in blobs.values()))}"))
    con.print(plain(signature))
    fast = parts.get("fast")
    if fast:
        con.print(Text.assemble("load: ", ("fast path", "green"), " (carried binaries, nothing compiled)", plain(
            (f"; writes to inputs {fast['mutated']}" if fast.get("mutated") else "")
            + (f"; custom ops {[o['op'] for o in fast['ops']]}" if fast.get("ops") else ""))))
    else:
        con.print(Text.assemble("load: ", ("portable path only", "yellow"),
                                " (", plain(build.get("fast_off") or "no reason recorded"), ")"))
    if parts.get("wrapper_graph"):
        con.print(Text.assemble("host code: ", ("none", "green"), plain(
            f" (wrapper stored as data, {len(parts['wrapper_graph'].get('kernels', {}))} kernels as cubins; "
            "inspect --wrapper prints it)")))
    else:
        con.print(plain(f"host code: {build.get('host_code') or 'a Python wrapper'}"))
    rewrites = build.get("rewrites")
    if isinstance(rewrites, dict) and rewrites:  # exact rewrites made before the key (precompile.key.passes)
        con.print(plain("graph rewrites before the key: " + ", ".join(f"{n} x{c}" for n, c in rewrites.items())))
    shapes = m.get("shapes") or {}
    if shapes.get("symbols"):
        con.print(plain("symbolic sizes: " + ", ".join(
            f"{n} in [{s['range'][0]}, {'inf' if s['range'][1] is None else s['range'][1]}] (example {s.get('hint')})"
            for n, s in shapes["symbols"].items()) + f"; guards: {shapes.get('guards')}"))
    at = table("ambient state (key factors)", ["setting", "value"])
    for k, v in (m["factors"].get("ambient") or {}).items():
        at.add_row(str(k), json.dumps(v))
    con.print(at)
    pt = table("parts", ["part", "digest", "size"])

    def size(digest: Any) -> str:
        return human_bytes(blobs[digest]["size"]) if digest in blobs else "?"

    for name, d in parts["fx_graph"].items():
        pt.add_row(f"fx_graph.{name}", str(d)[:16], size(d))
    pt.add_row("engine_payload", parts["engine_payload"][:16], size(parts["engine_payload"]))
    for name, d in parts.get("wrappers", {}).items():
        pt.add_row(f"wrapper {name}", d[:16], size(d))
    con.print(pt)
    kt = table(f"kernels ({len(m['kernels'])})", ["kernel", "lang", "source", "binaries", "autotune pick"])
    for k in m["kernels"]:
        bins = ", ".join(f"{f} ({size(d)})" for f, d in k["binaries"].items()) or "-"
        kt.add_row(str(k["name"]), str(k["lang"]), size(k.get("source")), bins,
                   json.dumps(k["config"], sort_keys=True) if k.get("config") else "-")
    con.print(kt)
    autotune = m["autotune"]
    if autotune.get("other"):
        con.print(plain("other autotune picks: " + json.dumps(autotune["other"], sort_keys=True)))
    if autotune.get("multi_kernel"):
        con.print(plain("multi-kernel picks (sub-kernel index): " + json.dumps(autotune["multi_kernel"], sort_keys=True)))
    from precompile.cli.picks_view import show_tuned

    show_tuned(autotune.get("tuned"), autotune.get("benchmark_leftovers", 0))
    it = table("inputs and alignment", ["#", "placeholder", "kind", "fqn", "shape", "dtype", "device", "aligned",
                                        "inductor assumes"])
    align = {a["index"]: a for a in m["alignment"]}
    for i, p in enumerate(m["placeholders"]):
        a = align.get(i, {})
        shape = p.get("shape", [])
        it.add_row(str(i), p["name"], p["kind"], str(p.get("fqn") or ""),
                   "x".join(map(str, shape)) if isinstance(shape, list) else str(shape),
                   str(p.get("dtype", p.get("type", ""))), str(p.get("device", "")),
                   str(a.get("aligned_at_build", "")), str(a.get("at_run_time", "")))
    con.print(it)
    et = table("environment (key fields marked *)", ["field", "value"])
    keyf = m["factors"].get("env") or {}
    for k, v in m["env"].items():
        et.add_row(("* " if k in keyf else "  ") + str(k), str(v))
    con.print(et)
    ft = table("key factors", ["factor", "value"])
    for k, v in m["factors"].items():
        if k != "ambient":  # its own table above
            ft.add_row(str(k), _short(json.dumps(v, sort_keys=True)))
    con.print(ft)
