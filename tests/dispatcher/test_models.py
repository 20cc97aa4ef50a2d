"""Real models, tiny configs, random weights (no download): a transformers GQA decoder with
``attn_implementation="attn_dispatch"`` and under `patched()`, and a diffusers block under
`patched()`, give what PyTorch's SDPA gives - with the default dispatcher and with one that may
only use our own kernels (no PyTorch SDPA backend to hide behind)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, default_dispatcher, patched, register_transformers

transformers = pytest.importorskip("transformers")
TOKENS = torch.tensor([[5, 17, 99, 3, 42, 8, 77, 1, 64, 23, 11]])
NEW_TOKENS = 8
LAYERS = 2
CALLS = LAYERS * (1 + 1 + NEW_TOKENS - 1)  # forward, then generate: prefill and one step per new token
OWN_KERNELS = ["math", "chunked[q=128,kv=1024]", "small_q[splits=8]"]


def _dispatcher(kind: str) -> Dispatcher:
    return default_dispatcher() if kind == "default" else Dispatcher(kernels=OWN_KERNELS)


def _tiny_decoder(attn_implementation: str, *, config_class=None, kv_heads: int = 2):
    config = (config_class or transformers.LlamaConfig)(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=8, num_key_value_heads=kv_heads, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def _run(model, tokens=TOKENS, mask=None):
    mask = mask if mask is not None else torch.ones_like(tokens)
    with torch.no_grad():
        logits = model(tokens, attention_mask=mask).logits
        generated = model.generate(tokens, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    return logits, generated


@pytest.fixture(scope="module")
def sdpa_reference():
    return _run(_tiny_decoder("sdpa"))


@pytest.mark.parametrize("kind", ["default", "own_kernels"])
def test_attn_implementation_attn_dispatch(sdpa_reference, kind):
    ours = _dispatcher(kind)
    register_transformers(dispatcher=None if kind == "default" else ours)
    try:
        logits, generated = _run(_tiny_decoder("attn_dispatch"))
    finally:
        register_transformers()  # back to the default dispatcher
    torch.testing.assert_close(logits, sdpa_reference[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(generated, sdpa_reference[1])
    assert sum(ours.stats().values()) == CALLS


@pytest.mark.parametrize("kind", ["default", "own_kernels"])
def test_sdpa_model_under_patched(sdpa_reference, kind):
    ours = _dispatcher(kind)
    with patched(ours):
        logits, generated = _run(_tiny_decoder("sdpa"))
    torch.testing.assert_close(logits, sdpa_reference[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(generated, sdpa_reference[1])
    assert sum(ours.stats().values()) == CALLS


def test_left_padded_batch_with_qwen2_single_kv_head():
    register_transformers()
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), TOKENS], dim=1).repeat(2, 1)
    mask = torch.ones_like(padded)
    mask[0, :3] = 0  # left padding: a real boolean mask reaches the attention
    ours = _run(_tiny_decoder("attn_dispatch", config_class=transformers.Qwen2Config, kv_heads=1), padded, mask)
    theirs = _run(_tiny_decoder("sdpa", config_class=transformers.Qwen2Config, kv_heads=1), padded, mask)
    keep = mask.bool()
    torch.testing.assert_close(ours[0][keep], theirs[0][keep], rtol=1e-4, atol=1e-4)
    assert torch.equal(ours[1], theirs[1])


@pytest.mark.parametrize("kind", ["default", "own_kernels"])
def test_diffusers_transformer_block_under_patched(kind):
    attention = pytest.importorskip("diffusers.models.attention")
    torch.manual_seed(0)
    block = attention.BasicTransformerBlock(dim=32, num_attention_heads=4, attention_head_dim=8, cross_attention_dim=24).eval()
    hidden = torch.randn(2, 37, 32)  # 37 latent tokens (odd on purpose)
    context = torch.randn(2, 5, 24)
    ours = _dispatcher(kind)
    with torch.no_grad():
        expected = block(hidden, encoder_hidden_states=context)
        with patched(ours):
            out = block(hidden, encoder_hidden_states=context)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert sum(ours.stats().values()) == 2  # self-attention and cross-attention
