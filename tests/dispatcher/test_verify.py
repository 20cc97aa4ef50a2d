"""A measured table's first choices are checked, with PyTorch's own choice, on a bucket's first
call (`dispatcher.verify`): the default stays unless the measurement says otherwise. The stopwatch
is stood in for (timings never decide a test)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, planner, verify
from attn_dispatch.dispatcher.planning import Option
from attn_dispatch.dispatcher.tuning import Tuned
from attn_dispatch.kernels import MathKernel, Problem, SdpaDefaultKernel, kernel_from_name
from attn_dispatch.models.environment import VERIFY
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

pytestmark = pytest.mark.stopwatch  # the first-call check on, as installed

CUDA = torch.device("cuda")  # a device object only: nothing runs on it
PREFILL = Problem(1, 4, 4, 64, 64, 16, 16, "float32")


def _options(monkeypatch, order):
    use_ranking(monkeypatch, FixedRanker(order))
    ours = Dispatcher(kernels=[MathKernel(), SdpaDefaultKernel()])
    return ours, ours._planner(torch.device("cpu"))


def _decided(monkeypatch, order):
    _, cpu = _options(monkeypatch, order)
    return cpu.decide(qkv_problem(), None, budget=None, tune=False, on_failure=lambda *a: None).options


def _wanted(options, device, problem=None, *, entry_decides=False, table_measured=True):
    return verify.verification_wanted(options, device, problem or qkv_problem(), entry_decides=entry_decides,
                                      table_measured=table_measured)


def test_a_measured_table_is_checked_on_every_device(monkeypatch):
    options = _decided(monkeypatch, ["math", "sdpa_default"])
    assert [o.kernel.name for o in options] == ["math", "sdpa_default"]
    assert _wanted(options, CUDA) and _wanted(options, torch.device("cpu"))
    assert _wanted(options[::-1], CUDA, PREFILL)  # the default first: the table's second choice is checked
    assert not _wanted(options, CUDA, entry_decides=True)  # a measured entry decides
    assert not _wanted(options, CUDA, table_measured=False)  # the prior keeps PyTorch's default
    assert not _wanted(options[:1], CUDA)  # no default to check against
    monkeypatch.setenv(VERIFY.name, "0")
    assert not _wanted(options, CUDA)


def test_decode_on_a_gpu_checks_only_a_pick_that_displaced_the_default(monkeypatch):
    options = _decided(monkeypatch, ["math", "sdpa_default"])
    decode = qkv_problem()  # one query row
    assert [o.kernel.name for o in verify.checked_options(options, CUDA, decode)] == ["math", "sdpa_default"]
    assert verify.checked_options(options[::-1], CUDA, decode) == ()
    assert not _wanted(options[::-1], CUDA, decode)
    assert [o.kernel.name for o in verify.checked_options(options[::-1], CUDA, PREFILL)] == ["sdpa_default", "math"]


def test_options_predicted_slow_are_not_timed(monkeypatch):
    options = _decided(monkeypatch, ["math", "sdpa_default"])
    slow_first = (replace(options[0], predicted_s=verify.MAX_CHECKED_SECONDS * 2), *options[1:])
    assert not _wanted(slow_first, CUDA)  # only the default would be left
    slow_default = (options[0], replace(options[1], predicted_s=verify.MAX_CHECKED_SECONDS * 2))
    assert not _wanted(slow_default, CUDA)


def test_only_devices_the_stopwatch_synchronises_are_checked(monkeypatch):
    options = _decided(monkeypatch, ["math", "sdpa_default"])
    assert not _wanted(options, torch.device("mps"))
    assert not _wanted(options, torch.device("meta"))


def test_the_checked_options_are_the_first_two_the_default_and_on_a_gpu_flash(monkeypatch):
    kernels = ["small_q[splits=8]", "math", "chunked[q=128,kv=1024]", "sdpa_flash", "sdpa_default"]
    use_ranking(monkeypatch, FixedRanker(kernels))
    ours = Dispatcher(kernels=kernels)
    options = ours._planner(torch.device("cpu")).decide(Problem(1, 4, 4, 16, 64, 16, 16, "float32"), None, budget=None,
                                                        tune=False, on_failure=lambda *a: None).options
    names = [o.kernel.name for o in options]
    assert names[:2] == ["small_q[splits=8]", "math"]
    prefill = Problem(1, 4, 4, 16, 64, 16, 16, "float16", device_type="cuda")
    cpu = [o.kernel.name for o in verify.checked_options(options, torch.device("cpu"), prefill)]
    gpu = [o.kernel.name for o in verify.checked_options(options, CUDA, prefill)]
    assert cpu == ["small_q[splits=8]", "math", "chunked[q=128,kv=1024]", "sdpa_default"]  # and each family of ours
    assert gpu == ["small_q[splits=8]", "math", "sdpa_flash", "sdpa_default"]


def test_where_the_default_sets_up_per_shape_a_set_up_free_option_and_flash_are_timed(monkeypatch):
    """cuDNN's per-shape set-up: a bucket whose shapes keep changing may swap to another kernel on
    a new shape (`buckets.Bucket.order_for_new_shape`), so flash (else the table's first option free
    of set-up) is timed, even in a GPU decode bucket whose table kept the default first."""
    kernels = ["sdpa_default", "small_q[splits=8]", "math", "sdpa_flash"]
    use_ranking(monkeypatch, FixedRanker(kernels))
    options = Dispatcher(kernels=kernels)._planner(torch.device("cpu")).decide(
        qkv_problem(), None, budget=None, tune=False, on_failure=lambda *a: None).options
    decode = Problem(1, 4, 4, 1, 64, 16, 16, "float16", device_type="cuda")
    assert verify.checked_options(options, CUDA, decode) == ()
    checked = verify.checked_options(options, CUDA, decode, sets_up=frozenset({"sdpa_default"}))
    assert [o.kernel.name for o in checked] == ["sdpa_default", "sdpa_flash"]
    no_flash = tuple(o for o in options if o.kernel.name != "sdpa_flash")  # e.g. fp32, or a head dim flash refuses
    checked = verify.checked_options(no_flash, CUDA, decode, sets_up=frozenset({"sdpa_default"}))
    assert [o.kernel.name for o in checked] == ["sdpa_default", "small_q[splits=8]"]
    assert verify.verification_wanted(options, CUDA, decode, entry_decides=False, table_measured=True,
                                      sets_up=frozenset({"sdpa_default"}))


def qkv_problem():
    return Problem(1, 4, 4, 1, 64, 16, 16, "float32")


@pytest.mark.parametrize(("winner", "first"), [("sdpa_default", "sdpa_default"), ("math", "math")])
def test_the_bucket_follows_the_measurement(monkeypatch, winner, first):
    ours, _ = _options(monkeypatch, ["math", "sdpa_default"])
    timed = []

    def stopwatch(options, inputs, problem, device, on_failure=None, exactly=False):
        timed.append([o.kernel.name for o in options])
        return Tuned(winner, (("math", 2e-3 if winner == "sdpa_default" else 1e-3), ("sdpa_default", 1.5e-3)))

    monkeypatch.setattr(verify, "tune", stopwatch)
    monkeypatch.setattr(planner, "verification_wanted", lambda *args, **kwargs: True)
    call = qkv(q_len=1, kv_len=60)
    assert_matches_reference(ours.attention(**call), call)
    assert timed == [["math", "sdpa_default"]]  # once, the two of them
    decision = ours.explain(**call)
    assert decision.kernel == first
    outcome = "the table's first choice stays" if winner == "math" else "sdpa_default replaces the table's math"
    assert any(note.startswith("checked on the first call") and note.endswith(outcome) for note in decision.notes)
    ours.attention(**qkv(q_len=1, kv_len=63))  # another shape of the bucket (lengths 33-64): no second check
    assert len(timed) == 1


class _GuardedRanker(FixedRanker):
    """A table whose quality guard gave `verdict` (the ranking as given: what serves is not the point)."""

    def __init__(self, order, verdict):
        super().__init__(order)
        self.verdict = verdict


@pytest.mark.parametrize(("verdict", "checked"), [("table", True), ("default", False), ("prior", False)])
def test_only_a_table_whose_guard_kept_its_model_is_checked(monkeypatch, verdict, checked):
    use_ranking(monkeypatch, _GuardedRanker(["math", "sdpa_default"], verdict))
    ours = Dispatcher(kernels=[MathKernel(), SdpaDefaultKernel()])
    seen = []
    monkeypatch.setattr(planner, "verification_wanted",
                        lambda *args, table_measured, **kwargs: seen.append(table_measured) or False)
    ours.attention(**qkv(q_len=1, kv_len=60))
    assert seen == [checked]


def test_the_portable_set_checks_its_first_two_choices(monkeypatch):
    """gfx906's set: PyTorch's default is only the last resort, so the table's first two are timed."""
    use_ranking(monkeypatch, FixedRanker(["small_q[splits=8]", "chunked[q=128,kv=1024]", "math"]))
    ours = Dispatcher(kernels="portable")
    options = ours._planner(torch.device("cpu")).decide(PREFILL, None, budget=None, tune=False,
                                                        on_failure=lambda *a: None).options
    assert not any(verify.is_default(o) for o in options)
    assert verify.checked_options(options, CUDA, qkv_problem()) == ()  # no default: nothing without `portable`
    checked = verify.checked_options(options, CUDA, qkv_problem(), portable=True)
    assert [o.kernel.name for o in checked] == [o.kernel.name for o in options[:2]]
    timed = []
    monkeypatch.setattr(verify, "tune", lambda options, *a, **k: timed.append([o.kernel.name for o in options]))
    ours.attention(**qkv(q_len=8, kv_len=64))
    assert timed == [[o.kernel.name for o in options[:2]]]  # the dispatcher passes its set's kind along


