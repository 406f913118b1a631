"""What a stored FX graph may call: a positive allow-list, applied wherever a stored graph becomes a ``GraphModule``
again (:func:`precompile.manifest.graph_json.graph_from_json`, which ``precompile rebuild`` uses).

A stored graph is data read from a cache: whoever can write the cache chose every target, method name and argument
in it, and a rebuilt graph runs (a rebuild calls it eagerly and compiles it).  So nothing stored is imported, and no
stored name is looked up by an attribute walk.  Each target is found in a fixed table, or by qualified name in
torch's operator registry:

- ``{"op": "ns::name.overload"}`` and ``{"oppacket": "ns::name"}``: an operator the dispatcher has registered
  (looked up by qualified name in its table, ``torch._C._dispatch_find_schema_or_throw``), in ``aten`` or ``prims``
  where it is on the list of operators known to check their arguments (:mod:`precompile.manifest.op_list`: no
  ``*_unsafe`` constructor, ``_reshape_alias``, ``set_``, sparse or nested constructor), in a custom-op namespace registered in this process (``torch.library`` in Python, ``TORCH_LIBRARY`` in C++: vLLM's
  ``vllm`` and ``_C``), or in one of torch's own other namespaces named by ``PRECOMPILE_GRAPH_OP_NAMESPACES``.  Only
  then is it fetched: the namespace object from ``torch.ops``' instance dict (never ``getattr`` on ``torch.ops`` or its
  class), then ``getattr`` on that namespace and its packet, every name an identifier without a leading ``__``.  An
  operator whose schema takes a ``Storage`` or a file name (``aten::from_file``, ``aten::set_.source_Storage``) is
  refused.
- ``{"hop": name}``: the higher-order operators of :data:`HIGHER_ORDER`, which call only the graph's own sub-graphs.
- ``{"fn": "module:qualname"}``: the table :func:`functions` (size arithmetic from ``operator``, ``math`` and
  ``torch.sym_*``; torch's Python bindings of the ATen operators on that list and ``torch.nn.functional``, which Dynamo graphs call;
  the grad-mode and autocast switches and the few other callables Dynamo keeps in a graph), each looked up by the
  whole stored string.
- ``call_method``: :data:`METHODS`, the public ``torch.Tensor`` methods, none a dunder, less those that reach past the
  tensor (storages, hooks, shared memory, NumPy) and those named as an ATen operator that is not on the list.

What the Python functions and methods call inside is checked when the graph runs, by the same list
(:mod:`precompile.manifest.op_guard`, around ``precompile rebuild``'s eager run).
- ``builtins.getattr`` (Dynamo's ``x.T``, ``x.real``): only the tensor attributes of :data:`TENSOR_ATTRIBUTES`.

Anything else is an :class:`~precompile.errors.ArtifactFormatError` naming the node and the target.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import keyword
import math
import operator
import re
import types
from collections.abc import Callable
from typing import Any

import torch

from precompile import config
from precompile.manifest import op_list
from precompile.manifest.names import ascii_identifier
from precompile.errors import ArtifactFormatError

MAX_NAME = 1024


def identifier(name: Any) -> bool:
    """Whether ``name`` is an ASCII Python identifier of at most :data:`MAX_NAME` characters, not a keyword."""
    return ascii_identifier(name, MAX_NAME) and not keyword.iskeyword(name)


def _plain(name: Any) -> bool:
    return identifier(name) and not name.startswith("__")


# ---------------------------------------------------------------------------------------------------- operators

#: Namespaces torch registers itself besides ``aten`` and ``prims`` (with torch, torch._inductor and
#: torch.distributed imported): collectives, profiling, quantized kernels, test ops.  They are not custom ops; a graph
#: may call them only where ``PRECOMPILE_GRAPH_OP_NAMESPACES`` names them.  (tests/manifest/test_graph_allow.py
#: checks this list against a fresh process.)
TORCH_NAMESPACES = frozenset({
    "_c10d_functional", "_c10d_functional_autograd", "_dtensor", "_native", "_quantized", "_test", "c10d",
    "debug_mode_ops", "debugprims", "export", "fsdp", "higher_order", "inductor", "inductor_prims", "mkl", "mkldnn",
    "mkldnn_prepacked", "onednn", "prim", "profiler", "quantization", "quantized", "rngprims", "sparse",
    "static_runtime", "streams", "symm_mem", "_inductor_test", "_TorchScriptTesting", "c10d_functional", "onnx",
    "onnx_symbolic", "quantized_decomposed", "flex_lib"})

_FILE_ARG = re.compile(r"file|path|dir", re.IGNORECASE)


def _registered(qualified: str, overload: str) -> bool:
    """Whether the dispatcher holds operator ``qualified`` (``"aten::mm"``) at ``overload`` (``""``: the default):
    one lookup in its table, so an operator registered a moment ago counts and a TorchScript-only one does not."""
    try:
        torch._C._dispatch_find_schema_or_throw(qualified, overload)
    except RuntimeError:
        return False
    return True


def allowed_namespace(ns: str) -> bool:
    """Whether a stored graph may call operators of namespace ``ns`` (their registration checked apart): ``aten``
    and ``prims``, a namespace named by ``PRECOMPILE_GRAPH_OP_NAMESPACES``, or any other that torch does not
    register itself (:data:`TORCH_NAMESPACES`): a custom-op namespace, once the operator is registered here.

    Raises:
        ConfigError: the setting is malformed.
    """
    return ns in ("aten", "prims") or ns in config.graph_op_namespaces() or ns not in TORCH_NAMESPACES


def _schema_refusal(qualified: str, overload: str) -> str | None:
    try:
        schema = torch._C._get_schema(qualified, overload)
    except RuntimeError:
        return "its schema cannot be read"
    for arg in schema.arguments:
        kind = str(arg.type)
        if "Storage" in kind:
            return f"its argument {arg.name} is a Storage"
        if "str" in kind and _FILE_ARG.search(arg.name):
            return f"its argument {arg.name} names a file"
    return None


def _overloads(qualified: str) -> list[str]:
    """The overload names of operator ``qualified`` (``""`` for the default), from torch's operator registry."""
    try:
        return list(torch._C._jit_get_operation(qualified)[1] or [])
    except RuntimeError:
        return []


