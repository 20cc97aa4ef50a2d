"""Backend probes that passed on this device and software stack, kept across processes.

A probe (`kernels.sdpa_probe`) runs a tiny problem through one of PyTorch's SDPA backends and
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
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from attn_dispatch.models._card_names import slug
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
"""(kernel family, device type, dtype, feature): `kernels.sdpa_probe.probe_backend`'s cache key."""


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