def _cpu_checked(monkeypatch, kernels):
    use_ranking(monkeypatch, FixedRanker(kernels))
    options = Dispatcher(kernels=kernels)._planner(torch.device("cpu")).decide(
        qkv_problem(), None, budget=None, tune=False, on_failure=lambda *a: None).options
    return options, [o.kernel.name for o in verify.checked_options(options, torch.device("cpu"), qkv_problem())]


def test_on_a_cpu_the_tables_first_kernel_of_each_of_our_families_is_timed_too(monkeypatch):
    kernels = ["sdpa_default", "sdpa_flash", "convert[contiguous]+sdpa_flash", "small_q[splits=8]",
               "chunked[q=128,kv=1024]", "small_q[splits=1]", "math"]
    options, cpu = _cpu_checked(monkeypatch, kernels)
    # a conversion of flash is still PyTorch's; the second small_q is not timed: its family is
    assert cpu == ["sdpa_default", "sdpa_flash", "small_q[splits=8]", "chunked[q=128,kv=1024]", "math"]
    gpu_prefill = Problem(1, 4, 4, 16, 64, 16, 16, "float16", device_type="cuda")
    gpu = [o.kernel.name for o in verify.checked_options(options, CUDA, gpu_prefill)]
    assert "small_q[splits=8]" not in gpu  # on a GPU the grids gave it no pick (first_call_check_simulation)


