"""The fuzz of the operators a stored FX graph may call (precompile.manifest.op_list), for
tests/manifest/test_op_fuzz.py: stored-graph documents (graph_json's format) calling admitted operators with extreme
ints (0, -1, 2**31, 2**62, -2**63...), NaN and infinite floats, indices just past and far past their tensor,
empty, 0-d, expanded (stride 0) and odd-dtype tensors, decoded through ``graph_from_json`` and run eagerly under
the guard (``OpGuard``), node by node (each printed before it runs: a crash names it).

Every input lives in one buffer with canary bytes around each input's storage, so a write past a storage changes a
canary and a read past one shows the canary's bit pattern in an output (as in tests/_wrapper_fuzz.py).  The process
is bounded: its address space may grow by :data:`MEMORY_MIB` (``RLIMIT_AS``), each graph gets :data:`ALARM_S`
seconds (``SIGALRM`` kills it), and it runs one thread.  Clean outcomes: the graph runs inside its storages, or
raises a Python exception (ATen's checks, the guard, the allocator under the bound) that rebuild turns into
"failed".  Anything else is a finding: a crash or hang (the process dies; the last ``RUN`` line names the operator)
or a write/read/view past a storage (listed in the summary).

``python -c "import _op_fuzz; _op_fuzz.main()" SHARD SHARDS EXAMPLES``: the deterministic sweep over this shard's
share of every admitted operator overload (each in every :data:`VARIANTS`), then ``EXAMPLES`` hypothesis-drawn graphs
of one to three nodes over that share; prints a JSON summary last.
"""

from __future__ import annotations

import contextlib
import json
import keyword
import re
import resource
import signal
import sys
from typing import Any

import numpy as np
import torch
import torch._inductor.inductor_prims  # noqa: F401 - registers prims::inductor_* (a rebuild's compile imports it)
import torch._prims  # noqa: F401 - registers the prims:: operators
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from precompile.manifest import op_list
from precompile.manifest.graph_json import graph_from_json
from precompile.manifest.op_guard import OpGuard, OpRefusedError

MEMORY_MIB = 2048
ALARM_S = 30
BATCH = 8  # overloads per graph of the sweep
GUARD = 256  # canary bytes on each side of every input's storage
INTS = [0, -1, 2 ** 31, 2 ** 62, -2 ** 63, 2 ** 63 - 1, 2 ** 31 - 1, 6, 63, -7]
FLOATS = [{"$float": "nan"}, {"$float": "inf"}, {"$float": "-inf"}, 1e308, -1e300, 0.0, 2.0 ** 62]
STRINGS = ["none", "mean", "sum", "floor", "trunc", "tanh", "reflect", "constant", "nearest", "linear", "fro", "L"]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool", "complex64"]
#: The inputs of every graph: ``(dtype, shape, stride or None, values)``; ``values`` "small" (near 0), "edge" (NaN,
#: infinities, huge; for integers: indices just past a 6-element tensor, negative, and 2**40, -2**63).
INPUTS = [
    ("float32", (2, 3), None, "small"), ("float32", (2, 3), None, "edge"), ("int64", (4,), None, "edge"),
    ("bool", (2, 3), None, "small"), ("float32", (0,), None, "small"), ("float32", (), None, "small"),
    ("float16", (3,), None, "small"), ("complex64", (2,), None, "small"), ("float32", (3, 2), (0, 1), "small"),
    ("int32", (3,), None, "edge"), ("uint8", (6,), None, "edge"), ("float32", (2, 3, 4, 5), None, "small"),
    ("int64", (2, 3), None, "small"), ("float32", (1, 0, 3), None, "small"),
]
FRESH = len(INPUTS)  # a resizable empty tensor outside the buffer, for out= arguments
#: Deterministic variants: which input each tensor argument takes (cycled), and how other arguments are chosen.
VARIANTS = {"plain": [0], "indices": [0, 2, 12], "ints": [0], "odd": [4, 5, 8, 13], "dtypes": [6, 7, 10, 3, 1],
            "4d": [11, 2, 9]}
_INDEXLIKE = re.compile(r"ind|idx|target|label|repeats|sorter|mask|counts|bins|lengths|pos|other", re.I)
SKIP = object()
REPORT: dict[str, Any] = {"tally": {"ran": 0, "error": 0, "guard": 0, "refused": 0}, "ran_ops": set(),
                          "covered": set(), "guard_refused": {}, "violations": []}


