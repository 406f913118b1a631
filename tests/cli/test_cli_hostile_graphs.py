"""``precompile rebuild`` of stored graphs that call ATen operators trusting their arguments (the probe of issue 39):
a sparse tensor built over indices nobody checked (``_sparse_coo_tensor_unsafe``, and ``torch.sparse_coo_tensor``,
whose invariant check is off by default), then densified, killed ``precompile rebuild`` with SIGSEGV; a view of any
size over a small storage (``_reshape_alias``) and a nested view at offsets it is given
(``_nested_view_from_buffer``) read and wrote outside it.  Each is now refused (the list of
precompile.manifest.op_list), and so is a Python function that reaches an operator off the list from inside
(the guard, precompile.manifest.op_guard).  Unsigned static entries built for another torch, in a real local cache,
each rebuilt by ``precompile rebuild`` in a fresh process.
"""

from __future__ import annotations

import json

import pytest
from _cli import cli
from test_cli_trust_ops import X, plant

from cache_backends.local.cache import LocalCache


def _n(i: int) -> dict:
    return {"$node": i}


def _graph(*nodes: tuple) -> dict:
    """Placeholder ``x`` (4 floats), ``nodes`` (``(op, target, args, kwargs)``), returning the last."""
    specs = [{"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {}}]
    specs += [{"name": f"n{i}", "op": op, "target": t, "args": a, "kwargs": k} for i, (op, t, a, k) in enumerate(nodes)]
    specs.append({"name": "output", "op": "output", "target": "output", "args": [[_n(len(specs) - 1)]], "kwargs": {}})
    return {"schema": 1, "submodules": {}, "nodes": specs}


def _fn(name: str, *args: object, **kwargs: object) -> tuple:
    return ("call_function", {"fn": name}, list(args), kwargs)


def _op(name: str, *args: object, **kwargs: object) -> tuple:
    return ("call_function", {"op": name}, list(args), kwargs)


FAR = [[2 ** 40]]  # an index 2**40 elements past a 4-element sparse tensor
CASES = {
    # the probe: to_dense writes a 1 at element 2**40 of a 4-float buffer
    "_sparse_coo_tensor_unsafe": (_graph(
        _fn("torch:tensor", FAR), _op("aten::ones.default", [1]),
        _op("aten::_sparse_coo_tensor_unsafe.default", _n(1), _n(2), [4]),
        ("call_method", "to_dense", [_n(3)], {})), "aten::_sparse_coo_tensor_unsafe"),
    # the public binding: its invariant check is off by default, so the same tensor comes out
    "torch.sparse_coo_tensor": (_graph(
        _fn("torch:tensor", FAR), _fn("torch:ones", 1),
        _fn("torch:sparse_coo_tensor", _n(1), _n(2), [4]), ("call_method", "to_dense", [_n(3)], {})),
        "torch:sparse_coo_tensor"),
    # a million floats seen through a 4-float storage, written
    "_reshape_alias": (_graph(_op("aten::_reshape_alias.default", _n(0), [1 << 20], [1]),
                              _op("aten::fill_.Scalar", _n(1), 1.0)), "aten::_reshape_alias"),
    # a nested view whose one component starts 2**20 floats into the 4-float buffer
    "_nested_view_from_buffer": (_graph(
        _fn("torch:tensor", [[4]]), _fn("torch:tensor", [[1]]), _fn("torch:tensor", [1 << 20]),
        _op("aten::_nested_view_from_buffer.default", _n(0), _n(1), _n(2), _n(3)),
        ("call_method", "contiguous", [_n(4)], {})), "aten::_nested_view_from_buffer"),
    # a Python function reaching an operator off the list from inside: refused by the guard when the graph runs
    "embedding_bag inside a function": (_graph(
        _fn("torch:tensor", [0, 3]), _fn("torch:tensor", [0]), ("call_method", "view", [_n(0), 2, 2], {}),
        _fn("torch.nn.functional:embedding_bag", _n(1), _n(3), _n(2))), "aten::_embedding_bag"),
}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[str, dict[str, str]]:
    """A local cache holding one unsigned entry per case, built for another torch: ``(url, {case: key})``."""
    cache = LocalCache(tmp_path_factory.mktemp("hostile") / "c")
    return "file://" + str(cache.root), {case: plant(cache, "", {"torch": "0.0"}, graph, X)
                                         for case, (graph, _) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stored_graph_calling_an_operator_that_trusts_its_arguments_is_refused(case, hostile):
    url, keys = hostile
    proc = cli("rebuild", keys[case], "--force", "--cache", url, "--json", check=False,
               env={"PRECOMPILE_VERIFY_KEYS": None}, timeout=300)
    assert proc.returncode in (0, 1), f"rebuild died with {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    [row] = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert row["outcome"] == "refused", row
    assert CASES[case][1] in row["detail"] and "may not call" in row["detail"], row
