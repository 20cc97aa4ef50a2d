"""Sharing tables between owners: export, import, and the dispatcher's start-up lookup.

Lookup order: exact card and stack -> same model, other stack (stale, warned) -> same family (times
scaled by the cards' rates) -> the analytic prior; the user's tables before the bundled ones. A file
whose head (`head_identities`) names only other cards is not parsed; a corrupt one is skipped with a
warning: an attention call never fails because of a table.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from attn_dispatch.models.identity import DeviceIdentity, slug, spec_for
from attn_dispatch.models.paths import tables_dir

if TYPE_CHECKING:  # the table modules load only where a table file is read or written
    from attn_dispatch.models.table import ThresholdTable


class TableWarning(UserWarning):
    """A table (or one item of it) was skipped, is stale, or stands in for another card."""

BUNDLED_TABLES_DIR = Path(__file__).resolve().parent / "tables"
LEVELS = ("exact", "model", "family", "prior")


@dataclass(frozen=True)
class TableLookup:
    """What `lookup_table` found: `level` "exact", "model", "family" (`table` scaled for this card)
    or "prior" (`table` and `path` None); `warnings`, each also issued as a `TableWarning`."""

    table: ThresholdTable | None
    level: str
    path: Path | None
    identity: DeviceIdentity
    warnings: tuple[str, ...] = field(default=())


def export_table(table: ThresholdTable, path: str | os.PathLike) -> Path:
    """Write one self-contained, validated JSON file to share."""
    from attn_dispatch.models.table_io import save_table

    return save_table(table, path)


HASHED_CREATED = "1970-01-01T00:00:00Z"
"""The creation time a merged table is hashed with (`_stored_name`): one for all."""


def _stored_name(table: ThresholdTable) -> str:
    """A merged table's file name: a hash of its content less its creation time, so merging the same tables again
    names the same file (and `merge` asks for --force), whenever it runs."""
    from attn_dispatch.models.table_io import dumps_table

    timeless = replace(table, provenance=replace(table.provenance, created=HASHED_CREATED))
    digest = hashlib.sha256(dumps_table(timeless).encode()).hexdigest()[:12]
    return f"merged-{digest}.json"


def local_table_path(identity: DeviceIdentity, *, home: str | os.PathLike | None = None) -> Path:
    """Where this card's own table lives: ``tables_dir()/<model key>/<card key>.json``."""
    return tables_dir(home) / slug(identity.model_key) / f"{identity.key}.json"


def stored_path(table: ThresholdTable, *, home: str | os.PathLike | None = None) -> Path:
    """Where `store_table` keeps `table` (`local_table_path`; merged tables by content hash)."""
    if not table.provenance.merged_from:
        return local_table_path(table.identity, home=home)
    return tables_dir(home) / slug(table.identity.model_key) / _stored_name(table)


def store_table(table: ThresholdTable, *, home: str | os.PathLike | None = None) -> Path:
    """Keep `table` where lookups find it (`stored_path`), replacing what is there."""
    from attn_dispatch.models.table_io import save_table

    return save_table(table, stored_path(table, home=home))


def import_table(path: str | os.PathLike, *, home: str | os.PathLike | None = None) -> Path:
    """Validate a shared table file (else `TableError`) and store it; returns the stored path."""
    from attn_dispatch.models.table_io import load_table

    return store_table(load_table(path), home=home)


def match_level(table: ThresholdTable, identity: DeviceIdentity) -> str | None:
    """How `table` matches `identity`: "exact", "model", "family", or None (another card)."""
    return cards_match_level(table.provenance.identities, identity)


def cards_match_level(cards: tuple[DeviceIdentity, ...], identity: DeviceIdentity) -> str | None:
    """How a table measured on `cards` matches `identity` (`match_level`)."""
    if any(card.key == identity.key for card in cards):
        return "exact"
    if any(card.model_key == identity.model_key for card in cards):
        return "model"
    # Family stand-ins are for GPUs of one architecture; two CPU models differ too much.
    if identity.device_type != "cpu" and any(card.family_key == identity.family_key for card in cards):
        return "family"
    return None