class Arena:
    """:data:`INPUTS` as tensors whose storages are slices of one buffer, :data:`GUARD` canary bytes around each."""

    made = 0
    spans: list[tuple[int, int]] = []
    values: list[torch.Tensor] = []

    def __init__(self) -> None:
        if not Arena.spans:  # the layout and the values, once
            at = GUARD
            for dtype, shape, stride, kind in INPUTS:
                item = torch.empty((), dtype=getattr(torch, dtype)).element_size()
                n = int(np.prod(shape)) if stride is None else 1 + sum((s - 1) * d for s, d in zip(shape, stride))
                Arena.spans.append((at, at + n * item))
                Arena.values.append(_values(dtype, n, kind))
                at = (at + n * item + GUARD + 63) // 64 * 64 + GUARD
        Arena.made += 1
        self.canary = 0x7FC00000 | (Arena.made % 0x3FFFFF + 1)  # a quiet NaN payload no operator makes
        self.buffer = np.empty(Arena.spans[-1][1] + GUARD, dtype=np.uint8)
        self.buffer[: len(self.buffer) // 4 * 4].view(np.uint32)[:] = self.canary
        self.inputs, self.guards = [], np.ones(len(self.buffer), dtype=bool)
        for (a, b), (dtype, shape, stride, _), values in zip(Arena.spans, INPUTS, Arena.values):
            flat = torch.from_numpy(self.buffer[a:b]).view(getattr(torch, dtype))
            flat.copy_(values)
            self.inputs.append(flat.view(shape) if stride is None else flat.as_strided(shape, stride))
            self.guards[a:b] = False
        self.inputs.append(torch.empty(0))
        self.pristine = self.buffer[self.guards].copy()
        self.word = int(np.uint32(self.canary).view(np.int32))

    def guards_intact(self) -> bool:
        return bool((self.buffer[self.guards] == self.pristine).all())

    def violations(self, values: list[Any]) -> list[str]:
        """Tensors among ``values`` reaching past their storage, or holding the canary (a read past one)."""
        found, lo, hi = [], self.buffer.ctypes.data, self.buffer.ctypes.data + len(self.buffer)
        for t in values:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type != "cpu":
                continue
            try:
                storage = t.untyped_storage()
                storage.data_ptr()
            except (RuntimeError, NotImplementedError):  # a tensor without a storage (a zero tensor)
                continue
            reach = 0 if 0 in t.shape else (t.storage_offset() + 1 + sum(
                (s - 1) * abs(d) for s, d in zip(t.shape, t.stride()))) * t.element_size()
            if reach > storage.nbytes():
                found.append(f"a {tuple(t.shape)}/{t.stride()}+{t.storage_offset()} view past its storage of "
                             f"{storage.nbytes()} bytes")
            elif not lo <= storage.data_ptr() < hi and 4 <= storage.nbytes() <= 1 << 26:
                words = torch.empty(0, dtype=torch.uint8).set_(storage)[: storage.nbytes() // 4 * 4]
                if bool((words.view(torch.int32) == self.word).any()):
                    found.append(f"a {t.dtype} {tuple(t.shape)} holds the canary: a read past a storage")
        return found


def _values(dtype: str, n: int, kind: str) -> torch.Tensor:
    i = torch.arange(n)
    if dtype == "bool":
        return i % 2 == 1
    if kind == "small":
        return (i % 5 - 2).to(getattr(torch, dtype))
    if dtype in ("float32", "float16", "complex64"):
        edge = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -0.0, 0.5])
        return edge[i % 6].to(getattr(torch, dtype))
    edge = {"int64": [6, 9, -7, 63, 2 ** 40, -2 ** 63], "int32": [6, -7, 2 ** 31 - 1], "uint8": [255, 6, 7]}[dtype]
    return torch.tensor(edge, dtype=getattr(torch, dtype))[i % len(edge)]


def overloads(shard: int, shards: int) -> list[str]:
    """This shard's share of every admitted operator's overloads the dispatcher holds (``aten::mm.default``), in a
    fixed order (a TorchScript-only operator, such as ``aten::element_size``, has none: no stored graph can call it)."""
    out = []
    for qualified in sorted(op_list.admitted()):
        packet = op_list._packet(qualified)
        for ov in sorted(packet.overloads()) if packet is not None else ():
            try:
                torch._C._dispatch_find_schema_or_throw(qualified, "" if ov == "default" else ov)
            except RuntimeError:
                continue  # a TorchScript-only overload: no stored graph can name it
            out.append(f"{qualified}.{ov}")
    return out[shard::shards]


def _schema(name: str) -> Any:
    qual, _, ov = name.rpartition(".")
    return getattr(op_list._packet(qual), ov)._schema