def lookup_op(qualified: Any, overload: str | None, where: str) -> Any:
    """The operator ``qualified`` (``"aten::mm"``) at ``overload`` (``"default"``, ``"out"``; None: the packet).

    A packet dispatches among all of its overloads when called, so every one of them must pass.

    Raises:
        ArtifactFormatError: naming ``where`` (the node): a malformed name, a namespace that is neither ``aten``,
            ``prims``, a registered custom-op namespace nor one the setting names, an operator or overload the
            dispatcher does not hold, one whose schema takes a storage or a file name, or an ``aten``/``prims``
            operator that is not on :mod:`precompile.manifest.op_list`'s list (the message says why).
        ConfigError: ``PRECOMPILE_GRAPH_OP_NAMESPACES`` is malformed.
    """
    what = f"{qualified}" + (f".{overload}" if overload is not None else "")
    ns, sep, name = qualified.partition("::") if isinstance(qualified, str) else ("", "", "")
    if not (sep and _plain(ns) and _plain(name) and (overload is None or _plain(overload))):
        raise ArtifactFormatError(f"{where} calls operator {what!r:.120}, which is not a qualified operator name "
                                  "(namespace::name.overload, identifiers)")
    if not allowed_namespace(ns):
        raise ArtifactFormatError(
            f"{where} calls {what!r:.120}: namespace {ns!r} is not aten, prims or a custom-op namespace registered in "
            "this process (import the module that registers it, or name it in PRECOMPILE_GRAPH_OP_NAMESPACES)")
    wanted = _overloads(qualified) if overload is None else ["" if overload == "default" else overload]
    if not any(_registered(qualified, ov) for ov in wanted):
        raise ArtifactFormatError(f"{where} calls {what!r:.120}, which is not an operator registered here (a custom "
                                  "operator: import the module that registers it first)")
    for ov in wanted:
        why = _schema_refusal(qualified, ov)
        if why:
            raise ArtifactFormatError(f"{where} calls {what!r:.120}, which a stored graph may not call: {why}")
    if ns in ("aten", "prims") and not op_list.is_admitted(qualified):
        why = op_list.denial(qualified) or "it is not on the list of operators known to check their arguments"
        raise ArtifactFormatError(f"{where} calls {what!r:.120}, which a stored graph may not call: {why}")
    # the namespace object from torch.ops' own dict (never getattr on torch.ops, whose class has import_module and
    # load_library), made the way torch.ops makes one on first use
    namespace = vars(torch.ops).get(ns) or type(torch.ops).__getattr__(torch.ops, ns)
    packet = getattr(namespace, name, None) if isinstance(namespace, torch._ops._OpNamespace) else None
    found = getattr(packet, overload, None) if overload is not None and packet is not None else packet
    kind = torch._ops.OpOverloadPacket if overload is None else torch._ops.OpOverload
    if not isinstance(found, kind):
        raise ArtifactFormatError(f"{where} calls {what!r:.120}, which does not resolve to an operator here")
    return found


