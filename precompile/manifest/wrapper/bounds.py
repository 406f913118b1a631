"""Bounds of a wrapper graph's tensors: every view's size, stride and offset checked against the storage it views,
every allocation's sizes checked, and size arithmetic kept within int64.

:func:`analyze` follows a checked graph (:func:`precompile.manifest.wrapper.graph.check`) node by node and knows,
for each value, whether it is a tensor, an integer or a tuple, and for a tensor a lower bound of its storage's
size where the graph itself fixes it (an allocation with constant sizes, and the views and ``out=`` results of
it; a storage only ever grows, so the bound holds for the whole call).  A view with constant size, stride and
offset of such a storage is proved in bounds when the graph is loaded, or refused there; any other view is
checked once per call, before it is made, by :func:`checked_view` (the base's ``untyped_storage().nbytes()`` and
``element_size()``).  What cannot be checked is refused: a negative size, stride or offset, a value of 2**63 or
more, sizes and strides of different lengths, a view of something that is not a tensor.

ATen's ``as_strided`` checks bounds itself (``setStorage``: "out of bounds for storage"; verified on torch 2.13);
these checks do not rely on it.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any

import torch

from precompile.manifest.graph_json import TORCH_NAMES
from precompile.manifest.wrapper.ops import ARITHMETIC, WrapperGraphError, lookup_op

#: Values above this (sizes, strides, offsets, byte counts, arithmetic results) are refused: int64's range.
LIMIT = 1 << 63
#: Most dimensions a view or an allocation may have (ATen's own limit is 64 for most kernels).
MAX_DIMS = 64
_INTS = ("int", "any")  # value kinds that may stand for an integer (checked again at call time)


@dataclass(frozen=True)
class Value:
    """What a node's result is, as far as the graph fixes it.

    Attributes:
        kind: ``tensor``, ``int``, ``tuple``, ``none`` or ``any`` (a placeholder, or an optional result).
        nbytes: for a tensor, a lower bound of its storage's size in bytes, where the graph fixes it; else None.
        itemsize: for a tensor with ``nbytes``, its element size in bytes.
        items: for a tuple, its elements' kinds.
    """

    kind: str
    nbytes: int | None = None
    itemsize: int | None = None
    items: tuple[str, ...] = ()


def extent(size: Any, stride: Any, offset: Any) -> int:
    """Elements of storage a view of ``size``, ``stride`` and ``offset`` reaches (its last element's index + 1;
    ``offset`` for an empty view).

    Raises:
        WrapperGraphError: a value that is not an int, negative, 2**63 or more, or sizes and strides of different
            lengths or more than :data:`MAX_DIMS` dimensions.
    """
    if not isinstance(size, (list, tuple)) or not isinstance(stride, (list, tuple)):
        raise WrapperGraphError("sizes and strides must be lists")
    if len(size) != len(stride) or len(size) > MAX_DIMS:
        raise WrapperGraphError(f"sizes and strides of a view or allocation: {len(size)} and {len(stride)} "
                                f"dimensions (at most {MAX_DIMS}, equal)")
    for v in (*size, *stride, offset):
        if type(v) is not int or not 0 <= v < LIMIT:
            raise WrapperGraphError(f"a size, stride or offset of {_short(v)} (a non-negative int below 2**63)")
    if 0 in size:
        return offset
    if math.prod(size) >= LIMIT:
        raise WrapperGraphError(f"a view or allocation of {math.prod(size)} elements, past int64")
    end = offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))
    if end >= LIMIT:
        raise WrapperGraphError(f"a view or allocation reaching element {end}, past int64")
    return end


def _short(value: Any) -> str:
    """``value`` for a message: an int of more than 64 bits by its size (``str`` of a huge int is slow, or raises)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit int"
    return str(value)[:30]


def checked_view(base: Any, size: Any, stride: Any, offset: Any, need: int | None = None) -> torch.Tensor:
    """``torch.as_strided(base, size, stride, offset)`` after checking that it lies inside ``base``'s storage.

    Args:
        need: :func:`extent` of the constant ``size``, ``stride`` and ``offset``, computed once at load; None: they
            are computed in this call and checked here.

    Raises:
        WrapperGraphError: ``base`` is not a strided tensor, a value is refused by :func:`extent`, or the view
            reaches past the storage (``need * element_size > untyped_storage().nbytes()``).
    """
    if not isinstance(base, torch.Tensor) or base.layout != torch.strided or base.is_nested:
        raise WrapperGraphError(f"a view of a {type(base).__name__}, not a strided tensor")
    if need is None:
        need = extent(size, stride, offset)
    nbytes = base.untyped_storage().nbytes()
    if need * base.element_size() > nbytes:
        raise WrapperGraphError(f"a view (sizes {list(size)[:8]}, strides {list(stride)[:8]}, offset {offset}) "
                                f"reaches {need * base.element_size()} bytes of a storage of {nbytes}")
    return torch.as_strided(base, size, stride, offset)


