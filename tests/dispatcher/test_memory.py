"""Memory fit: free memory and budgets drop kernels whose workspace does not fit; a chunked
kernel with smaller chunks is built where nothing else fits."""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import (
    Dispatcher,
    NoKernelError,
    core,
    parse_memory_size,
)
from attn_dispatch.dispatcher import (
    device_planner as planner,
)
from attn_dispatch.dispatcher.decision import MAX_MEMORY_BUDGET, format_bytes, free_bytes
from attn_dispatch.dispatcher.patching import install, is_installed, patched
from attn_dispatch.dispatcher.selection import RECHECK_FRACTION, failure_bucket
from attn_dispatch.kernels import ChunkedKernel, MathKernel, Problem, all_kernels
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

MIB = 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16GiB", 16 * 2**30), ("512MiB", 512 * MIB), ("16GB", 16 * 10**9), ("1.5G", int(1.5 * 2**30)),
     ("1048576", 2**20), (" 2 kib ", 2048), (4096, 4096), ("0", 0)],
)
def test_parse_memory_size(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["16 gigs", "-1GiB", "GiB", "", "nan", True, [1], -5])
def test_parse_memory_size_rejects_with_a_clear_message(text):
    with pytest.raises(ValueError, match="memory_budget"):
        parse_memory_size(text)


def test_bad_budget_in_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_MEMORY_BUDGET", "lots")
    with pytest.raises(ValueError, match="ATTN_DISPATCH_MEMORY_BUDGET"):
        dispatcher.attention(**qkv())


