"""A size bucket's kernels measured on its own calls (`Trial`): each call runs one candidate, timed without waiting
(`call_clock`), and its output is the call's. ``ATTN_DISPATCH_MEASURE=0`` or ``Dispatcher(measure=False)``: off."""

from __future__ import annotations

import functools
import math
import statistics
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from attn_dispatch.dispatcher.decision import failure_message, format_seconds
from attn_dispatch.dispatcher.selection import MIN_WIN_MARGIN, Option, Tuned
from attn_dispatch.kernels import Kernel, Problem
from attn_dispatch.models import environment

ROUNDS = 5
"""Samples of each candidate still in before the bucket is decided."""
BASELINE_CALLS = 2
"""The baseline's calls before another candidate runs: its warm-up and one sample."""
WARM_UP_CALLS = 1
"""A candidate's first call is not a sample (backends set up lazily)."""
CLEARLY_SLOWER = 0.10
"""A candidate whose fastest sample is this much slower than the slowest sample of the fastest so far leaves."""
BUDGET_CALLS = 3.0
"""What a bucket may spend on slower candidates, in baseline calls (summed excess over the baseline's median)."""
MAX_PENDING = 2
"""Readings that may wait for their device events before calls go untimed."""
DEVICE_BACKED_MARGIN = 0.15
"""On a device with events, a candidate replaces the baseline only where the part of its saving that the baseline's
device time can account for (the baseline's event time beyond its host time, median) is over this share of the
baseline's time. The rest of a saving is host time of the measuring's Python path, which the C++ fast path that
serves the decided bucket does not carry (docs/RESULTS.md#h100-without-tables)."""

_variants_run: set[tuple] = set()
"""Kernel variants (`Kernel.variant_key`) that have run a warm-up in this process."""


def first_run(kernel: Kernel, problem: Problem) -> bool:
    """Whether this is the first warm-up of `kernel`'s variant in this process (noting it as run)."""
    key = kernel.variant_key(problem)
    if key in _variants_run:
        return False
    _variants_run.add(key)
    return True


MAX_RUNNERS = 64
"""Exact problems whose candidate runners a trial keeps."""


def measure_from_env() -> bool:
    return environment.MEASURE.read()


@dataclass
class Contender:
    """One candidate in a trial: calls, samples (no warm-ups), each sample's device time beyond its host time
    (`excess`, events), its warm-up's cost (`warm_up_spent`, None until read), why it left (`out`), its failure."""

    option: Option
    calls: int = 0
    samples: list[float] = field(default_factory=list)
    excess: list[float] = field(default_factory=list)
    warm_up_spent: float | None = None
    out: str | None = None
    failure: str | None = None

    @property
    def name(self) -> str:
        return self.option.kernel.name

    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.inf


