"""Library calls recorded at build and replayed beside a load (precompile.inductor.load.prime): the build records
each distinct matmul of the graph, a load replays them in a thread the first call waits for, outputs stay the
fresh compile's, and what a manifest asks to replay is bounded."""

from __future__ import annotations

import _graphs
import pytest
import torch

import precompile
from precompile.errors import ConfigError
from precompile.inductor.load import prime


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """An MLP (two Linear layers: extern addmm calls) compiled under no_grad: (url, key, inputs, outputs)."""
    url = "file://" + str(tmp_path_factory.mktemp("prime") / "cache")
    gm, inputs = _graphs.dynamo_graph(_graphs.mlp(), _graphs.example())
    with torch.no_grad():
        art = precompile.standalone_compile(gm, inputs, cache=url)
        want = art(*inputs)
    return url, art.key, inputs, want


def _same(got, want) -> bool:
    return len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))


def test_the_build_records_each_distinct_library_call_with_its_shapes(stored):
    url, key, inputs, _ = stored
    calls = precompile.load(key, cache=url).manifest.parts["fast"]["prime"]
    assert {c["op"] for c in calls} == {"addmm"} and len(calls) == 2  # two layers, two shapes
    batch, d, h = _graphs.BATCH, _graphs.D, _graphs.H
    shapes = sorted(tuple(tuple(a["t"]) for a in c["args"] if isinstance(a, dict) and "t" in a) for c in calls)
    assert shapes == sorted([((h,), (batch, d), (d, h)), ((d,), (batch, h), (h, d))])
    assert all(c["device"] == "cpu" and c["args"][1]["d"] == "float32" for c in calls)


def test_replayed_beside_the_load_and_outputs_unchanged(stored, monkeypatch):
    url, key, inputs, want = stored
    monkeypatch.setenv("PRECOMPILE_PRIME", "all")  # CPU graphs too
    art = precompile.load(key, cache=url)
    assert art.engine_kind == "fast" and art.primer is not None
    with torch.no_grad():
        got = art(*inputs)  # waits for the primer, then runs
        again = art(*inputs)
    assert (art.primer.done, art.primer.failed) == (2, 0)
    assert art.primer.seconds is not None and art.primer.seconds > 0
    assert _same(got, want) and _same(again, want)


def test_a_cache_read_starts_the_replay_before_the_blobs_are_read(stored, monkeypatch):
    """The replay starts once the manifest is verified, so it runs while the blobs are read and checked and the
    binaries loaded, not after."""
    from precompile.store.cache_io import load_from_cache

    url, key, inputs, want = stored
    monkeypatch.setenv("PRECOMPILE_PRIME", "all")
    art = load_from_cache(key, url)  # the manifest and blobs read: no engine built yet
    assert art.primer is not None and art._engine is None
    art.primer.wait()
    assert (art.primer.done, art.primer.failed) == (2, 0)
    primer = art.primer
    with torch.no_grad():
        assert _same(art(*inputs), want)
    assert art.engine_kind == "fast" and art.primer is primer  # the engine waited on it, and started no other


@pytest.mark.parametrize("setting", [None, "off", "on"])
def test_cpu_graphs_are_not_primed_unless_asked(stored, monkeypatch, setting):
    url, key, inputs, want = stored
    if setting is None:
        monkeypatch.delenv("PRECOMPILE_PRIME", raising=False)  # the default: on, GPU graphs only
    else:
        monkeypatch.setenv("PRECOMPILE_PRIME", setting)  # on: GPU graphs only
    art = precompile.load(key, cache=url)
    assert art.engine_kind == "fast" and art.primer is None
    with torch.no_grad():
        assert _same(art(*inputs), want)


def test_a_bad_setting_is_a_config_error_not_a_slow_load(stored, monkeypatch):
    url, key, _, _ = stored
    monkeypatch.setenv("PRECOMPILE_PRIME", "cublas")
    with pytest.raises(ConfigError, match="PRECOMPILE_PRIME must be off, on or all, got 'cublas'"):
        precompile.load(key, cache=url)


