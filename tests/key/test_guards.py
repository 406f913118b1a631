"""Size guards from a manifest: arithmetic is evaluated, anything else is refused before it runs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from precompile.key.guards import Guards, GuardSyntaxError, evaluate_size

NAMES = ["w", "n", "x"]


def test_guards_name_what_breaks_in_placeholder_terms():
    g = Guards("L['t2'].size()[0] == L['t1'] and 2 <= L['t1'] and L['t1'] % 8 == 0", NAMES)
    w = torch.zeros(3)
    assert g.failures([w, 16, torch.zeros(16, 4)]) == []
    assert g.failures([w, 12, torch.zeros(12, 4)]) == ["n % 8 == 0"]
    assert g.failures([w, 8, torch.zeros(9, 4)]) == ["x.size()[0] == n"]
    assert g.failures([w, 0, torch.zeros(0, 4)]) == ["2 <= n"]


def test_functions_torch_prints_are_understood():
    g = Guards("max(L['t1'], 4) <= 64 and math.floor(L['t1'] / 3) >= 1 and torch.sym_float(L['t1']) > 2.5", NAMES)
    assert g.failures([None, 8, None]) == []
    assert len(g.failures([None, 65, None])) == 1


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch /tmp/pwned')",
    "L['t0'].__class__",
    "L['t0'].size.__globals__",
    "(lambda: 1)()",
    "[x for x in ()]",
    "open('/etc/passwd')",
    "10 ** 10 ** 10",
    "'a' * 1000",
    "L['x']",
    "L['t7']",
    "getattr(L['t0'], 'size')",
    "math.__dict__",
    "torch.ops",
])
def test_anything_but_arithmetic_is_refused(text):
    with pytest.raises(GuardSyntaxError):
        Guards(text, NAMES)


@pytest.mark.parametrize("text", [
    "((9 ** 64) ** 64) ** 64 > 0",  # 29 characters, 14 s and gigabytes per call before
    "(L['t1'] ** 64) ** 64 > 0",
    "max(1, (9 ** 64) ** 64) > 0",
    "((9 ** 64) ** 64)[0] > 0",  # the base is computed before the subscript fails
    " * ".join(["(L['t1'] ** 64)"] * 2) + " > 0",
    "((" + " * ".join(["L['t1']"] * 40) + ") ** 2) > 0",
])
def test_expressions_whose_values_can_pass_4096_bits_are_refused(text):
    with pytest.raises(GuardSyntaxError, match="4096 bits|not allowed"):
        Guards(text, NAMES)
    with pytest.raises(GuardSyntaxError, match="4096 bits|not allowed"):
        evaluate_size(text.replace("L['t1']", "s0").removesuffix(" > 0"), {"s0": 1})


@pytest.mark.parametrize("text", ["-" * 60000 + "1", "1+" * 30000 + "1", "not " * 15000 + "1",
                                  "(" * 300 + "1" + ")" * 300, "abs(" * 300 + "1" + ")" * 300, "1" * 5000])
def test_expressions_nested_too_deep_are_a_guard_syntax_error(text):
    # the parser's MemoryError / RecursionError, or a literal past Python's digit limit, never escapes
    with pytest.raises(GuardSyntaxError):
        Guards(text, NAMES)


def test_deep_but_real_expressions_still_work():
    total = " + ".join(["L['t1']"] * 200)  # a cat of 200 inputs: a sum 200 deep
    assert Guards(f"{total} <= 6400 and L['t1'] ** 2 * L['t1'] >= 8", NAMES).failures([None, 32, None]) == []
    assert evaluate_size(" + ".join(["s0"] * 200), {"s0": 3}) == 600


def test_overlong_expressions_are_refused():
    with pytest.raises(GuardSyntaxError):
        Guards(" and ".join(["L['t1'] > 0"] * 10000), NAMES)


@given(a=st.integers(-1000, 1000), b=st.integers(1, 1000), s0=st.integers(0, 10**6), op=st.sampled_from(
    ["+", "-", "*", "//", "%"]))
def test_size_expressions_evaluate_like_python(a, b, s0, op):
    text = f"({a} * s0 {op} {b})"
    assert evaluate_size(text, {"s0": s0}) == eval(text, {"s0": s0})  # noqa: S307 - the reference


def test_size_expressions_refuse_unknown_names():
    with pytest.raises(GuardSyntaxError):
        evaluate_size("s0 + s1", {"s0": 1})
    with pytest.raises(GuardSyntaxError):
        evaluate_size("__import__('os')", {})
