"""LoRA fine-tuning through the dispatcher: a tiny transformers decoder (random weights, no
download) with hand-written LoRA adapters on the attention projections, 20 steps of AdamW on a
left-padded batch (a bool mask with fully masked rows reaches the attention). A portable
dispatcher's training route runs `chunked` with its own backward; the loss curve must be the
`sdpa` run's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attn_dispatch.dispatcher import Dispatcher, register_transformers

transformers = pytest.importorskip("transformers")

STEPS = 20
LAYERS = 2
RANK = 4
LEARNING_RATE = 1e-2


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: the tiny matmuls gain nothing from two, and xdist workers share the cores
    (a loaded 2-core machine took 38 s with two threads, 6 s with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class LoRALinear(nn.Module):
    """``base(x) + (alpha / r) * B(A(x))`` with `base` frozen and ``B`` starting at zero."""

    def __init__(self, base: nn.Linear, rank: int = RANK, alpha: float = 2.0 * RANK) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.up.weight)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x)) * self.scaling


def lora_decoder(attn_implementation: str) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    model.requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj = LoRALinear(layer.self_attn.q_proj)
        layer.self_attn.v_proj = LoRALinear(layer.self_attn.v_proj)
    return model.train()


def loss_curve(attn_implementation: str) -> list[float]:
    model = lora_decoder(attn_implementation)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 128, (2, 24), generator=generator)
    mask = torch.ones_like(tokens)
    mask[0, :5] = 0  # left padding
    labels = tokens.masked_fill(mask == 0, -100)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    losses = []
    for _ in range(STEPS):
        loss = model(tokens, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_lora_fine_tuning_through_chunked_matches_sdpa():
    ours = Dispatcher(kernels="portable", memory_budget="64MiB")
    register_transformers(dispatcher=ours)
    try:
        dispatched = loss_curve("attn_dispatch")
    finally:
        register_transformers()  # back to the default dispatcher
    reference = loss_curve("sdpa")
    ran = ours.stats()
    assert sum(ran.values()) == STEPS * LAYERS and all(name.startswith("chunked") for name in ran), ran
    assert reference[-1] < reference[0] - 0.1  # it learns: the comparison is not of flat curves
    torch.testing.assert_close(torch.tensor(dispatched), torch.tensor(reference), rtol=1e-4, atol=1e-5)
