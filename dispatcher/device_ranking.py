"""Which ranker orders the kernels on a device: its threshold table (`models.table.ThresholdTable.rank`), else its
analytic prior, else kernel order with ``sdpa_default`` first; resolved once per device. A table never fails a call:
a corrupt, foreign or failing one gives a `TableWarning` and the next source serves. A device with no table measured
on its card says so once per process (`say_once`, `no_table_line`)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from attn_dispatch.dispatcher.decision import RankingSource, logger
from attn_dispatch.kernels import Kernel, Problem, kernel_from_name
from attn_dispatch.kernels._blocks import KEY_COUNT_MULTIPLE, key_count_aligned
from attn_dispatch.kernels.registry import uses_fused_backend
from attn_dispatch.kernels.sdpa_default import default_backend_choice
from attn_dispatch.models.measured import MeasuredEntry
from attn_dispatch.models.priors import Ranker, supported
from attn_dispatch.models.sharing import TableWarning  # one warning class for every table problem
from attn_dispatch.models.table_summary import threads_line

__all__ = ["DeviceRanking", "TableWarning", "fallback_order", "no_table_line", "resolve_ranking", "say_once",
           "table_description"]

ANOTHER_CARD = "another card"
"""The level of a given table file that does not match the device (`given_table_source`)."""
FALLBACK_FIRST = "sdpa_default"
"""With nothing to rank by, PyTorch's own choice goes first."""


def _warn(message: str) -> None:
    warnings.warn(message, TableWarning, stacklevel=4)


def entry_decides_bucket(entry: MeasuredEntry, problem: Problem) -> bool:
    """`DeviceRanking.entry_decides` for a given entry of `problem`'s bucket."""
    if not measured_alignment_carries(entry, problem):
        return False
    if not entry.default_by_tie:
        return True
    own = default_backend_choice(problem)
    return all(name == own for name in entry.faster_than_default())


def measured_alignment_carries(entry: MeasuredEntry, problem: Problem) -> bool:
    """Whether the entry's times carry to `problem` by key-count alignment: on a GPU, our own kernels' times measured
    at a key count that is (not) a multiple of `KEY_COUNT_MULTIPLE` say nothing of one that is not (is)
    (docs/RESULTS.md#kernels-per-call, #ablations); such calls are decided apart (`selection.decision_bucket`)."""
    if problem.device_type == "cpu" or not _multiplies_scores(entry.winner):
        return True
    return key_count_aligned(entry.kv_len) == key_count_aligned(problem.kv_len)


def _multiple_or_not(key_count: int) -> str:
    return "a multiple" if key_count_aligned(key_count) else "not a multiple"


def _multiplies_scores(name: str) -> bool:
    """Whether kernel `name` is one of our own (scores by matrix products), not PyTorch's SDPA."""
    try:
        return not uses_fused_backend(kernel_from_name(name))
    except ValueError:  # a name this version does not build: as before this rule
        return False


class DeviceRanking:
    """The ranker of one device (`table`, else `prior`; None where absent), and its `source` for `explain`."""

    def __init__(self, *, table: Ranker | None, prior: Ranker | None, source: RankingSource, prior_source: RankingSource) -> None:
        self.table = table
        self.prior = prior
        self.source = source
        self._prior_source = prior_source
        self._lock = threading.Lock()

    def rank(self, problem: Problem, kernels: list[Kernel]) -> list[tuple[str, float | None]]:
        """Supported kernel names with predicted seconds, fastest first (None: order only). Never raises."""
        if self.table is not None:
            try:
                return _checked(self.table.rank(problem, kernels))
            except Exception as error:  # noqa: BLE001 - a table must never fail a call
                self._drop_table(error)
        if self.prior is not None:
            try:
                return _checked(self.prior.rank(problem, kernels))
            except Exception as error:  # noqa: BLE001 - nor must the prior
                _warn(f"the analytic prior failed ({type(error).__name__}: {error}); kernels are tried in "
                      f"their default order, {FALLBACK_FIRST} first")
                self.prior = None
        return fallback_order(problem, kernels)

    def entry_decides(self, problem: Problem) -> bool:
        """Whether the table's measured entry for `problem`'s bucket decides it: one exists, and its winner is not
        PyTorch's default by a tie (`MeasuredEntry.default_by_tie`) unless every faster kernel is the backend the
        default runs anyway. Never raises."""
        try:
            entry = self.table.measured_entry(problem) if self.table is not None else None
            return entry is not None and entry_decides_bucket(entry, problem)
        except Exception:  # noqa: BLE001 - a damaged entry decides nothing; the table's own rank handles it
            return False

    def entry_doubt(self, problem: Problem) -> str | None:
        """Why the bucket's measured entry does not decide it (`explain`); None otherwise. Never raises."""
        try:
            entry = self.table.measured_entry(problem) if self.table is not None else None
            if entry is None or entry_decides_bucket(entry, problem):
                return None
            if not measured_alignment_carries(entry, problem):
                return (f"{entry.winner} was measured at {entry.kv_len} keys, {_multiple_or_not(entry.kv_len)} of "
                        f"{KEY_COUNT_MULTIPLE}, and this call has {problem.kv_len}, {_multiple_or_not(problem.kv_len)}: "
                        "the bucket's calls measure the options")
            return "PyTorch's default wins it only by a tie, so the bucket's calls measure them"
        except Exception:  # noqa: BLE001 - an explanation must never fail a call
            return None

    def measured_note(self, problem: Problem) -> str | None:
        """An `explain` line for the bucket's measured entry (winner, median, spread), else None. Never raises."""
        try:
            entry = self.table.measured_entry(problem) if self.table is not None else None
        except Exception:  # noqa: BLE001 - an explanation must never fail a call
            return None
        if entry is None:
            return None
        times = ", ".join(f"{t.kernel} {t.median_s * 1e3:.3g} ms [{t.low_s * 1e3:.3g}-{t.high_s * 1e3:.3g}]"
                          for t in entry.ordered()[:3])
        return f"measured in this bucket ({entry.source}, B{entry.batch} Lq={entry.q_len} Lk={entry.kv_len}): {times}"

    def _drop_table(self, error: Exception) -> None:
        with self._lock:
            if self.table is None:
                return
            _warn(f"threshold table {self.source.path or ''} failed to rank ({type(error).__name__}: {error}); "
                  f"using the analytic prior instead")
            self.table = None
            self.source = self._prior_source


