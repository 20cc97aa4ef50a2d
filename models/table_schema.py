"""The threshold table's JSON schema (format_version 1, docs/TABLE_FORMAT.md): strict
validation of untrusted data into a `ThresholdTable`, and the inverse.

Every rejection is a `TableError` naming the field (``classes[3].cells[7].ranking[0]``), what
was wrong, and what to do about it. Validation never runs code from the data: kernel names are
parsed by the registry's grammar, numbers are range-checked, unknown fields are refused.
"""

from __future__ import annotations

import math
from types import MappingProxyType

from kernels.problem import ITEMSIZE, MASK_KINDS
from models.buckets import ClassKey
from models.cards import CardSpec
from models.identity import DeviceIdentity
from models.ranking import kernel_named
from models.table import (
    FORMAT_VERSION,
    TABLE_KIND,
    Cell,
    Provenance,
    TableClass,
    Template,
    Threshold,
    ThresholdTable,
)

# Limits on untrusted tables. Real tables stay far below them (tests/models/test_table_io.py).
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
HEADER_KEYS = ("format_version", "kind", "provenance", "spec", "quality", "work_step", "classes")


class TableError(ValueError):
    """A threshold table is malformed, corrupt, foreign or hostile."""


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
    if not (math.isfinite(value) and low <= value <= high):
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
    name = _str(value, path)
    try:
        kernel_named(name)
    except ValueError as error:
        raise _fail(path, f"names a kernel that is not an attn-dispatch kernel ({error})") from None
    return name


def _seconds(value: object, path: str) -> float:
    return _num(value, path, MIN_SECONDS, MAX_SECONDS)


def _candidates(value: object, path: str, limit: int) -> tuple[tuple[str, float], ...]:
    entries = []
    for i, entry in enumerate(_list(value, path, limit)):
        pair = _list(entry, f"{path}[{i}]", 2, min_length=2)
        entries.append((_kernel(pair[0], f"{path}[{i}][0]"), _seconds(pair[1], f"{path}[{i}][1]")))
    if len({name for name, _ in entries}) != len(entries):
        raise _fail(path, "lists a kernel twice")
    return tuple(entries)


def _identity(value: object, path: str) -> DeviceIdentity:
    try:
        return DeviceIdentity.from_dict(value)
    except (TypeError, ValueError) as error:
        raise _fail(path, str(error)) from None


# ---------------------------------------------------------------------------------- sections
def _provenance(value: object) -> Provenance:
    p = "provenance"
    data = _obj(value, p, ("identity", "created", "points_measured"),
                ("calibration_wall_s", "software", "merged_from", "notes"))
    wall = data.get("calibration_wall_s")
    software = _mapping(data.get("software", {}), f"{p}.software", MAX_QUALITY_KEYS)
    return Provenance(
        identity=_identity(data["identity"], f"{p}.identity"),
        created=_str(data["created"], f"{p}.created"),
        points_measured=_int(data["points_measured"], f"{p}.points_measured", 0, 10**9),
        calibration_wall_s=None if wall is None else _num(wall, f"{p}.calibration_wall_s", 0, 1e8),
        software={_str(k, f"{p}.software key"): _str(v, f"{p}.software.{k}") for k, v in software.items()},
        merged_from=tuple(_identity(v, f"{p}.merged_from[{i}]")
                          for i, v in enumerate(_list(data.get("merged_from", []), f"{p}.merged_from", MAX_LIST))),
        notes=tuple(_str(v, f"{p}.notes[{i}]") for i, v in enumerate(_list(data.get("notes", []), f"{p}.notes", MAX_LIST))),
    )


_SPEC_NUMBERS = ("vector_flops", "bandwidth", "launch_overhead_s")


def _spec(value: object) -> CardSpec:
    p = "spec"
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


def _quality(value: object) -> dict:
    data = _mapping(value, "quality", MAX_QUALITY_KEYS)
    quality: dict = {}
    for key, item in data.items():
        path = f"quality.{_str(key, 'quality key')}"
        if item is None or isinstance(item, str):
            quality[key] = None if item is None else _str(item, path)
        elif key.startswith("n_") or key == "seed":
            quality[key] = _int(item, path, 0, 10**9)
        elif "accuracy" in key or "within" in key or key == "holdout_fraction":
            quality[key] = _num(item, path, 0.0, 1.0)
        elif "spearman" in key:
            quality[key] = _num(item, path, -1.0, 1.0)
        else:
            quality[key] = _num(item, path, 0.0, 1e6)
    return quality