def test_on_a_cpu_a_family_among_the_tables_first_two_is_not_timed_twice(monkeypatch):
    """Each family of ours once, the first two's included; a conversion counts as its inner kernel's family
    (a conversion of flash as PyTorch's)."""
    _, cpu = _cpu_checked(monkeypatch, ["chunked[q=128,kv=1024]", "sdpa_default", "chunked[q=2048,kv=16384]",
                                        "sdpa_flash", "math", "small_q[splits=1]"])
    assert cpu == ["chunked[q=128,kv=1024]", "sdpa_default", "math", "small_q[splits=1]"]
    names = ("sdpa_default", "convert[fp32->bf16]+sdpa_flash", "convert[fp32->bf16]+math", "math", "small_q[splits=1]")
    options = tuple(Option(kernel_from_name(name), 1e-3, 0) for name in names)
    own = verify.own_family_options(options, list(options[:2]))
    assert [o.kernel.name for o in own] == ["convert[fp32->bf16]+math", "small_q[splits=1]"]


def test_on_a_cpu_a_family_whose_first_option_is_too_slow_to_time_is_represented_by_its_next(monkeypatch):
    options, _ = _cpu_checked(monkeypatch,
                              ["sdpa_default", "sdpa_flash", "math", "small_q[splits=1]", "small_q[splits=8]"])
    slow = verify.MAX_CHECKED_SECONDS * 2
    options = tuple(replace(o, predicted_s=slow) if o.kernel.name == "small_q[splits=1]" else o for o in options)
    cpu = [o.kernel.name for o in verify.checked_options(options, torch.device("cpu"), qkv_problem())]
    assert cpu == ["sdpa_default", "sdpa_flash", "math", "small_q[splits=8]"]