def _checked(ranked: object) -> list[tuple[str, float | None]]:
    """Validate a ranker's answer (list of (name, seconds)); ValueError otherwise."""
    if not isinstance(ranked, (list, tuple)):
        raise ValueError(f"rank() returned {type(ranked).__name__}, not a list of (kernel name, seconds)")
    out = []
    for item in ranked:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"rank() returned {item!r}, not a (kernel name, seconds) pair")
        seconds = item[1]
        out.append((item[0], float(seconds) if seconds is not None else None))
    return out


def fallback_order(problem: Problem, kernels: Sequence[Kernel]) -> list[tuple[str, float | None]]:
    """Supported kernels in the given order, ``sdpa_default`` first, without predictions."""
    names = [kernel.name for kernel in supported(problem, kernels)]
    names.sort(key=lambda name: name != FALLBACK_FIRST)
    return [(name, None) for name in names]


def resolve_ranking(device: torch.device, *, home: str | Path | None = None,
                    given: tuple[object, str] | None = None) -> DeviceRanking:
    """Detect the device, look its table up, build its prior; never raises. `given`: (table, file) for ``--table``."""
    none_source = RankingSource("none", f"no table and no prior: kernel order, {FALLBACK_FIRST} first")
    try:
        from attn_dispatch.models.identity import DeviceIdentity

        identity = DeviceIdentity.detect(device)
    except Exception as error:  # noqa: BLE001 - detection must never fail a call
        _warn(f"could not identify {device} ({type(error).__name__}: {error}); no table or prior is used")
        return DeviceRanking(table=None, prior=None, source=none_source, prior_source=none_source)
    key = str(getattr(identity, "key", identity))
    prior, prior_source = _prior(identity, key, none_source, home)
    if given is not None:
        try:
            table, source = given_table_source(*given, identity)
        except Exception as error:  # noqa: BLE001 - resolving never raises (a family spec may be missing)
            _warn(f"table {given[1]} cannot serve {key} ({type(error).__name__}: {error}); using the analytic prior")
            return DeviceRanking(table=None, prior=prior, source=prior_source, prior_source=prior_source)
        return DeviceRanking(table=table, prior=prior, source=source, prior_source=prior_source)
    try:
        from attn_dispatch.models.sharing import lookup_table

        lookup = lookup_table(identity, home=home, warn=False)
    except Exception as error:  # noqa: BLE001 - lookup never raises by contract; be safe anyway
        _warn(f"table lookup for {key} failed ({type(error).__name__}: {error}); using the analytic prior")
        return DeviceRanking(table=None, prior=prior, source=prior_source, prior_source=prior_source)
    notes = tuple(str(w) for w in getattr(lookup, "warnings", ()) or ())
    for note in notes:
        _warn(note)
    if lookup.table is None or lookup.level == "prior":
        source = RankingSource(prior_source.level, prior_source.description, None, key, notes)
        return DeviceRanking(table=None, prior=prior, source=source, prior_source=prior_source)
    path = str(lookup.path) if lookup.path is not None else None
    notes = _with_threads(notes, lookup.table)
    source = RankingSource(lookup.level, table_description(lookup.table, lookup.level), path, key, notes)
    return DeviceRanking(table=lookup.table, prior=prior, source=source, prior_source=prior_source)


