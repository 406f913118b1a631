"""Memory safety of a stored wrapper graph (precompile.manifest.wrapper.ops, wrapper_bounds): a positive allow-list of
what Inductor's FX wrapper emits, and every view checked against the storage it views, at load where the graph
fixes the values, else once per call (issue 30: ``aten::_reshape_alias`` with ``clone`` leaked heap memory, with
``fill_`` it segfaulted).  The fuzz over hostile graphs is tests/manifest/test_wrapper_graph_fuzz.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from precompile.manifest.wrapper import ops as wrapper_ops
from precompile.manifest.wrapper.bounds import checked_view, extent
from precompile.manifest.wrapper.codegen import build
from precompile.manifest.wrapper.graph import check
from precompile.manifest.wrapper.ops import WrapperGraphError, schema_refusal


def _graph(*calls, placeholders=("x",)):
    """A wrapper graph: the placeholders, then ``(target, args, kwargs)`` per node (``{"$node": i}`` refers to
    node i, placeholders first), returning the last node."""
    nodes = [{"name": p, "op": "placeholder", "target": p, "args": [], "kwargs": {}} for p in placeholders]
    for target, args, kwargs in calls:
        nodes.append({"name": f"n{len(nodes)}", "op": "call_function", "target": target, "args": args,
                      "kwargs": kwargs})
    nodes.append({"name": "output", "op": "output", "target": "output", "args": [{"$node": len(nodes) - 1}],
                  "kwargs": {}})
    return json.loads(json.dumps({"schema": 1, "nodes": nodes, "submodules": {}}))


X = {"$node": 0}
VIEW, EMPTY = {"fn": "torch:as_strided"}, {"fn": "torch:empty_strided"}
F32 = {"dtype": {"$dtype": "float32"}, "device": "cpu"}


def test_every_allowed_aten_op_exists_here_and_passes_the_schema_rule():
    for name in wrapper_ops.ALLOWED_OPS:
        op = wrapper_ops.lookup_op(name)
        assert schema_refusal(op) is None, name
    assert wrapper_ops.lookup_op("aten::_reshape_alias.default") is None  # not listed: refused as a target


@pytest.mark.parametrize("name, why", [
    ("_reshape_alias.default", "view"), ("alias.default", "view"), ("expand.default", "view"),
    ("view.default", "view"), ("as_strided.default", "view"), ("as_strided_.default", "in place"),
    ("resize_.default", "in place"), ("set_.source_Storage", "in place"), ("set_.source_Tensor", "in place"),
    ("from_file.default", "string"), ("_nested_view_from_buffer.default", "view")])
def test_the_schema_rule_refuses_unchecked_views_storage_changes_and_files(name, why):
    op, overload = name.split(".")
    assert why in schema_refusal(getattr(getattr(torch.ops.aten, op), overload))


def test_an_allowed_op_this_torch_lacks_is_refused_as_missing(monkeypatch):
    monkeypatch.setitem(wrapper_ops.ALLOWED_OPS, "aten::no_such_op.default", "a newer torch's")
    with pytest.raises(WrapperGraphError, match="does not exist in this torch"):
        check(_graph(({"op": "aten::no_such_op.default"}, [X], {}),))


@pytest.mark.parametrize("follow", ["aten::clone.default", "aten::fill_.Scalar"])
def test_the_issues_reshape_alias_graphs_are_refused_before_anything_runs(follow):
    data = _graph(({"op": "aten::_reshape_alias.default"}, [X, [1 << 20], [1]], {}),
                  ({"op": follow}, [{"$node": 1}, *([0.0] if "fill" in follow else [])], {}))
    with pytest.raises(WrapperGraphError, match="allow-list"):
        build(data)


def test_a_view_past_an_allocation_with_constant_sizes_is_refused_at_load_and_one_inside_runs_unchecked():
    inside = _graph((EMPTY, [[4, 4], [4, 1]], F32), (VIEW, [{"$node": 1}, [2, 8], [8, 1], 0], {}))
    values, checks = check(inside)
    assert values[2].nbytes == 64 and 2 not in checks  # proved at load: no check per call
    assert build(inside)(torch.zeros(1)).shape == (2, 8)
    assert 2 not in check(_graph((EMPTY, [[4, 4], [4, 1]], F32), (VIEW, [{"$node": 1}, [4], [5], 0], {})))[1]
    for size, stride, offset in (([2, 8], [8, 1], 1), ([17], [1], 0), ([4], [6], 0), ([0], [1], 17)):
        with pytest.raises(WrapperGraphError, match="reaches (68|76) bytes of a storage of 64"):
            check(_graph((EMPTY, [[4, 4], [4, 1]], F32), (VIEW, [{"$node": 1}, size, stride, offset], {})))


def test_a_view_of_an_input_is_checked_against_its_storage_at_every_call():
    fn = build(_graph((VIEW, [X, [4, 4], [4, 1], 0], {})))
    assert fn(torch.arange(16.0)).sum() == 120
    with pytest.raises(WrapperGraphError, match="reaches 64 bytes of a storage of 60"):
        fn(torch.arange(15.0))
    with pytest.raises(WrapperGraphError, match="not a strided tensor"):
        fn(3)
    base = torch.arange(32.0)[8:]  # a view: its storage is the whole 32 elements
    assert build(_graph((VIEW, [X, [32], [1], 0], {})))(base).sum() == sum(range(32))


def test_a_view_with_sizes_computed_in_the_call_is_checked_at_every_call():
    size = {"$node": 1}  # the input's first size, read in the call
    fn = build(_graph(({"op": "aten::sym_size.int"}, [X, 0], {}), (VIEW, [X, [size, 2], [2, 1], 0], {})))
    assert fn(torch.zeros(6, 2)).shape == (6, 2)
    grow = build(_graph(({"op": "aten::sym_size.int"}, [X, 0], {}), ({"fn": "_operator:mul"}, [size, 4], {}),
                        (VIEW, [X, [{"$node": 2}], [1], 0], {})))
    with pytest.raises(WrapperGraphError, match="reaches 96 bytes of a storage of 48"):
        grow(torch.zeros(6, 2))


@pytest.mark.parametrize("size, stride, offset, why", [
    ([2], [-1], 4, "non-negative"), ([-2], [1], 0, "non-negative"), ([2], [1], -1, "non-negative"),
    ([2], [1 << 63], 0, "below 2\\*\\*63"), ([1 << 62, 3], [4, 1], 0, "past int64"), ([2, 2], [1], 0, "dimensions"),
    ([1] * 65, [1] * 65, 0, "dimensions")])
def test_sizes_strides_and_offsets_that_cannot_be_checked_are_refused(size, stride, offset, why):
    with pytest.raises(WrapperGraphError, match=why):
        check(_graph((VIEW, [X, size, stride, offset], {})))
    if offset == 0:
        with pytest.raises(WrapperGraphError, match=why):
            check(_graph((EMPTY, [size, stride], F32)))


@pytest.mark.parametrize("offset", [None, "3", 1.5, True, [0], {"$dtype": "float32"}])
def test_an_offset_that_is_not_an_integer_is_refused_at_load(offset):
    with pytest.raises(WrapperGraphError, match="offset must be an integer"):
        check(_graph((VIEW, [X, [1], [1], offset], {})))


def test_zero_strides_cannot_make_more_elements_than_int64_holds():
    with pytest.raises(WrapperGraphError, match="elements, past int64"):
        check(_graph((VIEW, [X, [1 << 62, 1 << 62], [0, 0], 0], {})))


def test_an_allocation_sized_in_the_call_past_int64_bytes_is_refused_before_aten_sees_it():
    # 4 * 2**60 elements are within int64; as float32 they are 2**64 bytes
    n = {"$node": 2}
    alloc = build(_graph(({"op": "aten::sym_size.int"}, [X, 0], {}),
                         ({"fn": "_operator:mul"}, [{"$node": 1}, 1 << 60], {}), (EMPTY, [[n], [1]], F32)))
    assert alloc(torch.zeros(0)).shape == (0,)
    with pytest.raises(WrapperGraphError, match=f"an allocation of {1 << 64} bytes, past int64"):
        alloc(torch.zeros(4))


@pytest.mark.parametrize("op", ["_operator:floordiv", "_operator:mod"])
def test_size_arithmetic_by_zero_is_a_wrapper_graph_error_at_the_call(op):
    fn = build(_graph(({"op": "aten::sym_size.int"}, [X, 0], {}), ({"fn": op}, [7, {"$node": 1}], {})))
    assert fn(torch.zeros(2)) == (7 // 2 if op.endswith("floordiv") else 7 % 2)
    with pytest.raises(WrapperGraphError, match="ZeroDivisionError"):
        fn(torch.zeros(0))


def test_a_view_of_something_not_a_tensor_is_refused():
    with pytest.raises(WrapperGraphError, match="a view of a int"):
        check(_graph(({"op": "aten::sym_size.int"}, [X, 0], {}), (VIEW, [{"$node": 1}, [1], [1], 0], {})))
    with pytest.raises(WrapperGraphError, match="a node, sizes, strides and an offset"):
        check(_graph((VIEW, [X, [1], [1]], {})))  # no offset: ATen would take the base's


def test_size_arithmetic_is_kept_within_int64_at_every_call():
    square = {"fn": "_operator:mul"}
    fn = build(_graph(({"op": "aten::sym_size.int"}, [X, 0], {}), (square, [{"$node": 1}, 1 << 40], {}),
                      (square, [{"$node": 2}, {"$node": 2}], {})))
    with pytest.raises(WrapperGraphError, match="not an int64"):
        fn(torch.zeros(1))
    with pytest.raises(WrapperGraphError, match="integers and integer nodes"):  # a tensor in size arithmetic
        check(_graph((EMPTY, [[4], [1]], F32), (square, [{"$node": 1}, 2], {})))


def test_a_kernel_pointer_must_be_a_tensor_of_the_graph():
    from test_wrapper_graph import BoundLaunch

    def launch(ptr):
        return (wrapper_ops.TRITON_LAUNCH, {"kernel_idx": 0, "constant_args_idx": 0, "grid": [{"$tuple": [1, 1, 1]}],
                                            "tma_descriptor_metadata": {"$dict": []},
                                            "kwargs": {"$dict": [["in_out_ptr0", ptr], ["xnumel", 1]]}})

    size = ({"op": "aten::sym_size.int"}, [X, 0], {})
    target, kwargs = launch({"$node": 1})
    with pytest.raises(WrapperGraphError, match="as pointers"):  # an integer node as an address
        build(_graph(size, ({"hop": target}, [], kwargs)), BoundLaunch())
    target, kwargs = launch(X)
    fn = build(_graph(({"hop": target}, [], kwargs)), BoundLaunch())
    fn(torch.randn(4))
    with pytest.raises(WrapperGraphError, match="pointer argument is a int"):  # a placeholder, checked per call
        fn(140000000000)


def test_an_allocation_takes_only_sizes_strides_dtype_and_device():
    with pytest.raises(WrapperGraphError, match="only dtype and device"):
        check(_graph((EMPTY, [[4], [1]], {**F32, "pin_memory": True})))
    assert build(_graph((EMPTY, [[4], [1]], F32)))(torch.zeros(1)).shape == (4,)


def test_torch_checks_as_strided_bounds_itself_here_too():
    """Verified rather than trusted (ATen's setStorage check); the graph's own checks do not rely on it."""
    base = torch.zeros(16)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.as_strided(base, (4,), (8,), 0)
    with pytest.raises(RuntimeError, match="Negative strides"):
        torch.as_strided(base, (2,), (-1,), 5)
    assert torch.as_strided(base, (0,), (1,), 1000).storage_offset() == 1000  # ATen allows an empty view past
    with pytest.raises(WrapperGraphError, match="reaches 4000 bytes"):  # the storage; precompile does not
        checked_view(base, [0], [1], 1000)
    assert extent([0], [1], 1000) == 1000


def test_a_keyword_name_outside_ascii_is_refused():
    # "\uff44evice" is an identifier that Python's compiler reads as "device": two stored names could become one
    with pytest.raises(WrapperGraphError, match="keyword names must be ASCII identifiers"):
        check(_graph((EMPTY, [[2], [1]], {"dtype": {"$dtype": "float32"}, "\uff44evice": "cpu"})))
