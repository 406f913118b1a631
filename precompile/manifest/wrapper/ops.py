"""What a stored wrapper graph may call: a positive allow-list of the targets Inductor's FX wrapper emits for a GPU
graph (``torch/_inductor/codegen/wrapper_fxir.py``, torch 2.11 and 2.13), each with the reason it cannot read or
write outside the storages of the tensors it is given.

The argument for the whole graph is inductive.  Every tensor a graph holds is a caller's input, a fresh allocation
(``torch.empty_strided``, sized by ATen), a view whose size, stride and offset were checked against its base's
storage (:mod:`precompile.manifest.wrapper.bounds`), or the result of an ATen operator below.  Each ATen operator
below checks its operands' sizes against each other and reads and writes only within the extents of the tensors
it is given (its ``out=`` tensor is resized by ATen, which only ever grows a storage), so what it returns or writes
lies inside storages too.  No target below makes a view without a check, takes a ``Storage``, an address or a
file name, or changes a tensor's size, stride or storage in place; :func:`schema_refusal` says so for each of them
(checked at import, so the table cannot drift from its rule).

What Inductor emits that is not here (its other fallback kernels: ``sort``, ``topk``, ``index_put_`` and ``scatter``
fallbacks, FFTs, ``_grouped_mm``, custom operators...) makes the build keep the Python wrapper, with the reason.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import torch

from precompile.errors import ArtifactFormatError


class WrapperGraphError(ArtifactFormatError):
    """A stored wrapper graph is malformed, too large, names a target or value outside the allow-list, or (at call
    time) makes a view that does not lie inside its base's storage."""


#: Python functions a wrapper graph may call, by the name :func:`precompile.manifest.graph_json.graph_to_json`
#: stores. ``empty_strided`` allocates (ATen sizes the storage, with an overflow check); ``as_strided`` is the
#: converter's only view, built only through :mod:`precompile.manifest.wrapper.bounds`'s check; ``getitem`` takes
#: one integer index (a tuple's element, or ATen's bounds-checked ``select``); the rest is size arithmetic on
#: integers, each result checked to fit in int64.
ALLOWED_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "torch:empty_strided": torch.empty_strided,
    "torch:as_strided": torch.as_strided,
    "_operator:getitem": operator.getitem,
    "_operator:add": operator.add,
    "_operator:sub": operator.sub,
    "_operator:mul": operator.mul,
    "_operator:floordiv": operator.floordiv,
    "_operator:mod": operator.mod,
    "_operator:neg": operator.neg,
    "_operator:eq": operator.eq,
    "_operator:lt": operator.lt,
    "_operator:le": operator.le,
    "_operator:gt": operator.gt,
    "_operator:ge": operator.ge,
    "torch:sym_max": torch.sym_max,
    "torch:sym_min": torch.sym_min,
}
#: Functions whose arguments must be plain integers or node references, and whose result must be an int64.
ARITHMETIC = frozenset(n for n in ALLOWED_FUNCTIONS if n.startswith("_operator:") and n != "_operator:getitem") | {
    "torch:sym_max", "torch:sym_min"}

