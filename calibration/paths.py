"""Where a calibration's files go by default: under the cache directory (``$ATTN_DISPATCH_HOME``
overrides it; see `models.paths`), one optuna journal and one results file per calibration id.
"""

from __future__ import annotations

import re
from pathlib import Path

from attn_dispatch.models.paths import journals_dir, tables_dir

# Characters kept in file names made from calibration ids (the rest become "_").
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_stem(calibration_id: str) -> str:
    """A calibration id as a file name stem (``|`` and other unsafe characters -> ``_``)."""
    return _UNSAFE.sub("_", calibration_id).strip("_")


def default_storage(calibration_id: str) -> Path:
    """The optuna journal of a calibration."""
    return journals_dir() / f"{file_stem(calibration_id)}.journal"


def default_results(calibration_id: str) -> Path:
    """The JSON Lines results file of a calibration."""
    return journals_dir() / f"{file_stem(calibration_id)}.jsonl"


def default_table(model_key_slug: str, key: str) -> Path:
    """Where a card's threshold table goes when `models` gives no place for it."""
    return tables_dir() / model_key_slug / f"{key}.json"