class Trial:
    """The measuring of one bucket: the baseline first (its warm-up and one sample), then the other candidates one
    call each in turn.

    - A candidate's first call is a warm-up; a variant's first run in the process (`first_run`) is not charged.
    - A candidate `CLEARLY_SLOWER` than the fastest so far leaves at once.
    - The excess of candidates' calls over the baseline's median is spent from `BUDGET_CALLS`; a candidate predicted
      over what is left never runs; once spent, only candidates faster than the baseline stay, and one whose warm-up
      ran gets its first sample (`_sample_owed`; docs/RESULTS.md#h100-without-tables).
    - After `ROUNDS` samples, the baseline stays unless a candidate beat it in every paired round and by more than
      `MIN_WIN_MARGIN` at the median, with a saving that is device time where events time the calls
      (`DEVICE_BACKED_MARGIN`).
    - At most `MAX_PENDING` readings wait on a GPU (then calls run untimed); nothing is timed during CUDA graph
      capture.
    - A candidate that raises is out (`on_failure`) and the call runs the plan's own kernel.

    `options`: baseline first, then ranking order; `fits(kernel, problem)`: runs this exact problem within the
    bucket's memory limits; `cold_s`: name -> per-shape set-up seconds; `on_close(trial)`: once decided, outside the
    lock; `count_cell(name) -> [calls]`: where a call run by another candidate is counted (`Dispatcher.stats`).
    `rank_rest()`: where `options` is the baseline alone (its bucket's ranking waits for the bucket's second call),
    called before every later call until it has given the trial the other candidates (`add_candidates`) or ended it
    (`cancel`); nothing is judged before."""

    def __init__(self, options: tuple[Option, ...], clock, *, fits: Callable[[Kernel, Problem], bool],
                 cold_s: Mapping[str, float] | None = None, on_close: Callable[[Trial], None] | None = None,
                 on_failure: Callable[[str, BaseException], None] | None = None,
                 count_cell: Callable[[str], list[int]] | None = None,
                 rank_rest: Callable[[], None] | None = None) -> None:
        if len(options) < (1 if rank_rest is not None else 2):
            raise ValueError(f"a trial needs at least two candidates, got {len(options)}")
        self.contenders = [Contender(option) for option in options]
        self.baseline = self.contenders[0]
        self.clock = clock
        self.fits = fits
        self.cold_s = dict(cold_s or {})
        self.on_close = on_close
        self.on_failure = on_failure
        self.count_cell = count_cell
        self.open = True
        self.spent_s = 0.0
        self.baseline_first_s = 0.0  # the baseline's first (warm-up) call
        self.first_runs_s = 0.0  # warm-ups that were their variant's first run in the process (not charged)
        self.plans: list = []  # the measuring plans of the bucket (`planner`): re-planned once decided
        self.result: Tuned | None = None
        self.host_bound: list[str] = []  # faster on the readings by host time only (`device_backed`): not taken
        self._pending: list[tuple[Contender, object, bool, bool]] = []
        self._runners: dict[tuple[str, Problem], Callable | None] = {}
        self._lock = threading.Lock()
        self._rank_rest = rank_rest

    def add_candidates(self, options: tuple[Option, ...], cold_s: Mapping[str, float]) -> None:
        """The bucket's ranking is done (`rank_rest`): `options` are the candidates, baseline first (its ranked
        option replaces the one the trial began with), `cold_s` their per-shape set-up seconds."""
        with self._lock:
            self.baseline.option = options[0]
            self.contenders += [Contender(option) for option in options[1:]]
            self.cold_s.update(cold_s)
            self._rank_rest = None

    def cancel(self) -> None:
        """End the trial deciding nothing and telling no one (`on_close` is not called): its bucket's ranking left
        nothing to measure against the baseline. Its plans run their own kernels."""
        with self._lock:
            self.open = False
            self.on_close = None
            self._rank_rest = None

    # ------------------------------------------------------------------ what the bucket's plans run
    def runner(self, plan) -> Callable:
        """A measuring plan's `run`: this call's candidate, or the plan's own kernel when nothing is timed."""
        return functools.partial(self.call, plan, plan.kernel.runner(plan.problem))

    def call(self, plan, own: Callable, query, key, value, attn_mask, scale, enable_gqa, problem):
        if not self.open:
            return self._decided_run(problem, own)(query, key, value, attn_mask, scale, enable_gqa, problem)
        if not self.clock.can_time():  # a CUDA graph being captured: not even an event may be queried
            return own(query, key, value, attn_mask, scale, enable_gqa, problem)
        rank_rest = self._rank_rest
        if rank_rest is not None and self.baseline.calls:  # only the baseline's first call runs without the others
            rank_rest()  # not while a graph is captured (above): ranking may ask PyTorch on the device
        with self._lock:
            self._collect()
            contender = self._next() if self.open and len(self._pending) < MAX_PENDING else None
            run = None if contender is None else self._run_of(contender, problem)
            if run is None:
                if contender is not None and contender is not self.baseline:
                    contender.out = "cannot run or does not fit this bucket's shapes"  # e.g. its probe failed
                    self._judge()
                contender = None
            else:
                contender.calls += 1
                warm_up = contender.calls <= WARM_UP_CALLS
                # a variant's first run in the process is a once-per-process cost: not charged to the bucket
                charged = not (warm_up and first_run(contender.option.kernel, problem) and not self.cold_s.get(contender.name))
        if contender is None:
            self._close_if_decided()  # a reading collected above may have decided it
            return own(query, key, value, attn_mask, scale, enable_gqa, problem)
        started = self.clock.start()
        try:
            out = run(query, key, value, attn_mask, scale, enable_gqa, problem)
        except Exception as error:  # noqa: BLE001 - a failing candidate is out; the plan's own kernel runs
            if contender is self.baseline and plan.kernel is contender.option.kernel:
                raise  # the plan's own kernel: the dispatcher's fallback (`cold_path.ColdPath.recover`) takes over
            out = own(query, key, value, attn_mask, scale, enable_gqa, problem)  # raises: not the candidate's fault
            self._failed(contender, error)
            return out
        reading = self.clock.stop(started)
        if contender.option.kernel is not plan.kernel and self.count_cell is not None:
            plan.count[0] -= 1  # `stats`: this call ran the candidate, not the plan's kernel
            self.count_cell(contender.name)[0] += 1
        with self._lock:
            self._pending.append((contender, reading, warm_up, charged))
            self._collect()
        self._close_if_decided()
        return out

    # ------------------------------------------------------------------ the rules
    def _next(self) -> Contender | None:
        """The candidate this call runs; None to run the plan's kernel untimed (readings awaited)."""
        baseline = self.baseline
        if baseline.out is not None:
            return None  # it failed: the plans run their own kernels until the bucket is decided again
        if baseline.calls < BASELINE_CALLS:
            return baseline
        if not baseline.samples:
            return None  # its readings are still on the device: the reference is not known yet
        for contender in self.contenders[1:]:
            if contender.out is None and contender.calls == 0:
                contender.out = self._over_budget_at_once(contender)
        live = [c for c in self.contenders if c.out is None and len(c.samples) < ROUNDS]
        if self._budget_spent():  # one owed sample each, once the candidate's warm-up reading is in
            live = [c for c in live if c.samples or (c.warm_up_spent is not None and c.calls <= WARM_UP_CALLS)]
        if not live:
            return None
        return min(live, key=lambda c: (c.calls, self.contenders.index(c)))

    def _over_budget_at_once(self, contender: Contender) -> str | None:
        """Why `contender`'s first call alone would overspend (predicted ratio to the baseline, or set-up)."""
        left = self.budget_s() - self.spent_s
        reference = self.baseline.median()
        predicted, base = contender.option.predicted_s, self.baseline.option.predicted_s
        if predicted is not None and base:
            extra = (predicted / base - 1.0) * reference
            if extra > left:
                return (f"predicted {predicted / base:.3g}x the baseline's time: its first call would spend more than "
                        "the bucket's measuring budget")
        set_up = self.cold_s.get(contender.name, 0.0)
        if set_up > left:
            return (f"its first call's set-up (~{format_seconds(set_up)}: a per-shape plan, or a compile in this process) "
                    "is over the bucket's measuring budget")
        return None

    @property
    def compared(self) -> bool:
        """Whether another candidate than the baseline got a sample (else the trial decided nothing worth storing)."""
        return any(c.samples for c in self.contenders[1:])

    def budget_s(self) -> float:
        reference = self.baseline.median()
        return BUDGET_CALLS * reference if math.isfinite(reference) else 0.0

    def _budget_spent(self) -> bool:
        return self.spent_s >= self.budget_s() > 0

    def _collect(self) -> None:
        """Record every ready pending reading, oldest first (events complete in stream order)."""
        while self._pending and self._pending[0][1].ready():
            contender, reading, warm_up, charged = self._pending.pop(0)
            self._record(contender, reading.seconds(), warm_up, charged, reading.device_excess())

    def _record(self, contender: Contender, seconds: float, warm_up: bool, charged: bool = True,
                excess: float | None = None) -> None:
        """One reading: a sample unless a warm-up, and its cost over the baseline (none when not `charged`). A reading
        that completes after the trial decided is left out: what was decided, and its account, stand."""
        if not self.open:
            return
        if contender is self.baseline:
            if warm_up:
                self.baseline_first_s = seconds
        elif not charged:
            self.first_runs_s += seconds
            contender.warm_up_spent = 0.0
        else:
            reference = self.baseline.median()
            if warm_up:
                reference = max(reference, self.baseline_first_s)
            cost = max(0.0, seconds - reference) if math.isfinite(reference) else 0.0
            self.spent_s += cost
            if warm_up:
                contender.warm_up_spent = cost
        if not warm_up:
            contender.samples.append(seconds)
            if excess is not None:
                contender.excess.append(excess)
        self._judge()

    def _judge(self) -> None:
        """Drop the clearly slower (or, budget spent, the not faster); decide once every candidate in has its rounds."""
        if self._rank_rest is not None or not self.open:  # the other candidates are not known yet; or decided
            return
        if self.baseline.out is not None:  # it failed: nothing can be measured against it; the bucket decides again
            self._decide()
            return
        live = [c for c in self.contenders if c.out is None]
        sampled = [c for c in live if c.samples]
        if sampled:
            best = min(sampled, key=Contender.median)
            ceiling = max(best.samples) * (1.0 + CLEARLY_SLOWER)
            for contender in sampled:
                if contender is not best and contender is not self.baseline and min(contender.samples) > ceiling:
                    contender.out = f"clearly slower than {best.name}"
        if self._budget_spent():
            reference = self.baseline.median()
            for contender in live[1:]:
                if contender.out is None and not self._sample_owed(contender) and not contender.median() < reference:
                    contender.out = "the bucket's measuring budget was spent"
        others = [c for c in self.contenders[1:] if c.out is None]
        if not others or not any(len(c.samples) < ROUNDS for c in (self.baseline, *others) if c.out is None):
            self._decide()

    def _sample_owed(self, contender: Contender) -> bool:
        """Whether `contender` (warm-up run, no sample) stays for one sample once the budget is spent: unless its own
        warm-up cost the whole budget, first calls' one-off costs at a new shape are no sign of being slower."""
        spent = contender.warm_up_spent
        return contender.calls > 0 and not contender.samples and (spent is None or spent < self.budget_s())

    def _decide(self) -> None:
        """Close: the baseline, unless a candidate won every paired round and by `MIN_WIN_MARGIN` at the median, with
        a saving the baseline's device time backs (`device_backed`)."""
        baseline, best, best_ratio = self.baseline, self.baseline, 1.0 / (1.0 + MIN_WIN_MARGIN)
        self.open = False
        if baseline.out is not None:  # it failed: nothing measured against it decides; the bucket decides again
            return
        for contender in self.contenders[1:]:
            if contender.out is not None or len(contender.samples) < ROUNDS:
                continue
            ratios = [c / b for c, b in zip(contender.samples, baseline.samples, strict=False)]  # paired by round
            median = statistics.median(ratios)
            if all(r < 1.0 for r in ratios) and median < best_ratio:
                if not self.device_backed(contender):
                    self.host_bound.append(contender.name)
                    continue
                best, best_ratio = contender, median
        self.result = Tuned(best.name, tuple((c.name, c.median()) for c in self.contenders if c.samples))

    def device_backed(self, contender: Contender) -> bool:
        """Whether `contender`'s saving over the baseline is device time (`DEVICE_BACKED_MARGIN`). Always where the
        clock has no events (a CPU's host clock times the work itself), and where the saving is at least the
        candidate's own time: the measuring path's host cost is about one call's, so a baseline twice as slow
        pays real host work that every call of the bucket pays too (cuDNN's plan for each new key length)."""
        baseline = self.baseline
        if not baseline.samples or len(baseline.excess) < len(baseline.samples):
            return True
        reference, own = baseline.median(), contender.median()
        saving = reference - own
        if saving >= own:
            return True
        return min(saving, statistics.median(baseline.excess)) > DEVICE_BACKED_MARGIN * reference

    def _close_if_decided(self) -> None:
        if not self.open and self.on_close is not None:
            with self._lock:
                on_close, self.on_close = self.on_close, None
            if on_close is not None:
                on_close(self)

    def _failed(self, contender: Contender, error: BaseException) -> None:
        with self._lock:
            contender.out = contender.failure = f"failed at run time on a problem of this size: {failure_message(error)}"
            self._judge()
        if self.on_failure is not None:
            self.on_failure(contender.name, error)
        self._close_if_decided()

    # ------------------------------------------------------------------ runners
    def _run_of(self, contender: Contender, problem: Problem) -> Callable | None:
        """`contender`'s runner for this exact problem; None where it cannot run it or does not fit."""
        key = (contender.name, problem)
        if key not in self._runners:
            if len(self._runners) >= MAX_RUNNERS:
                self._runners.clear()
            kernel = contender.option.kernel
            self._runners[key] = kernel.runner(problem) if self.fits(kernel, problem) else None
        return self._runners[key]

    def _decided_run(self, problem: Problem, own: Callable) -> Callable:
        """The winner's runner for this problem (until the plan is re-planned)."""
        if self.result is None:
            return own
        winner = next(c for c in self.contenders if c.name == self.result.kernel)
        with self._lock:
            run = self._run_of(winner, problem)
        return own if run is None else run

    # ------------------------------------------------------------------ explain
    def describe(self) -> str:
        """One line for `explain`: what is measured, pending, and the budget."""
        with self._lock:
            parts = []
            for contender in self.contenders:
                if contender.samples:
                    text = f"{contender.name} {format_seconds(contender.median())} ({len(contender.samples)} samples)"
                elif contender.calls:
                    text = f"{contender.name} warmed up, no sample yet"
                else:
                    text = f"{contender.name} not yet timed"
                if contender.out is not None:
                    text += f", out: {contender.out}"
                parts.append(text)
            if self.open:
                spent = (f"; spent {format_seconds(self.spent_s)} of {format_seconds(self.budget_s())} on slower "
                         "candidates" if self.baseline.samples else "")
                return (f"measurement pending: until this bucket's calls have timed each candidate {ROUNDS} times (one "
                        f"candidate a call), {self.baseline.name} serves them, so it is tried first; then the bucket "
                        "keeps the measured winner. The times above are predictions, not these timings: "
                        + "; ".join(parts) + spent)
            winner = self.result.kernel if self.result is not None else self.baseline.name
            outcome = ("the baseline stays" if winner == self.baseline.name
                       else f"{winner} beat {self.baseline.name} in every round")
            if self.host_bound:
                outcome += (f" ({', '.join(self.host_bound)} faster on the readings by host time of the measuring "
                            "path, not device time: not taken)")
            return "measured on this bucket's calls: " + "; ".join(parts) + f"; {outcome}"
