"""The ATen and prims operators a stored FX graph may call: a committed list (``aten_allowed.txt`` beside this
module, one ``namespace::name`` operator packet a line, sorted), made by :func:`generate` and read by
:func:`admitted`.

A stored graph is data from a cache, and ``precompile rebuild`` runs it eagerly and compiles it.  Some ATen
operators trust their arguments to describe memory that exists: ``_sparse_coo_tensor_unsafe`` builds a sparse
tensor over indices nobody checked (``to_dense`` then writes wherever they point), ``_reshape_alias`` makes a view of
any size over a small storage, ``_nested_view_from_buffer`` reads offsets it is given, ``set_`` swaps a storage in,
``max_pool2d_with_indices_backward`` writes where its ``indices`` say.  So a stored graph may call an ``aten``/``prims``
operator only if it is on the list, and the list holds only operators whose kernels check what they are given
against the tensors they are given (shapes against shapes, indices against sizes, views against their storage).

Where the list comes from (:func:`sources`, torch 2.13; every source is torch's own):

- ``core``: the operators tagged ``torch.Tag.core`` (Core ATen IR, tags in aten/src/ATen/native/native_functions.yaml);
- ``pointwise``: those tagged ``torch.Tag.pointwise``;
- ``view``: the view operators (an overload whose schema returns an alias of an input);
- ``inductor``: the operators Inductor lowers (``torch._inductor.lowering.lowerings``) or decomposes
  (``torch._inductor.decomposition.select_decomp_table()``) and the core decompositions
  (``torch._decomp.core_aten_decompositions()``).  What a decomposition emits is lowered or decomposed in turn, so
  this set holds what Inductor's decompositions emit too;
- ``inplace``: the in-place variant ``name_`` of an operator above (it computes the same, into ``self``; ATen checks
  that the result's shape fits ``self``);
- ``models``: :data:`SEEN_IN_MODELS`, what real models' stored graphs reach that the sources above lack
  (tests/manifest/test_model_graphs.py runs the project's model families and names any new one), and
  :data:`TENSOR_METHODS`, operators of tensor methods Dynamo graphs call, and :data:`REACHED_BY_COMPOSITES`, what
  admitted composite operators dispatch.

Then every operator :func:`denial` refuses is taken out: :data:`NAME_RULES` and :data:`ARG_RULES` (sparse and nested
constructors, views and storage swaps without a check, offsets and lengths a kernel follows, backward kernels of
saved tensors, unbounded resizes, files and storages), less :data:`SAFE_UNSAFE`, plus :data:`DENIED` (operators
that the fuzz of tests/manifest/test_op_fuzz.py found writing, reading or hanging outside what they were given).
The rules are applied again at every lookup, so a list edited by hand cannot readmit what they refuse.

Keeping it current, on a torch upgrade: ``python -m precompile.manifest.op_list --write`` regenerates the file;
review ``git diff precompile/manifest/aten_allowed.txt`` (a new operator is admitted only by the sources and rules
above), then run tests/manifest/test_op_list.py (the committed file equals :func:`generate`'s output on the torch it
names; skipped on another), test_op_fuzz.py (every listed operator with extreme sizes, strides and indices) and
test_model_graphs.py (real models' graphs still pass).
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: The torch release the committed list was generated on (its first line says so too).
GENERATED_ON = "2.13"
DATA_FILE = Path(__file__).with_name("aten_allowed.txt")
MAX_FILE_BYTES = 256 * 1024
_NAME = re.compile(r"(aten|prims)::[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

#: Operators real models' stored graphs reach that :func:`sources`' torch sources lack, each with where it is met.
SEEN_IN_MODELS: dict[str, str] = {
    "aten::dropout": "torch.nn.functional.dropout's binding in Dynamo graphs (CompositeImplicitAutograd)",
    "aten::numel": "x.numel() as a call_method of Dynamo graphs (transformers' generate)",
    "aten::batch_norm": "torch.batch_norm in Dynamo graphs of convolutional models (CompositeImplicitAutograd)",
}
#: Operators named by public ``torch.Tensor`` methods that Dynamo graphs call as ``call_method`` and the sources lack:
#: size and layout queries, device moves, and a few computations whose kernels check their operands.
TENSOR_METHODS: dict[str, str] = {
    "aten::dim": "a query", "aten::is_contiguous": "a query", "aten::storage_offset": "a query",
    "aten::element_size": "a query", "aten::is_same_size": "a query", "aten::requires_grad_": "an autograd flag",
    "aten::cpu": "a copy to the CPU", "aten::cuda": "a copy to a GPU", "aten::allclose": "compares broadcast operands",
    "aten::masked_select": "the mask is broadcast-checked against self", "aten::nonzero_static": "size is checked",
    "aten::fill_diagonal_": "fills self's diagonal through a checked view",
    "aten::unsafe_chunk": "chunk with checked sizes (see SAFE_UNSAFE)", "aten::dropout_": "as aten::dropout",
    "aten::alpha_dropout": "as aten::dropout", "aten::feature_dropout": "as aten::dropout",
    "aten::feature_alpha_dropout": "as aten::dropout",
}

#: Operators that admitted composite operators dispatch in eager (what the guard of :mod:`.op_guard` sees of them),
#: found by the fuzz's guard refusals: each checks its operands like its siblings on the list.
REACHED_BY_COMPOSITES: dict[str, str] = {
    "aten::_fft_c2c": "the complex FFT behind fft_fft2/fftn/ifftn (sizes from its input; _fft_r2c, _fft_c2r listed)",
    "aten::grid_sampler_3d": "grid_sampler of a 5-d input (grid_sampler_2d listed; the grid's shape is checked)",
    "aten::linalg_eig": "what linalg_eigvals dispatches (LAPACK geev on a checked square matrix)",
}

#: Names with ``unsafe`` in them that are safe: each checks what it is given like its checked twin.
SAFE_UNSAFE: dict[str, str] = {
    "aten::_unsafe_view": "a view checked as aten::view checks one (numel and strides); 'unsafe' means autograd "
                          "does not track it as a view (matmul's decomposition dispatches it)",
    "aten::unsafe_split": "split with checked sizes; 'unsafe' means the outputs are not tracked as views",
    "aten::unsafe_split_with_sizes": "split_with_sizes with checked sizes; as unsafe_split",
    "aten::unsafe_chunk": "chunk with checked sizes; as unsafe_split",
}

#: ``(pattern on the operator's name without its namespace, why)``: operators that trust what they are given.
NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"unsafe", "'unsafe': it skips a check its twin makes (Inductor lowers _unsafe_index with no bounds check)"),
    (r"sparse|coalesce|^_?(?:crow_|col_|ccol_|row_)?indices(?:_copy)?$|^_?values(?:_copy)?$|^hspmm$|^s?smm$|^sspaddmm$",
     "sparse tensors: a constructor or accessor of indices nobody checked (to_dense then writes where they point)"),
    (r"nested|jagged|padded_tensor|padded_dense", "nested tensors: views over a buffer at offsets it is given"),
    (r"^_reshape_alias", "a view of any size and strides over the storage, unchecked"),
    (r"^set_|^is_set_to$|^_copy_from", "it swaps or copies a tensor's storage"),
    (r"resize", "it resizes a storage to any size (unbounded memory)"),
    (r"mkldnn|miopen|cudnn_rnn|_mps|mps_|fbgemm|xnnpack|nnpack|vulkan|_cslt|quantized|_int4pack|_int8pack|_dyn_quant"
     r"|prepack",
     "a backend's packed or opaque layout (packed weights, a flattened RNN weight buffer) whose sizes the kernel "
     "takes on trust"),
    (r"backward", "a backward kernel: it trusts the sizes of the forward's saved tensors (indices, statistics, "
                  "workspaces), and a stored graph for rebuild is a forward graph"),
    (r"^from_file$|pin_memory$|^record_stream$|^_print$|^_make_dep_token$|^_cufft_|^get_gradients$",
     "it reaches past tensors (files, pinned or stream memory, printing, CUDA plan caches, distributed autograd)"),
    (r"batch_dim|_for_grad$|_dual$|^_fw_primal|functional_tensor|^_sync$",
     "functorch's and forward-mode AD's internal wrappers, whose levels a graph would forge"),
    (r"^_sobol_engine|packed_sequence", "it follows a state or batch-sizes tensor sized by another argument"),
    (r"qparams", "a quantization helper taking a numel and a bin count on trust (choose_qparams_optimized: the "
                 "fuzz saw it hang)"),
    (r"^_test_|^_foobar$", "an operator for torch's own tests"),
)

#: ``(pattern on an argument's name, why)``: an argument a kernel follows into memory without a check.
ARG_RULES: tuple[tuple[str, str], ...] = (
    (r"unsafe", "an argument that turns its checks off"),
    (r"^(?:offsets|offs|offset2bag|bag_size|maximum_indices|lengths|max_lengths|total_L)$",
     "offsets or lengths into another tensor, which the kernel follows"),
    (r"^(?:cu_seqlens_[qk]|cum_seq_[qk]|seqused_k|block_table|max_seqlen(?:_[qk])?|min_seqlen)$",
     "sequence offsets or a page table, which the kernel follows"),
)

#: Operators the fuzz (tests/manifest/test_op_fuzz.py) found crashing, hanging, or reaching outside what they were
#: given, with what it saw.
DENIED: dict[str, str] = {
    "aten::_chunk_cat": "a segfault on 0-d tensors (the fuzz): it trusts its inputs to have the dimension it cuts",
    "aten::random_": "random_(from=2**63-1) on a float tensor never returns (the fuzz: a hang)",
    "aten::_weight_norm_interface": "trusts g to hold v.size(dim) elements: a segfault with an empty g (the fuzz); "
                                    "aten::_weight_norm, which checks nothing either, reaches it and is refused too",
}

#: Argument preconditions the guard (:mod:`.op_guard`) checks before an admitted operator runs, by packet: a
#: function of the bound arguments (``{name: value}``) returning why the call is refused, or None.  Each stands for a
#: check the operator's kernel lacks and torch's public function makes before calling it.


def _batch_norm(bound: dict[str, Any]) -> str | None:
    """Batch norm's kernels read one element per channel from each of ``weight``, ``bias``, ``running_mean`` and
    ``running_var`` without checking their sizes (a 1-element ``weight`` for 4 channels is read past), and in
    inference (``training`` false, or no ``training`` argument) dereference the running statistics even when absent
    (a segfault); torch.nn.functional.batch_norm checks both, the operators neither (found by the fuzz)."""
    x = bound.get("input")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return "batch norm of an input of fewer than 2 dimensions"
    if not bound.get("training", False) and (bound.get("running_mean") is None or bound.get("running_var") is None):
        return "batch norm in inference without running statistics (its CPU kernel reads them: a null dereference)"
    for name in ("weight", "bias", "running_mean", "running_var"):
        t = bound.get(name)
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() != x.size(1)):
            return f"batch norm's {name} does not hold one element per channel ({x.size(1)})"
    return None


def _fft_dims(bound: dict[str, Any]) -> str | None:
    """FFT primitives take ``dim`` on trust (torch.fft's functions wrap and check it first): a dimension out of range
    reads past the tensor's sizes, a segfault (found by the fuzz)."""
    dims, ndim = bound.get("dim"), getattr(bound.get("self"), "ndim", 0)
    if not isinstance(dims, (list, tuple)) or not all(type(d) is int and -ndim <= d < ndim for d in dims) \
            or len({d % ndim for d in dims}) != len(dims):
        return f"FFT dimensions {dims!r:.60} are not distinct dimensions of a {ndim}-d tensor"
    return None


def _aa_scales(bound: dict[str, Any]) -> str | None:
    """Antialiased upsampling reads as far as its ``scales_h``/``scales_w`` say, whatever the sizes (a scale of 1e308,
    or 0.001, reads past the input: the fuzz); torch.nn.functional.interpolate passes a scale only with the output
    size it gives, ``floor(input size * scale)``, so a given scale must give the output size."""
    x, out = bound.get("self", bound.get("input")), bound.get("output_size")  # .default names it self, .vec input
    for i, name in enumerate(("scales_h", "scales_w")):
        scale = bound.get(name)
        if scale is None:
            continue
        size = x.size(2 + i) * scale if isinstance(x, torch.Tensor) and x.dim() == 4 and isinstance(
            scale, (int, float)) and scale > 0 else math.nan
        ok = math.isfinite(size) and isinstance(out, (list, tuple)) and len(out) == 2 and math.floor(size) == out[i]
        if not ok:
            return f"antialiased upsampling's {name} {scale!r:.40} does not give its output size {out!r:.40}"
    return None


PRECONDITIONS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    **{f"aten::_upsample_{n}2d_aa": _aa_scales for n in ("bilinear", "bicubic", "lanczos")},
    **{f"aten::{n}": _batch_norm for n in (
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit_no_training", "_batch_norm_no_update", "_batch_norm_with_update",
        "_batch_norm_with_update_functional", "cudnn_batch_norm")},
    "aten::_fft_c2c": _fft_dims, "aten::_fft_r2c": _fft_dims, "aten::_fft_c2r": _fft_dims,
}