def _cell(value: object, path: str) -> tuple[tuple[int, int], Cell]:
    data = _obj(value, path, ("q", "kv", "ranking"), ("measured", "spread", "excluded"))
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
        excluded.append((_kernel(pair[0], f"{path}.excluded[{i}][0]"), _str(pair[1], f"{path}.excluded[{i}][1]")))
    bucket = (_int(data["q"], f"{path}.q", 0, MAX_LOG2), _int(data["kv"], f"{path}.kv", 0, MAX_LOG2))
    cell = Cell(
        ranking=_candidates(data["ranking"], f"{path}.ranking", MAX_CANDIDATES),
        measured=_candidates(data.get("measured", []), f"{path}.measured", MAX_CANDIDATES),
        spread=spreads, excluded=tuple(excluded),
    )
    return bucket, cell


def _threshold(value: object, path: str) -> Threshold:
    data = _obj(value, path, ("kernel", "q_log2", "kv_log2", "cells_won", "cells_in_box", "text"))
    q = tuple(_int(v, f"{path}.q_log2", 0, MAX_LOG2) for v in _list(data["q_log2"], f"{path}.q_log2", 2, min_length=2))
    kv = tuple(_int(v, f"{path}.kv_log2", 0, MAX_LOG2) for v in _list(data["kv_log2"], f"{path}.kv_log2", 2, min_length=2))
    return Threshold(
        kernel=_kernel(data["kernel"], f"{path}.kernel"), q_log2=q, kv_log2=kv,
        cells_won=_int(data["cells_won"], f"{path}.cells_won", 0, MAX_CELLS_PER_CLASS),
        cells_in_box=_int(data["cells_in_box"], f"{path}.cells_in_box", 0, MAX_CELLS_PER_CLASS),
        text=_str(data["text"], f"{path}.text"),
    )


def _class(value: object, path: str) -> TableClass:
    data = _obj(value, path, ("dtype", "head_dim", "causal", "gqa_ratio", "mask_kind", "work_log2", "template", "cells"),
                ("thresholds",))
    key = ClassKey(
        dtype=_str(data["dtype"], f"{path}.dtype", tuple(ITEMSIZE)),
        head_dim=_int(data["head_dim"], f"{path}.head_dim", 1, MAX_SIZE),
        causal=_bool(data["causal"], f"{path}.causal"),
        gqa_ratio=_int(data["gqa_ratio"], f"{path}.gqa_ratio", 1, MAX_SIZE),
        mask_kind=_str(data["mask_kind"], f"{path}.mask_kind", MASK_KINDS),
        work_log2=_int(data["work_log2"], f"{path}.work_log2", 0, MAX_LOG2),
    )
    t = _obj(data["template"], f"{path}.template", ("batch", "q_heads", "kv_heads", "value_dim"))
    template = Template(*(_int(t[name], f"{path}.template.{name}", 1, MAX_SIZE) for name in ("batch", "q_heads", "kv_heads", "value_dim")))
    if template.q_heads != template.kv_heads * key.gqa_ratio:
        raise _fail(f"{path}.template", f"q_heads ({template.q_heads}) must equal kv_heads x gqa_ratio ({template.kv_heads} x {key.gqa_ratio})")
    cells = {}
    for i, raw in enumerate(_list(data["cells"], f"{path}.cells", MAX_CELLS_PER_CLASS, min_length=1)):
        bucket, cell = _cell(raw, f"{path}.cells[{i}]")
        if bucket in cells:
            raise _fail(f"{path}.cells[{i}]", f"bucket {bucket} appears twice")
        cells[bucket] = cell
    thresholds = tuple(_threshold(v, f"{path}.thresholds[{i}]")
                       for i, v in enumerate(_list(data.get("thresholds", []), f"{path}.thresholds", MAX_LIST)))
    return TableClass(key=key, template=template, cells=cells, thresholds=thresholds)


def table_from_dict(data: object) -> ThresholdTable:
    """Validate parsed JSON (`json.loads` output) and build the table; raises `TableError`."""
    if not isinstance(data, dict):
        raise TableError(f"a threshold table must be a JSON object, got {type(data).__name__}; {FIX}")
    version = data.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise TableError(
            f"threshold table format_version {version!r} is not supported (this attn-dispatch reads "
            f"version {FORMAT_VERSION}); upgrade attn-dispatch or {FIX}"
        )
    data = _obj(data, "(top level)", HEADER_KEYS)
    _str(data["kind"], "kind", (TABLE_KIND,))
    classes = {}
    for i, raw in enumerate(_list(data["classes"], "classes", MAX_CLASSES)):
        table_class = _class(raw, f"classes[{i}]")
        if table_class.key in classes:
            raise _fail(f"classes[{i}]", "repeats the class of an earlier entry")
        classes[table_class.key] = table_class
    return ThresholdTable(
        provenance=_provenance(data["provenance"]), spec=_spec(data["spec"]), quality=_quality(data["quality"]),
        classes=classes, work_step=_int(data["work_step"], "work_step", 0, 8),
    )
