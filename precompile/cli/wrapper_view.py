"""``precompile inspect --wrapper``: a GPU artifact's wrapper stored as data, as readable code, and its kernel
table (launch records of :mod:`precompile.inductor.load.cuda_runtime`)."""

from __future__ import annotations

from typing import Any

from precompile.cli.common import console, plain, table

#: Largest stored wrapper graph parsed for display, bytes (100,000 nodes of bounded size fit well under it).
MAX_GRAPH_BYTES = 64 << 20


def show_wrapper_graph(source: Any, m: dict[str, Any]) -> None:
    """Print ``m``'s wrapper graph (:func:`precompile.manifest.wrapper.text.describe`) and its kernels' launch records,
    or why the artifact has none.  The graph and records are checked before anything is printed.

    Raises:
        click.ClickException: a stored part is refused by its checks.
    """
    import click

    from cache_backends.bounded import loads_json
    from precompile.manifest.wrapper.text import describe
    from precompile.inductor.load.cuda_runtime import read_launch

    con = console()
    part = (m.get("parts") or {}).get("wrapper_graph")
    if not part:
        con.print(plain(f"no wrapper graph: {(m.get('build') or {}).get('host_code') or 'a Python wrapper'}"))
        return
    try:
        data = loads_json(source.part_text(part["graph"]) or "null", MAX_GRAPH_BYTES, "the stored wrapper graph")
        text = describe(data)
        records = {i: read_launch(source.read(d) or b"", i)[0] for i, d in sorted(part["kernels"].items())}
    except (ValueError, RecursionError) as err:
        raise click.ClickException(f"the stored wrapper graph is refused: {err}") from err
    con.print(plain(text))
    kt = table(f"kernels ({len(records)}): launched from their cubins by torch's static launcher",
               ["kernel_idx", "name", "arguments to the cubin", "type codes", "warps", "shared bytes"])
    for i, r in records.items():
        kt.add_row(str(i), str(r["name"]), ", ".join(map(str, r["passed"])), str(r["arg_tys"]), str(r["num_warps"]),
                   str(r["shared"]))
    con.print(kt)
