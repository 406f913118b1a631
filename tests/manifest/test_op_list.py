"""The list of ATen operators a stored FX graph may call (precompile.manifest.op_list): the committed file is what
its generator makes on torch 2.13, every denial rule holds on it, and the operators the security probe of issue 39
named (``_sparse_coo_tensor_unsafe``, ``_reshape_alias``, ``_nested_view_from_buffer``...) are refused by
``graph_from_json``, by the tensor methods and Python bindings a graph may name, and by the guard when something
reaches them from inside a Python function.
"""

from __future__ import annotations

import pytest
import torch

from precompile.manifest import graph_allow, op_list
from precompile.manifest.graph_json import graph_from_json
from precompile.manifest.op_guard import OpGuard, OpRefusedError
from precompile.errors import ArtifactFormatError

#: What the issue names, each refused.
PROBED = ["aten::_sparse_coo_tensor_unsafe", "aten::_sparse_csr_tensor_unsafe", "aten::_sparse_compressed_tensor_unsafe",
          "aten::_reshape_alias", "aten::_nested_view_from_buffer", "aten::sparse_coo_tensor", "aten::set_",
          "aten::resize_", "aten::resize_as_", "aten::from_file", "aten::_mkldnn_reshape", "aten::_indices",
          "aten::_values", "aten::_unsafe_index", "aten::_index_put_impl_", "aten::max_pool2d_with_indices_backward",
          "aten::_efficient_attention_forward", "aten::_flash_attention_forward", "aten::embedding_bag"]


def _registered_packets() -> list[str]:
    return sorted({n.partition(".")[0] for n in torch._C._dispatch_get_all_op_names()
                   if n.startswith(("aten::", "prims::"))})


@pytest.mark.skipif(not torch.__version__.startswith(op_list.GENERATED_ON + "."),
                    reason=f"the committed list is generated on torch {op_list.GENERATED_ON}")
def test_the_committed_list_is_the_generators_output():
    committed = sorted(op_list.admitted())
    generated = op_list.generate()
    assert committed == generated, (
        f"precompile/manifest/aten_allowed.txt is stale: added {sorted(set(generated) - set(committed))[:20]}, "
        f"removed {sorted(set(committed) - set(generated))[:20]}; run python -m precompile.manifest.op_list --write "
        "and review the diff")
    text = op_list.DATA_FILE.read_text()
    assert [line for line in text.splitlines() if not line.startswith("#")] == committed  # sorted, nothing else


def test_every_denial_rule_holds_on_the_committed_list():
    names = op_list.admitted()
    assert len(names) > 500 and all(n.startswith(("aten::", "prims::")) for n in names)
    assert not [n for n in names if op_list.denial(n)]
    for name in op_list.DATA_FILE.read_text().split():  # the file itself, before admitted() filters it
        if not name.startswith("#") and "::" in name:
            assert op_list.denial(name) is None, name
            assert "unsafe" not in name or name in op_list.SAFE_UNSAFE, name
            assert not any(p in name for p in ("sparse", "nested", "_reshape_alias", "resize", "mkldnn")), name
    for name in PROBED:
        assert name not in names and op_list.denial(name), name
    # the operators a graph of a real model runs are on it (tests/manifest/test_model_graphs.py: all of them)
    for name in ("aten::mm", "aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::embedding",
                 "aten::native_layer_norm", "aten::_unsafe_view", "aten::index_copy_", "aten::convolution"):
        assert name in names, name


def test_a_denial_rule_refuses_a_name_edited_into_the_file(tmp_path, monkeypatch):
    """The rules apply again when the file is read: a hand edit cannot admit what they refuse."""
    edited = tmp_path / "aten_allowed.txt"
    edited.write_text(op_list.DATA_FILE.read_text() + "aten::_sparse_coo_tensor_unsafe\naten::_reshape_alias\n")
    monkeypatch.setattr(op_list, "DATA_FILE", edited)
    op_list.admitted.cache_clear()
    try:
        assert "aten::_reshape_alias" not in op_list.admitted() and "aten::mm" in op_list.admitted()
        edited.write_text("aten::mm\nos.system\n")
        op_list.admitted.cache_clear()
        with pytest.raises(RuntimeError, match="not an aten:: or prims:: operator name"):
            op_list.admitted()
    finally:
        op_list.admitted.cache_clear()


def test_every_precondition_names_arguments_its_operators_have():
    """A precondition reads arguments by name: a renamed argument would switch it off silently."""
    wanted = {"_batch_norm": {"input"}, "_fft_dims": {"self", "dim"}, "_aa_scales": {"output_size"}}
    for name, check in op_list.PRECONDITIONS.items():
        packet = op_list._packet(name)
        assert packet is not None and name in op_list.admitted(), name
        for overload in packet.overloads():
            args = {a.name for a in getattr(packet, overload)._schema.arguments}
            assert wanted[check.__name__] <= args, (name, overload)


