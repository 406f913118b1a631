"""One process of the library cases (:mod:`tools.cases.libs`): the tests' and ``tools/bench/libs.py``'s child.

    python -m tools.cases.run_libs MODE --cases a,b --work DIR [--cache URL] [--device cpu] [--config JSON] [--calls N]

Modes:

- ``ours``: each case compiled with ``precompile.compile(target, dynamic=..., cache=URL)``;
- ``torch``: ``torch.compile(target, dynamic=...)`` (the Inductor cache is ``$TORCHINDUCTOR_CACHE_DIR``, cold or
  warm as the caller set it); with ``--save-mega`` it then writes ``torch.compiler.save_cache_artifacts()``'s bytes
  to ``DIR/<case>.mega``;
- ``mega``: ``torch.compiler.load_cache_artifacts(DIR/<case>.mega's bytes)`` first, then as ``torch``;
- ``percall``: ours and ``torch.compile``'s of each case in one process, called in turns (``--calls`` each, sizes
  alternating as the case's :attr:`~tools.cases.base.Setup.call` makes them), each call timed alone
  (:func:`per_call` says how the two are kept apart).

The cases are built before the clock starts; each case's clock then covers the compile call, its calls, and (mode
``mega``) reading and loading the Mega-Cache.  With ``BENCH_DYNAMO_IMPORTED=1`` ``torch._dynamo`` is imported
before any clock, as in a process that uses transformers or vLLM.  Outputs go to ``DIR/<mode>-<tag>.pt``
(``{case: {name: tensor}}``); the last stdout line is JSON: per case ``first_s`` (seconds from the compile call to
the compiled callable's first return), ``run_s`` (to the end of the case's calls), ``outcome``, ``miss_reason``,
``not_stored``, ``eager_equal`` (None where the case is not compared with eager), ``dynamo_before_clock``
(whether ``torch._dynamo`` was imported when the clock started); and ``frames``: the frames
Dynamo traced in this process, over all its calls (``precompile.inductor.dynamo.pkg.frames_traced`` for ``ours``,
Dynamo's ``counters["frames"]["ok"]`` for torch's modes).  Per-call rows carry ``ours_us`` and ``torch_us``
(medians, microseconds per call) and their ``ratio``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tools._common import sync

log = logging.getLogger("precompile.tools.cases.run_libs")


class FirstReturn:
    """``fn`` that notes the ``time.perf_counter()`` of its first return (:attr:`at`, seconds; None before).

    It is ``fn`` to ``inspect.signature`` (``__wrapped__``): transformers' ``generate`` passes the forward only the
    keywords its signature names, so a wrapper with a bare ``**kwargs`` would change the calls, and with them
    ``precompile.compile``'s key.
    """

    def __init__(self, fn: Any) -> None:
        self.fn, self.at, self.__wrapped__ = fn, None, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        if self.at is None:
            self.at = time.perf_counter()
        return out


def run_case(name: str, mode: str, a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Build case ``name``, then (timed) compile it in ``mode`` and make its calls: ``(row, outputs)``."""
    from tools.cases import libs

    work = Path(a.work)
    s = libs.setup(name, a.device, a.config)
    sync(a.device)
    dynamo_before = "torch._dynamo" in sys.modules  # transformers and diffusers import it while building a model
    t0 = time.perf_counter()
    loaded = None
    if mode == "mega":
        loaded = torch.compiler.load_cache_artifacts((work / f"{name}.mega").read_bytes())
    if mode == "ours":
        import precompile

        compiled = precompile.compile(s.target, dynamic=s.dynamic, cache=a.cache)
    else:
        compiled = torch.compile(s.target, dynamic=s.dynamic)
    first = FirstReturn(compiled)
    out = s.run(first)
    sync(a.device)
    row: dict[str, Any] = {"first_s": first.at - t0, "run_s": time.perf_counter() - t0,
                           "dynamo_before_clock": dynamo_before}
    if mode == "ours":
        row.update(outcome=compiled.outcome, miss_reason=compiled.miss_reason, not_stored=compiled.not_stored,
                   retraces=compiled.retraces, load_s=compiled.load_seconds)
    if loaded is not None:  # what the Mega-Cache held: {artifact kind: count}
        row["mega_artifacts"] = {kind: len(keys) for kind, keys in loaded.artifacts.items()}
    if mode == "torch" and a.save_mega:
        data = torch.compiler.save_cache_artifacts()
        if data is not None:
            (work / f"{name}.mega").write_bytes(data[0])
    row["eager_equal"] = None
    if s.eager_equal:
        ref = s.run(s.target)
        row["eager_equal"] = all(torch.equal(out[k], ref[k]) for k in out)
    return row, out


