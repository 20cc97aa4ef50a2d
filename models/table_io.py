"""Reading and writing threshold-table files: bounded, UTF-8 JSON only, validated, atomic; never
unpickled (docs/TABLE_FORMAT.md). Written in a line layout that is one JSON document: the small
members on the first line, then each item of ``classes``, ``models`` and ``measured_entries`` on a
line of its own (`SECTIONS`), so a lazy load splits items without parsing them
(`models._json_checks.LazySection`). Any other layout is parsed and validated whole.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from attn_dispatch.models._json_checks import _spec_dict, parse_json
from attn_dispatch.models.forest import models_to_dict
from attn_dispatch.models.gc_pause import cyclic_collection_paused
from attn_dispatch.models.paths import write_text_atomically
from attn_dispatch.models.table import TABLE_KIND, Cell, ThresholdTable
from attn_dispatch.models.table_schema import FIX, TableError, entries_to_list, guard_to_dict, table_from_dict

# A card's table is a few hundred KiB written compactly, mostly its embedded cost model's trees
# (~300 trees of ~30 nodes); a merged table keeps every card's model (`merge_tables` refuses a
# merge over this cap). A file larger than this is not a table.
MAX_TABLE_BYTES = 8 * 2**20
# Pickle streams start with the PROTO opcode (0x80) for protocols 2-5; protocol 0/1 streams
# start with an opcode letter ('(' , ']', '}', 'c') that is never valid JSON start either.
_PICKLE_PROTO = b"\x80"
SECTIONS = ("classes", "models", "measured_entries")
"""The top-level members written one item a line, in this order."""
_SECTION_LINE = re.compile(r'\],"(\w+)":\[')
_FIRST_SECTION = ',"classes":['


def loads_table(raw: bytes, *, source: str = "<bytes>", lazy: bool = False) -> ThresholdTable:
    """Parse and validate the bytes of a table file; raises `TableError` naming `source`.
    `lazy` (the dispatcher's lookup): a line-layout file's sections are validated on first use."""
    if len(raw) > MAX_TABLE_BYTES:
        raise TableError(f"{source}: {len(raw)} bytes is over the {MAX_TABLE_BYTES}-byte cap for threshold tables; it is not a table")
    if raw.startswith(_PICKLE_PROTO):
        raise TableError(f"{source}: this is a pickle payload, not a JSON table; tables are never unpickled; {FIX}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TableError(f"{source}: not UTF-8 text (byte {error.start}); threshold tables are UTF-8 JSON; {FIX}") from None
    if not text.strip():
        raise TableError(f"{source}: the file is empty; {FIX}")
    # The parse allocates ~500k acyclic objects, enough to set off full collections over everything
    # the process holds (torch, transformers): the collector is paused meanwhile.
    with cyclic_collection_paused():
        return _parse(text, source, lazy)


def _line_layout(text: str) -> tuple[str, dict[str, list[str]]] | None:
    """(the header as a JSON object holding each section empty, each section's item lines) of a
    file in the line layout (module docstring); None for any other layout."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or not lines[0].startswith("{") or not lines[0].endswith(_FIRST_SECTION) or lines[-1] != "]}":
        return None
    sections: dict[str, list[str]] = {"classes": []}
    items = sections["classes"]
    for line in lines[1:-1]:
        if line.startswith("],"):
            match = _SECTION_LINE.fullmatch(line)
            if match is None or match[1] not in SECTIONS or match[1] in sections:
                return None
            items = sections[match[1]] = []
        else:
            items.append(line)
    for name, items in sections.items():
        if items and (items[-1].endswith(",") or not all(line.endswith(",") for line in items[:-1])):
            return None  # not one JSON array: the whole parse names the fault
        sections[name] = [line.removesuffix(",") for line in items]
    head = lines[0].removesuffix(_FIRST_SECTION) + "".join(f',"{name}":[]' for name in sections) + "}"
    return head, sections


def _parse(text: str, source: str, lazy: bool) -> ThresholdTable:
    layout = _line_layout(text) if lazy else None
    try:
        data = parse_json(layout[0] if layout is not None else text)
    except json.JSONDecodeError as error:
        raise TableError(
            f"{source}: truncated or malformed JSON ({error.msg.removesuffix(' at')} at line {error.lineno} column "
            f"{error.colno}); {FIX}"  # json's "Unterminated string starting at" ends where ours goes on
        ) from None
    except RecursionError:
        raise TableError(f"{source}: JSON nested too deeply to be a table; {FIX}") from None
    try:
        return table_from_dict(data, sections=layout and layout[1], source=source)
    except TableError as error:
        raise TableError(f"{source}: {error}") from None


def load_table(path: str | os.PathLike, *, lazy: bool = False) -> ThresholdTable:
    """Read a table file (at most `MAX_TABLE_BYTES` are read; `lazy` as in `loads_table`)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TABLE_BYTES + 1)
    except OSError as error:
        raise TableError(f"{path}: cannot read the table ({error.strerror})") from None
    return loads_table(raw, source=str(path), lazy=lazy)


def _json_text(data: dict) -> str:
    """Compact JSON in the line layout (module docstring)."""
    def dumps(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)

    head = dumps({key: value for key, value in data.items() if key not in SECTIONS})
    lines = [head[:-1] + _FIRST_SECTION]  # a table's header is never empty
    for name in SECTIONS:
        if name in data:
            if name != SECTIONS[0]:
                lines.append(f'],"{name}":[')
            lines.append(",\n".join(map(dumps, data[name])))
    return "\n".join(line for line in lines if line) + "\n]}\n"


def table_bytes(table: ThresholdTable) -> int:
    """Size of `table`'s file in bytes (not validated; `dumps_table` refuses more than `MAX_TABLE_BYTES`)."""
    return len(_json_text(table_to_dict(table)).encode())


def dumps_table(table: ThresholdTable) -> str:
    """Validated JSON text of `table` (NaN / Infinity refused)."""
    data = table_to_dict(table)
    table_from_dict(data)  # what we write must load
    text = _json_text(data)
    if len(text.encode()) > MAX_TABLE_BYTES:
        raise TableError(
            f"this table serialises to {len(text.encode())} bytes, over the {MAX_TABLE_BYTES}-byte cap; "
            "build it with fewer classes or candidates"
        )
    return text


def save_table(table: ThresholdTable, path: str | os.PathLike) -> Path:
    """Write `table` to `path` atomically (temporary file in the same directory, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, dumps_table(table))
    return path


def _cell_dict(bucket: tuple[int, int], cell: Cell) -> dict:
    out: dict = {"q": bucket[0], "kv": bucket[1], "ranking": [[n, s] for n, s in cell.ranking]}
    if cell.measured:
        out["measured"] = [[n, s] for n, s in cell.measured]
    if cell.spread:
        out["spread"] = {n: [lo, hi] for n, (lo, hi) in cell.spread.items()}
    if cell.excluded:
        out["excluded"] = [[n, why] for n, why in cell.excluded]
    return out


def table_to_dict(table: ThresholdTable) -> dict:
    """The JSON-ready form (inverse of `table_from_dict`)."""
    p = table.provenance
    classes = []
    for key in sorted(table.classes):
        c = table.classes[key]
        classes.append({
            "dtype": key.dtype, "causal": key.causal, "mask_kind": key.mask_kind, "head_dim": key.head_dim,
            "gqa_ratio": key.gqa_ratio, "work_log2": key.work_log2,
            "template": {"batch": c.template.batch, "q_heads": c.template.q_heads, "kv_heads": c.template.kv_heads,
                         "head_dim": c.template.head_dim, "value_dim": c.template.value_dim},
            "cells": [_cell_dict(b, c.cells[b]) for b in sorted(c.cells)],
            "thresholds": [{"kernel": t.kernel, "q_log2": list(t.q_log2), "kv_log2": list(t.kv_log2),
                            "cells_won": t.cells_won, "cells_in_box": t.cells_in_box, "text": t.text}
                           for t in c.thresholds],
        })
    out = {
        "format_version": table.format_version, "kind": TABLE_KIND,
        "provenance": {
            "identity": p.identity.to_dict(), "created": p.created, "points_measured": p.points_measured,
            "calibration_wall_s": p.calibration_wall_s, "software": dict(p.software),
            "merged_from": [i.to_dict() for i in p.merged_from], "notes": list(p.notes),
        },
        "spec": _spec_dict(table.spec), "quality": dict(table.quality),
        "class_fields": list(table.class_fields), "work_step": table.work_step,
        "classes": classes, "models": models_to_dict(table.models),
    }
    if p.timing_threads is not None:  # written only where known: GPU tables stay as older versions read them
        out["provenance"]["timing_threads"] = p.timing_threads
    if table.entries:
        out["measured_entries"] = entries_to_list(table.entries)
    if table.guard is not None:
        out["guard"] = guard_to_dict(table.guard)
    return out