def _arg(arg: Any, variant: str, k: int, draw: Any = None, before: int = 0) -> Any:
    """A stored value for schema argument ``arg`` (its ``k``-th tensor slot for tensors); ``draw``: hypothesis, which
    may pick an input or one of the ``before`` nodes before this one."""
    kind = str(arg.type)
    pick = (lambda seq: draw(st.sampled_from(seq))) if draw else (lambda seq: seq[k % len(seq)])
    if "Tensor" in kind:
        if arg.alias_info is not None and arg.alias_info.is_write and arg.kwarg_only:
            i = FRESH
        elif draw:
            i = draw(st.integers(-1, FRESH + before))  # -1: None, which a stored graph may pass for any tensor
            if i < 0:
                return None
        else:
            slots = VARIANTS[variant]
            i = 2 if variant == "indices" and _INDEXLIKE.search(arg.name) else slots[k % len(slots)]
        if kind.startswith("Optional") and variant == "plain" and not draw:
            return None
        ref = {"$node": i}
        return [ref, ref] if kind.startswith("List") else ref
    if variant == "plain" and arg.has_default_value() and not draw:
        return SKIP
    if re.search(r"Generator|Stream|Dimname|Storage", kind):
        return None if kind.startswith("Optional") or arg.has_default_value() else SKIP
    extreme = variant in ("ints", "odd") or draw is not None and draw(st.booleans())
    if "int" in kind.lower() and "[" not in kind and "List" not in kind:
        return pick(INTS) if extreme else 1
    if "List[int]" in kind or "List[SymInt]" in kind:
        return [pick(INTS), pick(INTS)] if extreme else [1]
    if "float" in kind.lower() and "List" not in kind:
        return pick(FLOATS) if extreme else 0.5
    if "Scalar" in kind and "Type" not in kind:
        return pick(INTS + FLOATS) if extreme else 1
    if "List[float]" in kind:
        return [pick(FLOATS)] if extreme else [0.5]
    if "List[bool]" in kind:
        return [True, False, True]
    if "bool" in kind:
        return extreme
    if "ScalarType" in kind:
        return {"$dtype": pick(DTYPES)} if extreme else {"$dtype": "float32"}
    if "str" in kind:
        return pick(STRINGS)
    if "Layout" in kind:
        return {"$layout": "strided"}
    if "Device" in kind:
        return {"$device": "cpu"}
    if "MemoryFormat" in kind:
        return {"$memory_format": "contiguous_format"}
    return None


def node(name: str, variant: str, draw: Any = None, before: int = 0) -> dict[str, Any] | None:
    """A stored call_function node calling overload ``name``, or None when an argument cannot be stored.  A dunder
    (``aten::__lshift__``), which no stored graph can name, is called through its ``operator`` function (``x << y``
    dispatches it)."""
    if name.partition("::")[2].startswith("__"):
        fn = name.partition("::")[2].partition(".")[0].strip("_")
        args = [_arg(a, variant, k, draw, before) for k, a in enumerate(_schema(name).arguments[:2])]
        return {"op": "call_function", "target": {"fn": f"_operator:{fn + '_' if fn in ('and', 'or') else fn}"},
                "args": args, "kwargs": {}}
    args, kwargs, k, skipped = [], {}, 0, False
    for arg in _schema(name).arguments:
        value = _arg(arg, variant, k, draw, before)
        k += "Tensor" in str(arg.type)
        if value is SKIP:
            if not arg.has_default_value():
                return None
            skipped = True  # the arguments after it go by name
        elif arg.kwarg_only or skipped:
            kwargs[arg.name] = value
        else:
            args.append(value)
    overload = name.rpartition(".")[2]  # "from" (random_.from): no stored name; its packet dispatches to it
    target = {"oppacket": name.rpartition(".")[0]} if keyword.iskeyword(overload) else {"op": name}
    return {"op": "call_function", "target": target, "args": args, "kwargs": kwargs}


