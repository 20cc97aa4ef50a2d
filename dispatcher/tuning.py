"""First-call tuning: the table prunes, the stopwatch decides the close calls.

With tuning on (``Dispatcher(tune=True)`` or ``ATTN_DISPATCH_TUNE=1``), the first call of a new
problem bucket (`planning.failure_bucket`: lengths and batch rounded up to powers of two) times the
kernels the ranking predicts within `TUNE_MARGIN` of its best (at most `MAX_TUNED`) on that call's
own inputs, together with PyTorch's own choice, and the bucket keeps the measured fastest for every
later shape in it. This is cuDNN's benchmark mode and Triton's autotuner, with the cost model
pruning the candidates first.

The price is paid once per bucket: a warm-up and a sizing call of each contender, then up to `TUNE_ROUNDS`
rounds of ~2 ms samples (`TUNE_BUDGET_S` caps them; a 100k-token video call costs a few calls per
contender). Not done while a CUDA graph is being captured (timing synchronises) nor on the
training route. It runs under the dispatcher's lock: other threads' new decisions wait for it,
their calls of shapes already decided do not.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attn_dispatch.dispatcher.planning import Option
from attn_dispatch.dispatcher.ranking import FALLBACK_FIRST

TUNE_MARGIN = 2.0
"""Contenders: options predicted within this factor of the best prediction. Chosen on the H200
calibration of 2026-11-30 (`python -m bench.tuning_simulation
bench/results/h200_calibrations/run4_fixed_timer`, 5 held-out splits of 20% of 164 problems): the
model's own pick cost 16% on average (worst 383%); timing the contenders of margin 1.5 / at most
4 cost 5.7% (worst 250%), of margin 2 / at most 6 cost 1.1% (worst 71%, 97% of problems within 2%
of the fastest) for 4.6 kernels timed on average."""

MAX_TUNED = 6
"""At most this many contenders (PyTorch's own choice comes on top): bounds the first call of a
bucket at a few dozen calls of its kernels (`TUNE_TIMER`)."""

TUNE_ROUNDS = 5
"""Interleaved rounds: each round times one sample of every contender, in rotated order, so a
clock ramp or another process's burst lands on all of them alike (as `attn-dispatch bench` does);
each contender's median over the rounds decides."""

TUNE_BUDGET_S = 1.0
"""No new round after this many seconds (at least one round is always completed; the sizing calls
count too): a contender of 100 ms per call gets its warm-up, its sizing call and a sample or two."""


SIZING_CALLS = 2
"""Calls of each contender before its timed rounds: a warm-up, then a warm call whose time sets
how many back-to-back calls make one ~2 ms sample (a cold first call, slowed by lazy set-up,
would give a 20-100 us kernel too few calls per sample). On the H200 this did not by itself stop
tuning from timing PyTorch's default 1.3-2.5x slow on some short calls (`docs/RESULTS.md`,
section 4; `bench/results/h200_session3/`, decision notes)."""


MIN_WIN_MARGIN = 0.03
"""A contender replaces PyTorch's own choice only when faster by more than this fraction (or by
more than either one's spread over the rounds, if larger): the dispatcher's rule is never to be
slower than doing nothing, and issue 14 allows no shape more than 3% slower than the default."""


@dataclass(frozen=True)
class Tuned:
    """A bucket's tuning: the measured fastest kernel and every contender's seconds (inf: failed)."""

    kernel: str
    seconds: tuple[tuple[str, float], ...]

    def timings(self) -> str:
        """``"sdpa_flash 0.034 ms, sdpa_default 0.029 ms"`` (a contender that raised: "failed")."""
        return ", ".join(f"{name} {s * 1e3:.3g} ms" if math.isfinite(s) else f"{name} failed" for name, s in self.seconds)

    def note(self) -> str:
        return f"tuned on the first call of this bucket: {self.timings()}"


def contenders(options: tuple[Option, ...]) -> tuple[Option, ...]:
    """The options whose order the stopwatch should settle: predicted within `TUNE_MARGIN` of the
    first (the ranking's best), at most `MAX_TUNED`, plus PyTorch's own choice (``sdpa_default``)
    wherever it can run, so a tuned bucket never keeps something slower than what PyTorch would
    have run. Other unpredicted options are not timed."""
    if not options:
        return ()
    close = []
    if options[0].predicted_s is not None:
        limit = options[0].predicted_s * TUNE_MARGIN
        close = [o for o in options if o.predicted_s is not None and o.predicted_s <= limit][:MAX_TUNED]
    else:
        close = [options[0]]
    baseline = [o for o in options if o.kernel.name == FALLBACK_FIRST and o not in close
                and not getattr(o.kernel, "last_resort", False)]  # the portable set's stays the last resort
    return tuple(close + baseline)


def can_time(device: torch.device) -> bool:
    """Timing synchronises the device: never while a CUDA graph is being captured on it."""
    if device.type != "cuda":
        return True
    with _on(device):
        return not torch.cuda.is_current_stream_capturing()


def _on(device: torch.device):
    """Make `device` current, so events and capture checks concern its stream (a model split
    over GPUs calls on cuda:1 while cuda:0 is current)."""
    if device.type == "cuda" and device.index is not None:
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def tune(options: tuple[Option, ...], inputs: tuple, problem, device: torch.device,
         on_failure: Callable[[str, BaseException], None] | None = None, *, exactly: bool = False) -> Tuned | None:
    """Time `contenders(options)` (`exactly`: `options` as given) on ``inputs = (query, key, value,
    attn_mask, scale, enable_gqa)``:
    `SIZING_CALLS` calls each (a warm-up, then a warm call that sizes the samples; a contender
    that raises is out, and reported to `on_failure` with its name), then `TUNE_ROUNDS` interleaved rounds of one batched sample each (`calibration.timer`:
    back-to-back calls lasting ~2 ms). None when there is nothing to settle (one contender) or
    nothing ran."""
    timed = tuple(options) if exactly else contenders(options)
    if len(timed) < 2 or not can_time(device):
        return None
    with _on(device):
        samples = _time_contenders(timed, inputs, problem, device, on_failure)
    seconds = {name: statistics.median(values) for name, values in samples.items()}
    finite = {name: s for name, s in seconds.items() if math.isfinite(s)}
    if not finite:
        return None
    best = min(finite, key=finite.get)
    if FALLBACK_FIRST in finite and best != FALLBACK_FIRST:
        margin = max(MIN_WIN_MARGIN, spread(samples[best]), spread(samples[FALLBACK_FIRST]))
        if finite[best] * (1.0 + margin) >= finite[FALLBACK_FIRST]:
            best = FALLBACK_FIRST  # not faster beyond the noise: PyTorch's own choice stays
    return Tuned(best, tuple((o.kernel.name, seconds.get(o.kernel.name, math.inf)) for o in timed))


def spread(samples: list[float]) -> float:
    """Relative spread of a contender's samples: (largest - smallest) / median over the finite ones
    (0 with fewer than two)."""
    finite = sorted(s for s in samples if math.isfinite(s))
    if len(finite) < 2:
        return 0.0
    return (finite[-1] - finite[0]) / statistics.median(finite)


def _time_contenders(timed: tuple[Option, ...], inputs: tuple, problem, device: torch.device,
                     on_failure: Callable[[str, BaseException], None] | None) -> dict[str, list[float]]:
    """Seconds per call of each contender that ran, one sample per round (see `tune`), by name."""
    from attn_dispatch.calibration.timer import (  # calibration's timer, only when tuning
        calls_per_sample,
        time_batch,
    )

    query, key, value, attn_mask, scale, enable_gqa = inputs
    runs, calls, samples = {}, {}, {}
    started = time.perf_counter()
    for option in timed:
        run = option.kernel.runner(problem)  # what a plan runs (`run` costs more host time: `SdpaBackendKernel.runner`)
        try:
            warm_call_s = math.inf
            for _ in range(SIZING_CALLS):  # the first is the warm-up; the fastest sizes the samples
                begin = time.perf_counter()
                run(query, key, value, attn_mask, scale, enable_gqa, problem)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                warm_call_s = min(warm_call_s, time.perf_counter() - begin)
                if warm_call_s > TUNE_BUDGET_S / TUNE_ROUNDS:
                    break  # a slow kernel: one call told enough
        except Exception as error:  # noqa: BLE001 - a contender that fails is not chosen
            if on_failure is not None:
                on_failure(option.kernel.name, error)
            continue
        name = option.kernel.name
        runs[name] = lambda _i, run=run: run(query, key, value, attn_mask, scale, enable_gqa, problem)
        calls[name] = calls_per_sample(warm_call_s)
        samples[name] = []
    names = list(runs)
    if not names:
        return {}
    for round_index in range(TUNE_ROUNDS):
        if round_index and time.perf_counter() - started > TUNE_BUDGET_S:
            break
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            try:
                samples[name].append(time_batch(runs[name], 0, calls[name], device))
            except Exception:  # noqa: BLE001 - e.g. out of memory in a later round: drop it
                samples[name].append(math.inf)
    return samples


def put_first(options: tuple[Option, ...], name: str) -> tuple[Option, ...]:
    """`options` with kernel `name` moved to the front (unchanged when it is not among them)."""
    chosen = [o for o in options if o.kernel.name == name]
    return tuple(chosen + [o for o in options if o.kernel.name != name])
