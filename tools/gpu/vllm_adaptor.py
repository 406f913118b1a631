"""The vLLM adaptor's compile/load round trip on vLLM-shaped piecewise graphs, without vLLM (CUDA or CPU).

    python tools/gpu/vllm_adaptor.py [--device cuda|cpu] [--layers 2] [--sizes 1,7,8,64,300] [--cache URL]

vLLM's wheel cannot go where the GPU is, so this script builds what vLLM hands its compiler there: a bf16
Llama-ish model (embedding, RMSNorm, qkv projection, rotary embedding on ``[s, 4, 64]`` heads, attention as an
opaque custom op, SiLU-gated MLP; hidden 256) traced by ``torch.compile`` with a capturing backend, ``num_tokens``
marked dynamic, the graph split at the attention op with ``split_module`` as vLLM's ``split_graph`` does.  Each
piece (a SymInt ``num_tokens`` first input, tensors ``[s, 256]``, ``[s, 4, 64]``) goes to
``PrecompileAdaptor.compile`` twice: for the range ``(1, 512)`` with the piece's own fake inputs (as vLLM's
``get_fake_args_from_graph``) and for the single size ``(8, 8)`` with concrete fake inputs (as its
``create_concrete_args``).

Phase 1 (this process) compiles into a fresh cache (or ``--cache``); phase 2, a fresh process, captures again and
must hit every piece.  For each ``num_tokens`` in ``--sizes`` the model runs with the pieces eager, freshly
compiled (phase 1) and loaded (phase 2; the size-8 artifact at 8, the range's elsewhere); it prints a table of
outcomes and engine kinds per piece and whether the loaded outputs equal the fresh compile's bit for bit (and
eager's within bf16 tolerance).  Exit 0 when all do and phase 2 hit everything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run by path: the repository root in place of this folder (tools/__init__.py)
    sys.path[0] = str(REPO)

from tools._common import ChildFailed, child_flag, run_child, self_command  # noqa: E402 - after the path

HIDDEN, HEADS, HEAD_DIM, VOCAB, INTER = 256, 4, 64, 1024, 512
RANGE, SINGLE = (1, 512), (8, 8)


@torch.library.custom_op("pcvllm::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over one sequence of ``s`` tokens: ``[s, heads, 64]`` x3 -> ``[s, heads * 64]``."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1).reshape(q.shape[0], -1)


@attention.register_fake
def _(q, k, v):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.Parameter(torch.ones(HIDDEN))
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.norm2 = torch.nn.Parameter(torch.ones(HIDDEN))
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * INTER, bias=False)
        self.down = torch.nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        s = x.shape[0]
        q, k, v = self.qkv(rms_norm(x, self.norm1)).split(HIDDEN, dim=-1)
        q, k, v = (t.view(s, HEADS, HEAD_DIM) for t in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        x = x + self.o(attention(q, k, v))
        g, u = self.gate_up(rms_norm(x, self.norm2)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class TinyLlama(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
        self.norm = torch.nn.Parameter(torch.ones(HIDDEN))
        inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(512).float(), inv)
        self.register_buffer("cos_sin", torch.cat((freqs.cos(), freqs.sin()), dim=-1))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = self.cos_sin.index_select(0, positions).to(x.dtype).chunk(2, dim=-1)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return rms_norm(x, self.norm)


def split_at_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` split into pieces with each attention call alone in its own, as vLLM's ``split_graph`` does."""
    from torch.fx.passes.split_module import split_module

    part, ids = 0, {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target is torch.ops.pcvllm.attention.default:
            ids[node], part = part + 1, part + 2
        else:
            ids[node] = part
    return split_module(gm, None, lambda n: ids[n], keep_original_order=True)


def concrete_fakes(piece: torch.fx.GraphModule, size: int) -> list:
    """Fake inputs with ``num_tokens`` at ``size`` in a fresh fake mode (vLLM's ``create_concrete_args``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    def c(v):
        return int(v.node.expr.subs({s: size for s in v.node.expr.free_symbols})) if isinstance(v, torch.SymInt) else int(v)

    out = []
    with FakeTensorMode(shape_env=ShapeEnv()):
        for n in piece.graph.nodes:
            if n.op != "placeholder":
                break
            v = n.meta["example_value"]
            out.append(c(v) if isinstance(v, torch.SymInt) else torch.empty_strided(
                [c(d) for d in v.shape], [c(d) for d in v.stride()], dtype=v.dtype, device=v.device)
                if isinstance(v, torch.Tensor) else v)
    return out


class Harness:
    """Captures the model once, compiles its pieces through the adaptor, and swaps pieces in and out."""

    def __init__(self, layers: int, device: str, cache: str) -> None:
        from precompile.integrations.vllm.adaptor import PrecompileAdaptor

        torch.manual_seed(0)
        self.model = TinyLlama(layers).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
        self.device = device
        self.adaptor = PrecompileAdaptor(cache=cache)
        self.adaptor.initialize_cache(cache_dir="(unused)", prefix="gpu-script")
        self.split: torch.fx.GraphModule | None = None
        self.eager: dict[str, torch.nn.Module] = {}
        self.compiled: dict[str, dict[tuple[int, int], object]] = {}
        self.mode = "eager"
        self.size = 0

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list):
        self.split = split_at_attention(gm)
        for name, sub in list(self.split.named_children()):
            if any(n.op == "call_function" and n.target is torch.ops.pcvllm.attention.default for n in sub.graph.nodes):
                continue
            self.eager[name] = sub
            range_inputs = [n.meta["example_value"] for n in sub.graph.nodes if n.op == "placeholder"]
            fn_range, _ = self.adaptor.compile(sub, range_inputs, {}, RANGE, key=f"{name} range")
            fn_single, _ = self.adaptor.compile(sub, concrete_fakes(sub, SINGLE[0]), {}, SINGLE, key=f"{name} single")
            self.compiled[name] = {RANGE: fn_range, SINGLE: fn_single}
            self.split.add_submodule(name, _Swap(self, name))
        return self.split

    def inputs(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(0, VOCAB, (n,), generator=g).to(self.device)
        return ids, torch.arange(n, device=self.device)

    def run(self, n: int, mode: str) -> torch.Tensor:
        self.mode, self.size = mode, n
        with torch.no_grad():
            return self.fn(*self.inputs(n))

    def capture(self) -> None:
        ids, pos = self.inputs(16)
        torch._dynamo.mark_dynamic(ids, 0)
        torch._dynamo.mark_dynamic(pos, 0)
        # no guards, as vLLM runs its graph: num_tokens 1 (Dynamo's 0/1 specialization) takes the same graph
        skip = getattr(torch.compiler, "skip_all_guards_unsafe", lambda entries: [False for _ in entries])
        self.fn = torch.compile(self.model, backend=self.backend, fullgraph=True, options={"guard_filter_fn": skip})
        with torch.no_grad():
            self.fn(ids, pos)


class _Swap(torch.nn.Module):
    def __init__(self, h: Harness, name: str) -> None:
        super().__init__()
        self.h, self.name = h, name

    def forward(self, *args):
        if self.h.mode == "eager":
            return self.h.eager[self.name](*args)
        rng = SINGLE if self.h.size == SINGLE[0] else RANGE
        return self.h.compiled[self.name][rng](*args)


def phase(args: argparse.Namespace, out_dir: Path, warm: bool) -> dict:
    h = Harness(args.layers, args.device, args.cache)
    h.capture()
    result = {"records": [r.__dict__ for r in h.adaptor.records], "sizes": {}}
    for n in [int(s) for s in args.sizes.split(",")]:
        got = h.run(n, "compiled").float().cpu()
        if not warm:
            torch.save(got, out_dir / f"fresh-{n}.pt")
            torch.save(h.run(n, "eager").float().cpu(), out_dir / f"eager-{n}.pt")
            continue
        fresh, eager = torch.load(out_dir / f"fresh-{n}.pt"), torch.load(out_dir / f"eager-{n}.pt")
        result["sizes"][n] = {"equal_fresh": bool(torch.equal(got, fresh)),
                              "close_eager": bool(torch.allclose(got, eager, rtol=5e-2, atol=5e-2)),
                              "max_abs_diff_eager": float((got - eager).abs().max())}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sizes", default="1,7,8,64,300")
    ap.add_argument("--cache", help="precompile cache URL (default: a fresh local cache in a temporary dir)")
    child_flag(ap, "--phase", choices=["cold", "warm"])
    child_flag(ap, "--out")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args, Path(args.out), warm=args.phase == "warm")))
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-vllm-adaptor-") as tmp:
        args.cache = args.cache or "file://" + os.path.join(tmp, "cache")
        runs = {}
        for ph in ("cold", "warm"):  # each phase a fresh process: the warm one must hit every piece
            cmd = self_command(__file__, "--phase", ph, "--out", tmp, "--device", args.device, "--layers",
                               str(args.layers), "--sizes", args.sizes, "--cache", args.cache)
            try:
                runs[ph] = run_child(cmd, ph)
            except ChildFailed as err:
                print(err.stdout[-3000:], err.stderr[-6000:], file=sys.stderr)
                return 1
    return report(args, runs)


def report(args: argparse.Namespace, runs: dict) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"PrecompileAdaptor on vLLM-shaped pieces ({args.device}, torch {torch.__version__})")
    for col in ("piece", "range", "cold", "warm (fresh process)", "warm s", "engine", "key"):
        t.add_column(col)
    for c, w in zip(runs["cold"]["records"], runs["warm"]["records"]):
        t.add_row(c["piece"], str(tuple(c["compile_range"])), c["outcome"], w["outcome"], f"{w['seconds']:.3f}",
                  str(w["engine_kind"]), w["key"][:12] + (" =" if w["key"] == c["key"] else " != cold"))
    console.print(t)
    for w in runs["warm"]["records"]:
        if w.get("fast_off"):
            console.print(f"{w['piece']} {tuple(w['compile_range'])}: no fast path: {w['fast_off']}")
    s = Table(title="outputs after the warm load")
    for col in ("num_tokens", "equal to fresh compile (bitwise)", "close to eager (bf16)", "max |diff| vs eager"):
        s.add_column(col)
    ok = all(r["outcome"] == "hit" for r in runs["warm"]["records"])
    for n, r in runs["warm"]["sizes"].items():
        s.add_row(str(n), str(r["equal_fresh"]), str(r["close_eager"]), f"{r['max_abs_diff_eager']:.4f}")
        ok = ok and r["equal_fresh"] and r["close_eager"]
    console.print(s)
    console.print("RESULT:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