def document(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """A stored graph: one placeholder per input, ``nodes``, returning every node."""
    specs = [{"name": f"p{i}", "op": "placeholder", "target": f"p{i}", "args": [], "kwargs": {}}
             for i in range(FRESH + 1)]
    specs += [{"name": f"n{j}", **n} for j, n in enumerate(nodes)]
    specs.append({"name": "output", "op": "output", "target": "output", "kwargs": {},
                  "args": [[{"$node": FRESH + 1 + j} for j in range(len(nodes))]]})
    return {"schema": 1, "submodules": {}, "nodes": specs}


class _Loud(torch.fx.Interpreter):
    """Runs a graph node by node under the guard, printing each operator before it runs (a crash names it); a node
    that raises is an outcome (its value None), and what each node returns or changes is checked."""

    def __init__(self, gm: torch.fx.GraphModule, arena: Arena, guarded: bool = True):
        super().__init__(gm)
        self.arena, self.guarded = arena, guarded
        self.fresh = next((n for n in gm.graph.nodes if n.name == f"p{FRESH}"), None)

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in ("call_function", "call_method"):
            return super().run_node(n)
        tally, target = REPORT["tally"], n.target
        name = (f"{target._schema.name}.{target._overloadname}" if isinstance(target, torch._ops.OpOverload)
                else f"{target._qualified_op_name}.packet" if isinstance(target, torch._ops.OpOverloadPacket)
                else f"Tensor.{target}.method" if n.op == "call_method"
                else f"aten::__{target.__name__.rstrip('_')}__.operator")
        print("RUN", name, n.args, n.kwargs, flush=True)
        signal.alarm(ALARM_S)
        try:
            with OpGuard() if self.guarded else contextlib.nullcontext():
                out = super().run_node(n)
            tally["ran"] += 1
            REPORT["ran_ops"].add(name.rpartition(".")[0])
        except OpRefusedError as err:
            tally["guard"] += 1
            REPORT["guard_refused"].setdefault(name, str(err).split("operator ")[1][:60])
            out = None
        except Exception:  # noqa: BLE001 - ATen's checks, the allocator under the bound: clean outcomes
            tally["error"] += 1
            out = None
            # a run ends at its first exception; this one goes on, so the out= tensor a failed resize may have
            # left larger than its storage (sizes set, allocation refused) is replaced, as a new run would have it
            self.arena.inputs[FRESH] = torch.empty(0)
            if self.fresh is not None:
                self.env[self.fresh] = self.arena.inputs[FRESH]
        finally:
            signal.alarm(0)
        values = list(out) if isinstance(out, (list, tuple)) else [out]
        bad = self.arena.violations([*self.arena.inputs, *values]) + (
            [] if self.arena.guards_intact() else ["a canary changed: a write past a storage"])
        if bad:
            REPORT["violations"].append(f"{name} {n.args} {n.kwargs}: {bad[:2]}")
            self.arena.pristine = self.arena.buffer[self.arena.guards].copy()  # report each once
        return out


def run_graph(data: dict[str, Any]) -> None:
    """Decode ``data`` (graph_from_json, the allow-list) and run it node by node on a fresh arena."""
    try:
        gm = graph_from_json(data)
    except Exception:  # noqa: BLE001 - a refusal at decoding (an argument the format refuses)
        REPORT["tally"]["refused"] += 1
        return
    arena = Arena()
    _Loud(gm, arena).run(*arena.inputs)


def unguarded(code: str) -> None:
    """Run ``code`` (a graph's body: ``x`` is an arena input, ``torch`` and ``aten`` are bound) traced by FX, node by
    node as the fuzz runs graphs but without the list or the guard: the harness's own check that it names an
    operator that crashes."""
    fn = eval(f"lambda x: {code}", {"torch": torch, "aten": torch.ops.aten})  # noqa: S307 - the test's own text
    gm = torch.fx.symbolic_trace(fn)
    arena = Arena()
    _Loud(gm, arena, guarded=False).run(arena.inputs[0])
    print(json.dumps({"tally": REPORT["tally"], "violations": REPORT["violations"]}))


def main() -> None:
    """``argv: SHARD SHARDS EXAMPLES`` (module docstring)."""
    shard, shards, examples = map(int, sys.argv[1:4])
    torch.set_num_threads(1)
    names = overloads(shard, shards)
    start = names.index(sys.argv[4]) + 1 if len(sys.argv) > 4 else 0  # resume after an operator (finding them all)
    run_graph(document([node("aten::add.Tensor", "plain")]))  # warm before the bound
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_MIB * 2 ** 20, resource.RLIM_INFINITY))
    for i in range(start, len(names), BATCH):  # a graph per batch of overloads, each in every variant
        batch = names[i:i + BATCH]
        REPORT["covered"].update(name.rpartition(".")[0] for name in batch)
        specs = [node(name, variant) for name in batch for variant in VARIANTS]
        run_graph(document([spec for spec in specs if spec is not None]))

    def fuzz(data: Any) -> None:
        chosen = [data.draw(st.sampled_from(names)) for _ in range(data.draw(st.integers(1, 3)))]
        specs = [node(n, "drawn", data.draw, j) for j, n in enumerate(chosen)]
        if None not in specs:
            run_graph(document(specs))

    if examples:
        settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))(given(st.data())(fuzz))()
    print(json.dumps({**REPORT, "ran_ops": sorted(REPORT["ran_ops"]), "covered": sorted(REPORT["covered"])}))
