"""Strict checks for untrusted JSON (threshold tables): each failure is a `TableError` naming
the field, what was wrong, and what to do. `LazySection` holds a table section's items as text
and validates each on first use."""

from __future__ import annotations

import json
import math
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

from attn_dispatch.kernels.problem import ITEMSIZE
from attn_dispatch.models.gc_pause import cyclic_collection_paused
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.sharing import TableWarning

# Limits on untrusted tables. The tables we build respect them by construction: a cell lists at
# most MAX_CANDIDATES ranked and measured kernels (table_build and merge keep the fastest), and
# merge_tables refuses more than MAX_MODELS models or an over-size file; the other limits are far
# above real tables (tests/models/test_table_io.py).
MAX_CLASSES = 4096
MAX_CELLS_PER_CLASS = 4096  # a 64 x 64 bucket grid
MAX_CANDIDATES = 64
MAX_LOG2 = 40  # lengths up to 2^40
MAX_SIZE = 1 << 20  # head dims, head counts, GQA ratios, batch
MAX_TEXT = 400
MAX_LIST = 256  # notes, identities, thresholds per class
MAX_QUALITY_KEYS = 64
# An attention call between a nanosecond and an hour; anything outside is corrupt.
MIN_SECONDS, MAX_SECONDS = 1e-9, 3600.0
# Spec sheet sanity: no card moves more than 10^16 B/s or computes 10^19 FLOP/s.
MAX_RATE = 1e19
FIX = "re-create it with `attn-dispatch calibrate` or re-export it from its owner"


class TableError(ValueError):
    """A threshold table is malformed, corrupt, foreign or hostile."""


def _reject_constant(name: str) -> float:
    raise TableError(f"threshold table holds the non-JSON number {name}; times must be finite numbers; {FIX}")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """One JSON object as a dict, refusing a key given twice."""
    result = dict(pairs)
    if len(result) != len(pairs):
        keys = [key for key, _ in pairs]
        duplicate = next(key for key in keys if keys.count(key) > 1)
        raise TableError(f"threshold table repeats the key {duplicate!r} in one object; {FIX}")
    return result


