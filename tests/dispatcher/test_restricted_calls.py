"""Under the caller's `sdpa_kernel` restriction, `explain` names the restriction and the backend
PyTorch runs, and a call over the memory budget warns once, naming the budget and the bytes
(`dispatcher.sdpa_context`)."""

from __future__ import annotations

import logging

import pytest
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_dispatch.dispatcher import Dispatcher, sdpa_context
from tests.dispatcher.helpers import assert_matches_reference, qkv

BUDGET = 64 * 2**20


def _training_inputs():
    inputs = qkv(heads=4, kv_heads=4, q_len=1024, kv_len=1024, dim=16)
    inputs["query"].requires_grad_()
    return inputs


def test_explain_names_the_restriction_and_the_backend_that_runs():
    ours = Dispatcher(memory_budget=BUDGET)
    inputs = _training_inputs()
    assert ours.explain(**inputs, is_causal=True).kernel != "sdpa_math"  # unrestricted: the dispatcher's choice
    with sdpa_kernel([SDPBackend.MATH]):
        decision = ours.explain(**inputs, is_causal=True)
    assert decision.kernel == "sdpa_math"
    assert decision.source.level == sdpa_context.RESTRICTED_LEVEL
    assert "math on" in decision.source.description and "flash" in decision.source.description
    needed = decision.candidates[0].workspace_bytes
    assert needed > BUDGET
    assert any("over the memory budget" in note and str(needed) in note and str(BUDGET) in note
               for note in decision.notes)


def test_a_restricted_call_over_the_budget_warns_once_with_the_budget_and_the_bytes(caplog):
    ours = Dispatcher(memory_budget=BUDGET)
    inputs = _training_inputs()
    sdpa_context._checked.clear()
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"), sdpa_kernel([SDPBackend.MATH]):
        for _ in range(3):
            out = ours.attention(**inputs, is_causal=True)
    assert_matches_reference(out.detach(), {**inputs, "query": inputs["query"].detach(), "is_causal": True})
    warned = [r.getMessage() for r in caplog.records if "over the memory budget" in r.getMessage()]
    assert len(warned) == 1
    assert str(BUDGET) in warned[0] and "sdpa_math" in warned[0] and "sdpa_kernel restriction" in warned[0]


def test_no_warning_within_the_budget_or_without_one(caplog):
    small = qkv(q_len=8, kv_len=8)
    sdpa_context._checked.clear()
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"), sdpa_kernel([SDPBackend.MATH]):
        Dispatcher(memory_budget=BUDGET).attention(**small)
        Dispatcher().attention(**_training_inputs(), is_causal=True)
    assert not [r for r in caplog.records if "over the memory budget" in r.getMessage()]


def test_bad_inputs_under_a_restriction_still_get_pytorchs_error():
    inputs = qkv(heads=4, kv_heads=4)
    query, bad_key, value = inputs["query"], inputs["key"][..., :3], inputs["value"]
    with sdpa_kernel([SDPBackend.MATH]):
        with pytest.raises(RuntimeError) as ours:
            Dispatcher(memory_budget=BUDGET).attention(query, bad_key, value)
        with pytest.raises(RuntimeError) as theirs:
            F.scaled_dot_product_attention(query, bad_key, value)
    assert str(ours.value) == str(theirs.value)