class _RankerWithEntry(FixedRanker):
    """A table holding one measured entry for every problem it is asked about."""

    def __init__(self, order, times):
        super().__init__(order)
        self.times = times

    def measured_entry(self, problem):
        from attn_dispatch.models.measured import MeasuredEntry, entry_key

        return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, problem.kv_len, self.times)


def _tied_entry_dispatcher(monkeypatch, faster: str, faster_s=(2.4e-5, 2.2e-5, 4.5e-5)):
    """A dispatcher whose table ranks PyTorch's default first on an entry where `faster` has the
    lower median and a spread overlapping the default's (a tie the default wins)."""
    from attn_dispatch.models.measured import MeasuredTime

    times = (MeasuredTime(faster, *faster_s, 20), MeasuredTime("sdpa_default", 3.0e-5, 2.9e-5, 3.1e-5, 20))
    use_ranking(monkeypatch, _RankerWithEntry(["sdpa_default", faster], times))
    return Dispatcher(kernels=["sdpa_default", faster])


def test_a_tied_entry_is_timed_on_the_first_call_and_the_measurement_decides(monkeypatch):
    ours = _tied_entry_dispatcher(monkeypatch, "math")
    timed = []

    def stopwatch(options, inputs, problem, device, on_failure=None, exactly=False):
        timed.append([o.kernel.name for o in options])
        return Tuned("math", (("math", 1e-3), ("sdpa_default", 1.5e-3)))

    monkeypatch.setattr(verify, "tune", stopwatch)
    call = qkv(q_len=8, kv_len=60)
    assert_matches_reference(ours.attention(**call), call)
    assert timed == [["sdpa_default", "math"]]
    decision = ours.explain(**call)
    assert decision.kernel == "math"
    assert any("only by a tie" in note for note in decision.notes)
    assert any(note.startswith("checked on the first call") for note in decision.notes)


def test_a_tie_with_the_defaults_own_backend_is_not_timed(monkeypatch):
    """PyTorch's default against the backend it runs anyway (`default_backend_choice`): nothing
    to learn from the stopwatch, so the entry decides (the default stays)."""
    from attn_dispatch.kernels.sdpa_probe import default_backend_choice

    call = qkv(q_len=8, kv_len=60)
    own = default_backend_choice(Problem.from_tensors(call["query"], call["key"], call["value"], None, False, True))
    ours = _tied_entry_dispatcher(monkeypatch, own)
    timed = []
    monkeypatch.setattr(verify, "tune", lambda options, *a, **k: timed.append(options))
    assert_matches_reference(ours.attention(**call), call)
    assert timed == [] and ours.explain(**call).kernel == "sdpa_default"