#: Higher-order operators a stored graph may call: each runs the graph's own sub-graphs (``get_attr`` nodes, checked
#: to be sub-graphs it stores) on its values.  Triton kernel wrappers (a process-local side table) and operators that
#: take an operator or a Python callable as an argument are not among them.
HIGHER_ORDER = ("cond", "while_loop", "map_impl", "scan", "associative_scan", "invoke_subgraph", "wrap",
                "wrap_with_set_grad_enabled", "wrap_with_autocast", "tag_activation_checkpoint", "flex_attention",
                "flex_attention_backward", "hints_wrapper")


def lookup_hop(name: Any, where: str) -> Any:
    """The higher-order operator ``name`` of :data:`HIGHER_ORDER`.

    Raises:
        ArtifactFormatError: ``name`` is not on the list, or this torch lacks it.
    """
    if not isinstance(name, str) or name not in HIGHER_ORDER:
        raise ArtifactFormatError(f"{where} calls higher-order operator {name!r:.120}, which a stored graph may not "
                                  f"call (allowed: {', '.join(HIGHER_ORDER)})")
    found = getattr(torch.ops.higher_order, name, None)
    if not isinstance(found, torch._ops.HigherOrderOperator):
        raise ArtifactFormatError(f"{where} calls higher-order operator {name!r}, which this torch lacks")
    return found


# ---------------------------------------------------------------------------------------------------- functions

#: ``operator`` functions: arithmetic, comparison and bit operations on sizes and tensors, and item access on
#: tuples, sizes and tensors (what Dynamo emits for ``a + b``, ``x[i]``, ``x[i] = v``, ``x += y``: its
#: ``BuiltinVariable``, torch/_dynamo/variables/builtin.py, and ``SymNodeVariable``, variables/tensor.py).
OPERATORS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "neg", "pos", "abs", "invert",
             "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "lshift", "rshift", "not_", "truth",
             "getitem", "setitem", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul",
             "iand", "ior", "ixor", "ilshift", "irshift")
#: ``math`` functions of size expressions (``METHOD_TO_OPERATOR`` and ``math_op_names`` in
#: torch/fx/experimental/sym_node.py, which make_fx and AOTAutograd emit for SymInt/SymFloat arithmetic).
MATH = ("ceil", "floor", "trunc", "sqrt", "cos", "cosh", "sin", "sinh", "tan", "tanh", "asin", "acos", "atan", "log2")
#: ``torch.sym_*`` (torch/__init__.py) and the ``torch._sym_<math>`` functions sym_node.py maps size math to.
SYM = ("sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum", "sym_fresh_size",
       *(f"_sym_{n}" for n in MATH[3:]))