_NAME_RES = tuple((re.compile(p), why) for p, why in NAME_RULES)
_ARG_RES = tuple((re.compile(p), why) for p, why in ARG_RULES)


def _packet(qualified: str) -> torch._ops.OpOverloadPacket | None:
    ns, _, name = qualified.partition("::")
    namespace = vars(torch.ops).get(ns) or type(torch.ops).__getattr__(torch.ops, ns)
    found = vars(namespace).get(name)
    if found is None:
        try:
            torch._C._dispatch_find_schema_or_throw(qualified, "")
        except RuntimeError:
            if not torch._C._jit_get_operation(qualified)[1]:
                return None
        found = getattr(namespace, name, None)
    return found if isinstance(found, torch._ops.OpOverloadPacket) else None


@functools.cache
def denial(qualified: str) -> str | None:
    """Why operator ``qualified`` (``"aten::mm"``, a packet) may not be on the list, or None: a rule of
    :data:`NAME_RULES` (less :data:`SAFE_UNSAFE`), :data:`DENIED`, or an overload's argument matching
    :data:`ARG_RULES` or of type ``Storage``."""
    name = qualified.partition("::")[2]
    if qualified in DENIED:
        return DENIED[qualified]
    for pattern, why in _NAME_RES:
        if pattern.search(name) and not (why.startswith("'unsafe'") and qualified in SAFE_UNSAFE):
            return why
    packet = _packet(qualified)
    for overload in packet.overloads() if packet is not None else ():
        for arg in getattr(packet, overload)._schema.arguments:
            if "Storage" in str(arg.type):
                return f"its argument {arg.name} is a Storage"
            for pattern, why in _ARG_RES:
                if pattern.search(arg.name):
                    return f"its argument {arg.name}: {why}"
    return None


