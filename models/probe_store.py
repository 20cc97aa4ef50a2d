"""What the home keeps per device from probes and set-up measurements.

- Backend probes that passed (`kernels.sdpa_default`; they depend only on card and software):
  ``<home>/probes/<identity key>__cudnn-<version>__attn-dispatch-<version>.json``, holding
  ``{"format": 1, "identity_key", "cudnn", "attn_dispatch", "passed": [[backend, device, dtype,
  layout], ...]}``. Failures are never kept (they may be transient); a damaged file is ignored.
  A dispatcher seeds and writes them per device through `ProbeCache`.
- A CPU's probed rates (`probe_cpu_spec`, measured by `models.cpu_probe`), once per machine:
  ``<home>/probes/cpu__<identity key>__mem-<bytes>__threads-<n>.json``. The dispatcher never
  probes inside a call (``now=False``: `FALLBACK_CPU_SPEC` until the probe runs at exit).
- Per-shape set-up costs (`calibration.cold_shape`): ``<home>/cold_shape/<card model>/<device
  key>.json``, per kernel and problem kind (`KINDS`); `load_cold_costs` falls back to another
  card of the model, then to ``models/tables/cold_shape/``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import torch

from attn_dispatch.kernels.sdpa_default import passed_probes, seed_passed_probes
from attn_dispatch.models.identity import CardSpec, DeviceIdentity, slug
from attn_dispatch.models.paths import cold_shape_dir, home, package_version, write_text_atomically

FORMAT = 1
PASSED_MAX_BYTES = 1 << 18
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


def _read_document(path: Path, max_bytes: int, **expected: object) -> dict | None:
    """The JSON object at `path` when it is a file of at most `max_bytes` in our `FORMAT` whose
    fields hold the `expected` values; None otherwise (missing, too large, damaged, another's)."""
    try:
        if not path.is_file() or path.stat().st_size > max_bytes:
            return None
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or any(document.get(k) != v for k, v in {"format": FORMAT, **expected}.items()):
        return None
    return document


def load_passed(identity: DeviceIdentity, cudnn_version: str, root: str | os.PathLike | None = None) -> set[ProbeKey]:
    """The probe keys that passed on this identity and cuDNN version; empty where none were kept or
    the file is damaged or another stack's."""
    document = _read_document(probe_file(identity, cudnn_version, root), PASSED_MAX_BYTES, identity_key=identity.key,
                              cudnn=cudnn_version, attn_dispatch=package_version())
    if document is None:
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
    """Write the passed probe keys (atomically: concurrent writers leave one whole file)."""
    path = probe_file(identity, cudnn_version, root, create=True)
    document = {"format": FORMAT, "identity_key": identity.key, "cudnn": cudnn_version,
                "attn_dispatch": package_version(), "passed": sorted(list(key) for key in passed)[:MAX_KEYS]}
    write_text_atomically(path, json.dumps(document, indent=1))
    return path


class ProbeCache:
    """One device's kept probe results (`for_device`), and what this process has written since."""

    def __init__(self, identity, cudnn_version: str, home: str | None, kept: set, index: int | None = None) -> None:
        self.identity = identity
        self.device_type = identity.device_type
        self.index = index  # the device's CUDA index (None: the current device, or a CPU)
        self.cudnn_version = cudnn_version
        self.home = home
        self.kept = kept

    @classmethod
    def for_device(cls, device: torch.device, home: str | None) -> ProbeCache | None:
        """Seed probe results from the device's file; None off CPU/CUDA, on error, or for a non-current GPU."""
        if device.type not in ("cpu", "cuda"):
            return None
        try:
            if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
                return None
            identity = DeviceIdentity.detect(device)
            cudnn_version = str(torch.backends.cudnn.version() or "") if device.type == "cuda" else ""
            kept = {key for key in load_passed(identity, cudnn_version, home) if key[1] == device.type}
        except Exception:  # noqa: BLE001 - no kept probes: they run as before
            return None
        seed_passed_probes(kept)
        return cls(identity, cudnn_version, home, kept, device.index)

    def save_new(self) -> None:
        """Write the passes the file lacks (not when the current device has changed)."""
        passed = passed_probes(self.device_type) | self.kept
        if passed == self.kept:
            return
        try:
            if self.device_type == "cuda" and self.index is not None and self.index != torch.cuda.current_device():
                return
            save_passed(self.identity, self.cudnn_version, passed, self.home)
        except Exception:  # noqa: BLE001 - an unwritable home costs the next process its probes, nothing else
            return
        self.kept = passed


RATES_MAX_BYTES = 1 << 14
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
    document = _read_document(probe_path(identity, threads, root), RATES_MAX_BYTES, machine=machine_key(identity, threads))
    try:
        spec = document["spec"]
        matrix = {str(dtype): _rate(value) for dtype, value in spec["matrix_flops"].items()}
        rates = {name: _rate(spec[name]) for name in RATE_FIELDS}
        source = str(spec["source"])[:200]
    except (ValueError, KeyError, TypeError, AttributeError):  # none kept (TypeError), or damaged
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


# Probe-free fallback (tests, or a probe that failed): the probe's rates on the project's dev machine,
# rounded down, marked as an estimate (docs/RESULTS.md#where-the-priors-constants-come-from).
FALLBACK_CPU_SPEC = CardSpec(
    name="generic CPU",
    matrix_flops=MappingProxyType({"float16": 150e9, "bfloat16": 250e9, "float32": 200e9, "float64": 120e9}),
    vector_flops=100e9, bandwidth=50e9, memory_bytes=8 * 2**30, compute_units=os.cpu_count() or 1,
    launch_overhead_s=1e-6, source="probe-free fallback constants (the project's 2-core dev machine, rounded)",
    estimated=True,
)


PROBE_AT_EXIT = " (this machine's probe runs when the process exits and serves the next process)"
"""Added to the probe-free constants' source while this machine's probe waits for the exit (`explain` shows it)."""

_measured: dict[int, CardSpec] = {}  # torch threads -> this process's rates (kept or measured: one machine)
_waiting: set[tuple[str, int]] = set()  # (home, torch threads) of the probes registered to run at exit
_lock = threading.Lock()


def probe_cpu_spec(identity: DeviceIdentity | None = None, root: str | os.PathLike | None = None, *,
                   now: bool = True) -> CardSpec:
    """This CPU's rates with the threads torch runs now: the ones this process already has (read or
    measured: for any home), else kept for this machine in the home `root` (`probe_store`), else
    measured now and kept (`now`), else the probe-free constants (`FALLBACK_CPU_SPEC`) while the probe
    waits for the process's exit. Never raises for the home: a home that cannot be written only costs
    the next process its probe."""
    threads = torch.get_num_threads()
    spec = _measured.get(threads)  # a process runs on one machine, whichever home it reads
    if spec is not None:
        return spec
    identity = identity if identity is not None else DeviceIdentity.cpu()
    spec = load_cpu_rates(identity, threads, FALLBACK_CPU_SPEC, root)
    if spec is None and not now:
        waiting = (str(home(root, create=False)), threads)
        with _lock:
            if waiting not in _waiting:
                _waiting.add(waiting)
                atexit.register(_probe_and_keep, identity, threads, root)
        return replace(FALLBACK_CPU_SPEC, source=FALLBACK_CPU_SPEC.source + PROBE_AT_EXIT)
    if spec is None:
        spec = _probe_and_keep(identity, threads, root)
    _measured[threads] = spec
    return spec


def _probe_and_keep(identity: DeviceIdentity, threads: int, root: str | os.PathLike | None) -> CardSpec:
    """Measure this CPU (`cpu_probe.measure_cpu_spec`) and keep the rates for this machine (not the
    constants a failed probe gives); torch's thread count is set to `threads` for the probe (an exit
    may come after the program changed it)."""
    from attn_dispatch.models.cpu_probe import measure_cpu_spec  # imported where a probe runs

    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        spec = measure_cpu_spec()
    finally:
        torch.set_num_threads(previous)
    if not spec.estimated:
        try:
            save_cpu_rates(identity, threads, spec, root)
        except OSError:
            pass
    return spec


KINDS = ("decode", "prefill")
"""Problem kinds measured apart: a decode step (one query row) and a prefill (many)."""
BUNDLED_DIR = Path(__file__).resolve().parent / "tables" / "cold_shape"
COLD_MAX_BYTES = 1 << 20
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
    write_text_atomically(path, json.dumps(document, indent=1, sort_keys=True))
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
        document = _read_document(path, COLD_MAX_BYTES, model_key=identity.model_key)
        try:
            return _checked_seconds(document.get(field, {}))
        except (ValueError, AttributeError):  # no document, or a damaged one: the next candidate
            continue
    return {}


def measured_costs(device: torch.device, home: str | None, field: str = "seconds") -> Costs:
    """`load_cold_costs` of this GPU's card (``field="floor_seconds"``: per-call floors); {} otherwise."""
    if device.type != "cuda":
        return {}
    try:
        return load_cold_costs(DeviceIdentity.detect(device), home=home, field=field)
    except Exception:  # noqa: BLE001 - a missing or damaged file never fails a call: the priors serve
        return {}


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
