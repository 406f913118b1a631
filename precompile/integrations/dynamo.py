"""``"precompile"`` as a named ``torch.compile`` backend: ``torch.compile(model, backend="precompile")``.

Registered through the ``torch_dynamo_backends`` entry point, so any code that hands a backend *name* to
``torch.compile`` can use precompile without importing it: vLLM does in its ``DYNAMO_TRACE_ONCE`` and
``STOCK_TORCH_COMPILE`` modes (``compilation_config={"mode": "DYNAMO_TRACE_ONCE", "backend": "precompile"}``).
Each graph Dynamo captures is loaded from ``$PRECOMPILE_CACHE`` or built into it
(:class:`precompile.builder.capture.Backend`); a graph with symbolic sizes (vLLM's ``num_tokens``, or
``dynamic=True``) is compiled with ``dynamic_shapes="from_graph"``, so one artifact serves every size,
a graph without them with ``"from_example_inputs"``.

A graph with inputs that are neither tensors nor numbers (vLLM's whole ``DYNAMO_TRACE_ONCE`` graph passes its
attention op ``LayerName`` opaque objects) is compiled by Inductor directly, uncached, with a warning: serve vLLM
through its piecewise ``VLLM_COMPILE`` mode (:mod:`precompile.integrations.vllm.adaptor`) instead.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("precompile")

_BACKENDS: dict[tuple[str, str], Any] = {}


def is_symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether a placeholder of ``gm`` has a symbolic size or is a SymInt (Dynamo's ``example_value`` meta)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
    return False


def precompile_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *, options: dict[str, Any] | None = None,
                       mode: str | None = None) -> Any:
    """The backend ``torch.compile(..., backend="precompile", options=...)`` calls, once per captured graph.

    Args:
        gm: the graph Dynamo captured (parameters lifted as inputs).
        example_inputs: its real example inputs.
        options: Inductor config patches (JSON values only), as for the ``"inductor"`` backend.
        mode: ``torch.compile``'s ``mode``; only ``None``/``"default"`` are supported.

    Returns:
        a callable artifact (or, for a graph precompile cannot store, Inductor's own compiled callable).

    Raises:
        ValueError: ``mode`` is another ``torch.compile`` mode (pass Inductor options instead).
        OptionsError: ``options`` names no Inductor option or holds a value a key cannot store.
    """
    from precompile.builder.capture import Backend

    if mode not in (None, "default"):
        raise ValueError(f"the 'precompile' backend takes no torch.compile mode ({mode!r}); pass Inductor options, "
                         "e.g. options={'max_autotune': True}")
    dynamic_shapes = "from_graph" if is_symbolic(gm) else "from_example_inputs"
    opts = dict(options or {})
    key = (dynamic_shapes, repr(sorted(opts.items())))
    backend = _BACKENDS.get(key)
    if backend is None:
        backend = _BACKENDS[key] = Backend(options=opts or None, dynamic_shapes=dynamic_shapes)
    opaque = [type(x).__name__ for x in example_inputs
              if not isinstance(x, (torch.Tensor, int, float, bool, torch.SymInt, torch.SymFloat))]
    if opaque:
        # e.g. vLLM's whole graph (DYNAMO_TRACE_ONCE) passes its attention op a LayerName, a torch opaque object:
        # precompile keys and stores tensors and numbers only, so such a graph runs, uncached, as Inductor's own
        log.warning("precompile cannot cache a graph with %s inputs; compiling it with Inductor directly, uncached",
                    sorted(set(opaque)))
        from precompile.inductor.shim import compile_uncached

        return compile_uncached(gm, example_inputs, opts)
    return backend(gm, example_inputs)


def records() -> list[Any]:
    """Every :class:`precompile.builder.capture.GraphRecord` of this process's named-backend graphs, in no fixed order."""
    return [r for b in _BACKENDS.values() for r in b.records]