def given_table_source(table, path: str, identity) -> tuple[object, RankingSource]:
    """(table as served, source) for a table file the user named: treated as the lookup would at its match level
    (`models.sharing.served_at_level`), or used as is with a note when another card's."""
    from attn_dispatch.models.sharing import match_level, served_at_level

    level = match_level(table, identity)
    table, notes = served_at_level(table, level, identity, path)
    if level is None:
        level = ANOTHER_CARD
        notes = (f"table {path} was calibrated on {table.identity.model_key}, not on this device "
                 f"({identity.model_key}): its times and choices are that card's",)
    notes = _with_threads(notes, table)
    return table, RankingSource(level, table_description(table, level, given=True), path, identity.key, notes)


def _with_threads(notes: tuple[str, ...], table: object) -> tuple[str, ...]:
    """`notes`, plus for a CPU table its timing threads against this process's (`models.table_summary.threads_line`)."""
    threads = threads_line(table, torch.get_num_threads()) if hasattr(table, "provenance") else None
    return notes if threads is None else (*notes, threads)


LEVEL_WORDS = {
    "exact": "calibrated on this card",
    "model": "calibrated on this card model under another software stack",
    "family": "of another card of its family, times scaled",
    ANOTHER_CARD: "another card's",
}
"""Whose a table is, by lookup level, in `table_description`."""


def table_description(table: object, level: str, *, given: bool = False) -> str:
    """``threshold table (calibrated on this card, 254 measured entries)``, plus the quality guard's line where the
    model lost on held-out data. `given`: a file named with ``explain --table``."""
    entries = len(getattr(table, "entries", None) or ())
    what = "threshold table given with --table" if given else "threshold table"
    match = LEVEL_WORDS.get(level, f"{level} match")
    text = f"{what} ({match}, {entries} measured entries)" if entries else f"{what} ({match})"
    guard = getattr(table, "guard", None)
    if guard is not None and guard.verdict != "table":
        text += f"; {guard.describe()}"
    return text


def _prior(identity: object, key: str, none_source: RankingSource,
           home: str | Path | None) -> tuple[Ranker | None, RankingSource]:
    """The device's analytic prior and its source (never probes inside a call)."""
    try:
        from attn_dispatch.models.identity import spec_for
        from attn_dispatch.models.priors import PriorRanker

        spec = spec_for(identity, home=home, probe_now=False)
        prior = PriorRanker(spec)
    except Exception as error:  # noqa: BLE001 - a missing spec must not fail a call
        _warn(f"no analytic prior for {key} ({type(error).__name__}: {error})")
        return None, none_source
    name = getattr(spec, "name", None) or key
    rates = f"; {spec.source}" if getattr(spec, "estimated", False) else ""
    return prior, RankingSource("prior", f"analytic prior ({name}{rates})", None, key)


# ------------------------------------------------------------------ the one line about no table
MEASURED_LEVELS = ("exact", "model")
"""Lookup levels measured on this card model."""

CALIBRATE_TIME = ("`attn-dispatch calibrate --quick` measures for 30-100 s on a 2-core CPU, a full "
                  "`attn-dispatch calibrate` about 10 minutes on a GPU")
"""How long calibrating takes (`calibration.config.QUICK_BUDGET_S`, `FULL_BUDGET_S`, plus start-up and fit)."""

_said: set[str] = set()
_lock = threading.Lock()


def no_table_line(level: str, device: str, *, measure: bool) -> str | None:
    """The line for a device ranked at lookup `level`; None at `MEASURED_LEVELS`."""
    if level in MEASURED_LEVELS:
        return None
    ranked = ("another card's table of its family, times scaled" if level == "family"
              else "its analytic prior, an estimate from the card's spec sheet")
    if measure:
        doing = ("each new size bucket's first calls run the candidate kernels in turn, PyTorch's default first, "
                 "and the bucket keeps the fastest (a few calls' worth, remembered in the home for later processes)")
    else:
        doing = "PyTorch's default runs where nothing measured another kernel faster (ATTN_DISPATCH_MEASURE=0)"
    return (f"no table measured on this card for {device} (ranked by {ranked}): {doing}; calibrating measures every "
            f"kernel over a sweep of shapes ahead of time instead: {CALIBRATE_TIME}")


NO_TABLE_NOTICE = "attn_dispatch_no_table_notice"
"""Attribute set on the log record of `say_once`'s line (a command that prints the line itself filters it)."""


def say_once(key: str, level: str, device: str, *, measure: bool) -> None:
    """Log `no_table_line` once per process for the device identity `key`."""
    line = no_table_line(level, device, measure=measure)
    if line is None:
        return
    with _lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning("attn_dispatch: %s", line, extra={NO_TABLE_NOTICE: True})