def _conv(padding: int = 0, stride: int = 1, transposed: bool = False) -> dict:
    """A recorded ``aten.convolution`` call on a 1x1x4x4 input and a 1x1x1x1 weight."""
    return {"op": "convolution", "overload": "default", "device": "cpu", "kwargs": {},
            "args": [{"t": [1, 1, 4, 4], "s": [16, 16, 4, 1], "d": "float32"},
                     {"t": [1, 1, 1, 1], "s": [1, 1, 1, 1], "d": "float32"}, None, {"l": [stride, stride]},
                     {"l": [padding, 0]}, {"l": [1, 1]}, transposed, {"l": [0, 0]}, 1]}


def test_recording_skips_what_draws_random_numbers_and_replays_only_bounded_library_calls():
    q = torch.randn(1, 2, 8, 16)
    with torch.no_grad():
        calls = prime.record(lambda x: (torch.mm(x[0, 0], x[0, 0].T), torch.nn.functional.dropout(x, 0.5, True),
                                        torch.relu(x)), [q])
    assert [c["op"] for c in calls] == ["mm"]  # relu and dropout are not library calls
    ok = calls[0]
    huge = {**ok, "args": [{"t": [1 << 20, 1 << 20], "s": [1 << 20, 1], "d": "float32"}, ok["args"][1]]}
    hostile = [
        {**ok, "op": "empty"},  # not a library op
        {**ok, "overload": "default; import os"},
        {**ok, "device": "/tmp/x"},
        {**ok, "args": [{"t": [2] * 9, "s": [1] * 9, "d": "float32"}, ok["args"][1]]},  # too many dims
        {**ok, "args": [{"t": [-1, 8], "s": [8, 1], "d": "float32"}, ok["args"][1]]},
        {**ok, "args": [{"t": [8, 8], "s": [8, 1], "d": "object"}, ok["args"][1]]},
        huge,  # 4 TiB
        {**ok, "args": [{"t": [1 << 31, 1 << 31], "s": [0, 0], "d": "float32"}, ok["args"][1]]},  # 0 strides
        # 16 bytes by their shape, whose storage is 512 GiB
        {**ok, "args": [{"t": [2, 2], "s": [1 << 37, 1], "d": "float32"}, ok["args"][1]]},
        {**ok, "args": [{"t": [1 << 17, 1], "s": [1, 1], "d": "float32"},
                        {"t": [1, 1 << 17], "s": [1 << 17, 1], "d": "float32"}]},  # 1 MiB in, a 64 GiB output
        {"op": "_scaled_dot_product_efficient_attention", "overload": "default", "device": "cpu", "kwargs": {},
         "args": [{"t": [1, 1, 4, 8], "s": [32, 32, 8, 1], "d": "float32"}] * 3 + [None, False, 0.5]},  # dropout
        {"op": "_scaled_dot_product_flash_attention", "overload": "default", "device": "cpu", "kwargs": {},
         "args": [{"t": [1, 1, 1 << 17, 8], "s": [8 << 17, 8 << 17, 8, 1], "d": "float16"}] * 3 + [0.0, False, True]},
        # 6 MiB of inputs whose debug mask would be 32 GiB
        _conv(padding=1 << 40),  # a number past the bounds
        _conv(stride=1 << 20, transposed=True),  # a 1-byte input, a 36 TiB output
        "not a call",
    ]
    checked = prime.check_calls([ok, _conv(padding=1), *hostile])
    assert [c[0] for c in checked] == [torch.ops.aten.mm.default, torch.ops.aten.convolution.default]
    primer = prime.start([ok, _conv(padding=1), *hostile], on_cpu=True)
    primer.wait()
    assert (primer.done, primer.failed) == (2, 0)
    assert prime.start("garbage", on_cpu=True) is None and prime.start([ok], on_cpu=False) is None