def sources() -> dict[str, set[str]]:
    """``{source: operator packets}`` for each source of the module docstring (``aten``/``prims`` only).  Imports
    Inductor's lowering and decomposition tables (seconds)."""
    import torch._inductor.decomposition as inductor_decomp
    import torch._inductor.lowering as lowering
    from torch._decomp import core_aten_decompositions

    def names(ops: object) -> set[str]:
        out = set()
        for op in ops:  # type: ignore[attr-defined]
            if isinstance(op, torch._ops.OpOverload):
                out.add(op._schema.name)
            elif isinstance(op, torch._ops.OpOverloadPacket):
                out.add(op._qualified_op_name)
        return {n for n in out if _NAME.match(n)}

    found: dict[str, set[str]] = {"core": set(), "pointwise": set(), "view": set()}
    every = sorted({n.partition(".")[0] for n in torch._C._dispatch_get_all_op_names() if _NAME.match(
        n.partition(".")[0])})
    for qualified in every:
        packet = _packet(qualified)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                found["core"].add(qualified)
            if torch.Tag.pointwise in op.tags:
                found["pointwise"].add(qualified)
            if op.is_view:
                found["view"].add(qualified)
    found["inductor"] = (names(lowering.lowerings) | names(inductor_decomp.select_decomp_table())
                         | names(core_aten_decompositions()))
    above = set().union(*found.values())
    found["inplace"] = {f"{n}_" for n in above if not n.endswith("_") and _packet(f"{n}_") is not None}
    found["models"] = set(SEEN_IN_MODELS) | set(TENSOR_METHODS) | set(REACHED_BY_COMPOSITES)
    return found