def _load_unchanged(path: Path) -> ThresholdTable:
    """`load_table`, parsed once per process while the file is unchanged (every new dispatcher
    device looks at every file)."""
    stat = path.stat()
    return _load_version(path, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _load_version(path: Path, inode: int, mtime_ns: int, ctime_ns: int, size: int) -> ThresholdTable:
    """One parse per version of the file (atomic writes replace the inode; tables are never
    mutated after loading, so one object can serve every dispatcher). Its classes, models and
    measured entries are validated on first use (`table_io.loads_table`'s `lazy`)."""
    from attn_dispatch.models.table_io import load_table

    return load_table(path, lazy=True)


def _candidate_files(home: str | os.PathLike | None) -> list[tuple[Path, bool]]:
    """(path, bundled) of every table file, the user's first."""
    files: list[tuple[Path, bool]] = []
    for root, bundled in ((tables_dir(home, create=False), False), (BUNDLED_TABLES_DIR, True)):
        pattern = "*.json" if bundled else "*/*.json"
        try:
            files += [(path, bundled) for path in sorted(root.glob(pattern)) if path.is_file()]
        except OSError:
            continue
    return files


def lookup_table(
    identity: DeviceIdentity, *, home: str | os.PathLike | None = None, warn: bool = True,
) -> TableLookup:
    """The best table for `identity` (module docstring); never raises for a bad table file.
    `warn`: also issue the result's warnings as `TableWarning`s (False: only return them)."""
    notes: list[str] = []
    found: list[tuple[tuple, Path, ThresholdTable, str]] = []
    for path, bundled in _candidate_files(home):
        cards = head_identities(path)  # a file measured on another card is not parsed
        if cards is not None and cards_match_level(cards, identity) is None:
            continue
        try:
            table = _load_unchanged(path)
        except Exception as error:  # noqa: BLE001 - a bad file must never break inference
            notes.append(f"skipped table {path}: {error}")
            continue
        level = match_level(table, identity)
        if level is not None:
            rank = (LEVELS.index(level), bundled, tuple(-ord(ch) for ch in table.provenance.created), -table.provenance.points_measured)
            found.append((rank, path, table, level))
    if not found:
        return _finish(TableLookup(None, "prior", None, identity, tuple(notes)), warn)
    _, path, table, level = min(found, key=lambda item: (item[0], str(item[1])))
    table, said = served_at_level(table, level, identity, path)
    return _finish(TableLookup(table, level, path, identity, (*notes, *said)), warn)


def served_at_level(table: ThresholdTable, level: str | None, identity: DeviceIdentity,
                    path: str | os.PathLike) -> tuple[ThresholdTable, tuple[str, ...]]:
    """`table` (from `path`) as it serves `identity` at lookup `level` (`_level`), with what to say:
    stale at the "model" level, rescaled with a note at the "family" level, as is otherwise."""
    if level == "model":
        return table, (
            f"table {path} was calibrated on {table.identity.software_key}, this process runs "
            f"{identity.software_key}: its decisions may be stale; run `attn-dispatch check` or calibrate again",
        )
    if level == "family":
        from attn_dispatch.models.merge import card_scale

        spec = spec_for(identity)
        factor = card_scale(table.spec, spec)
        note = (
            f"no table for {identity.model_key}: using the {table.identity.model_key} table of the same "
            f"family ({identity.family_key}) with times scaled by {factor:.3f} (unmeasured on this card)"
        )
        return table.scaled(factor, spec=spec, note=note), (note,)
    return table, ()


def _finish(result: TableLookup, warn: bool) -> TableLookup:
    for message in result.warnings if warn else ():
        warnings.warn(message, TableWarning, stacklevel=3)
    return result


HEAD_BYTES = 64 * 1024
"""Bytes of a file's head read for its provenance (a few KiB even for a merged table)."""

_decoder = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def head_identities(path: str | os.PathLike) -> tuple[DeviceIdentity, ...] | None:
    """The cards a table file says it was measured on (its identity, then the merged ones), read
    from its first `HEAD_BYTES`; None where the head does not say (the file must be parsed)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES).decode("utf-8", errors="ignore")
        provenance = _top_level_member(head, "provenance")
        if not isinstance(provenance, dict):
            return None
        cards = [provenance["identity"], *provenance.get("merged_from", [])]
        return tuple(DeviceIdentity.from_dict(card) for card in cards)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _top_level_member(text: str, wanted: str) -> object | None:
    """The value of member `wanted` of the JSON object `text` starts with, decoding the members
    before it in order; None where it is not among those `text` holds whole."""
    index = _skip_space(text, 0)
    if text[index:index + 1] != "{":
        return None
    index += 1
    while True:
        index = _skip_space(text, index)
        name, index = _decoder.raw_decode(text, index)  # ValueError where the head ends inside it
        index = _skip_space(text, index)
        if not isinstance(name, str) or text[index:index + 1] != ":":
            return None
        value, index = _decoder.raw_decode(text, _skip_space(text, index + 1))
        if name == wanted:
            return value
        index = _skip_space(text, index)
        if text[index:index + 1] != ",":
            return None
        index += 1


def _skip_space(text: str, index: int) -> int:
    return _SPACE.match(text, index).end()