#: ATen operator overloads a wrapper graph may call (``aten::<name>.<overload>``), each with why it stays inside
#: the storages it is given.  An overload this torch lacks is refused as not existing.
ALLOWED_OPS: dict[str, str] = {
    # Library GEMMs (Inductor's ExternKernelOut: kernel/mm.py, kernel/bmm.py).  ATen checks that the operands'
    # shapes multiply and resizes ``out`` to the result's shape (resize_output: a storage only grows); cuBLAS is
    # given each operand's own sizes and strides.
    "aten::mm.out": "GEMM into out; ATen checks the shapes and resizes out",
    "aten::mm.dtype_out": "GEMM into out with an output dtype; as mm.out",
    "aten::addmm.out": "bias + GEMM into out; ATen checks the shapes (the bias broadcasts) and resizes out",
    "aten::addmm.dtype_out": "as addmm.out, with an output dtype",
    "aten::bmm.out": "batched GEMM into out; ATen checks batch and matrix shapes and resizes out",
    "aten::bmm.dtype_out": "as bmm.out, with an output dtype",
    "aten::baddbmm.out": "batched bias + GEMM into out; as bmm.out, the bias broadcast-checked",
    "aten::baddbmm.dtype_out": "as baddbmm.out, with an output dtype",
    "aten::_int_mm.out": "int8 GEMM into out; ATen checks shapes, dtypes and out's size",
    "aten::_scaled_mm.out": "fp8 GEMM into out; ATen checks operand, scale and bias shapes and resizes out",
    # Convolution (kernel/conv.py): ATen checks input, weight, bias, stride, padding, dilation and groups
    # against each other and allocates its result.
    "aten::convolution.default": "convolution; ATen checks every shape and allocates its result",
    # Attention fallbacks (lowering of scaled_dot_product_attention): ATen checks query, key, value (and bias)
    # shapes, dtypes and head sizes, and allocates every result.  None of them takes sequence offsets or a
    # page table (which a kernel would follow without a bounds check).
    "aten::_scaled_dot_product_flash_attention.default": "flash attention; ATen checks q/k/v, allocates results",
    "aten::_scaled_dot_product_efficient_attention.default": "memory-efficient attention; as flash, bias checked",
    "aten::_scaled_dot_product_cudnn_attention.default": "cuDNN attention; as flash, bias checked",
    # Copies: ATen checks that src broadcasts to self's shape and that self does not overlap itself.
    "aten::copy_.default": "copies src into self within self's extent; ATen checks the broadcast",
    # Sizes read from a tensor (dynamic shapes, unbacked symbols): ATen checks the dimension index.
    "aten::sym_size.int": "reads a size; the dimension is checked",
    "aten::sym_stride.int": "reads a stride; the dimension is checked",
    "aten::sym_storage_offset.default": "reads the storage offset",
    # Dynamic scalars (the converter's DynamicScalarLine): item checks that the tensor has one element; where
    # is elementwise and allocates its result.
    "aten::item.default": "reads the one element of a one-element tensor (checked)",
    "aten::where.Scalar": "elementwise select into a new tensor",
}
#: The higher-order operator a Triton kernel launch is; bound to the loader's launcher of the artifact's cubins.
TRITON_LAUNCH = "triton_kernel_wrapper_mutation"

_RAW = re.compile(r"ptr|pointer|addr|file|path|storage", re.IGNORECASE)


def schema_refusal(op: torch._ops.OpOverload) -> str | None:
    """Why ``op``'s schema alone rules it out of a wrapper graph, or None.

    Refused: an overload that returns an alias it does not write (a view made without a bounds check:
    ``_reshape_alias``, ``alias``, ``view``, ``expand``...), one that changes a tensor's size, stride or storage in
    place (``inplace_view``: ``as_strided_``, ``resize_``, ``set_``...), and one taking a ``Storage``, a string (a
    file name: ``from_file``) or an argument named as a raw pointer, address or path.
    """
    schema = op._schema
    if torch.Tag.inplace_view in op.tags:
        return "it changes a tensor's size, stride or storage in place"
    written = {frozenset(a.alias_info.before_set) for a in schema.arguments
               if a.alias_info is not None and a.alias_info.is_write}
    for ret in schema.returns:
        info = ret.alias_info
        if info is not None and not (info.is_write and frozenset(info.before_set) in written):
            return "it returns a view of its input made without a bounds check"
    for arg in schema.arguments:
        kind = str(arg.type)
        if "Storage" in kind or kind.startswith(("str", "Optional[str]")) or _RAW.search(arg.name):
            return f"its argument {arg.name} ({kind}) is a storage, a string, an address or a path"
    return None


def lookup_op(name: str) -> torch._ops.OpOverload | None:
    """The allowed ATen overload ``name`` (``aten::mm.out``), looked up on ``torch.ops`` with nothing imported;
    None if it is not on :data:`ALLOWED_OPS`.

    Raises:
        WrapperGraphError: it is on the list but this torch lacks it.
    """
    if name not in ALLOWED_OPS:
        return None
    qual, _, overload = name.rpartition(".")
    found = getattr(getattr(torch.ops.aten, qual.partition("::")[2], None), overload, None)
    if not isinstance(found, torch._ops.OpOverload):
        raise WrapperGraphError(f"operator {name!r} does not exist in this torch")
    return found


def _check_table() -> None:
    for name in ALLOWED_OPS:
        try:
            op = lookup_op(name)
        except WrapperGraphError:
            continue  # a newer overload (dtype_out) on an older torch: refused when a graph names it
        why = schema_refusal(op)
        if why:  # pragma: no cover - the table contradicts its rule: a programming error caught at import
            raise RuntimeError(f"{name} is on the wrapper allow-list but {why}")


_check_table()
