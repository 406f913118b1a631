"""Call-time input checks: the generated fast check accepts only what the full check accepts, and every mismatch
still raises an InputMismatchError naming the placeholder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precompile.errors import InputMismatchError
from precompile.loader.inputs import CallChecks, fast_check

SPECS = [
    {"name": "w", "type": "tensor", "dtype": "float32", "device": "cpu", "shape": [4, 8], "stride": [8, 1]},
    {"name": "x", "type": "tensor", "dtype": "float32", "device": "cpu", "shape": ["s0", 8], "stride": [8, 1]},
    {"name": "n", "type": "int", "size": "s0"},
    {"name": "k", "type": "int", "value": 3},
    {"name": "idx", "type": "tensor", "dtype": "int64", "device": "cpu", "shape": ["s0"], "stride": [1]},
]
SHAPES = {"symbols": {"s0": {"range": [2, 64], "hint": 5}},
          "guards": "L['t1'].size()[0] == L['t2'] and L['t4'].size()[0] == L['t2'] and 2 <= L['t2'] <= 64"}


def good(n: int = 5) -> list:
    return [torch.zeros(4, 8), torch.zeros(n, 8), n, 3, torch.zeros(n, dtype=torch.int64)]


def test_fitting_inputs_pass_fast_and_each_mismatch_names_its_placeholder():
    checks = CallChecks(SPECS, SHAPES)
    ok = fast_check(checks.checks, frozenset(), checks.guards)
    assert ok(good()) and ok(good(64))
    checks.check(good(), "a" * 64)
    bad = {
        "w": (0, torch.zeros(4, 8, dtype=torch.float64)),   # dtype
        "x": (1, torch.zeros(5, 9)),                       # static size
        "k": (3, 4),                                        # specialized int
        "idx": (4, torch.zeros(5, 1, dtype=torch.int64)),  # rank
    }
    for name, (i, value) in bad.items():
        flat = good()
        flat[i] = value
        assert not ok(flat)
        with pytest.raises(InputMismatchError, match=rf"  {name}: expected"):
            checks.check(flat, "a" * 64)
    with pytest.raises(InputMismatchError, match="sizes outside what the artifact was compiled for"):
        checks.check(good(65), "a" * 64)
    # a transposed view: the fast check declines, the full check words it
    flat = good()
    flat[0] = torch.zeros(8, 4).t()
    assert not ok(flat)
    with pytest.raises(InputMismatchError, match="stride"):
        checks.check(flat, "a" * 64)


def test_a_tolerated_difference_is_left_to_the_full_check_and_passes():
    checks = CallChecks(SPECS, SHAPES)
    flat = good()
    flat[0] = torch.zeros(4, 16)[:, :8]  # stride (16, 1): not the example's, and not tolerated
    with pytest.raises(InputMismatchError):
        checks.check(flat, "a" * 64)
    one = [{"name": "v", "type": "tensor", "dtype": "float32", "device": "cpu", "shape": [1, 8], "stride": [8, 1]}]
    c1 = CallChecks(one, None)
    sliced = torch.empty_strided((1, 8), (99, 1)).zero_()  # a size-1 dim with another stride
    assert fast_check(c1.checks, frozenset(), None)([sliced])  # a size-1 dim's stride is free in both checks
    c1.check([sliced], "a" * 64)
    assert c1.problems([sliced]) == []


def test_bound_placeholders_are_skipped():
    checks = CallChecks(SPECS, SHAPES)
    flat = good()
    flat[0] = None  # a bound weight is filled in by the artifact; the check skips it
    assert fast_check(checks.checks, frozenset({0}), checks.guards)(flat)


_values = st.one_of(
    st.builds(lambda d, r, n: torch.zeros([n] * r, dtype=d),
              st.sampled_from([torch.float32, torch.float64, torch.int64]), st.integers(0, 3), st.integers(0, 9)),
    st.integers(-2, 70), st.floats(allow_nan=False, width=32), st.none(), st.just("3"), st.just(True))


@settings(max_examples=400, deadline=None)
@given(st.lists(_values, min_size=4, max_size=6), st.data())
def test_the_fast_check_never_accepts_what_the_full_check_refuses(flat, data):
    checks = CallChecks(SPECS, SHAPES)
    base = good(data.draw(st.integers(0, 70)))
    for i, v in enumerate(flat[:5]):  # mix drawn values into fitting ones
        if data.draw(st.booleans()):
            base[i] = v
    candidates = [base, flat]
    for cand in candidates:
        if fast_check(checks.checks, frozenset(), checks.guards)(cand):
            assert checks.problems(cand) == [], cand


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_after_the_first_call_the_check_runs_in_cpp_and_still_refuses_every_mismatch(mode):
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        checks = CallChecks(SPECS, SHAPES)
        checks.check(good(), "a" * 64)  # the first call: the Python check, then the C++ one is built from it
        native = checks._fast[frozenset()]
        assert native(good()) and native(good(9))
        for i, value in ((0, torch.zeros(4, 8, dtype=torch.float64)), (1, torch.zeros(5, 9)),
                         (4, torch.zeros(5, 1, dtype=torch.int64)), (3, 4)):
            flat = good()
            flat[i] = value
            assert not native(flat)
            with pytest.raises(InputMismatchError, match=SPECS[i]["name"]):
                checks.check(flat, "a" * 64)
        with pytest.raises(InputMismatchError, match="sizes outside"):
            checks.check(good(65), "a" * 64)
    # a tensor made in another grad mode has other dispatch keys: the C++ check declines, the full check accepts
    other = good()
    checks.check(other, "a" * 64)
