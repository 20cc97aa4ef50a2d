"""`install` / `uninstall` / `patched()` route F.scaled_dot_product_attention through the
dispatcher and restore the very same original object, nested, after errors, across threads."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import Dispatcher, install, is_installed, patched, uninstall
from attn_dispatch.dispatcher.cold_path import TRAINING_COUNT
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

ORIGINAL = F.scaled_dot_product_attention


def test_install_uninstall_restores_the_original_object():
    install()
    assert F.scaled_dot_product_attention is not ORIGINAL and is_installed()
    inputs = qkv()
    assert_matches_reference(F.scaled_dot_product_attention(**inputs), inputs)
    assert sum(dispatcher.stats().values()) == 1
    uninstall()
    assert F.scaled_dot_product_attention is ORIGINAL and not is_installed()


def test_uninstall_without_install_raises():
    with pytest.raises(RuntimeError, match="install"):
        uninstall()
    assert F.scaled_dot_product_attention is ORIGINAL


def test_patched_restores_after_an_exception():
    with pytest.raises(ValueError, match="boom"):
        with patched():
            assert F.scaled_dot_product_attention is not ORIGINAL
            raise ValueError("boom")
    assert F.scaled_dot_product_attention is ORIGINAL


def test_nesting_with_different_dispatchers():
    inner = Dispatcher(kernels="portable")
    with patched() as outer:
        with patched(inner):
            F.scaled_dot_product_attention(**qkv())
            with patched():
                F.scaled_dot_product_attention(**qkv())
            F.scaled_dot_product_attention(**qkv())
        assert F.scaled_dot_product_attention is not ORIGINAL
        F.scaled_dot_product_attention(**qkv())
    assert F.scaled_dot_product_attention is ORIGINAL
    assert sum(inner.stats().values()) == 2 and sum(outer.stats().values()) == 2


def test_out_of_order_uninstall_by_token():
    first, second = install(), install(Dispatcher())
    uninstall(first)
    assert is_installed()
    with pytest.raises(RuntimeError, match="token"):
        uninstall(first)
    uninstall(second)
    assert F.scaled_dot_product_attention is ORIGINAL


def test_threads_installing_and_calling_concurrently():
    inputs = qkv()
    expected = ORIGINAL(**inputs)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker() -> None:
        try:
            start.wait()
            for _ in range(20):
                with patched():
                    torch.testing.assert_close(F.scaled_dot_product_attention(**inputs), expected)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert F.scaled_dot_product_attention is ORIGINAL
    assert sum(dispatcher.stats().values()) == 80


def test_training_goes_to_pytorch_sdpa_with_matching_grads(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))  # math has no backward
    inputs = qkv()
    ours = {name: t.clone().requires_grad_(True) for name, t in inputs.items() if name != "enable_gqa"}
    theirs = {name: t.detach().clone().requires_grad_(True) for name, t in ours.items()}
    grad_out = torch.randn(1, 4, 8, 16)
    with patched(Dispatcher(kernels=["math"])) as active:  # no kernel with a backward
        F.scaled_dot_product_attention(**ours, enable_gqa=True).backward(grad_out)
        assert active.stats() == {TRAINING_COUNT: 1}
        assert active.explain(**ours, enable_gqa=True).route == "training"
    ORIGINAL(**theirs, enable_gqa=True).backward(grad_out)
    for name in ours:
        torch.testing.assert_close(ours[name].grad, theirs[name].grad)


def test_dropout_goes_to_pytorch_sdpa():
    inputs = qkv()
    torch.manual_seed(0)
    ours = dispatcher.attention(**inputs, dropout_p=0.5)
    torch.manual_seed(0)
    theirs = ORIGINAL(**inputs, dropout_p=0.5)
    torch.testing.assert_close(ours, theirs)
    assert dispatcher.stats() == {TRAINING_COUNT: 1}
    with pytest.raises(RuntimeError, match="dropout"):
        dispatcher.attention(**inputs, dropout_p=1.5)


def test_backward_capable_kernel_trains_through_the_dispatcher():
    inputs = qkv(heads=2, kv_heads=2)
    query = inputs["query"].clone().requires_grad_(True)
    ours = Dispatcher(kernels=["sdpa_math"])
    out = ours.attention(query, inputs["key"], inputs["value"])
    out.sum().backward()
    reference = inputs["query"].clone().requires_grad_(True)
    ORIGINAL(reference, inputs["key"], inputs["value"]).sum().backward()
    torch.testing.assert_close(query.grad, reference.grad)
    assert ours.stats() == {"sdpa_math": 1}


def test_torch_compile_under_patched_traces_pytorch_sdpa():
    inputs = qkv()

    def attend(query, key, value):
        return F.scaled_dot_product_attention(query, key, value, enable_gqa=True)

    compiled = torch.compile(attend, backend="eager", fullgraph=True)
    with patched():
        out = compiled(inputs["query"], inputs["key"], inputs["value"])
    assert_matches_reference(out, inputs)


def test_torchscript_under_patched_compiles_pytorch_sdpa_and_leaves_no_trace():
    """`torch.jit.script` cannot compile the dispatcher: under `patched()` it compiles the patched name as PyTorch's
    own operator (as unpatched), nested installs included, and after the last uninstall nothing of ours is left in
    TorchScript's builtin table (a failed compile would break every later script of the module)."""
    import torch.jit._builtins as script_builtins

    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(embed_dim=8, num_heads=2).eval()
    x = torch.randn(5, 1, 8)
    expected = attention(x, x, x)[0]
    with patched():
        scripted = torch.jit.script(attention)
        with patched(Dispatcher()):
            encoder = torch.jit.script(torch.nn.TransformerEncoderLayer(8, 2).eval())
            inner = F.scaled_dot_product_attention
        outer = F.scaled_dot_product_attention
    torch.testing.assert_close(scripted(x, x, x)[0], expected)
    assert encoder(x).shape == x.shape
    table = script_builtins._get_builtin_table()
    assert id(inner) not in table and id(outer) not in table and F.scaled_dot_product_attention is ORIGINAL
    torch.jit.script(torch.nn.MultiheadAttention(embed_dim=8, num_heads=2))


def test_what_patching_reaches_and_what_it_cannot():
    """The documented limit (patching module docstring, docs/USAGE.md): a name bound before patching and
    the C++ binding go to PyTorch's SDPA and are not counted; `F.scaled_dot_product_attention` is."""
    from torch.nn.functional import scaled_dot_product_attention as bound_before

    inputs = qkv(heads=2, kv_heads=2)
    with patched(Dispatcher(kernels=["math"])) as ours:
        for call in (F.scaled_dot_product_attention, bound_before, torch._C._nn.scaled_dot_product_attention):
            assert_matches_reference(call(**inputs), inputs)
        assert ours.stats() == {"math": 1}
    assert F.scaled_dot_product_attention is bound_before