def test_free_memory_on_cpu_is_known():
    assert free_bytes(torch.device("cpu")) > 0
    assert format_bytes(3 * MIB // 2) == "1.5 MiB"


@pytest.mark.parametrize(("count", "text"), [
    (None, "unknown"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 2**30, "5.0 GiB"),
    (2**40, "1.0 TiB"), (3 * 2**50, "3072.0 TiB"),
])
def test_format_bytes(count, text):
    assert format_bytes(count) == text


def _prefill(**overrides) -> dict:
    return qkv(batch=1, heads=4, kv_heads=4, q_len=256, kv_len=256, dim=32, **overrides)


def _problem(inputs: dict) -> Problem:
    return Problem.from_tensors(inputs["query"], inputs["key"], inputs["value"], None, False, inputs["enable_gqa"])


def test_budget_below_math_workspace_picks_chunked(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math", "small_q[splits=8]", "chunked[q=128,kv=1024]"]))
    inputs = _prefill()
    problem = _problem(inputs)
    math_bytes = MathKernel().workspace_bytes(problem)
    chunked_bytes = ChunkedKernel(q=128, kv=1024).workspace_bytes(problem)
    assert chunked_bytes < math_bytes
    budget = (math_bytes + chunked_bytes) // 2
    ours = Dispatcher(kernels="portable", memory_budget=budget)
    decision = ours.explain(**inputs)
    assert decision.kernel == "chunked[q=128,kv=1024]"
    assert "budget" in decision.reason_dropped("math") and format_bytes(budget) in decision.reason_dropped("math")
    assert "budget" in str(decision)
    assert_matches_reference(ours.attention(**inputs), inputs)
    assert ours.stats() == {"chunked[q=128,kv=1024]": 1}


def test_budget_from_environment(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math", "chunked[q=128,kv=1024]"]))
    inputs = _prefill()
    math_bytes = MathKernel().workspace_bytes(_problem(inputs))
    monkeypatch.setenv("ATTN_DISPATCH_MEMORY_BUDGET", str(math_bytes - 1))
    ours = Dispatcher(kernels="portable")
    assert ours.memory_budget == math_bytes - 1
    assert ours.explain(**inputs).kernel == "chunked[q=128,kv=1024]"


def test_with_the_real_ranker_a_tight_budget_still_avoids_math():
    inputs = _prefill()
    problem = _problem(inputs)
    budget = MathKernel().workspace_bytes(problem) - 1
    ours = Dispatcher(kernels="portable", memory_budget=budget)
    decision = ours.explain(**inputs)
    workspace = {c.name: c.workspace_bytes for c in decision.candidates}
    assert workspace[decision.kernel] <= budget and "math" not in workspace
    assert_matches_reference(ours.attention(**inputs), inputs)


def test_nothing_fits_builds_smaller_chunks(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))
    inputs = _prefill()
    problem = _problem(inputs)
    kernel_set = ["math", "chunked[q=128,kv=1024]", "small_q[splits=8]"]
    smallest = min(k.workspace_bytes(problem) for k in Dispatcher(kernels=kernel_set).kernels)
    tiny = ChunkedKernel(q=16, kv=32).workspace_bytes(problem)
    ours = Dispatcher(kernels=kernel_set, memory_budget=(smallest + tiny) // 2)
    decision = ours.explain(**inputs)
    assert decision.kernel.startswith("chunked[") and decision.kernel not in {k.name for k in all_kernels()}
    assert any("smaller chunks" in note for note in decision.notes)
    assert_matches_reference(ours.attention(**inputs), inputs)


@pytest.mark.parametrize("budget", [0, "100B", 1024])
def test_budget_below_every_kernel_leads_with_the_cause(budget):
    inputs = _prefill()
    problem = _problem(inputs)
    ours = Dispatcher(kernels="portable", memory_budget=budget)
    with pytest.raises(NoKernelError) as raised:
        ours.attention(**inputs)
    error = raised.value
    first, *rest = str(error).splitlines()
    smallest = min([k.workspace_bytes(problem) for k in ours.kernels if not k.reasons(problem)]
                   + [ChunkedKernel(q=16, kv=16).workspace_bytes(problem)])
    assert first == error.cause
    assert first.startswith(f"no attention kernel fits the memory budget of {format_bytes(parse_memory_size(budget))}")
    assert f"the smallest workspace this problem needs is {format_bytes(smallest)}" in first
    assert "ATTN_DISPATCH_MEMORY_BUDGET" in first
    assert len(rest) == 2 and "q_len=256" in rest[0]
    assert {name for name, _ in error.reasons} == {k.name for k in ours.kernels}


def test_unsupported_problem_leads_with_the_first_reason():
    inputs = _prefill()
    ours = Dispatcher(kernels=["sdpa_cudnn"])
    with pytest.raises(NoKernelError) as raised:
        ours.attention(**inputs)
    first = str(raised.value).splitlines()[0]
    assert first.startswith("no attention kernel in this dispatcher's set can run this problem on cpu")
    assert "sdpa_cudnn: " in first and "pass a kernel set" in first


@pytest.mark.parametrize("value", ["99999999999TiB", "2PiB", "lots", "-1G"])
def test_a_bad_environment_budget_fails_when_the_dispatcher_starts(monkeypatch, value):
    dispatcher.default_dispatcher()  # made before the variable was set: install() still checks it
    monkeypatch.setenv("ATTN_DISPATCH_MEMORY_BUDGET", value)
    for start in (Dispatcher, install, lambda: patched().__enter__()):
        with pytest.raises(ValueError, match=r"ATTN_DISPATCH_MEMORY_BUDGET=.*unset it") as raised:
            start()
        assert "\n" not in str(raised.value)
    assert not is_installed()


def test_an_absurd_budget_is_refused_under_the_named_limit():
    with pytest.raises(ValueError, match="more memory than any machine has"):
        parse_memory_size(MAX_MEMORY_BUDGET + 1)
    assert parse_memory_size(MAX_MEMORY_BUDGET) == MAX_MEMORY_BUDGET


def test_large_workspace_is_rechecked_against_free_memory(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math", "chunked[q=128,kv=1024]"]))
    inputs = _prefill()
    math_bytes = MathKernel().workspace_bytes(_problem(inputs))
    free = {"bytes": int(math_bytes / RECHECK_FRACTION) - 1}  # math is just over the fraction
    monkeypatch.setattr(planner, "free_bytes", lambda device: free["bytes"])
    ours = Dispatcher(kernels="portable")
    ours.attention(**inputs)
    assert ours.stats() == {"math": 1}
    free["bytes"] = math_bytes - 1  # something else took memory between calls
    out = ours.attention(**inputs)
    assert ours.stats() == {"math": 1, "chunked[q=128,kv=1024]": 1}
    assert "free on the device" in ours.explain(**inputs).reason_dropped("math")
    assert_matches_reference(out, inputs)
    assert any("reset" in note for note in ours.explain(**inputs).notes)
    free["bytes"] = 10 * math_bytes  # memory came back: reset() reconsiders the faster kernel
    ours.reset()
    ours.attention(**inputs)
    assert ours.stats() == {"math": 1}


def test_recheck_miss_redoes_only_the_memory_fit(monkeypatch):
    ranker = FixedRanker(["math", "chunked[q=128,kv=1024]", "chunked[q=64,kv=64]"])
    use_ranking(monkeypatch, ranker)
    inputs = _prefill()
    problem = _problem(inputs)
    math_bytes = MathKernel().workspace_bytes(problem)
    free = {"bytes": int(math_bytes / RECHECK_FRACTION) - 1}
    monkeypatch.setattr(planner, "free_bytes", lambda device: free["bytes"])
    validations = {"n": 0}
    from_tensors = Problem.from_tensors

    def counting_from_tensors(*args, **kwargs):
        validations["n"] += 1
        return from_tensors(*args, **kwargs)

    monkeypatch.setattr(core.Problem, "from_tensors", counting_from_tensors)
    ours = Dispatcher(kernels="portable")
    ours.attention(**inputs)
    assert (ranker.calls, validations["n"]) == (1, 1)
    free["bytes"] = math_bytes - 1
    ours.attention(**inputs)
    assert ours.stats() == {"math": 1, "chunked[q=128,kv=1024]": 1}
    assert (ranker.calls, validations["n"]) == (1, 1)  # neither ranked nor validated again
    free["bytes"] = int(math_bytes / RECHECK_FRACTION) - 1  # memory came back: the refit takes math again
    ours.attention(**inputs)
    assert ours.stats() == {"math": 2, "chunked[q=128,kv=1024]": 1} and ranker.calls == 1


def test_recheck_miss_skips_a_kernel_that_failed_in_the_bucket_since(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math", "chunked[q=128,kv=1024]", "chunked[q=64,kv=64]"]))
    inputs = _prefill()
    problem = _problem(inputs)
    math_bytes = MathKernel().workspace_bytes(problem)
    free = {"bytes": int(math_bytes / RECHECK_FRACTION) - 1}
    monkeypatch.setattr(planner, "free_bytes", lambda device: free["bytes"])
    ours = Dispatcher(kernels="portable")
    ours.attention(**inputs)
    # the next option failed on another shape of the bucket after this decision was made
    failures = ours._cold.state(torch.device("cpu")).failures
    failures.setdefault(failure_bucket(problem), {})["chunked[q=128,kv=1024]"] = "RuntimeError: injected"
    free["bytes"] = math_bytes - 1
    ours.attention(**inputs)
    assert ours.stats() == {"math": 1, "chunked[q=64,kv=64]": 1}
    assert "failed at run time" in ours.explain(**inputs).reason_dropped("chunked[q=128,kv=1024]")


def test_shrunk_chunks_under_memory_pressure_are_kept_warm(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))
    inputs = _prefill()
    problem = _problem(inputs)
    free = ChunkedKernel(q=64, kv=64).workspace_bytes(problem) * 2  # math does not fit; small chunks do
    calls = {"n": 0}

    def counting_free(device):
        calls["n"] += 1
        return free

    monkeypatch.setattr(planner, "free_bytes", counting_free)
    ours = Dispatcher(kernels=["math"])
    for _ in range(3):
        assert_matches_reference(ours.attention(**inputs), inputs)
    assert len(ours.stats()) == 1 and next(iter(ours.stats())).startswith("chunked[")
    assert calls["n"] <= 3  # decided once, then only the re-check of free memory: no new decisions


def test_small_workspace_is_not_rechecked(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))
    calls = {"n": 0}

    def counting_free(device):
        calls["n"] += 1
        return 2**40

    monkeypatch.setattr(planner, "free_bytes", counting_free)
    ours = Dispatcher(kernels="portable")
    inputs = qkv()
    for _ in range(5):
        ours.attention(**inputs)
    assert calls["n"] == 1  # measured once, when the decision was made


def test_portable_last_resort_waits_for_a_shrunk_chunked_kernel(monkeypatch):
    # Nothing ranked fits the budget: a chunked kernel with smaller chunks runs, not PyTorch's
    # default (the portable set's last resort, fused on cards that have fused backends).
    budget = 12 * 2**20
    ours = Dispatcher(kernels="portable", memory_budget=budget)
    query = torch.randn(1, 8, 4096, 64)
    key = torch.randn(1, 8, 4096, 64)
    decision = ours.explain(query, key, key)
    assert decision.kernel.startswith("chunked[") and decision.candidates[0].workspace_bytes <= budget
    assert decision.candidates[-1].name == "sdpa_default"


def test_too_little_free_memory_leads_with_the_free_bytes(monkeypatch):
    monkeypatch.setattr(planner, "free_bytes", lambda device: 64)
    inputs = _prefill()
    with pytest.raises(NoKernelError) as raised:
        Dispatcher(kernels="portable").attention(**inputs)
    first = str(raised.value).splitlines()[0]
    assert first.startswith("no attention kernel fits in the 64 B free on cpu: the smallest workspace this problem needs")
    assert "free device memory" in first


def test_the_smallest_workspace_is_named_the_same_whatever_the_ranking(monkeypatch):
    """Two kernels needing the same workspace: the message names the first by name, not by rank
    (a docs example changed with the fitted table's order)."""
    inputs = qkv(q_len=1, kv_len=64)
    causes = []
    tie_bytes = 8192  # both kernels need the same workspace
    monkeypatch.setattr(MathKernel, "workspace_bytes", lambda self, problem: tie_bytes)
    monkeypatch.setattr(ChunkedKernel, "workspace_bytes", lambda self, problem: tie_bytes)
    for order in (["chunked[q=16,kv=16]", "math"], ["math", "chunked[q=16,kv=16]"]):
        use_ranking(monkeypatch, FixedRanker(order))
        with pytest.raises(NoKernelError) as raised:
            Dispatcher(kernels=["math", "chunked[q=16,kv=16]"], memory_budget=100).attention(**inputs)
        causes.append(raised.value.cause)
    assert all("needs is 8.0 KiB (chunked[q=16,kv=16])" in cause for cause in causes), causes
