"""A stored graph's size arithmetic and literals are bounded (issue 39): ``3 ** 10**8`` and ``"A" * 2**31`` are
refused before they are computed, in a graph rebuilt from JSON and run as the rebuild's fake run runs it; sizes, shape
tuples and tensors pass as before; the literals a stored argument may hold are bounded when it is read."""

from __future__ import annotations

import time

import pytest
import torch

from precompile.manifest import size_math
from precompile.manifest.graph_json import decode_arg, graph_from_json, graph_to_json
from precompile.manifest.size_math import Ledger, SizeMathError, bounded, bounded_graph
from precompile.errors import ArtifactFormatError


def _fn(name: str):
    from precompile.manifest.graph_allow import functions

    return bounded(name, functions()[name], Ledger())


@pytest.mark.parametrize("name, args, message", [
    ("_operator:pow", (3, 10**8), "passes 64 bits"),
    ("_operator:pow", (2**40, 2**40), "passes 64 bits"),
    ("_operator:ipow", (-3, 100), "passes 64 bits"),
    ("_operator:lshift", (1, 2**40), "passes 64 bits"),
    ("_operator:mul", ("A", 2**31), "more than 65536"),
    ("_operator:mul", (2**20, [0]), "more than 65536"),
    ("_operator:add", ((0,) * 40000, (1,) * 40000), "more than 65536"),
    ("_operator:mod", ("%0999999999d", 1), "formats a str"),
    ("_operator:mul", (2**63, 2**63), "bits of size arithmetic"),
    ("_operator:add", (2**70, 1), "bits of size arithmetic"),
    ("builtins:round", (5, -10**9), "digits"),
    ("_operator:getitem", (object(), 0), "does not take"),
])
def test_size_arithmetic_past_its_bounds_is_refused_before_it_computes(name, args, message):
    start = time.monotonic()
    with pytest.raises(SizeMathError, match=message):
        _fn(name)(*args)
    assert time.monotonic() - start < 5  # a bound checked before computing; 3 ** 10**8 alone takes minutes


def test_sizes_shapes_and_tensors_pass_unchanged():
    assert _fn("_operator:pow")(2, 62) == 2**62 and _fn("_operator:lshift")(3, 60) == 3 << 60
    assert _fn("_operator:mul")((1, 2), 3) == (1, 2) * 3 and _fn("_operator:floordiv")(2**63, 7) == 2**63 // 7
    assert _fn("_operator:getitem")(torch.Size([4, 5]), 1) == 5 and _fn("math:ceil")(2.5) == 3
    x = torch.arange(4.0)
    assert torch.equal(_fn("_operator:mul")(x, 3), x * 3)  # a tensor goes to the real operator
    assert torch.equal(_fn("_operator:pow")(x, 10**8), x ** 10**8)


def test_the_ledger_bounds_the_sequences_of_a_whole_run():
    import operator

    ledger = Ledger()
    repeat = bounded("_operator:mul", operator.mul, ledger)
    with pytest.raises(SizeMathError, match="in all"):
        for _ in range(size_math.MAX_SEQUENCE_TOTAL // size_math.MAX_SEQUENCE + 1):
            repeat("A", size_math.MAX_SEQUENCE)


def test_a_rebuilt_graph_runs_its_arithmetic_bounded_in_the_copy_and_unchanged_in_the_original():
    def n(i):
        return {"$node": i}
    data = {"schema": 1, "submodules": {}, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {}},
        {"name": "s", "op": "call_function", "target": {"fn": "builtins:getattr"}, "args": [n(0), "shape"],
         "kwargs": {}},
        {"name": "d", "op": "call_function", "target": {"fn": "_operator:getitem"}, "args": [n(1), 0], "kwargs": {}},
        {"name": "p", "op": "call_function", "target": {"fn": "_operator:pow"}, "args": [n(2), n(2)], "kwargs": {}},
        {"name": "output", "op": "output", "target": "output", "args": [[n(3)]], "kwargs": {}}]}
    gm = graph_from_json(data)
    copy = bounded_graph(gm, Ledger())
    assert copy(torch.zeros(3)) == [27] and gm(torch.zeros(3)) == [27]
    with pytest.raises(SizeMathError, match="passes 64 bits"):
        copy(torch.zeros(100))
    assert graph_to_json(gm) == data  # the original keeps the real functions: it stores and compiles as before
    assert "size_math" not in gm.code and "**" in gm.code


@pytest.mark.parametrize("value, message", [
    (2**65, "int of 66 bits"), (-(2**65), "int of 66 bits"), ("x" * (2**16 + 1), "string of 65537"),
    ([0] * (2**20 + 1), "list of 1048577"), ({"$tuple": [0] * (2**20 + 1)}, "list of 1048577"),
])
def test_stored_literals_are_bounded(value, message):
    with pytest.raises(ArtifactFormatError, match=message):
        decode_arg(value, [])
    assert decode_arg([2**64, -(2**64), "x" * 2**16], []) == [2**64, -(2**64), "x" * 2**16]
