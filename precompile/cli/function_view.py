"""``precompile inspect`` of a whole-function artifact: its graphs, the sources it was traced through, its guards."""

from __future__ import annotations

import json
from typing import Any

from precompile.cli.common import console, human_bytes, plain, table


def show_function(m: dict[str, Any], where: str, signature: str) -> None:
    """Print a (checked) whole-function manifest readably: what it is, the graphs its bytecode calls (by graph
    artifact key), each source with its hash and whether it still matches here, each frame's guards, and the key
    factors.  ``signature`` is the line :func:`precompile.manifest.trust.describe` wrote.  Stored values are printed
    as plain text, never markup."""
    from rich.text import Text

    from precompile.function.sources import changed

    con = console()
    build, factors = m["build"], m["factors"]
    fn = factors.get("function") if isinstance(factors.get("function"), dict) else {}
    con.print(Text.assemble(("function artifact", "bold"), " ", plain(m["key"]), " (from ", plain(where), ")"))
    con.print(plain(f"{fn.get('module')}.{fn.get('qualname')} (source sha256 {str(fn.get('source'))[:16]}); built "
                    f"{build.get('created')} in {build.get('seconds')} s by precompile {build.get('precompile')}, "
                    f"torch {build.get('torch')}; {build.get('codes')} code objects, "
                    f"{human_bytes(sum(b['size'] for b in m['blobs'].values()))} of Dynamo state"))
    con.print(plain(signature))
    if m["build"].get("refused"):
        con.print(Text.assemble(("stored as refused", "bold red"), ": its builder could not store the function "
                                "whole, so every process traces it (its graphs still load from the cache): ",
                                plain(str(build["refused"]))))
    for frame, why in (build.get("left_out") or {}).items():
        con.print(Text.assemble(("left out", "bold yellow"), " (traced at run time): ", plain(str(frame)), ": ",
                                plain("; ".join(map(str, why)) if isinstance(why, list) else str(why))))
    gt = table(f"graphs ({len(m['graphs'])}): the names its bytecode calls, and the artifact each loads",
               ["compiled graph", "graph artifact"])
    for name, key in m["graphs"].items():
        gt.add_row(name, key)
    con.print(gt)
    st = table(f"sources Dynamo traced through ({len(m['sources'])})", ["module", "lines", "sha256", "here"])
    for s in m["sources"]:
        why = changed([s], import_missing=False)  # reading an entry imports nothing it names
        st.add_row(s["module"], f"{s['first']}-{s['last'] - 1}", s["sha256"][:16],
                   Text("same", style="green") if why is None else Text(why.split(":")[0], style="red"))
    con.print(st)
    for f in m["frames"]:
        ft = table(f"{f['code']}: {len(f.get('guards', []))} guards", ["guard"])
        for g in f.get("guards", []):
            ft.add_row(g)
        con.print(ft)
    kt = table("key factors", ["factor", "value"])
    for k, v in factors.items():
        text = json.dumps(v, sort_keys=True)
        kt.add_row(str(k), text if len(text) < 160 else text[:157] + "...")
    con.print(kt)
