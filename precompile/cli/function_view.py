"""``precompile inspect`` of a whole-function artifact: its graphs, the sources it was traced through, its guards."""

from __future__ import annotations

import json
from typing import Any

from precompile.cli.common import console, human_bytes


def show_function(m: dict[str, Any], where: str) -> None:
    """Print a whole-function manifest readably: what it is, the graphs its bytecode calls (by graph artifact key),
    each source with its hash and whether it still matches here, each frame's guards, and the key factors."""
    from rich.table import Table

    from precompile.artifact.trust import describe
    from precompile.function.sources import changed

    con = console()
    build, factors = m.get("build") or {}, m.get("factors") or {}
    fn = factors.get("function") or {}
    con.print(f"[bold]function artifact[/] {m['key']}  (from {where})")
    con.print(f"{fn.get('module')}.{fn.get('qualname')} (source sha256 {str(fn.get('source'))[:16]}); built "
              f"{build.get('created')} in {build.get('seconds')} s by precompile {build.get('precompile')}, "
              f"torch {build.get('torch')}; {build.get('codes')} code objects, "
              f"{human_bytes(sum(b['size'] for b in m['blobs'].values()))} of Dynamo state", markup=False)
    con.print(describe(m), markup=False)
    gt = Table(title=f"graphs ({len(m['graphs'])}): the names its bytecode calls, and the artifact each loads")
    gt.add_column("compiled graph")
    gt.add_column("graph artifact")
    for name, key in m["graphs"].items():
        gt.add_row(name, key)
    con.print(gt)
    st = Table(title=f"sources Dynamo traced through ({len(m['sources'])})")
    for col in ("module", "lines", "sha256", "here"):
        st.add_column(col)
    for s in m["sources"]:
        why = changed([s])
        st.add_row(s["module"], f"{s['first']}-{s['last'] - 1}", s["sha256"][:16],
                   "[green]same[/]" if why is None else f"[red]{why.split(':')[0]}[/]")
    con.print(st)
    for f in m["frames"]:
        ft = Table(title=f"{f['code']}: {len(f.get('guards', []))} guards")
        ft.add_column("guard")
        for g in f.get("guards", []):
            ft.add_row(g)
        con.print(ft)
    kt = Table(title="key factors")
    kt.add_column("factor")
    kt.add_column("value")
    for k, v in factors.items():
        text = json.dumps(v, sort_keys=True)
        kt.add_row(k, text if len(text) < 160 else text[:157] + "...")
    con.print(kt)
