"""The graphs of tools/bench/coverage.py: what servers compile, each a model, its inputs and how it is captured.
tools/bench/call.py and tools/profile/call.py time them too, and the GPU tests of tests/inductor/ build them.

Every case is deterministic (seeded weights and inputs), so each fresh process of the benchmark builds the same
model and inputs.  GPU-only cases import Triton when built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tools.cases import recipes

#: The graphs every device runs, and those only a CUDA device does (a user Triton kernel, multi-kernel, autotuning).
CPU_CASES = ("static_mlp", "mlp_requires_grad", "dynamic_batch", "kv_decode", "llama_dynamic_seq")
GPU_CASES = ("triton_op", "multi_kernel", "max_autotune")

@dataclass
class GraphCase:
    """One benchmark graph.

    Attributes:
        model: the module; ``model(*inputs)`` is what eager runs.
        inputs: the model's inputs at the example size.
        dynamic: ``(input index, dim)`` marked dynamic before capture.
        mode: ``dynamic_shapes`` for both compiles.
        options: Inductor config patches.
        inputs_at: the model's inputs at another size (symbolic cases), or None.
        other_size: the size :meth:`at_size` uses, or None.
    """

    model: torch.nn.Module
    inputs: tuple[Any, ...]
    dynamic: tuple[tuple[int, int], ...] = ()
    mode: str = "from_example_inputs"
    options: dict[str, Any] = field(default_factory=dict)
    inputs_at: Callable[[int], tuple[Any, ...]] | None = None
    other_size: int | None = None

    def capture(self) -> tuple[torch.fx.GraphModule, list[Any]]:
        """The one graph Dynamo captures (capturing backend, ``no_grad``) and its example inputs (the graph's user
        inputs are copies of :attr:`inputs`, which the capture run may write to)."""
        graphs = []

        def grab(gm, example_inputs):
            graphs.append((gm, list(example_inputs)))
            return gm.forward

        self._args = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.inputs]
        for i, dim in self.dynamic:
            torch._dynamo.mark_dynamic(self._args[i], dim)
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(self.model, backend=grab)(*self._args)
        if len(graphs) != 1:
            raise RuntimeError(f"expected one graph, Dynamo captured {len(graphs)}")
        self._example = graphs[0][1]
        return graphs[0]

    def at_size(self, gm: torch.fx.GraphModule, concrete: list[Any], n: int) -> list[Any]:
        """The graph's flat inputs at size ``n`` of the one dynamic dim: the model's inputs from :attr:`inputs_at`
        where the graph takes them, ``n`` for the size placeholder, the same weights elsewhere."""
        new = self.inputs_at(n)
        out = []
        for value, ex in zip(concrete, self._example):
            j = next((j for j, a in enumerate(self._args) if a is ex), None)
            out.append(new[j] if j is not None else n if isinstance(ex, torch.SymInt) else value)
        return out


def _mlp(d: int, h: int, device: str, dtype: torch.dtype, requires_grad: bool) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d))
    return model.to(device=device, dtype=dtype).eval().requires_grad_(requires_grad)


def _x(*shape: int, device: str, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


def build_case(name: str, device: str) -> GraphCase:
    """The case ``name`` on ``device`` (bfloat16 on CUDA, float32 on CPU).

    Raises:
        KeyError: no such case.
    """
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name in ("static_mlp", "mlp_requires_grad", "max_autotune"):
        model = _mlp(256, 1024, device, dtype, requires_grad=name == "mlp_requires_grad")
        return GraphCase(model, (_x(8, 256, device=device, dtype=dtype),),
                    options={"max_autotune": True} if name == "max_autotune" else {})
    if name == "dynamic_batch":
        return GraphCase(_mlp(256, 1024, device, dtype, requires_grad=True), (_x(8, 256, device=device, dtype=dtype),),
                    dynamic=((0, 0),), mode="from_graph", other_size=13,
                    inputs_at=lambda n: (_x(n, 256, device=device, dtype=dtype, seed=2),))
    if name == "kv_decode":
        model, inputs = recipes.decode_step(batch=4, cache_len=64, d=256, dtype=dtype, device=device)
        return GraphCase(model, tuple(inputs.values()))
    if name == "llama_dynamic_seq":
        from precompile.recipes.catalog import get_recipe

        recipe = get_recipe("llama", device=device, dtype="bfloat16" if dtype == torch.bfloat16 else None)
        model = recipe.model()

        def ids(n: int) -> tuple[torch.Tensor]:
            return recipe.example_inputs((1, n))

        return GraphCase(model, ids(32), dynamic=((0, 1),), mode="from_graph", other_size=20, inputs_at=ids)
    if name in ("mlp12_static", "mlp12_dynamic"):  # tools/bench/call.py: 12 small layers, 25 placeholders
        torch.manual_seed(0)
        layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)]).to(device, dtype).eval()
        dyn = name == "mlp12_dynamic"
        return GraphCase(layers, (_x(4, 64, device=device, dtype=dtype),), dynamic=((0, 0),) if dyn else (),
                    mode="from_graph" if dyn else "from_example_inputs", other_size=7 if dyn else None,
                    inputs_at=(lambda n: (_x(n, 64, device=device, dtype=dtype, seed=2),)) if dyn else None)
    if name == "triton_op":
        return _triton_op_case(device, dtype)
    if name == "multi_kernel":
        class RowNorm(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(x * 2.0, -1) + torch.nn.functional.layer_norm(x, x.shape[-1:])

        return GraphCase(RowNorm(), (_x(64, 4096, device=device, dtype=dtype),), options={"triton.multi_kernel": 1})
    raise KeyError(f"no coverage case {name!r}")


def _triton_op_case(device: str, dtype: torch.dtype) -> GraphCase:
    """A user Triton kernel registered with ``torch.library.triton_op`` (Inductor inlines its kernel)."""
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton

    @triton.jit
    def add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        z = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.maximum(z, 0.0), mask=mask)

    @triton_op("pcbench::add_relu", mutates_args={})
    def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(add_relu_kernel)[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(256, 256)

        def forward(self, x, y):
            return add_relu(self.lin(x), y)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Model()
    model = model.to(device=device, dtype=dtype).eval()
    return GraphCase(model, (_x(64, 256, device=device, dtype=dtype), _x(64, 256, device=device, dtype=dtype, seed=2)))
