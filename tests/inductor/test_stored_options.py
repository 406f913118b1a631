"""Stored Inductor options are data (precompile.inductor.stored_options): each has a type and a value domain, and
``cpp.march`` is an architecture name from gcc's documented list, never a fragment of a command line (issue 34:
``"native -wrapper /bin/sh,-c,CMD"`` was pasted into g++'s arguments by ``precompile rebuild``)."""

from __future__ import annotations

import pytest

from precompile.errors import OptionsError
from precompile.inductor import shim, stored_options


@pytest.fixture(scope="module")
def entries():
    return shim.config_entries()


@pytest.mark.parametrize("value", ["native", "x86-64-v3", "skylake-avx512", "znver4", "armv8.2-a",
                                   "armv8.2-a+fp16+dotprod", "armv9-a+nosve", "", None])
def test_architecture_names_are_accepted(value, entries):
    if "cpp.march" in entries:
        stored_options.check("cpp.march", value, entries)
        return
    # torch 2.11 has no ``cpp.march``: a stored one is refused as unknown there, and the name is still in the domain
    with pytest.raises(OptionsError, match=r"cpp\.march.*not an Inductor option of this torch"):
        stored_options.check("cpp.march", value, entries)
    assert value is None or stored_options.STRING_DOMAINS["cpp.march"](value)


@pytest.mark.parametrize("value", ["native -wrapper /bin/sh,-c,CMD", "native;id", "x86-64 ", "-march=native",
                                   "armv8.2-a+evil", "haswell+avx", "armv8-a+crc -o/tmp/x", 7, ["native"]])
def test_anything_else_as_march_is_refused_naming_option_and_value(value, entries):
    with pytest.raises(OptionsError, match=r"cpp\.march") as err:
        stored_options.check("cpp.march", value, entries)
    assert repr(value)[:40] in str(err.value)


@pytest.mark.parametrize("name, value", [
    ("trace.debug_dir", "/tmp/x"), ("cuda.cutlass_dir", "/opt/evil"), ("cpp.cxx", [None, "/bin/sh"]),
    ("cuda.compile_opt_level", "-O3 -Xcompiler=-wrapper"), ("max_autotune_gemm_backends", "ATEN,$(id)"),
    ("compile_threads", 10**6), ("cpp.threads", -5), ("max_autotune", "yes"), ("max_autotune", 1),
    ("cpp.simdlen", 2**40), ("memory_pool", "everything"), ("post_grad_custom_post_pass", {"fn": "os:system"}),
    ("no_such_option", 1), ("triton.autotune_at_compile_time", 0.5)])
def test_values_outside_their_domain_are_refused(name, value, entries):
    with pytest.raises(OptionsError, match="stored option"):
        stored_options.check(name, value, entries)


def test_what_builds_store_is_accepted_and_the_rest_split_off(entries):
    good = {"max_autotune": True, "triton.multi_kernel": 1, "cpp.simdlen": 8, "memory_pool": "none",
            "max_autotune_gemm_backends": "ATEN,TRITON", "cpp.march": "x86-64-v2", "coordinate_descent_tuning": False}
    bad = {"cpp.march": "native -wrapper /bin/sh,-c,CMD", "trace.debug_dir": "/tmp"}
    kept, refused = stored_options.within_domain({**good, **bad}, entries)
    assert kept == {k: v for k, v in good.items() if k != "cpp.march"}  # the hostile cpp.march replaced the good one
    assert sorted(str(e).split("'")[1] for e in refused) == ["cpp.march", "trace.debug_dir"]
    assert stored_options.within_domain(["not", "a", "dict"], entries)[0] == {}