def _node_graph(target):
    return {"schema": 1, "submodules": {}, "nodes": [
        {"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {}},
        {"name": "a", "op": "call_function", "target": target, "args": [{"$node": 0}], "kwargs": {}},
        {"name": "output", "op": "output", "target": "output", "args": [{"$node": 1}], "kwargs": {}}]}


@pytest.mark.parametrize("name", PROBED)
def test_the_probed_operators_are_refused_at_decoding(name):
    overload = torch._C._jit_get_operation(name)[1][0] or "default"
    for target in ({"op": f"{name}.{overload}"}, {"oppacket": name}):
        with pytest.raises(ArtifactFormatError, match="which a stored graph may not call") as err:
            graph_from_json(_node_graph(target))
        assert name in str(err.value) and "node 1 ('a'" in str(err.value)


def test_bindings_and_methods_follow_the_list():
    table = graph_allow.functions()
    for binding in ("torch:_sparse_coo_tensor_unsafe", "torch:sparse_coo_tensor", "torch:_reshape_alias",
                    "torch:_nested_view_from_buffer", "torch:_index_put_impl_", "torch:embedding_bag"):
        assert binding not in table, binding
        with pytest.raises(ArtifactFormatError, match="which a stored graph may not call"):
            graph_from_json(_node_graph({"fn": binding}))
    assert {"torch:mm", "torch:cat", "torch._C._nn:linear", "torch._C._nn:scaled_dot_product_attention"} <= set(table)
    for method in ("to_sparse", "indices", "values", "sparse_resize_", "random_", "to_mkldnn"):
        assert method not in graph_allow.METHODS, method
    assert {"view", "reshape", "numel", "dim", "contiguous", "to", "float", "requires_grad_"} <= graph_allow.METHODS


def test_the_guard_refuses_what_a_python_function_reaches_and_runs_the_rest():
    x = torch.randn(2, 4)
    with OpGuard():
        y = torch.nn.functional.linear(torch.nn.functional.layer_norm(x, (4,)), torch.randn(3, 4)).relu()
        torch.nn.functional.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])
    assert y.shape == (2, 3)
    i = torch.tensor([[2 ** 40]])
    with OpGuard(), pytest.raises(OpRefusedError, match="_sparse_coo_tensor_with_dims_and_tensors"):
        torch.sparse_coo_tensor(i, torch.ones(1), (4,))  # check_invariants is off by default: it goes unchecked
    with OpGuard(), pytest.raises(OpRefusedError, match="_reshape_alias"):
        torch.ops.aten._reshape_alias(x, [100], [1])
    with OpGuard(), pytest.raises(OpRefusedError, match="tensor argument self is None"):
        torch.ops.aten.copy(None, x)  # an undefined tensor: the kernel would dereference it
    with OpGuard(), pytest.raises(OpRefusedError, match="without running statistics"):
        torch.ops.aten.native_batch_norm(x, None, None, None, None, False, 0.1, 1e-5)
    with OpGuard(), pytest.raises(OpRefusedError, match="one element per channel"):
        torch.ops.aten.native_batch_norm(x, torch.ones(1), None, torch.zeros(4), torch.ones(4), False, 0.1, 1e-5)
    with OpGuard(), pytest.raises(OpRefusedError, match="FFT dimensions"):
        torch.ops.aten._fft_c2c(x.to(torch.complex64), [5], 1, True)
    image = torch.randn(1, 3, 4, 6)
    with OpGuard(), pytest.raises(OpRefusedError, match="scales_h 1e\\+308 does not give its output size"):
        torch.ops.aten._upsample_bicubic2d_aa(image, [63, 63], False, 1e308, 0.5)
    with OpGuard():  # what interpolate passes: a scale with the size it gives
        y = torch.nn.functional.interpolate(image, scale_factor=1.5, mode="bilinear", antialias=True)
    assert y.shape == (1, 3, 6, 9)


def test_the_guard_runs_a_higher_order_operators_subgraphs_under_itself():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return torch.cond(x.sum() > 0, lambda y: y.sin(), lambda y: torch.ops.aten._reshape_alias(y, [3], [1]).clone(), (x,))

    gm = make_fx(f)(torch.ones(3))
    with OpGuard():
        assert torch.equal(gm(torch.ones(3)), torch.ones(3).sin())
    with OpGuard(), pytest.raises(OpRefusedError, match="_reshape_alias"):
        gm(-torch.ones(3))
    from torch.nn.attention.flex_attention import flex_attention  # its score_mod runs under vmap

    q = torch.randn(1, 2, 8, 4)
    gm = make_fx(lambda q: flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s + (i - j)))(q)
    with OpGuard():
        got = gm(q)
    torch.testing.assert_close(got, gm(q), rtol=0, atol=0)
