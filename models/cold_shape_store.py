"""Measured per-shape set-up costs, kept per device: what `calibration.cold_shape` measures and the
dispatcher weighs (`dispatcher.selection`, stage 5).

One small JSON file per device identity, ``<home>/cold_shape/<card model>/<device key>.json``::

    {"format": 1, "model_key": "...", "identity_key": "...", "measured": "2026-12-01T...",
     "seconds": {"sdpa_default": {"decode": 0.0079, "prefill": 0.052}, "sdpa_flash": {...}},
     "floor_seconds": {"small_q[splits=16]": {"decode": 0.0003, ...}, ...}, "conditions": {...}}

``floor_seconds`` (optional) is each kernel's time per call back to back on a small problem of
the kind: its host-side floor, which no larger problem of that kind goes below.

Lookup: this device's own file, else another file of the same card model in the user's home, else
the one shipped for the card model (``models/tables/cold_shape/<card model>.json``). A damaged or
foreign file is skipped: the dispatcher then uses its priors (an attention call never fails for it).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from attn_dispatch.models._card_names import slug
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.paths import cold_shape_dir

FORMAT = 1
KINDS = ("decode", "prefill")
"""Problem kinds measured apart: a decode step (one query row) and a prefill (many)."""
BUNDLED_DIR = Path(__file__).resolve().parent / "tables" / "cold_shape"
MAX_BYTES = 1 << 20
"""A cold-shape file is a few hundred bytes; anything over a megabyte is not one."""

Costs = dict[str, dict[str, float]]
"""kernel name -> problem kind (`KINDS`) -> seconds of per-shape set-up."""


def kind_of(q_len: int) -> str:
    return "decode" if q_len == 1 else "prefill"


def save_cold_costs(identity: DeviceIdentity, seconds: Mapping[str, Mapping[str, float]], *, measured: str,
                    conditions: Mapping[str, object], home: str | os.PathLike | None = None,
                    floors: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Write this device's measured costs (and per-call floors; replacing an earlier file)."""
    clean = _checked_seconds(seconds)
    floor_seconds = _checked_seconds(floors or {})
    folder = cold_shape_dir(home) / slug(identity.model_key)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{identity.key}.json"
    document = {"format": FORMAT, "model_key": identity.model_key, "identity_key": identity.key,
                "measured": measured, "seconds": clean, "floor_seconds": floor_seconds, "conditions": dict(conditions)}
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(document, indent=1, sort_keys=True))
    temporary.replace(path)
    return path


def load_cold_costs(identity: DeviceIdentity, *, home: str | os.PathLike | None = None,
                    field: str = "seconds") -> Costs:
    """The costs (``field="floor_seconds"``: the per-call floors) that apply to this device (see the
    module docstring); {} when none do."""
    own = cold_shape_dir(home) / slug(identity.model_key)
    candidates = [own / f"{identity.key}.json"]
    if own.is_dir():
        candidates += sorted(path for path in own.glob("*.json") if path != candidates[0])
    candidates.append(BUNDLED_DIR / f"{slug(identity.model_key)}.json")
    for path in candidates:
        costs = _read(path, identity.model_key, field)
        if costs is not None:
            return costs
    return {}


def _read(path: Path, model_key: str, field: str) -> Costs | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        document = json.loads(path.read_text())
        if document.get("format") != FORMAT or document.get("model_key") != model_key:
            return None
        return _checked_seconds(document.get(field, {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _checked_seconds(seconds: object) -> Costs:
    """``{kernel: {kind: seconds}}`` with finite, non-negative seconds and known kinds, or ValueError."""
    if not isinstance(seconds, Mapping):
        raise ValueError("cold-shape seconds must be an object of kernel name -> {kind: seconds}")
    clean: Costs = {}
    for name, by_kind in seconds.items():
        if not isinstance(name, str) or not isinstance(by_kind, Mapping):
            raise ValueError(f"cold-shape entry {name!r} must map a kernel name to {{kind: seconds}}")
        for kind, value in by_kind.items():
            if kind not in KINDS or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"cold-shape entry {name}.{kind} = {value!r}: kinds are {KINDS}, seconds >= 0")
            clean.setdefault(name, {})[kind] = float(value)
    return clean