def per_call(name: str, a: argparse.Namespace) -> dict[str, Any]:
    """Ours (a warm hit) and ``torch.compile``'s of case ``name``, called in turns: medians in microseconds.

    Every ``torch.compile`` of a function shares one list of Dynamo entries per code object, and a call runs the
    first entry whose guards pass, whoever made it; ours are installed there too.  So torch's is compiled first,
    with ``isolate_recompiles=True`` (its entries apart, looked up before the shared ones), and called at every size
    of the mix before ours is installed; ``loop_frames`` (frames Dynamo traced while the two were timed) must be 0.
    """
    import precompile
    from torch._dynamo.utils import counters
    from tools.cases import libs

    s = libs.setup(name, a.device, a.config)
    theirs = torch.compile(s.target, dynamic=s.dynamic, isolate_recompiles=True)
    expected = s.run(theirs)
    for i in range(a.warmup):
        s.call(theirs, i)
    torch_frames = int(counters["frames"]["ok"])
    ours = precompile.compile(s.target, dynamic=s.dynamic, cache=a.cache)
    got = s.run(ours)
    same = all(torch.equal(got[k], expected[k]) for k in expected)
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    before = int(counters["frames"]["ok"])
    for i in range(a.warmup + a.calls):
        order = (("ours", ours), ("torch", theirs)) if i % 2 == 0 else (("torch", theirs), ("ours", ours))
        for who, fn in order:
            sync(a.device)
            t = time.perf_counter()
            s.call(fn, i)
            sync(a.device)
            if i >= a.warmup:
                times[who].append(time.perf_counter() - t)
    o, t = statistics.median(times["ours"]) * 1e6, statistics.median(times["torch"]) * 1e6
    return {"ours_us": o, "torch_us": t, "ratio": o / t, "outcome": ours.outcome, "same_as_torch": same,
            "torch_frames": torch_frames, "loop_frames": int(counters["frames"]["ok"]) - before}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("ours", "torch", "mega", "percall"))
    p.add_argument("--cases", required=True, help="comma-separated names from tools.cases.libs.CASES")
    p.add_argument("--work", required=True, help="folder for outputs and Mega-Cache files")
    p.add_argument("--cache", default=None, help="precompile cache URL (ours, percall)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", type=json.loads, default=None,
                   help="JSON object of config keywords over each case's small default, e.g. '{\"hidden_size\": 64}'")
    p.add_argument("--tag", default="run", help="names this process's output file")
    p.add_argument("--save-mega", action="store_true", help="torch: save the Mega-Cache after each case")
    p.add_argument("--calls", type=int, default=40, help="percall: timed calls of each callable")
    p.add_argument("--warmup", type=int, default=6, help="percall: untimed calls of each callable first")
    a = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("BENCH_LOG", "WARNING"), stream=sys.stderr)
    if os.environ.get("BENCH_DYNAMO_IMPORTED") == "1":
        importlib.import_module("torch._dynamo")  # as transformers and vLLM do before any compile
    rows: dict[str, Any] = {}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    with torch.no_grad():
        for name in a.cases.split(","):
            if a.mode == "percall":
                rows[name] = per_call(name, a)
            else:
                rows[name], outputs[name] = run_case(name, a.mode, a)
            log.info("%s %s: %s", a.mode, name, rows[name])
    if a.mode == "ours":
        from precompile.inductor.dynamo.pkg import frames_traced

        frames = frames_traced()
    else:
        from torch._dynamo.utils import counters

        frames = int(counters["frames"]["ok"])
    if outputs:
        torch.save(outputs, Path(a.work) / f"{a.mode}-{a.tag}.pt")
    print(json.dumps({"cases": rows, "frames": frames}))


if __name__ == "__main__":
    main()
