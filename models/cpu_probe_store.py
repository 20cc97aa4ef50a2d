"""A CPU's probed rates (`_cpu_probe`), kept in the home per machine so the probe runs once per machine.

The probe times matrix products, a copy and a softmax: tens to hundreds of milliseconds, which a
process's first attention call would otherwise pay. Its answer depends on the processor, the memory, the torch build and the thread count torch runs
with, so it is kept under a name holding all four (`DeviceIdentity.key` names the processor, its
logical CPUs and the torch version; the memory and threads are added): another machine, a resized
VM or a torch update finds no file and probes again. One small JSON file::

    <home>/probes/cpu__<identity key>__mem-<bytes>__threads-<n>.json
    {"format": 1, "machine": "...", "spec": {"matrix_flops": {...}, "vector_flops": ..., ...}}

A damaged or foreign file is ignored (the probe runs again and the file is rewritten).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from attn_dispatch.models.atomic_files import write_text_atomically
from attn_dispatch.models.cards import CardSpec
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.paths import home

FORMAT = 1
MAX_BYTES = 1 << 14
"""A probe file is a few hundred bytes: anything over 16 KiB is not one."""
RATE_FIELDS = ("vector_flops", "bandwidth", "launch_overhead_s")


def machine_key(identity: DeviceIdentity, threads: int) -> str:
    """The name the probe of this CPU, memory, torch build and thread count is kept under."""
    return f"cpu__{identity.key}__mem-{identity.memory_bytes}__threads-{threads}"


def probe_path(identity: DeviceIdentity, threads: int, root: str | os.PathLike | None = None) -> Path:
    return home(root, create=False) / "probes" / f"{machine_key(identity, threads)}.json"


def load_cpu_rates(identity: DeviceIdentity, threads: int, template: CardSpec,
                   root: str | os.PathLike | None = None) -> CardSpec | None:
    """The rates kept for this machine, as `template` with them filled in; None where none are kept
    or the file is damaged or another machine's."""
    path = probe_path(identity, threads, root)
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        document = json.loads(path.read_text(encoding="utf-8"))
        if document.get("format") != FORMAT or document.get("machine") != machine_key(identity, threads):
            return None
        spec = document["spec"]
        matrix = {str(dtype): _rate(value) for dtype, value in spec["matrix_flops"].items()}
        rates = {name: _rate(spec[name]) for name in RATE_FIELDS}
        source = str(spec["source"])[:200]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return replace(template, matrix_flops=MappingProxyType(matrix), compute_units=threads, source=source, estimated=False,
                   **rates)


def save_cpu_rates(identity: DeviceIdentity, threads: int, spec: CardSpec,
                   root: str | os.PathLike | None = None) -> Path:
    """Keep `spec`'s rates for this machine (replacing the file atomically)."""
    path = probe_path(identity, threads, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"format": FORMAT, "machine": machine_key(identity, threads), "spec": {
        "matrix_flops": dict(spec.matrix_flops), **{name: getattr(spec, name) for name in RATE_FIELDS},
        "source": spec.source}}
    write_text_atomically(path, json.dumps(document, indent=1))
    return path


def _rate(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"a probed rate must be a positive finite number, got {value!r}")
    return float(value)