def parse_json(text: str) -> object:
    """Strict JSON: NaN / Infinity and a key repeated in one object raise `TableError`;
    malformed text raises `json.JSONDecodeError`."""
    return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def parse_json_at(text: str, path: str) -> object:
    """`parse_json` of the item at field `path`: any fault is a `TableError` naming it. Python's
    cyclic collector is paused meanwhile (`models.gc_pause`): a model's trees are ~100k objects."""
    try:
        with cyclic_collection_paused():
            return parse_json(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise _fail(path, f"malformed JSON ({error})") from None


class LazySection(Mapping):
    """Items of a table section kept as JSON text, validated on first use (`get`, ``[]``,
    iteration); a malformed one is dropped with a `TableWarning`, never raised. `pending`: index ->
    (item number, text); `build(value, path)` -> (key, value); `index(key)` -> index or None."""

    def __init__(self, pending: dict, build: Callable[[object, str], tuple[object, object]], *, path: str,
                 source: str, index: Callable[[object], object] = lambda key: key) -> None:
        self._pending = pending
        self._built: dict = {}
        self._order: dict = {}
        self._build, self._index, self._path, self._source = build, index, path, source
        self._lock = threading.Lock()

    def mapped(self, function: Callable[[object], object]) -> LazySection:
        """A section whose items are `function` of these (validated on first use as well)."""
        build = self._build
        out = LazySection({}, lambda value, path: _apply(function, build(value, path)), path=self._path,
                          source=self._source, index=self._index)
        with self._lock:
            out._pending = dict(self._pending)
            out._built = {key: function(value) for key, value in self._built.items()}
            out._order = dict(self._order)
        return out

    def listed(self) -> list:
        """Keys of the items not yet found malformed, without validating any (for a section
        indexed by its keys)."""
        with self._lock:
            return [*self._built, *self._pending]

    def _take(self, index: object) -> object | None:
        """Validate the pending item at `index`; under the lock."""
        number, text = self._pending.pop(index)
        path = f"{self._path}[{number}]"
        try:
            key, value = self._build(parse_json_at(text, path), path)
            if self._index(key) != index:
                raise _fail(f"{path}.key", "is not written as attn-dispatch writes it")
        except Exception as error:  # noqa: BLE001 - a malformed item must never fail an inference call
            warnings.warn(f"table {self._source}: skipped {path}: {error}", TableWarning, stacklevel=4)
            return None
        self._built[key], self._order[key] = value, number
        return key

    def __getitem__(self, key: object) -> object:
        value = self._built.get(key)
        if value is not None:
            return value
        try:
            index = self._index(key)
        except (TypeError, ValueError):
            raise KeyError(key) from None
        with self._lock:
            if index in self._pending:
                self._take(index)
            if key in self._built:
                return self._built[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator:
        with self._lock:
            for index in list(self._pending):
                self._take(index)
            keys = sorted(self._built, key=self._order.__getitem__)
        return iter(keys)

    def __len__(self) -> int:
        return len(self._built) + len(self._pending)


def _apply(function: Callable[[object], object], item: tuple[object, object]) -> tuple[object, object]:
    return item[0], function(item[1])


def _fail(path: str, problem: str) -> TableError:
    return TableError(f"threshold table field {path}: {problem}; {FIX}")


def _obj(value: object, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise _fail(path, f"must be a JSON object, got {type(value).__name__}")
    unknown = set(value) - set(required) - set(optional)
    if unknown:
        raise _fail(path, f"unknown fields {sorted(unknown)[:5]} (allowed: {sorted(required + optional)})")
    missing = [key for key in required if key not in value]
    if missing:
        raise _fail(path, f"missing fields {missing}")
    return value


def _mapping(value: object, path: str, limit: int) -> dict:
    """A JSON object with free-form keys (checked by the caller) and at most `limit` entries."""
    if not isinstance(value, dict):
        raise _fail(path, f"must be a JSON object, got {type(value).__name__}")
    if len(value) > limit:
        raise _fail(path, f"has {len(value)} entries, at most {limit} allowed")
    return value


def _list(value: object, path: str, limit: int, *, min_length: int = 0) -> list:
    if not isinstance(value, list):
        raise _fail(path, f"must be a JSON array, got {type(value).__name__}")
    if not min_length <= len(value) <= limit:
        raise _fail(path, f"must hold {min_length} to {limit} entries, got {len(value)}")
    return value


def _int(value: object, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, f"must be an integer, got {value!r:.60}")
    if not low <= value <= high:
        raise _fail(path, f"must lie in [{low}, {high}], got {value}")
    return value


def _num(value: object, path: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, f"must be a number, got {value!r:.60}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past float64's range
        finite = False
    if not (finite and low <= value <= high):
        raise _fail(path, f"must be a finite number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _str(value: object, path: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _fail(path, f"must be a string of at most {MAX_TEXT} characters, got {value!r:.60}")
    if choices is not None and value not in choices:
        raise _fail(path, f"must be one of {list(choices)}, got {value!r}")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, f"must be true or false, got {value!r:.60}")
    return value


def _kernel(value: object, path: str) -> str:
    if type(value) is str and value in _KERNEL_NAMES:
        return value
    name = _str(value, path)
    try:
        kernel_named(name)
    except ValueError as error:
        raise _fail(path, f"names a kernel that is not an attn-dispatch kernel ({error})") from None
    _KERNEL_NAMES.add(name)
    return name


def _seconds(value: object, path: str) -> float:
    return _num(value, path, MIN_SECONDS, MAX_SECONDS)


_KERNEL_NAMES: set[str] = set()
"""Names `_kernel` has accepted in this process: a table repeats a few dozen names thousands of times."""


def _candidates(value: object, path: str, limit: int) -> tuple[tuple[str, float], ...]:
    """``[[kernel name, seconds], ...]`` -> pairs (valid names, times in range, no name twice);
    checked in one tight loop, the first doubt re-checked by `_candidates_in_detail` for the error."""
    known = _KERNEL_NAMES
    if type(value) is list and len(value) <= limit:
        entries = []
        for entry in value:
            if type(entry) is not list or len(entry) != 2:
                break
            name, seconds = entry
            if (type(name) is not str or name not in known or type(seconds) not in (float, int)
                    or not MIN_SECONDS <= seconds <= MAX_SECONDS):
                break
            entries.append((name, float(seconds)))
        else:
            if len({name for name, _ in entries}) == len(entries):
                return tuple(entries)
    return _candidates_in_detail(value, path, limit)


def _candidates_in_detail(value: object, path: str, limit: int) -> tuple[tuple[str, float], ...]:
    entries = []
    for i, entry in enumerate(_list(value, path, limit)):
        pair = _list(entry, f"{path}[{i}]", 2, min_length=2)
        entries.append((_kernel(pair[0], f"{path}[{i}][0]"), _seconds(pair[1], f"{path}[{i}][1]")))
    if len({name for name, _ in entries}) != len(entries):
        raise _fail(path, "lists a kernel twice")
    return tuple(entries)


_SPEC_NUMBERS = ("vector_flops", "bandwidth", "launch_overhead_s")


def _spec(value: object, p: str = "spec") -> CardSpec:
    data = _obj(value, p, ("name", "matrix_flops", *_SPEC_NUMBERS, "memory_bytes", "compute_units"),
                ("fused_attention", "source", "estimated"))
    rates = _obj(data["matrix_flops"], f"{p}.matrix_flops", ("float32",), tuple(k for k in ITEMSIZE if k != "float32"))
    return CardSpec(
        name=_str(data["name"], f"{p}.name"),
        matrix_flops=MappingProxyType({k: _num(v, f"{p}.matrix_flops.{k}", 1.0, MAX_RATE) for k, v in rates.items()}),
        vector_flops=_num(data["vector_flops"], f"{p}.vector_flops", 1.0, MAX_RATE),
        bandwidth=_num(data["bandwidth"], f"{p}.bandwidth", 1.0, MAX_RATE),
        memory_bytes=_int(data["memory_bytes"], f"{p}.memory_bytes", 0, 1 << 60),
        compute_units=_int(data["compute_units"], f"{p}.compute_units", 1, MAX_SIZE),
        launch_overhead_s=_num(data["launch_overhead_s"], f"{p}.launch_overhead_s", 0.0, 1.0),
        fused_attention=_bool(data.get("fused_attention", True), f"{p}.fused_attention"),
        source=_str(data.get("source", ""), f"{p}.source"),
        estimated=_bool(data.get("estimated", False), f"{p}.estimated"),
    )


def _spec_dict(spec: CardSpec) -> dict:
    return {
        "name": spec.name, "matrix_flops": {k: float(v) for k, v in spec.matrix_flops.items()},
        "vector_flops": float(spec.vector_flops), "bandwidth": float(spec.bandwidth),
        "memory_bytes": int(spec.memory_bytes), "compute_units": int(spec.compute_units),
        "launch_overhead_s": float(spec.launch_overhead_s), "fused_attention": spec.fused_attention,
        "source": spec.source, "estimated": spec.estimated,
    }
