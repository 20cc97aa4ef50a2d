"""A model compiled with the dispatcher compiles like the same model with PyTorch's SDPA: inside
transformers' static-cache decoding step, as many graphs, no graph break, no recompile, the same
attention op and no extra copies; guards on nothing of the dispatcher's but its identity; and a
warm compile cache never replays a graph traced with another kernel."""

from __future__ import annotations

import collections
import types

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.kernels import sdpa_default
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("fresh_dynamo"),
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")]

DECODE_STEPS = 5
"""New tokens per generation: the prefill runs eagerly, every later token through the compiled step."""
GENERATIONS = 2
"""`generate()` calls per model (the e2e bench's cold and warm runs): the second compiles nothing."""
COPY_OPS = {"aten.clone.default", "aten.copy.default", "aten.copy_.default", "aten._to_copy.default",
            "aten.expand.default", "aten.contiguous.default"}
DEAD_ROW_REPAIR_OPS = {"aten.any.dim", "aten.where.self", "aten.scalar_tensor.default",  # a bool mask's
                       "aten.eq.Scalar", "aten.all.dim", "aten.masked_fill.Scalar", "aten.masked_fill_.Scalar"}
"""`sdpa_default`'s zeroing of rows a mask blocks entirely, traced where PyTorch's SDPA is not known
to zero them itself (GPUs: `kernels.sdpa_default.default_zeroes_dead_rows`)."""


class GraphCatcher:
    """A torch.compile backend keeping Dynamo's graphs and the ATen graphs AOTAutograd traced
    (forward). transformers deep-copies its compile config: copies share the lists."""

    def __init__(self) -> None:
        self.dynamo_graphs: list[torch.fx.GraphModule] = []
        self.aten_graphs: list[torch.fx.GraphModule] = []

    def __deepcopy__(self, memo):
        return self

    def __call__(self, graph_module, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        self.dynamo_graphs.append(graph_module)

        def keep(gm, inputs):
            self.aten_graphs.append(gm)
            return gm.forward

        return aot_autograd(fw_compiler=keep)(graph_module, example_inputs)

    def ops(self) -> collections.Counter:
        return collections.Counter(str(node.target) for gm in self.aten_graphs for node in gm.graph.nodes
                                   if node.op == "call_function")


def _generate_compiled(implementation: str) -> tuple[list[int], GraphCatcher, dict]:
    """Greedy generation by a tiny GQA Llama (2 layers, 4/2 heads, D 32, fp32) with transformers'
    static cache and its compiled decoding step (as `generate` compiles it on CUDA, with a catching
    backend), `GENERATIONS` times -> (new tokens of each, the graphs, Dynamo's counters)."""
    from transformers.generation.configuration_utils import CompileConfig

    config = transformers.LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      intermediate_size=256, vocab_size=256, num_hidden_layers=2,
                                      max_position_embeddings=64)
    config._attn_implementation = implementation
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    catcher = GraphCatcher()
    compile_config = CompileConfig(backend=catcher, mode=None)
    compile_config._compile_all_devices = True  # compile on the CPU as on CUDA
    prompt = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    tokens = []
    with torch.no_grad():
        for _ in range(GENERATIONS):
            out = model.generate(prompt, max_new_tokens=DECODE_STEPS, min_new_tokens=DECODE_STEPS, do_sample=False,
                                 pad_token_id=0, eos_token_id=None, cache_implementation="static",
                                 compile_config=compile_config)
            tokens.append(out[0, prompt.shape[1]:].tolist())
    counters = {name: dict(values) for name, values in torch._dynamo.utils.counters.items()}
    return tokens, catcher, counters