#: Thread-local mode switches Dynamo emits around a region of a graph (torch/_dynamo/variables/ctx_manager.py:
#: ``GradModeVariable``, ``AutocastModeVariable``, ``InferenceModeVariable``).
IN_GRAPH: tuple[tuple[Any, str], ...] = (
    (torch._C, "_set_grad_enabled"), (torch.amp.autocast_mode, "_enter_autocast"),
    (torch.amp.autocast_mode, "_exit_autocast"), (torch.autograd.grad_mode, "_enter_inference_mode"),
    (torch.autograd.grad_mode, "_exit_inference_mode"),
    # and what else Dynamo keeps in a graph: a size made of numbers, the API-usage counter of a traced function,
    # ``x.data`` (variables/tensor.py's ``method_attr_data``; vLLM's pieces hold it)
    (torch, "Size"), (torch._C, "_log_api_usage_once"), (torch._C._autograd, "_get_data_attr"))
#: Modules of torch's generated Python bindings of ATen operators (``torch.relu``, ``torch._C._nn.linear``...): a
#: name there is allowed where ATen registers an operator of that name (with no storage or file argument) that is
#: on :mod:`precompile.manifest.op_list`'s list.
BINDINGS = (("torch", torch._C._VariableFunctions), ("torch._C._nn", torch._C._nn),
            ("torch._C._fft", torch._C._fft), ("torch._C._linalg", torch._C._linalg),
            ("torch._C._special", torch._C._special))
#: Bindings that are not ATen operators: a tensor made from numbers and lists the graph holds.
TENSOR_FROM_DATA = ("tensor", "as_tensor")
#: Modules of Python functions on tensors (``torch.nn.functional.relu``, ``torch.functional.einsum``): their own
#: public functions.
FUNCTIONAL = ("torch.nn.functional", "torch.functional")


@functools.cache
def functions() -> dict[str, Callable[..., Any]]:
    """``{"module:qualname": callable}``: every Python callable a stored graph's ``{"fn": ...}`` may name, keyed as
    :func:`precompile.manifest.graph_json.graph_to_json` stores it.  Built once from torch's own modules; nothing
    is imported (every module named is imported by ``import torch``)."""
    import sys

    table: dict[str, Callable[..., Any]] = {f"_operator:{n}": getattr(operator, n) for n in OPERATORS}
    table.update({f"math:{n}": getattr(math, n) for n in MATH})
    table.update({"builtins:round": builtins.round, "builtins:abs": builtins.abs, "builtins:getattr": builtins.getattr})
    table.update({f"torch:{n}": vars(torch)[n] for n in SYM if n in vars(torch)})
    for module, name in IN_GRAPH:
        if callable(vars(module).get(name)):
            table[f"{module.__name__}:{name}"] = vars(module)[name]
    table.update({f"torch:{n}": vars(torch)[n] for n in TENSOR_FROM_DATA})
    for prefix, source in BINDINGS:
        names = vars(torch) if prefix == "torch" else vars(source)
        for name, fn in names.items():
            if (_plain(name) and isinstance(fn, types.BuiltinFunctionType) and getattr(source, name, None) is fn
                    and _aten_binding(name)):
                table[f"{prefix}:{name}"] = fn
    for modname in FUNCTIONAL:
        names = vars(sys.modules[modname])
        for name, fn in names.items():
            if not name.startswith("_") and inspect.isfunction(fn) and fn.__module__ == modname:
                # stored under its __qualname__ where that names it too (F.threshold is F._threshold), as
                # graph_json._encode_target stores it
                table[f"{modname}:{fn.__qualname__ if names.get(fn.__qualname__) is fn else name}"] = fn
    return table


def _aten_binding(name: str) -> bool:
    """Whether ``aten::<name>`` is a registered operator on the list, none of whose overloads takes a storage or a
    file name."""
    overloads = _overloads(f"aten::{name}")
    return op_list.is_admitted(f"aten::{name}") and any(_registered(f"aten::{name}", ov) for ov in overloads) and all(
        _schema_refusal(f"aten::{name}", ov) is None for ov in overloads)


def lookup_function(name: Any, where: str) -> Callable[..., Any]:
    """The callable ``{"fn": name}`` stands for, from :func:`functions`.

    Raises:
        ArtifactFormatError: ``name`` is not in the table.
    """
    found = functions().get(name) if isinstance(name, str) else None
    if found is None:
        raise ArtifactFormatError(f"{where} calls {name!r:.120}, which a stored graph may not call (only ATen and "
                                  "registered custom operators, torch's own tensor functions and size arithmetic)")
    return found


