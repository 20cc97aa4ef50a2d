"""optuna search of a family's parameters: distinct configs only, never the same config twice
(also across a resumed study), clearly losing configs pruned."""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from attn_dispatch.calibration.results import open_storage
from attn_dispatch.calibration.tuning import configurations, effective_values, tune_family
from attn_dispatch.kernels import kernel_from_name
from attn_dispatch.models.measurement import Measurement
from tests.calibration.helpers import problem


def test_effective_values_drop_equivalent_configs():
    decode = effective_values("chunked", problem(q_len=1, kv_len=300))
    assert decode == {"q": [64], "kv": [256, 512]}
    assert effective_values("small_q", problem(q_len=1, kv_len=7)) == {"splits": [1, 8]}
    assert len(configurations(effective_values("small_q", problem(kv_len=4096)))) == 8


def _fake(p, calls, best_q=256, best_kv=1024):
    def measure(kernel, hook):
        seconds = 1e-3 * (1 + abs(math.log2(kernel.q_chunk / best_q)) + abs(math.log2(kernel.kv_chunk / best_kv)))
        stopped = "early" if hook is not None and hook([seconds] * 3) else "stable"
        calls.append(kernel.name)
        return Measurement(problem=p, kernel=kernel.name, median_s=seconds, reps=3, extra={"stopped": stopped})
    return measure


def test_no_config_measured_twice_across_a_resume(tmp_path):
    p = problem(q_len=2048, kv_len=4096)
    storage = open_storage(None, default_journal=tmp_path / "j.journal")
    known = {"chunked[q=512,kv=4096]": Measurement(problem=p, kernel="chunked[q=512,kv=4096]", median_s=4e-3)}
    calls: list[str] = []
    kwargs = dict(storage=storage, study_name="cal|tune|chunked|p", best_s=1e-3, measure=_fake(p, calls), seed=0)
    first = tune_family(p, "chunked", trials=6, known=known, **kwargs)
    assert len(first) == len(calls) and "chunked[q=512,kv=4096]" not in calls
    resumed = tune_family(p, "chunked", trials=12, known=known, **kwargs)
    assert len(calls) == len(set(calls)) == len(first) + len(resumed)
    study = optuna.load_study(study_name="cal|tune|chunked|p", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) >= 12
    assert any(t.user_attrs.get("source") == "sweep" for t in study.trials)  # the default seeded in
    states = {t.user_attrs["kernel"]: t.state for t in study.trials if t.user_attrs.get("kernel") in calls}
    assert TrialState.PRUNED in states.values()  # > 2x the best known: pruned
    assert all(known[name].median_s > 2e-3 for name, s in states.items() if s == TrialState.PRUNED)


def test_small_space_is_tried_exhaustively(tmp_path):
    p = problem(q_len=1, kv_len=300)
    storage = open_storage(None, default_journal=tmp_path / "j.journal")
    calls: list[str] = []
    tune_family(p, "chunked", storage=storage, study_name="s", trials=10, known={}, best_s=1.0,
                measure=_fake(p, calls), seed=0)
    assert sorted(calls) == ["chunked[q=64,kv=256]", "chunked[q=64,kv=512]"]


def test_triton_block_sizes_past_the_problem_and_splits_with_one_effect_are_dropped():
    flash = effective_values("triton_flash", problem(q_len=1, kv_len=40))
    assert flash["bm"] == [16] and flash["bn"] == [16, 32, 64] and flash["w"] == [1, 2, 4, 8]
    decode = effective_values("triton_decode", problem(q_len=1, kv_len=100))
    assert decode["splits"] == [1, 2, 4, 8]  # 16 splits and more use the same 7 blocks of 16 keys as 8
    assert decode["bn"] == [16, 32, 64, 128]