@pytest.mark.parametrize(("math_s", "checked"), [((2.4e-5, 2.2e-5, 4.5e-5), True), ((2.0e-5, 1.9e-5, 2.1e-5), False)])
def test_an_entry_tied_to_the_default_leaves_the_bucket_to_the_check(monkeypatch, math_s, checked):
    """A measured entry decides its bucket unless its winner, PyTorch's default, only ties a
    faster kernel (their spreads overlap): then the first call times them as for a bucket with no
    entry (flash at 2k keys on the H200, docs/RESULTS.md section 18)."""
    from attn_dispatch.models.measured import MeasuredTime

    times = (MeasuredTime("math", *math_s, 20), MeasuredTime("sdpa_default", 3.0e-5, 2.9e-5, 3.1e-5, 20))
    use_ranking(monkeypatch, _RankerWithEntry(["sdpa_default", "math"], times))
    ours = Dispatcher(kernels=[MathKernel(), SdpaDefaultKernel()])
    seen = []
    monkeypatch.setattr(planner, "verification_wanted",
                        lambda *args, entry_decides, **kwargs: seen.append(entry_decides) or False)
    ours.attention(**qkv(q_len=8, kv_len=60))
    assert seen == [not checked]


def test_an_entry_of_ours_measured_at_an_aligned_key_count_does_not_decide_an_unaligned_call():
    """On a GPU, a portable kernel's measured win at 8,192 keys does not carry to 4,731 keys (rows
    not a multiple of `KEY_COUNT_MULTIPLE`: 2.45x PyTorch's default on the H200, session 15): the
    bucket's first call is checked, and `explain` says why. PyTorch's backends, and CPUs, keep the
    entry's word."""
    from attn_dispatch.dispatcher.ranking import DeviceRanking, entry_decides_bucket
    from attn_dispatch.models.measured import MeasuredEntry, MeasuredTime, entry_key
    from tests.dispatcher.helpers import PRIOR_SOURCE, TEST_SOURCE

    def entry(winner, problem):
        times = (MeasuredTime(winner, 1.3e-4, 1.24e-4, 1.36e-4, 5), MeasuredTime("sdpa_default", 1.9e-4, 1.88e-4, 1.93e-4, 5))
        return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, 8192, times)

    def call(kv_len, device_type="cuda"):
        return Problem(4, 32, 8, 2, kv_len, 256, 256, "bfloat16", device_type=device_type)

    ours = entry("small_q[splits=1]", call(8192))
    assert not entry_decides_bucket(ours, call(4731))
    assert entry_decides_bucket(ours, call(4736)) and entry_decides_bucket(ours, call(8192))
    assert entry_decides_bucket(entry("small_q[splits=1]", call(8192, "cpu")), call(4731, "cpu"))
    assert entry_decides_bucket(entry("sdpa_flash", call(8192)), call(4731))
    from attn_dispatch.dispatcher.planning import decision_bucket

    assert decision_bucket(call(4731)) != decision_bucket(call(4736))  # decided apart: the first seen never decides both
    assert decision_bucket(call(4731, "cpu")) == decision_bucket(call(4736, "cpu"))
    ranking = DeviceRanking(table=_RankerWithEntry(["small_q[splits=1]", "sdpa_default"], ours.times),
                            prior=None, source=TEST_SOURCE, prior_source=PRIOR_SOURCE)
    ranking.table.measured_entry = lambda problem: ours
    assert not ranking.entry_decides(call(4731)) and ranking.entry_decides(call(4736))
    assert "this call has 4731, not a multiple" in ranking.entry_doubt(call(4731))
    assert ranking.entry_doubt(call(4736)) is None
