"""Backend probes that passed on this device and software stack, kept across processes.

A probe (`kernels.sdpa_default`) runs a tiny problem through one of PyTorch's SDPA backends and
checks it against the float64 reference: a large part of a GPU process's first call (the float64
reference, and a cuDNN plan built for the probe's own shape). Their answer depends only on the card
and the software, so the ones that passed are kept here and a later process on the same stack
starts from them. Failures are never kept: a failure may be transient (out of memory), and
probing again costs only the processes where a backend does not work.

One small JSON file per device identity, cuDNN version and attn-dispatch version (a probe runs our
wrapper of the backend too: a later release re-probes),
``<home>/probes/<identity key>__cudnn-<version>__attn-dispatch-<version>.json``::

    {"format": 1, "identity_key": "...", "cudnn": "91002", "attn_dispatch": "0.1.0",
     "passed": [["sdpa_flash", "cuda", "bfloat16", "plain"], ...]}

A damaged or foreign file is ignored (the probes run again and the file is rewritten).

A CPU's probed rates (`_cpu_probe`: matrix products, a copy, a softmax) are kept here too, so the
probe runs once per machine (`load_cpu_rates`, `save_cpu_rates`): one file per processor, memory,
torch build and thread count, ``<home>/probes/cpu__<identity key>__mem-<bytes>__threads-<n>.json``
(another machine, a resized VM or a torch update finds none and probes again).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from attn_dispatch.models._card_names import slug
from attn_dispatch.models.atomic_files import write_text_atomically
from attn_dispatch.models.cards import CardSpec
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.paths import home
from attn_dispatch.models.versions import package_version

FORMAT = 1
MAX_BYTES = 1 << 18
"""A probe file lists a few dozen keys: anything over 256 KiB is not one."""
MAX_KEYS = 1024
"""Keys one file may hold: a card has 4 backends x 4 dtypes x 6 features at most (96); more is not ours."""
MAX_FIELD = 64
"""Characters of one key field: family, device type, dtype and feature names are under 20."""

ProbeKey = tuple[str, str, str, str]
"""(kernel family, device type, dtype, feature): `kernels.sdpa_default.probe_backend`'s cache key."""


def probe_file(identity: DeviceIdentity, cudnn_version: str, root: str | os.PathLike | None = None,
               *, create: bool = False) -> Path:
    """Where this device's passed probes are kept (`create`: make its folder)."""
    folder = home(root, create=create) / "probes"
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{identity.key}__cudnn-{cudnn_version or 'none'}__attn-dispatch-{slug(package_version())}.json"


def load_passed(identity: DeviceIdentity, cudnn_version: str, root: str | os.PathLike | None = None) -> set[ProbeKey]:
    """The probe keys that passed on this identity and cuDNN version; empty where none were kept or
    the file is damaged or another stack's."""
    path = probe_file(identity, cudnn_version, root)
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return set()
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    if (not isinstance(document, dict) or document.get("format") != FORMAT
            or document.get("identity_key") != identity.key or document.get("cudnn") != cudnn_version
            or document.get("attn_dispatch") != package_version()):
        return set()
    passed = document.get("passed")
    if not isinstance(passed, list) or len(passed) > MAX_KEYS:
        return set()
    keys = set()
    for entry in passed:
        if not (isinstance(entry, list) and len(entry) == 4
                and all(isinstance(field, str) and 0 < len(field) <= MAX_FIELD for field in entry)):
            return set()  # one bad entry: the whole file is suspect
        keys.add(tuple(entry))
    return keys


def save_passed(identity: DeviceIdentity, cudnn_version: str, passed: Iterable[ProbeKey],
                root: str | os.PathLike | None = None) -> Path:
    """Write the passed probe keys (replacing the file atomically: a temporary file of its own per
    writer, then a rename, so two threads or processes writing at once leave one whole file)."""
    path = probe_file(identity, cudnn_version, root, create=True)
    document = {"format": FORMAT, "identity_key": identity.key, "cudnn": cudnn_version,
                "attn_dispatch": package_version(), "passed": sorted(list(key) for key in passed)[:MAX_KEYS]}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.stem, suffix=".tmp", delete=False) as handle:
        handle.write(json.dumps(document, indent=1))
    Path(handle.name).replace(path)
    return path


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
