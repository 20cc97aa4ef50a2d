"""JSON form of a table's ``measured_entries`` and ``guard`` sections (format_version 2,
docs/TABLE_FORMAT.md): strict validation into `models.measured.MeasuredEntry` /
`models.guard.Guard`, and back."""

from __future__ import annotations

from attn_dispatch.kernels.problem import ITEMSIZE, MASK_KINDS
from attn_dispatch.models._json_checks import (
    _KERNEL_NAMES,
    MAX_CANDIDATES,
    MAX_LOG2,
    MAX_SECONDS,
    MAX_SIZE,
    MIN_SECONDS,
    _bool,
    _fail,
    _int,
    _kernel,
    _list,
    _obj,
    _seconds,
    _str,
)
from attn_dispatch.models.guard import VERDICTS, Guard
from attn_dispatch.models.measured import KEY_FIELDS, SOURCES, MeasuredEntry, MeasuredTime

MAX_ENTRIES = 20000
"""Entries per table: a merged table of a dozen owners' calibrations (~300 problems each) and
their tunings stays far below; at ~300 bytes an entry, 20000 fit the 8 MiB cap."""
MAX_SAMPLES = 10**9
MAX_DEVICE_TYPE_CHARS = 32


def _key(value: object, path: str) -> tuple:
    data = _obj(value, path, KEY_FIELDS)
    ints = {name: _int(data[name], f"{path}.{name}", 0, MAX_LOG2 if name.endswith("log2") else MAX_SIZE)
            for name in ("batch_log2", "q_heads", "kv_heads", "q_log2", "kv_log2", "head_dim", "value_dim")}
    if ints["q_heads"] < 1 or ints["kv_heads"] < 1 or ints["q_heads"] % ints["kv_heads"]:
        raise _fail(f"{path}.q_heads", "must be a positive multiple of kv_heads")
    broadcast = tuple(_bool(v, f"{path}.mask_broadcast[{i}]")
                      for i, v in enumerate(_list(data["mask_broadcast"], f"{path}.mask_broadcast", 8)))
    device_type = _str(data["device_type"], f"{path}.device_type")
    if not device_type.isalnum() or len(device_type) > MAX_DEVICE_TYPE_CHARS:
        raise _fail(f"{path}.device_type", f"must be a device type such as cuda or cpu, got {device_type!r:.40}")
    return (
        ints["batch_log2"], ints["q_heads"], ints["kv_heads"], ints["q_log2"], ints["kv_log2"], ints["head_dim"],
        ints["value_dim"], _str(data["dtype"], f"{path}.dtype", tuple(ITEMSIZE)), _bool(data["causal"], f"{path}.causal"),
        _str(data["mask_kind"], f"{path}.mask_kind", MASK_KINDS), broadcast, device_type,
        _bool(data["strided"], f"{path}.strided"), _bool(data["broadcast_inputs"], f"{path}.broadcast_inputs"),
    )


def _time(value: object, path: str) -> MeasuredTime:
    item = _list(value, path, 5, min_length=5)
    median, low, high = (_seconds(item[i], f"{path}[{i}]") for i in (1, 2, 3))
    if not low <= median <= high:
        raise _fail(path, f"needs low <= median <= high seconds, got {low}, {median}, {high}")
    return MeasuredTime(_kernel(item[0], f"{path}[0]"), median, low, high, _int(item[4], f"{path}[4]", 1, MAX_SAMPLES))


def _well_formed_time(value: object) -> MeasuredTime | None:
    """`_time` for the usual case, checked in one expression: None at the first doubt (`_time` then
    names the bad field). A table holds thousands of these: each field's error path is built only
    on a doubt."""
    if type(value) is not list or len(value) != 5:
        return None
    name, median, low, high, samples = value
    if (type(name) is str and name in _KERNEL_NAMES and type(samples) is int and 1 <= samples <= MAX_SAMPLES
            and all(type(s) in (float, int) and MIN_SECONDS <= s <= MAX_SECONDS for s in (median, low, high))
            and low <= median <= high):
        return MeasuredTime(name, float(median), float(low), float(high), samples)
    return None


def _entry(value: object, path: str) -> MeasuredEntry:
    data = _obj(value, path, ("key", "batch", "q_len", "kv_len", "times", "source"))
    key = _key(data["key"], f"{path}.key")
    times = tuple(_well_formed_time(v) or _time(v, f"{path}.times[{i}]")
                  for i, v in enumerate(_list(data["times"], f"{path}.times", MAX_CANDIDATES, min_length=1)))
    if len({t.kernel for t in times}) != len(times):
        raise _fail(f"{path}.times", "lists a kernel twice")
    return MeasuredEntry(
        key, _int(data["batch"], f"{path}.batch", 1, MAX_SIZE), _int(data["q_len"], f"{path}.q_len", 1, 1 << MAX_LOG2),
        _int(data["kv_len"], f"{path}.kv_len", 1, 1 << MAX_LOG2), times, _str(data["source"], f"{path}.source", SOURCES),
    )


def parse_entries(value: object) -> dict[tuple, MeasuredEntry]:
    """``measured_entries`` -> entries by key (a key listed twice is refused)."""
    entries: dict[tuple, MeasuredEntry] = {}
    for i, raw in enumerate(_list(value, "measured_entries", MAX_ENTRIES)):
        entry = _entry(raw, f"measured_entries[{i}]")
        if entry.key in entries:
            raise _fail(f"measured_entries[{i}]", "repeats the key of an earlier entry (merge them)")
        entries[entry.key] = entry
    return entries


def entries_to_list(entries: dict[tuple, MeasuredEntry]) -> list[dict]:
    return [
        {
            "key": {name: list(v) if isinstance(v, tuple) else v for name, v in zip(KEY_FIELDS, e.key, strict=True)},
            "batch": e.batch, "q_len": e.q_len, "kv_len": e.kv_len, "source": e.source,
            "times": [[t.kernel, t.median_s, t.low_s, t.high_s, t.samples] for t in e.times],
        }
        for e in sorted(entries.values(), key=lambda e: repr(e.key))
    ]


RETIRED_GUARD_FIELDS = ("default_margin",)
"""The guard's margin, which tables written before its removal still hold: accepted and ignored
(docs/RESULTS.md#ablations)."""


def parse_guard(value: object) -> Guard:
    data = _obj(value, "guard", ("verdict", "reason"), RETIRED_GUARD_FIELDS)
    return Guard(_str(data["verdict"], "guard.verdict", VERDICTS), _str(data["reason"], "guard.reason"))


def guard_to_dict(guard: Guard) -> dict:
    return {"verdict": guard.verdict, "reason": guard.reason}
