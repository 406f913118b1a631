"""Inductor's FX wrapper: the host side of a compiled graph as an FX graph (seed ``wrapper_fxir.py``).

With ``config.fx_wrapper``, Inductor's ``WrapperFxCodegen`` converts its wrapper IR into a ``GraphModule``
(``FxConverter``): buffers from ``torch.empty_strided``, views from ``torch.as_strided``, library calls as ATen
``.out`` overloads, Triton kernels as ``triton_kernel_wrapper_mutation`` nodes over a kernel side table.
:func:`wrapper_graph` compiles a graph that way and returns that ``GraphModule``; :mod:`precompile.wrapper_graph`
stores it as data.

What Inductor's converter lacks (found on torch 2.11 and 2.13): C++ kernels (a CPU graph with any fused kernel),
subgraphs, and, on 2.11, symbolic sizes (``vr must not be None``), user Triton kernels and Triton GEMM templates
(``RecursionError``).  Such a graph raises :class:`NotExpressible` with Inductor's reason.  The FX wrapper has no
cache support in Inductor (``supports_caching = False``), so this compile is separate from the one whose cache
entries an artifact carries.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_LOCK = threading.Lock()


class NotExpressible(Exception):
    """Inductor's FX wrapper cannot express this graph (the message says why)."""


def wrapper_graph(gm: torch.fx.GraphModule, example_inputs: list[Any],
                  options: dict[str, Any] | None = None) -> tuple[torch.fx.GraphModule, Any]:
    """Compile ``gm`` with Inductor's FX wrapper.

    Args:
        gm: the graph (as :func:`precompile.standalone_compile` normalizes it).
        example_inputs: its example inputs (real tensors; SymInts where the graph is symbolic).
        options: Inductor config patches, besides ``fx_wrapper``.

    Returns:
        ``(wrapper graph, compiled callable)``: the ``GraphModule`` the converter produced and what Inductor
        returned for ``gm`` (the same graph, run by FX).

    Raises:
        NotExpressible: the converter refused or failed on the graph, or produced none.
    """
    from torch._inductor import config
    from torch._inductor.codegen import wrapper_fxir
    from torch._inductor.compile_fx import compile_fx

    captured: list[torch.fx.GraphModule] = []
    original = wrapper_fxir.WrapperFxCodegen.compile_graph

    def capture(self: Any, graph: torch.fx.GraphModule) -> Any:
        captured.append(graph)
        return original(self, graph)

    with _LOCK:
        wrapper_fxir.WrapperFxCodegen.compile_graph = capture
        try:
            with config.patch({**(options or {}), "fx_wrapper": True}), torch.no_grad():
                compiled = compile_fx(gm, example_inputs)
        except Exception as err:  # noqa: BLE001 - any converter failure means "not expressible", with its reason
            cause = err.__cause__ or err
            raise NotExpressible(f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}") from err
        finally:
            wrapper_fxir.WrapperFxCodegen.compile_graph = original
    if len(captured) != 1:
        raise NotExpressible(f"Inductor's FX wrapper produced {len(captured)} wrapper graphs, not one")
    return captured[0], compiled
