"""The threshold table's JSON schema (format_version 2, docs/TABLE_FORMAT.md): strict validation
of untrusted data into a `ThresholdTable`. Every rejection is a `TableError` naming the field
(``classes[3].cells[7].ranking[0]``), what was wrong and what to do; nothing in the data runs.
A line-layout table's classes and measured entries are validated on first use (`LazySection`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

from attn_dispatch.kernels.problem import ITEMSIZE, MASK_KINDS
from attn_dispatch.models._json_checks import (
    _KERNEL_NAMES,
    FIX,
    MAX_CANDIDATES,
    MAX_CELLS_PER_CLASS,
    MAX_CLASSES,
    MAX_LIST,
    MAX_LOG2,
    MAX_QUALITY_KEYS,
    MAX_SECONDS,
    MAX_SIZE,
    MIN_SECONDS,
    LazySection,
    TableError,
    _bool,
    _candidates,
    _fail,
    _int,
    _kernel,
    _list,
    _mapping,
    _num,
    _obj,
    _seconds,
    _spec,
    _str,
    parse_json,
    parse_json_at,
)
from attn_dispatch.models.forest import LazyModels, parse_models
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measured import (
    KEY_FIELDS,
    OPTIONAL_FIELDS,
    SOURCES,
    ClassKey,
    MeasuredEntry,
    MeasuredTime,
)
from attn_dispatch.models.quality import VERDICTS, Guard
from attn_dispatch.models.table import (
    EXCLUDING_STATUSES,
    FORMAT_VERSION,
    TABLE_KIND,
    Cell,
    Provenance,
    TableClass,
    Template,
    Threshold,
    ThresholdTable,
    quality_kind,
)

HEADER_KEYS = (
    "format_version", "kind", "provenance", "spec", "quality", "class_fields", "work_step", "classes", "models",
)
OPTIONAL_HEADER_KEYS = ("measured_entries", "guard")
"""Absent where a calibration measured too few problems for a held-out verdict, or none was kept."""
__all__ = ["TableError", "table_from_dict", "FIX"]
REPEATED_CLASS = "repeats the class of an earlier entry"
REPEATED_ENTRY = "repeats the key of an earlier entry (merge them)"


# ---------------------------------------------------------------------------------- sections
def _identity(value: object, path: str) -> DeviceIdentity:
    try:
        return DeviceIdentity.from_dict(value)
    except (TypeError, ValueError) as error:
        raise _fail(path, str(error)) from None


def _created(value: object, path: str) -> str:
    """An ISO 8601 timestamp (``2026-11-30T00:00:00Z``; a trailing Z means UTC)."""
    text = _str(value, path)
    try:
        datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise _fail(path, f"must be an ISO 8601 timestamp such as 2026-11-30T00:00:00Z, got {text!r:.60}") from None
    return text


def _provenance(value: object) -> Provenance:
    p = "provenance"
    data = _obj(value, p, ("identity", "created", "points_measured"),
                ("calibration_wall_s", "software", "merged_from", "notes", "timing_threads"))
    wall, threads = data.get("calibration_wall_s"), data.get("timing_threads")
    software = _mapping(data.get("software", {}), f"{p}.software", MAX_QUALITY_KEYS)
    return Provenance(
        identity=_identity(data["identity"], f"{p}.identity"),
        created=_created(data["created"], f"{p}.created"),
        points_measured=_int(data["points_measured"], f"{p}.points_measured", 0, 10**9),
        calibration_wall_s=None if wall is None else _num(wall, f"{p}.calibration_wall_s", 0, 1e8),
        software={_str(k, f"{p}.software key"): _str(v, f"{p}.software.{k}") for k, v in software.items()},
        merged_from=tuple(_identity(v, f"{p}.merged_from[{i}]")
                          for i, v in enumerate(_list(data.get("merged_from", []), f"{p}.merged_from", MAX_LIST))),
        notes=tuple(_str(v, f"{p}.notes[{i}]") for i, v in enumerate(_list(data.get("notes", []), f"{p}.notes", MAX_LIST))),
        timing_threads=None if threads is None else _int(threads, f"{p}.timing_threads", 1, MAX_SIZE),
    )


def _quality(value: object) -> dict:
    data = _mapping(value, "quality", MAX_QUALITY_KEYS)
    quality: dict = {}
    for key, item in data.items():
        path = f"quality.{_str(key, 'quality key')}"
        if item is None or isinstance(item, str):
            quality[key] = None if item is None else _str(item, path)
        elif (kind := quality_kind(key)) in ("count", "seed"):
            quality[key] = _int(item, path, 0, 10**9)
        elif kind in ("fraction", "holdout_fraction"):
            quality[key] = _num(item, path, 0.0, 1.0)
        elif kind == "correlation":
            quality[key] = _num(item, path, -1.0, 1.0)
        else:
            quality[key] = _num(item, path, 0.0, 1e6)
    return quality


RETIRED_CELL_FIELDS = ("keep_default", "default_yields_at")
"""Cell fields of the region guard, which tables written before its removal still hold (the bundled
H200 table among them): accepted and ignored (docs/RESULTS.md#ablations)."""


def _cell(value: object, path: str) -> tuple[tuple[int, int], Cell]:
    data = _obj(value, path, ("q", "kv", "ranking"), ("measured", "spread", "excluded", *RETIRED_CELL_FIELDS))
    spread = _mapping(data.get("spread", {}), f"{path}.spread", MAX_CANDIDATES)
    spreads = {}
    for name, pair in spread.items():
        lo, hi = (_seconds(v, f"{path}.spread.{name}") for v in _list(pair, f"{path}.spread.{name}", 2, min_length=2))
        if lo > hi:
            raise _fail(f"{path}.spread.{name}", f"min {lo} exceeds max {hi}")
        spreads[_kernel(name, f"{path}.spread key")] = (lo, hi)
    excluded = []
    for i, entry in enumerate(_list(data.get("excluded", []), f"{path}.excluded", MAX_CANDIDATES)):
        pair = _list(entry, f"{path}.excluded[{i}]", 2, min_length=2)
        excluded.append((_kernel(pair[0], f"{path}.excluded[{i}][0]"),
                         _str(pair[1], f"{path}.excluded[{i}][1]", EXCLUDING_STATUSES)))
    bucket = (_int(data["q"], f"{path}.q", 0, MAX_LOG2), _int(data["kv"], f"{path}.kv", 0, MAX_LOG2))
    cell = Cell(
        ranking=_candidates(data["ranking"], f"{path}.ranking", MAX_CANDIDATES),
        measured=_candidates(data.get("measured", []), f"{path}.measured", MAX_CANDIDATES),
        spread=spreads, excluded=tuple(excluded),
    )
    return bucket, cell


def _bucket_range(value: object, path: str) -> tuple[int, int]:
    low, high = (_int(v, path, 0, MAX_LOG2) for v in _list(value, path, 2, min_length=2))
    if low > high:
        raise _fail(path, f"low {low} exceeds high {high}")
    return low, high


def _threshold(value: object, path: str) -> Threshold:
    data = _obj(value, path, ("kernel", "q_log2", "kv_log2", "cells_won", "cells_in_box", "text"))
    q, kv = (_bucket_range(data[name], f"{path}.{name}") for name in ("q_log2", "kv_log2"))
    return Threshold(
        kernel=_kernel(data["kernel"], f"{path}.kernel"), q_log2=q, kv_log2=kv,
        cells_won=_int(data["cells_won"], f"{path}.cells_won", 0, MAX_CELLS_PER_CLASS),
        cells_in_box=_int(data["cells_in_box"], f"{path}.cells_in_box", 0, MAX_CELLS_PER_CLASS),
        text=_str(data["text"], f"{path}.text"),
    )


CLASS_KEY_FIELDS = ("dtype", "causal", "mask_kind", "head_dim", "gqa_ratio", "work_log2")


def _class_key(data: dict, path: str, fields: tuple[str, ...]) -> ClassKey:
    key = ClassKey(
        dtype=_str(data["dtype"], f"{path}.dtype", tuple(ITEMSIZE)),
        causal=_bool(data["causal"], f"{path}.causal"),
        mask_kind=_str(data["mask_kind"], f"{path}.mask_kind", MASK_KINDS),
        head_dim=_int(data["head_dim"], f"{path}.head_dim", 0, MAX_SIZE),
        gqa_ratio=_int(data["gqa_ratio"], f"{path}.gqa_ratio", 0, MAX_SIZE),
        work_log2=_int(data["work_log2"], f"{path}.work_log2", 0, MAX_LOG2),
    )
    for name, field_name in (("head_dim", "head_dim"), ("gqa_ratio", "gqa_ratio"), ("work_log2", "work")):
        split = field_name in fields
        if split != bool(getattr(key, name)) and not (name == "work_log2" and split):
            raise _fail(f"{path}.{name}", f"must be {'a positive value' if split else '0'} since class_fields is {list(fields)}")
    return key


def _class(value: object, path: str, fields: tuple[str, ...]) -> TableClass:
    data = _obj(value, path, (*CLASS_KEY_FIELDS, "template", "cells"), ("thresholds",))
    key = _class_key(data, path, fields)
    names = ("batch", "q_heads", "kv_heads", "head_dim", "value_dim")
    t = _obj(data["template"], f"{path}.template", names)
    template = Template(*(_int(t[name], f"{path}.template.{name}", 1, MAX_SIZE) for name in names))
    if template.q_heads % template.kv_heads or (key.gqa_ratio and template.q_heads != template.kv_heads * key.gqa_ratio):
        raise _fail(f"{path}.template", f"q_heads ({template.q_heads}) must be kv_heads ({template.kv_heads}) x the class's GQA ratio")
    if key.head_dim and template.head_dim != key.head_dim:
        raise _fail(f"{path}.template.head_dim", f"must equal the class head_dim {key.head_dim}")
    cells = _keyed(data["cells"], f"{path}.cells", MAX_CELLS_PER_CLASS, _cell, "bucket {key} appears twice",
                   min_length=1)
    thresholds = tuple(_threshold(v, f"{path}.thresholds[{i}]")
                       for i, v in enumerate(_list(data.get("thresholds", []), f"{path}.thresholds", MAX_LIST)))
    return TableClass(key=key, template=template, cells=cells, thresholds=thresholds)


def _class_item(value: object, path: str, fields: tuple[str, ...]) -> tuple[ClassKey, TableClass]:
    table_class = _class(value, path, fields)
    return table_class.key, table_class


def _keyed(value: object, path: str, limit: int, build: Callable[[object, str], tuple], repeated: str, *,
           min_length: int = 0) -> dict:
    """The JSON array `value` as ``{key: value}`` of ``build(item, its path)`` -> (key, value) for
    each item, refusing a key given twice (`repeated`, formatted with ``{key}``)."""
    result: dict = {}
    for i, item in enumerate(_list(value, path, limit, min_length=min_length)):
        key, value = build(item, f"{path}[{i}]")
        if key in result:
            raise _fail(f"{path}[{i}]", repeated.format(key=key))
        result[key] = value
    return result


def table_from_dict(data: object, *, sections: dict[str, list[str]] | None = None, source: str = "") -> ThresholdTable:
    """Validate parsed JSON (`json.loads` output) and build the table; raises `TableError`.

    `sections`: the items of ``classes``, ``models`` and ``measured_entries`` as JSON text, one
    string each, for `data` that holds them empty (`models.table_io`'s line layout): the models are
    validated now, the classes and entries on first use (`LazySection`, warnings naming `source`)."""
    if not isinstance(data, dict):
        raise TableError(f"a threshold table must be a JSON object, got {type(data).__name__}; {FIX}")
    # No "kind" but a format_version may be a table of another format: the version check names it.
    if data.get("kind") != TABLE_KIND and ("kind" in data or "format_version" not in data):
        raise TableError(f"not an attn-dispatch table (its \"kind\" is {data.get('kind')!r}, not {TABLE_KIND!r}); {FIX}")
    version = data.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise TableError(
            f"threshold table format_version {version!r} is not supported (this attn-dispatch reads version "
            f"{FORMAT_VERSION}); {'upgrade attn-dispatch' if isinstance(version, int) and version > FORMAT_VERSION else 'recalibrate'} or {FIX}"
        )
    data = _obj(data, "(top level)", HEADER_KEYS, OPTIONAL_HEADER_KEYS)
    _str(data["kind"], "kind", (TABLE_KIND,))
    fields = tuple(_str(v, f"class_fields[{i}]", OPTIONAL_FIELDS)
                   for i, v in enumerate(_list(data["class_fields"], "class_fields", len(OPTIONAL_FIELDS))))
    if len(set(fields)) != len(fields):
        raise _fail("class_fields", "lists a field twice")
    header = dict(
        provenance=_provenance(data["provenance"]), spec=_spec(data["spec"]), quality=_quality(data["quality"]),
        class_fields=fields, work_step=_int(data["work_step"], "work_step", 0, 8),
        guard=parse_guard(data["guard"]) if "guard" in data else None, format_version=FORMAT_VERSION,
    )
    if sections is not None:
        return ThresholdTable(**header, models=LazyModels(sections.get("models", []), source=source),
                              classes=_lazy_classes(sections.get("classes", []), fields, source),
                              entries=_lazy_entries(sections.get("measured_entries", []), source))
    classes = _keyed(data["classes"], "classes", MAX_CLASSES, lambda value, path: _class_item(value, path, fields),
                     REPEATED_CLASS)
    models = parse_models(data["models"])  # before the entries: the first fault is the one named
    entries = _keyed(data.get("measured_entries", []), "measured_entries", MAX_ENTRIES, _entry_item, REPEATED_ENTRY)
    return ThresholdTable(**header, classes=classes, models=models, entries=entries)


def _lazy_classes(lines: list[str], fields: tuple[str, ...], source: str) -> LazySection:
    """The classes by key, read now from each line's start (`CLASS_KEY_FIELDS` come first as
    `table_io` writes them; a line written otherwise is validated whole now)."""
    pending: dict[ClassKey, tuple[int, str]] = {}
    for i, line in enumerate(_list(lines, "classes", MAX_CLASSES)):
        path = f"classes[{i}]"
        end = line.find(',"template":')
        try:
            head = _obj(parse_json(line[:end] + "}"), path, CLASS_KEY_FIELDS) if end > 0 else None
        except (json.JSONDecodeError, RecursionError, TableError):
            head = None
        key = _class_key(head, path, fields) if head is not None else _class(parse_json_at(line, path), path, fields).key
        if key in pending:
            raise _fail(path, REPEATED_CLASS)
        pending[key] = (i, line)
    return LazySection(pending, lambda value, path: _class_item(value, path, fields), path="classes", source=source)


_ENTRY_START = '{"key":{'


def entry_key_text(key: tuple) -> str:
    """A measured entry's key as `table_io` writes it: the index of a lazily read entry."""
    return json.dumps(dict(zip(KEY_FIELDS, key, strict=True)), separators=(",", ":"), ensure_ascii=False)


def _lazy_entries(lines: list[str], source: str) -> LazySection:
    """The measured entries indexed by their key's text (``key`` comes first as `table_io` writes
    it, and holds no nested object: it ends at the first ``}``). An entry written otherwise can be
    no lookup's: it is dropped with a warning when the entries are listed."""
    pending: dict[object, tuple[int, str]] = {}
    for i, line in enumerate(_list(lines, "measured_entries", MAX_ENTRIES)):
        end = line.find("}") if line.startswith(_ENTRY_START) else -1
        index = line[len(_ENTRY_START) - 1:end + 1] if end > 0 else ("unindexed", i)
        if index in pending:
            raise _fail(f"measured_entries[{i}]", REPEATED_ENTRY)
        pending[index] = (i, line)
    return LazySection(pending, _entry_item, path="measured_entries", source=source, index=entry_key_text)


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


def _entry_item(value: object, path: str) -> tuple[tuple, MeasuredEntry]:
    entry = _entry(value, path)
    return entry.key, entry


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
