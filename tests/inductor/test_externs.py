"""precompile.inductor.load.externs: each stand-in names an extern kernel this torch's Inductor still has, and
computes the same bits as it on every bias layout Inductor passes."""

from __future__ import annotations

import pytest
import torch

from precompile.inductor.load import externs
from precompile.inductor.load.runtime import resolve


@pytest.mark.parametrize("inductors, ours", sorted(externs.STAND_INS.items()))
def test_stand_ins_name_inductors_extern_and_resolve_without_inductor(inductors, ours):
    original = resolve(inductors)
    assert original.__name__ == resolve(ours).__name__
    assert not ours.startswith("torch._inductor")


@pytest.mark.parametrize("bias", ["broadcast row", "one row", "full"])
def test_bias_addmm_stand_in_matches_inductors(bias):
    from torch._inductor.kernel.mm import bias_addmm

    gen = torch.Generator().manual_seed(0)
    mat1, mat2 = torch.randn(8, 16, generator=gen), torch.randn(16, 4, generator=gen)
    row = torch.randn(4, generator=gen)
    inp = {"broadcast row": row.expand(8, 4), "one row": row[None], "full": torch.randn(8, 4, generator=gen)}[bias]
    want, got = bias_addmm(inp, mat1, mat2, beta=0.5), externs.bias_addmm(inp, mat1, mat2, beta=0.5)
    assert torch.equal(got, want)
    out = torch.empty(8, 4)
    externs.bias_addmm(inp, mat1, mat2, out=out)
    assert torch.equal(out, bias_addmm(inp, mat1, mat2))


def test_the_fast_plan_resolves_inductors_bias_addmm_to_the_stand_in():
    import torch._inductor.kernel.mm  # noqa: F401 - defines Inductor's extern kernel choices

    from precompile.inductor import shim
    from precompile.inductor.build import fast_plan

    assert fast_plan.extern_ref(shim.extern_kernel("bias_addmm")) == "precompile.inductor.load.externs:bias_addmm"
    assert fast_plan.extern_ref(shim.extern_kernel("mm")) == "torch:mm"  # torch's own ops stay as they are
