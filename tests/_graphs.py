"""Tiny models and the FX graphs the artifact tests compile: importable by the tests and by their subprocesses.

Every builder is deterministic (seeded weights and inputs), so a fresh process rebuilds exactly the graph, the
weights and the inputs the parent process used.  Graphs are a 2-layer MLP (``D`` -> ``H`` -> ``D``) so that one
Inductor CPU compile costs a few seconds.

Graph kinds (:func:`graph`):

- ``"dynamo"``: the graph a ``torch.compile`` backend receives (parameters lifted to placeholders, passed as
  inputs), via :func:`precompile.builder.capture.capture_graphs`.
- ``"make_fx"``: ``make_fx`` of a function taking the parameters as positional inputs (``functional_call``).
- ``"export"``: ``torch.export.export(model, (x,)).module()``: weights are ``get_attr`` reads, so the artifact
  binds them and takes only ``x``.
- ``"export_no_grad"``: the same, exported under ``torch.no_grad()``.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from tools.cases import recipes

D = 16
H = 32
BATCH = 4
KINDS = ("dynamo", "make_fx", "export", "export_no_grad")


def mlp(seed: int = 0, d: int = D, h: int = H, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """``Linear(d, h) -> ReLU -> Linear(h, d)`` with weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, d)).to(dtype)


def example(batch: int = BATCH, d: int = D, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    """The user input ``x``: ``[batch, d]``, contiguous."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, d, generator=gen).to(dtype)


def dynamo_graph(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    from precompile.builder.capture import capture_graphs

    graphs = capture_graphs(model, (x,))
    assert len(graphs) == 1, f"expected one Dynamo graph, got {len(graphs)}"
    return graphs[0]


def make_fx_graph(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    from torch.fx.experimental.proxy_tensor import make_fx

    names = [name for name, _ in model.named_parameters()]
    params = [p.detach() for _, p in model.named_parameters()]

    def forward(w0, b0, w2, b2, x):
        return (torch.func.functional_call(model, dict(zip(names, (w0, b0, w2, b2))), (x,)),)

    return make_fx(forward)(*params, x), [*params, x]


def export_module(model: torch.nn.Module, x: torch.Tensor, *, no_grad: bool = False) -> torch.fx.GraphModule:
    if no_grad:
        with torch.no_grad():
            return torch.export.export(model, (x,)).module()
    return torch.export.export(model, (x,)).module()


def graph(kind: str, model: torch.nn.Module | None = None,
          x: torch.Tensor | None = None) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``(graph, example inputs)`` of one kind (see module docstring) for ``model`` (default :func:`mlp`)."""
    model = mlp() if model is None else model
    x = example() if x is None else x
    if kind == "dynamo":
        return dynamo_graph(model, x)
    if kind == "make_fx":
        return make_fx_graph(model, x)
    if kind in ("export", "export_no_grad"):
        return export_module(model, x, no_grad=kind == "export_no_grad"), [x]
    raise ValueError(f"unknown graph kind {kind!r}")


def key(gm: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> str:
    """The artifact key ``standalone_compile`` would use, computed without compiling."""
    from precompile.builder.standalone import prepare

    kwargs.setdefault("dynamic_shapes", "from_example_inputs")
    kwargs.setdefault("options", None)
    return prepare(gm, inputs, **kwargs)[1].key


def all_keys() -> dict[str, str]:
    """``{kind: key}`` for every graph kind of the default model and input."""
    return {kind: key(*graph(kind)) for kind in KINDS}


def report_environment() -> dict[str, Any]:
    """What a key must not depend on, as this process sees it (for the key-stability tests' messages)."""
    import os
    import socket
    import tempfile

    return {"cwd": os.getcwd(), "home": os.path.expanduser("~"), "tmp": tempfile.gettempdir(),
            "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "hostname": socket.gethostname(),
            "uid": os.getuid() if hasattr(os, "getuid") else None}


if __name__ == "__main__":  # python tests/_graphs.py: print the keys and the environment as JSON
    print(json.dumps({"keys": all_keys(), "env": report_environment()}))


# ------------------------------------------------------------------------------------ graphs real servers compile
class DecodeStep(recipes.DecodeStep):
    """``tools.cases.recipes.DecodeStep`` with its in-place bump and its output combination as custom operators
    (``tests/_custom_ops.py``): ``pctest::bump_`` writes into the caller's ``counter``."""

    def count(self, counter: torch.Tensor) -> None:
        import _custom_ops

        _custom_ops.bump_(counter, torch.ones_like(counter))

    def combine(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        import _custom_ops

        return _custom_ops.scale_add(a, x, 0.5)


def decode_step(**kwargs: Any) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """``tools.cases.recipes.decode_step`` with custom operators (:class:`DecodeStep`), ``d`` = :data:`D`."""
    kwargs.setdefault("d", D)
    return recipes.decode_step(cls=DecodeStep, **kwargs)


def misaligned_like(t: torch.Tensor) -> torch.Tensor:
    """A copy of contiguous ``t`` whose data pointer is 16-byte misaligned (one element into a larger buffer)."""
    base = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = base[1:].view(t.shape).copy_(t)
    assert out.data_ptr() % 16, "expected a misaligned view"
    return out


def capture(model: torch.nn.Module, inputs: tuple[Any, ...], *, dynamic: tuple[tuple[int, int], ...] = (),
            grad: bool = False) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The one graph Dynamo captures for ``model(*inputs)`` with a capturing backend, and its example inputs.

    Args:
        dynamic: ``(input index, dim)`` pairs marked dynamic (``torch._dynamo.mark_dynamic``).
        grad: capture with grad enabled (default: under ``torch.no_grad()``, as inference is served).

    The model runs once on copies of the tensor inputs (it may write to them).
    """
    import contextlib

    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
    for i, dim in dynamic:
        torch._dynamo.mark_dynamic(args[i], dim)
    torch._dynamo.reset()
    with contextlib.nullcontext() if grad else torch.no_grad():
        torch.compile(model, backend=grab)(*args)
    assert len(graphs) == 1, f"expected one Dynamo graph, got {len(graphs)}"
    return graphs[0]


def user_inputs(art: Any, by_name: dict[str, Any]) -> list[Any]:
    """``by_name`` values in the order of the artifact's user-input placeholders (Dynamo names ``x`` ``l_x_``;
    tensor placeholders left unmatched take the remaining values in order); a size placeholder (``s33``, spec
    ``size`` ``"s0"``) gets the matching dim of a tensor it sizes, a specialized one its value."""
    specs = [p for p in (art.placeholders if hasattr(art, "placeholders") else art) if p["kind"] == "user_input"]
    values: dict[str, Any] = {}
    for p in specs:
        name = p["name"].removeprefix("l_").removesuffix("_")
        if name in by_name or p["name"] in by_name:
            values[p["name"]] = by_name[name] if name in by_name else by_name[p["name"]]
    rest = iter(v for k, v in by_name.items() if not any(v is w for w in values.values()))
    for p in specs:  # Dynamo names the argument of a module called directly ``l_args_0_``
        if p["name"] not in values and p.get("type") == "tensor":
            values[p["name"]] = next(rest)
    for p in specs:
        if p["name"] not in values and isinstance(p.get("size"), str):
            values[p["name"]] = next(values[q["name"]].shape[j] for q in specs if q["name"] in values
                                     for j, d in enumerate(q.get("shape") or []) if d == p["size"])
        elif p["name"] not in values and p.get("value") is not None:
            values[p["name"]] = p["value"]  # a size the artifact is specialized to
    return [values[p["name"]] for p in specs]
