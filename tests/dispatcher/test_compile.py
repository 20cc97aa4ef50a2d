"""torch.compile runs the dispatcher's choice: no graph break, the chosen kernel traced into the
graph (not PyTorch's SDPA when the dispatcher chose another kernel), symbolic shapes decided at run
time, and the same results as eager calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher, patched
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

pytestmark = [pytest.mark.usefixtures("fresh_dynamo"), pytest.mark.filterwarnings("ignore::UserWarning")]


class GraphCatcher:
    """A torch.compile backend keeping the ATen graphs AOTAutograd traced (forward)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph_module, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        def keep(gm, inputs):
            self.graphs.append(gm)
            return gm.forward

        return aot_autograd(fw_compiler=keep)(graph_module, example_inputs)

    def targets(self) -> set[str]:
        return {str(node.target) for gm in self.graphs for node in gm.graph.nodes if node.op == "call_function"}


def test_a_dispatcher_limited_to_chunked_traces_chunked_not_sdpa(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]"]))
    ours = Dispatcher(kernels=["chunked[q=128,kv=1024]"])
    inputs = qkv(q_len=12, kv_len=40)
    catcher = GraphCatcher()
    compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, is_causal=True, enable_gqa=True),
                             backend=catcher, fullgraph=True)
    out = compiled(inputs["query"], inputs["key"], inputs["value"])
    assert_matches_reference(out, {**inputs, "is_causal": True})
    targets = catcher.targets()
    assert not any("scaled_dot_product" in target for target in targets), targets
    assert any("mm" in target for target in targets), targets  # the chunked kernel's own matmuls
    assert ours.stats() == {"chunked[q=128,kv=1024] (traced)": 1}


def test_sdpa_default_traces_what_compiled_sdpa_traces(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["sdpa_default"]))
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(q_len=12, kv_len=40)
    ours_catcher, sdpa_catcher = GraphCatcher(), GraphCatcher()
    torch.compile(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), backend=ours_catcher, fullgraph=True)(
        inputs["query"], inputs["key"], inputs["value"])
    torch._dynamo.reset()
    torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), backend=sdpa_catcher,
                  fullgraph=True)(inputs["query"], inputs["key"], inputs["value"])
    assert ours_catcher.targets() == sdpa_catcher.targets()


def test_symbolic_shapes_decide_at_run_time_without_recompiling(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]", "math"]))
    ours = Dispatcher(kernels=["math", "chunked[q=128,kv=1024]"])
    compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), dynamic=True, fullgraph=True)
    for kv_len in (17, 40, 300):
        inputs = qkv(q_len=3, kv_len=kv_len)
        assert_matches_reference(compiled(inputs["query"], inputs["key"], inputs["value"]), inputs)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert ours.stats() == {"chunked[q=128,kv=1024]": 3}  # counted per call: decided per call at run time


def test_training_under_compile_stays_pytorchs_sdpa():
    ours = Dispatcher(kernels=["math", "sdpa_default"])
    inputs = qkv()
    query = inputs["query"].clone().requires_grad_()
    compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), fullgraph=True)
    compiled(query, inputs["key"], inputs["value"]).sum().backward()
    expected = query.detach().clone().requires_grad_()
    F.scaled_dot_product_attention(expected, inputs["key"], inputs["value"], enable_gqa=True).sum().backward()
    torch.testing.assert_close(query.grad, expected.grad)


class Attention(torch.nn.Module):
    """A tiny self-attention block calling `F.scaled_dot_product_attention` by name at call time
    (as transformers and diffusers do): ``x [B, L, 16] -> [B, 2, L, 8]``, causal."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_a_patched_module_compiles_whole_and_matches_eager(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]"]))
    ours = Dispatcher(kernels=["chunked[q=128,kv=1024]", "math"])

    torch.manual_seed(0)
    module, x = Attention(), torch.randn(2, 24, 16)
    with torch.no_grad(), patched(ours):
        eager = module(x)
        compiled = torch.compile(module, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert ours.stats().get("chunked[q=128,kv=1024] (traced)") == 1


class CausalGqaAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _export_through_chunked(monkeypatch, **export_options) -> tuple[set[str], torch.nn.Module]:
    """`CausalGqaAttention` exported through a dispatcher limited to chunked -> (the exported graph's
    call targets, the exported module)."""
    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]"]))
    inputs = qkv(q_len=12, kv_len=12)
    with patched(Dispatcher(kernels=["chunked[q=128,kv=1024]"])):
        exported = torch.export.export(CausalGqaAttention(), (inputs["query"], inputs["key"], inputs["value"]),
                                       **export_options)
    return {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}, exported.module()


@pytest.mark.parametrize("strict", [False, True])
def test_an_exported_program_holds_the_chosen_kernel_not_the_dispatcher(monkeypatch, strict):
    """torch.export traces the kernel the dispatcher chose (an exported program must run in a
    process without this dispatcher)."""
    targets, module = _export_through_chunked(monkeypatch, strict=strict)
    assert not any("attn_dispatch" in target or "scaled_dot_product" in target for target in targets), targets
    inputs = qkv(q_len=12, kv_len=12)
    assert_matches_reference(module(inputs["query"], inputs["key"], inputs["value"]), {**inputs, "is_causal": True})


def test_an_exported_program_with_symbolic_lengths_holds_pytorchs_sdpa(monkeypatch):
    """Exported with a dynamic length, no decision can be traced, and the program must run where
    no dispatcher of this process exists: PyTorch's SDPA, not the run-time operator."""
    length = torch.export.Dim("length", min=2, max=64)
    targets, module = _export_through_chunked(monkeypatch, dynamic_shapes=({2: length}, {2: length}, {2: length}))
    assert not any("attn_dispatch" in target for target in targets), targets
    assert any("scaled_dot_product" in target for target in targets), targets
    longer = qkv(q_len=20, kv_len=20)
    assert_matches_reference(module(longer["query"], longer["key"], longer["value"]), {**longer, "is_causal": True})