def generate() -> list[str]:
    """The list as :func:`sources` and :func:`denial` make it on this torch: sorted operator packets."""
    return sorted(n for n in set().union(*sources().values()) if _packet(n) is not None and denial(n) is None)


@functools.cache
def admitted() -> frozenset[str]:
    """The committed list (:data:`DATA_FILE`), each name checked again against :func:`denial`: what a stored graph
    may call in ``aten`` and ``prims``.

    Raises:
        RuntimeError: the file is missing, larger than :data:`MAX_FILE_BYTES`, or holds a line that is not an
            operator name (a broken installation, not bad input).
    """
    with open(DATA_FILE, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise RuntimeError(f"{DATA_FILE} is larger than {MAX_FILE_BYTES} bytes")
    names = [line.strip() for line in raw.decode("ascii").splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise RuntimeError(f"{DATA_FILE} holds {bad[0]!r:.80}, which is not an aten:: or prims:: operator name")
    return frozenset(n for n in names if denial(n) is None)


def is_admitted(qualified: str) -> bool:
    """Whether a stored graph may call ``aten``/``prims`` operator packet ``qualified`` (``"aten::mm"``)."""
    return qualified in admitted()


def render(names: list[str]) -> str:
    """The data file's text for ``names``."""
    head = (f"# ATen and prims operators a stored FX graph may call (torch {torch.__version__}).\n"
            "# Generated by: python -m precompile.manifest.op_list --write  (sources and rules: op_list.py)\n")
    return head + "".join(f"{n}\n" for n in names)


def main(argv: list[str]) -> int:
    """``--write``: regenerate :data:`DATA_FILE`; ``--check``: exit 1 if it differs from :func:`generate`; with
    neither, print what would change."""
    names = generate()
    committed = sorted(admitted()) if DATA_FILE.exists() else []
    if "--write" in argv:
        DATA_FILE.write_text(render(names))
        print(f"wrote {len(names)} operators to {DATA_FILE}")
        return 0
    added, removed = sorted(set(names) - set(committed)), sorted(set(committed) - set(names))
    for n in added:
        print(f"+ {n}")
    for n in removed:
        print(f"- {n}  ({denial(n) or 'in no source'})")
    return 1 if "--check" in argv and (added or removed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