def checked_empty(size: Any, stride: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.empty_strided(size, stride, **kwargs)`` for sizes computed in the call, after :func:`extent`'s
    checks and a check that its bytes (elements x the dtype's size) stay within int64: ATen computes the
    storage's size from them.

    Raises:
        WrapperGraphError: as :func:`extent`, or the allocation's bytes are 2**63 or more.
    """
    dtype = kwargs.get("dtype")
    itemsize = (dtype if isinstance(dtype, torch.dtype) else torch.get_default_dtype()).itemsize
    nbytes = extent(size, stride, 0) * itemsize
    if nbytes >= LIMIT:
        raise WrapperGraphError(f"an allocation of {nbytes} bytes, past int64")
    return torch.empty_strided(size, stride, **kwargs)


def checked_int(fn: Any) -> Any:
    """``fn`` (size arithmetic) whose result must be an int (or bool) within int64.

    Raises (per call):
        WrapperGraphError: the result is anything else (a tensor, a float, an integer past int64).
    """
    def call(*args: Any) -> Any:
        try:
            out = fn(*args)
        except ArithmeticError as err:  # a floordiv or mod by 0, an overflow
            raise WrapperGraphError(f"size arithmetic failed: {type(err).__name__}: {err}") from err
        if type(out) not in (int, bool) or not -LIMIT <= out < LIMIT:
            raise WrapperGraphError(f"size arithmetic gave {type(out).__name__} {_short(out)}, not an int64")
        return out

    return call


def analyze(nodes: list[dict[str, Any]]) -> tuple[list[Value], dict[int, Any]]:
    """``(values, checks)`` of a checked graph's nodes: each node's :class:`Value`, and for each node that must be
    checked at call time how: ``("view", need, size, stride, offset)`` (constant values, of :func:`extent` ``need``:
    only the storage is checked per call), ``("view", None)``, ``("empty",)`` or ``("int",)``; a node not in
    ``checks`` is called directly.

    Raises:
        WrapperGraphError: a node's arguments are not what its target takes (naming the node), a constant size,
            stride or offset is refused by :func:`extent`, or a view with constant values reaches past a storage
            the graph fixes.
    """
    values: list[Value] = []
    checks: dict[int, Any] = {}
    for i, node in enumerate(nodes):
        where = f"node {i} ({node['name']})"
        try:
            values.append(_value_of(node, values, checks, i))
        except WrapperGraphError as err:
            raise WrapperGraphError(f"{where}: {err}") from None
    return values, checks


def _ref(arg: Any) -> int | None:
    return arg["$node"] if isinstance(arg, dict) and set(arg) == {"$node"} else None


def _ints(arg: Any, values: list[Value]) -> list[Any] | None:
    """A stored int list's constants, with None for each node reference; None if it has a node reference to a
    value that is not an integer, or is not a list."""
    items = arg.get("$size", arg.get("$tuple")) if isinstance(arg, dict) else arg
    if not isinstance(items, list):
        raise WrapperGraphError("sizes and strides must be lists")
    out = []
    for v in items:
        j = _ref(v)
        if j is not None and values[j].kind not in _INTS:
            raise WrapperGraphError(f"a size of node {j}, a {values[j].kind}")
        if j is None and type(v) is not int:
            raise WrapperGraphError(f"a size or stride of {_short(v)}")
        out.append(None if j is not None else v)
    return out


def _value_of(node: dict[str, Any], values: list[Value], checks: dict[int, Any], i: int) -> Value:
    op, target, args, kwargs = node["op"], node["target"], node["args"], node["kwargs"]
    if op == "placeholder":
        return Value("any")
    if op == "output":
        return Value("none")
    fn = target.get("fn")
    if fn == "torch:as_strided":
        return _view(args, kwargs, values, checks, i)
    if fn == "torch:empty_strided":
        return _empty(args, kwargs, values, checks, i)
    if fn == "_operator:getitem":
        j = _ref(args[0]) if len(args) == 2 and not kwargs else None
        if j is None or type(args[1]) is not int:
            raise WrapperGraphError("getitem takes a node and an integer index")
        base = values[j]
        if base.kind == "tuple":
            if not 0 <= args[1] < len(base.items):
                raise WrapperGraphError(f"getitem {args[1]} of a tuple of {len(base.items)}")
            return Value(base.items[args[1]])
        if base.kind in ("tensor", "any"):  # ATen's select checks the index; the result views the same storage
            return Value(base.kind, base.nbytes, base.itemsize)
        raise WrapperGraphError(f"getitem of a {base.kind}")
    if fn in ARITHMETIC:
        if kwargs or any(_ref(a) is not None and values[_ref(a)].kind not in _INTS for a in args):
            raise WrapperGraphError("size arithmetic takes integers and integer nodes only")
        checks[i] = ("int",)
        return Value("int")
    if "op" in target:
        return _op(lookup_op(target["op"]), args, kwargs, values)
    return Value("none")  # a Triton launch (its pointers are checked where it is bound)


def _view(args: list[Any], kwargs: dict[str, Any], values: list[Value], checks: dict[int, Any], i: int) -> Value:
    j = _ref(args[0]) if len(args) == 4 and not kwargs else None
    if j is None:
        raise WrapperGraphError("as_strided takes a node, sizes, strides and an offset, positionally")
    base = values[j]
    if base.kind not in ("tensor", "any"):
        raise WrapperGraphError(f"a view of a {base.kind}, not a tensor")
    size, stride = _ints(args[1], values), _ints(args[2], values)
    k = _ref(args[3])
    offset = args[3] if k is None else None
    if (k is None and type(offset) is not int) or (k is not None and values[k].kind not in _INTS):
        raise WrapperGraphError(f"a view's offset must be an integer, not {_short(args[3])}")
    need = None
    if None not in size and None not in stride and offset is not None:
        need = extent(size, stride, offset)
        if base.nbytes is not None:
            if need * base.itemsize > base.nbytes:
                raise WrapperGraphError(f"a view (sizes {size[:8]}, strides {stride[:8]}, offset {offset}) reaches "
                                        f"{need * base.itemsize} bytes of a storage of {base.nbytes}")
            return Value("tensor", base.nbytes, base.itemsize)  # proved here: no check per call
    elif len(size) != len(stride) or len(size) > MAX_DIMS:
        raise WrapperGraphError(f"a view of {len(size)} sizes and {len(stride)} strides")
    checks[i] = ("view", need, size, stride, offset) if need is not None else ("view", None)
    return Value("tensor", base.nbytes, base.itemsize)


def _empty(args: list[Any], kwargs: dict[str, Any], values: list[Value], checks: dict[int, Any], i: int) -> Value:
    if len(args) != 2 or not set(kwargs) <= {"dtype", "device"}:
        raise WrapperGraphError("empty_strided takes sizes and strides, and only dtype and device")
    dtype = kwargs.get("dtype")
    if dtype is not None and not (isinstance(dtype, dict) and "$dtype" in dtype):
        raise WrapperGraphError("empty_strided's dtype must be a dtype")
    size, stride = _ints(args[0], values), _ints(args[1], values)
    if None in size or None in stride:
        if len(size) != len(stride) or len(size) > MAX_DIMS:
            raise WrapperGraphError(f"an allocation of {len(size)} sizes and {len(stride)} strides")
        checks[i] = ("empty",)
        return Value("tensor")
    itemsize = _dtype(dtype).itemsize
    nbytes = extent(size, stride, 0) * itemsize
    if nbytes >= LIMIT:
        raise WrapperGraphError(f"an allocation of {nbytes} bytes, past int64")
    return Value("tensor", nbytes, itemsize)


def _dtype(tagged: Any) -> torch.dtype:
    return torch.get_default_dtype() if tagged is None else TORCH_NAMES["$dtype"][tagged["$dtype"]]


def _op(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any], values: list[Value]) -> Value:
    """An allowed ATen overload's result: the written argument it returns (``out=``, ``copy_``'s self), or what
    its schema returns."""
    schema = op._schema
    rets = schema.returns
    if len(rets) == 1 and rets[0].alias_info is not None:  # an out= or in-place overload returns what it wrote
        alias = rets[0].alias_info.before_set
        for n, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.before_set == alias:
                given = kwargs.get(a.name, args[n] if n < len(args) and not a.kwarg_only else None)
                j = _ref(given)
                return values[j] if j is not None and values[j].kind in ("tensor", "any") else Value("any")
    kinds = tuple("tensor" if str(r.type) == "Tensor" else "int" if str(r.type) in ("SymInt", "int") else "any"
                  for r in rets)
    if not kinds:
        return Value("none")
    return Value(kinds[0]) if len(kinds) == 1 else Value("tuple", items=kinds)
