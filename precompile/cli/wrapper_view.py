"""``precompile inspect --wrapper``: a GPU artifact's wrapper stored as data, as readable code, and its kernel
table (launch records of :mod:`precompile.inductor.cuda_runtime`)."""

from __future__ import annotations

import json
from typing import Any

from precompile.cli.common import console


def show_wrapper_graph(source: Any, m: dict[str, Any]) -> None:
    """Print ``m``'s wrapper graph (:func:`precompile.artifact.wrapper_text.describe`) and its kernels' launch records,
    or why the artifact has none.  The graph and records are checked before anything is printed.

    Raises:
        click.ClickException: a stored part is refused by its checks.
    """
    import click
    from rich.table import Table
    from rich.text import Text

    from precompile.artifact.wrapper_text import describe
    from precompile.inductor.cuda_runtime import read_launch

    con = console()
    part = (m.get("parts") or {}).get("wrapper_graph")
    if not part:
        con.print(Text(f"no wrapper graph: {(m.get('build') or {}).get('host_code') or 'a Python wrapper'}"))
        return
    try:
        data = json.loads(source.part_text(part["graph"]) or "null")
        text = describe(data)
        records = {i: read_launch(source.read(d) or b"", i)[0] for i, d in sorted(part["kernels"].items())}
    except (ValueError, RecursionError) as err:
        raise click.ClickException(f"the stored wrapper graph is refused: {err}") from err
    con.print(Text(text))
    kt = Table(title=f"kernels ({len(records)}): launched from their cubins by torch's static launcher")
    for col in ("kernel_idx", "name", "arguments to the cubin", "type codes", "warps", "shared bytes"):
        kt.add_column(col)
    for i, r in records.items():
        kt.add_row(i, Text(r["name"]), Text(", ".join(r["passed"])), Text(r["arg_tys"]), str(r["num_warps"]),
                   str(r["shared"]))
    con.print(kt)
