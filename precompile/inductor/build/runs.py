"""Running a freshly compiled graph at build time without touching the caller's tensors.

A build runs the compiled graph to settle Triton autotuning and to validate the fast path against it.  A graph
may write to its inputs (a KV cache, a counter), so every such run works on copies of the inputs the graph
writes to, laid out like the originals (same shape, stride, dtype, device, 16-byte alignment or not), and the
caller's example inputs come out of a build exactly as they went in.
"""

from __future__ import annotations

from typing import Any

import torch


def clone_like(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same shape, strides, dtype and device whose data pointer is 16-byte aligned
    exactly when ``t``'s is (a misaligned original gets a copy at the same offset from an aligned block)."""
    offset = (t.data_ptr() % 16) // t.element_size() if t.element_size() and t.data_ptr() % 16 else 0
    needed = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) if t.numel() else 0
    base = torch.empty(needed + offset, dtype=t.dtype, device=t.device)
    out = base.as_strided(t.shape, t.stride(), offset)
    if t.numel():
        out.copy_(t)
    return out


def inputs_for_run(inputs: list[Any], mutated: list[int] | set[int]) -> list[Any]:
    """``inputs`` with every tensor the graph writes to (``mutated`` indices) replaced by :func:`clone_like`."""
    return [clone_like(x) if i in mutated and isinstance(x, torch.Tensor) else x for i, x in enumerate(inputs)]


def same_values(a: Any, b: Any, unset: frozenset[int] = frozenset()) -> str | None:
    """None if ``a`` and ``b`` are equal bit for bit (tensors: shape, stride, dtype, device, values; other values:
    ``==``), else what differs.  ``unset``: indices of ``a``/``b`` (lists) whose values the graph leaves unset
    (:func:`unset_outputs`): only their shape, stride, dtype and device are compared."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{type(a).__name__} vs {type(b).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return f"{tuple(a.shape)} {a.dtype} {a.device} vs {tuple(b.shape)} {b.dtype} {b.device}"
        if a.numel() > 1 and a.stride() != b.stride():
            return f"strides {a.stride()} vs {b.stride()}"
        if not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                          and torch.equal(a.nan_to_num(), b.nan_to_num())):
            return "values differ"
        return None
    if type(a) is not type(b):
        return f"{type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{len(a)} vs {len(b)} values"
        for i, (x, y) in enumerate(zip(a, b)):
            if i in unset and isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                x, y = x.new_zeros(()).expand(x.shape), y.new_zeros(()).expand(y.shape)  # layout, not values
                if x.dtype != y.dtype or x.device != y.device or tuple(a[i].stride()) != tuple(b[i].stride()):
                    return f"[{i}]: {a[i].dtype} {tuple(a[i].stride())} vs {b[i].dtype} {tuple(b[i].stride())}"
            why = same_values(x, y)
            if why:
                return f"[{i}]: {why}"
        return None
    return None if a == b else f"{a!r} vs {b!r}"


#: Operators whose result has unspecified values (storage the graph allocates and does not write).
_EMPTY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
#: Operators whose result is a view of (or, for ``contiguous``, a copy of) their first argument.
_VIEWS = {"view", "reshape", "_unsafe_view", "unflatten", "flatten", "transpose", "permute", "unsqueeze", "squeeze",
          "expand", "as_strided", "t", "narrow", "select", "slice", "view_as", "reshape_as", "contiguous", "getitem"}


def _op_name(node: torch.fx.Node) -> str | None:
    """The name of a tensor method, of an ATen operator, or of a function of torch's own (``torch.empty``,
    ``operator.getitem``); None for anything else: a custom operator named ``empty`` or ``view`` is not one."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return None
    target = node.target
    packet = getattr(target, "_overloadpacket", target)
    qualified = getattr(packet, "_qualified_op_name", None)
    if qualified is not None:
        return qualified.split("::", 1)[1] if qualified.startswith("aten::") else None
    module = getattr(target, "__module__", None) or ""
    if module == "_operator" or module.split(".")[0] == "torch":
        return getattr(target, "__name__", None)
    return None


def unset_outputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Indices of ``gm``'s outputs that are fresh storage the graph never writes: an ``empty``-like call
    (``torch.empty``, ``aten.empty.memory_format``, ``x.new_empty(...)``...), or views of one, that nothing else in
    the graph reads.  vLLM's pieces return such a buffer, ``output.view(-1, heads, head_size)`` of a
    ``torch.empty``, for the attention op that follows them to fill (``unified_attention_with_output`` takes its
    ``output``); its contents are whatever the allocator handed out, so two runs never agree on them."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    found = set()
    for i, v in enumerate(values):
        node, child = v, out
        while isinstance(node, torch.fx.Node) and all(u is child or u is out for u in node.users):
            name = _op_name(node)
            if name in _EMPTY:
                found.add(i)
                break
            if name not in _VIEWS or not node.args or not isinstance(node.args[0], torch.fx.Node):
                break
            node, child = node.args[0], node
    return frozenset(found)
