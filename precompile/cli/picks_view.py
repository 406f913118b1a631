"""``precompile inspect``'s table of GEMM and convolution picks: each op ``max_autotune`` tuned, the choice it
took and what every candidate measured (records of :mod:`precompile.inductor.build.picks`, read from the manifest)."""

from __future__ import annotations

import json
from typing import Any

from precompile.cli.common import console, plain, table

#: Candidates shown per op; ``inspect --json`` has them all.
SHOWN = 12


def show_tuned(tuned: Any, leftovers: Any = 0) -> None:
    """Print one summary row per tuned op, then each op's candidates, fastest first.

    ``tuned`` is the manifest's ``autotune.tuned`` list; anything not shaped like it is skipped (the manifest
    is data from a cache: its strings are printed as text, never as markup).
    """
    con = console()
    ops = [t for t in tuned if isinstance(t, dict)] if isinstance(tuned, list) else []
    if not ops:
        return
    st = table(f"tuned ops ({len(ops)}): the choice max_autotune took (times: Inductor's benchmark, ms)",
               ["#", "op", "inputs", "chosen", "kind", "ms", "by", "fastest extern ms", "candidates"])
    for i, op in enumerate(ops):
        cands = _candidates(op)
        chosen = next((c for c in cands if c.get("choice") == op.get("chosen")), {})
        extern = [c["ms"] for c in cands if c.get("kind") == "extern" and _is_ms(c.get("ms"))]
        st.add_row(str(i), plain(str(op.get("op"))), plain(", ".join(map(str, _list(op.get("inputs"))))),
                   plain(str(op.get("chosen"))), plain(str(chosen.get("kind", "-"))), _ms(chosen.get("ms")),
                   plain(str(op.get("by", "-"))), _ms(min(extern)) if extern else "-",
                   str(len(cands) + _more(op)))
    con.print(st)
    for i, op in enumerate(ops):
        cands = _candidates(op)
        ct = table(f"#{i} {op.get('op')}: candidates, fastest first", ["choice", "kind", "config", "ms", ""])
        for c in cands[:SHOWN]:
            ct.add_row(plain(str(c.get("choice"))), plain(str(c.get("kind"))),
                       plain(json.dumps(c.get("config") or {}, sort_keys=True)), _ms(c.get("ms")),
                       "chosen" if c.get("choice") == op.get("chosen") else "")
        con.print(ct)
        more = len(cands) - SHOWN + _more(op)
        if more > 0:
            con.print(f"  and {more} more candidates (inspect --json)")
    if isinstance(leftovers, int) and leftovers:
        con.print(f"{leftovers} autotune configs of kernels that only a benchmark compiled (candidates not kept) "
                  "are not picks and are not stored")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _candidates(op: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in _list(op.get("candidates")) if isinstance(c, dict)]


def _more(op: dict[str, Any]) -> int:
    more = op.get("more")
    return more if isinstance(more, int) and not isinstance(more, bool) and more > 0 else 0


def _is_ms(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ms(value: Any) -> str:
    return f"{value:.4f}" if _is_ms(value) else "failed"