def test_triton_configs_a_card_refuses_or_cannot_compile_are_failures_not_crashes(tmp_path, monkeypatch):
    """On a faked gfx906 (64 KiB of LDS, Triton 3.8): configurations its shared memory refuses are
    recorded unsupported without running or counting as trials; one that fails to compile is
    recorded failed with its error; both score inf, and the search goes on and times the rest."""
    from attn_dispatch.kernels import _triton_support as support
    from attn_dispatch.kernels import triton_flash as flash_module

    monkeypatch.setattr(support, "gpu_architecture", lambda device_index=None: ("gfx906", (9, 0)))
    monkeypatch.setattr(support, "triton_version", lambda: (3, 8))
    monkeypatch.setattr(support.torch.version, "hip", "6.2")
    monkeypatch.setattr(flash_module, "shared_memory_limit", lambda device_index=None: 64 * 1024)
    p = problem(q_len=512, kv_len=512, head_dim=128, value_dim=128, dtype="float16", device_type="cuda")
    calls: list[str] = []

    def measure(kernel, hook):
        reasons = kernel.reasons(p)
        if reasons:
            return Measurement(problem=p, kernel=kernel.name, status="unsupported", reason="; ".join(reasons))
        calls.append(kernel.name)
        if kernel.config.warps <= 2:  # what calibration.measure records when the first call raises
            return Measurement(problem=p, kernel=kernel.name, status="failed",
                               reason="CompilationError: out of resource: shared memory")
        seconds = 1e-3 * kernel.config.block_m / kernel.config.block_n
        return Measurement(problem=p, kernel=kernel.name, median_s=seconds, reps=3, extra={"stopped": "stable"})

    refused = kernel_from_name("triton_flash[bm=256,bn=256,w=8,s=5]")
    known = {refused.name: measure(refused, None)}
    storage = open_storage(None, default_journal=tmp_path / "j.journal")
    new = tune_family(p, "triton_flash", storage=storage, study_name="cal|tune|triton_flash|p", trials=8,
                      known=known, best_s=1e-3, measure=measure, seed=0)
    study = optuna.load_study(study_name="cal|tune|triton_flash|p", storage=storage)
    counted = [t for t in study.trials if t.state.is_finished() and not t.user_attrs.get("refused")]
    assert len(counted) >= 8 and all(name in calls for name in (m.kernel for m in new if m.status != "unsupported"))
    assert all(not kernel_from_name(name).reasons(p) for name in calls)  # nothing refused was run
    assert known[refused.name].status == "unsupported" and "shared memory" in known[refused.name].reason
    assert any(m.status == "ok" for m in new)
    failed = {m.kernel: m for m in new if m.status == "failed"}
    assert failed and all("out of resource" in m.reason for m in failed.values())
    scores = {t.user_attrs["kernel"]: t.value for t in study.trials if t.state.is_finished()}
    assert all(scores[name] == math.inf for name in (*failed, refused.name))  # as Triton's autotuner scores them


def test_a_triton_config_that_cannot_compile_is_recorded_failed_by_the_real_measure(tmp_path, monkeypatch):
    """Tuning `triton_flash` on the CPU under Triton's interpreter, timed by `calibration.measure`:
    a configuration whose launch raises Triton's out-of-resources error is recorded failed with the
    error's first line, and the search times the others."""
    from triton.runtime.errors import OutOfResources

    from attn_dispatch.calibration.measure import measure
    from attn_dispatch.calibration.timer import TimerSettings
    from attn_dispatch.kernels import _triton_flash_ops

    real = _triton_flash_ops.flash_attention

    def too_big_for_four_stages(query, key, value, mask, scale, causal, causal_offset, config, with_backward):
        if config.stages >= 4:
            raise OutOfResources(4 * 65536, 65536, "shared memory")
        return real(query, key, value, mask, scale, causal, causal_offset, config, with_backward)

    monkeypatch.setattr(_triton_flash_ops, "flash_attention", too_big_for_four_stages)
    p = problem(q_len=16, kv_len=16, head_dim=16, value_dim=16, q_heads=2, kv_heads=1)
    fast = TimerSettings(warmup=0, min_reps=1, max_reps=2, target_relative_iqr=float("inf"), budget_s=1.0)
    storage = open_storage(None, default_journal=tmp_path / "j.journal")
    new = tune_family(p, "triton_flash", storage=storage, study_name="t", trials=6, known={}, best_s=1.0, seed=1,
                      measure=lambda kernel, hook: measure(kernel, p, "cpu", settings=fast, should_stop=hook,
                                                           measure_peak=False))
    failed = [m for m in new if m.status == "failed"]
    assert failed and all(m.reason.startswith("OutOfResources: out of resource: shared memory") for m in failed)
    assert all(m.kernel.endswith(("s=4]", "s=5]")) for m in failed)
    assert any(m.ok for m in new)