# ---------------------------------------------------------------------------------------------------- methods

#: ``torch.Tensor`` methods left out of :data:`METHODS`: they reach past the tensor's values (its storage, shared
#: memory, pinned memory, autograd hooks and backward, NumPy arrays, a subclass) or take a Python callable.
METHODS_REFUSED = frozenset({
    "storage", "untyped_storage", "storage_type", "set_", "data_ptr", "share_memory_", "is_shared", "pin_memory",
    "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "backward", "apply_", "map_", "map2_",
    "numpy", "as_subclass", "module_load", "new", "record_stream", "tolist", "resize_", "resize_as_"})


def _tensor_methods() -> frozenset[str]:
    return frozenset(n for n in dir(torch.Tensor) if not n.startswith("_") and n not in METHODS_REFUSED
                     and callable(inspect.getattr_static(torch.Tensor, n, None))
                     and (not _overloads(f"aten::{n}") or op_list.is_admitted(f"aten::{n}")))


#: Method names a ``call_method`` node may name.  Dynamo emits ``call_method`` for a tensor method a model calls
#: (``TensorVariable.call_method``'s generic case, torch/_dynamo/variables/tensor.py, plus the ``view_as``, ``type``,
#: ``requires_grad_`` and ``detach_`` it writes itself); AOTAutograd and make_fx emit none (their graphs call ATen
#: overloads, torch/fx/experimental/proxy_tensor.py).  So: the public methods of ``torch.Tensor``, no dunder, less
#: :data:`METHODS_REFUSED`, less those named as an ATen operator that is not on :mod:`precompile.manifest.op_list`'s
#: list (``to_sparse``, ``indices``, ``sparse_resize_``...).
METHODS = _tensor_methods()

#: Attributes ``builtins.getattr(tensor, name)`` may read: the tensor properties Dynamo reads through a graph node
#: (``GetAttrVariable.create_getattr_proxy`` for a ``getset_descriptor`` of ``torch.Tensor`` other than ``grad``,
#: torch/_dynamo/variables/tensor.py), each a tensor, a size or a flag.
TENSOR_ATTRIBUTES = frozenset({"T", "H", "mT", "mH", "real", "imag", "data", "shape", "ndim", "dtype", "device",
                               "layout", "is_leaf", "requires_grad", "itemsize", "nbytes", "is_cuda", "is_cpu",
                               "is_sparse", "is_quantized", "is_meta", "is_nested"})


def check_method(name: Any, args: Any, where: str) -> None:
    """Check a ``call_method`` node's method name and receiver (a reference to an earlier node).

    Raises:
        ArtifactFormatError: the name is not in :data:`METHODS` (a dunder never is), or the receiver is not a node.
    """
    if not isinstance(name, str) or name not in METHODS:
        raise ArtifactFormatError(f"{where} calls method {name!r:.120}, which a stored graph may not call (only "
                                  "public torch.Tensor methods, none that reach a storage, a hook or a callable)")
    if not (isinstance(args, list) and args and isinstance(args[0], dict) and set(args[0]) == {"$node"}):
        raise ArtifactFormatError(f"{where} calls method {name!r} on something other than an earlier node")


def check_getattr(args: Any, kwargs: Any, where: str) -> None:
    """Check a ``builtins.getattr`` node: ``getattr(<node>, <name of TENSOR_ATTRIBUTES>)``.

    Raises:
        ArtifactFormatError: any other form.
    """
    ok = (isinstance(args, list) and len(args) == 2 and not kwargs and isinstance(args[0], dict)
          and set(args[0]) == {"$node"} and isinstance(args[1], str) and args[1] in TENSOR_ATTRIBUTES)
    if not ok:
        attr = args[1] if isinstance(args, list) and len(args) > 1 else None
        raise ArtifactFormatError(f"{where} reads attribute {attr!r:.120} with getattr, which a stored graph may "
                                  f"not read (only {', '.join(sorted(TENSOR_ATTRIBUTES))} of a node)")