@pytest.mark.slow
@pytest.mark.parametrize("pytorch_zeroes_dead_rows", [True, False], ids=["cpu", "gpu-repair"])
def test_static_cache_decoding_compiles_like_sdpa(monkeypatch, pytorch_zeroes_dead_rows):
    from attn_dispatch.dispatcher.hf import register_transformers

    if not pytorch_zeroes_dead_rows:  # the path a GPU takes, traced on the CPU
        monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda *args: False)
    use_ranking(monkeypatch, FixedRanker(["sdpa_default"]))
    ours = Dispatcher(kernels=["sdpa_default"])
    name = register_transformers("attn_dispatch_compile_test", dispatcher=ours)
    # our transformers function calling F.scaled_dot_product_attention itself: the dispatcher's graph, less the dispatcher
    plain = register_transformers("attn_dispatch_compile_test_plain",
                                  dispatcher=types.SimpleNamespace(attention=F.scaled_dot_product_attention))
    sdpa_tokens, sdpa_graphs, sdpa_counters = _generate_compiled("sdpa")
    our_tokens, our_graphs, our_counters = _generate_compiled(name)
    _, plain_graphs, _ = _generate_compiled(plain)

    assert our_tokens == sdpa_tokens and our_tokens[0] == our_tokens[-1]
    assert len(our_graphs.dynamo_graphs) == len(sdpa_graphs.dynamo_graphs) == 1  # one graph for every decode step
    assert len(our_graphs.aten_graphs) == len(sdpa_graphs.aten_graphs) == 1
    for counters in (our_counters, sdpa_counters):
        assert not counters.get("graph_break") and not counters.get("recompiles"), counters
    assert our_counters["stats"]["unique_graphs"] == sdpa_counters["stats"]["unique_graphs"] == 1
    # one exact decode shape, counted once though Dynamo (fake tensors) and AOTAutograd (functional ones) both trace it
    assert ours.stats()["sdpa_default (traced)"] == 1

    ours_ops, sdpa_ops = our_graphs.ops(), sdpa_graphs.ops()
    attention = {op for op in sdpa_ops if "scaled_dot_product" in op}
    assert attention and {op: ours_ops[op] for op in attention} == {op: sdpa_ops[op] for op in attention}
    added = set(ours_ops) - set(sdpa_ops)
    assert added <= (set() if pytorch_zeroes_dead_rows else DEAD_ROW_REPAIR_OPS), added
    # the same graph as F.scaled_dot_product_attention through the same function, op for op (plus the repair)
    repair = ours_ops - plain_graphs.ops()  # what our graph has beyond F.scaled_dot_product_attention's
    assert set(repair) <= DEAD_ROW_REPAIR_OPS and not plain_graphs.ops() - ours_ops, repair
    assert bool(repair) is not pytorch_zeroes_dead_rows
    # GQA without repeating K/V: fewer copies than transformers' SDPA path (repeat_kv), never more
    assert sum(ours_ops[op] for op in COPY_OPS) < sum(sdpa_ops[op] for op in COPY_OPS)


def _guard_names(fn, *args) -> set[str]:
    return {guard.name for guard in torch._dynamo.explain(fn)(*args).out_guards}


def test_guards_name_the_dispatcher_not_its_state():
    """Beyond what compiling F.scaled_dot_product_attention guards, only module-level names, the
    dispatcher's type and `compile_id`, and `Dispatcher.attention`'s defaults: nothing on its plans,
    counts or caches (which change on every call and would recompile)."""
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(q_len=3, kv_len=20)
    args = (inputs["query"], inputs["key"], inputs["value"])
    sdpa_guards = _guard_names(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), *args)
    torch._dynamo.reset()
    our_guards = _guard_names(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), *args)
    on_the_dispatcher = {name for name in our_guards - sdpa_guards if "['ours']" in name}
    methods = "dict(type(L['ours']).__dict__)['attention'].__"  # the method's default arguments
    assert on_the_dispatcher, our_guards  # the check below sees the dispatcher's guards
    assert {name for name in on_the_dispatcher if not name.startswith(methods)} == {"L['ours']",
                                                                                     "L['ours'].compile_id"}


@pytest.mark.slow
def test_a_warm_compile_cache_traces_the_current_decision(monkeypatch, tmp_path):
    """The same dispatcher (same id in the graph) deciding otherwise after a reset: the second
    compile, with AOTAutograd's and Inductor's caches warm, runs the new kernel, not the graph
    cached for the old one."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    inputs = qkv(q_len=12, kv_len=40)
    ours = Dispatcher(kernels=["chunked[q=128,kv=1024]", "sdpa_default"])

    def profiled_ops(order: list[str]) -> set[str]:
        use_ranking(monkeypatch, FixedRanker(order))
        ours.reset()
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, is_causal=True, enable_gqa=True),
                                 fullgraph=True)
        compiled(inputs["query"], inputs["key"], inputs["value"])  # compiles
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            out = compiled(inputs["query"], inputs["key"], inputs["value"])
        assert_matches_reference(out, {**inputs, "is_causal": True})
        return {event.name for event in profile.events()}

    with torch._inductor.config.patch(fx_graph_cache=True):
        chunked_ops = profiled_ops(["chunked[q=128,kv=1024]", "sdpa_default"])
        sdpa_ops = profiled_ops(["sdpa_default", "chunked[q=128,kv=1024]"])
    assert not any("scaled_dot_product" in name for name in chunked_ops), chunked_ops
    assert any("scaled_dot_product" in name for name in sdpa_ops), sdpa_ops
    assert ours.stats() == {"sdpa_default (traced)": 1}
