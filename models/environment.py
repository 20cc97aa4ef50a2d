"""The ``ATTN_DISPATCH_*`` environment variables, each declared, read and validated only here.

Readers ask at the moment they need a value (``HOME.read()``); `check()` reads them all, so a
`Dispatcher`, `install()` or `patched()` fails at start with one line naming a bad value. Switches
take 1/0, true/false, on/off, yes/no; empty or unset is the default. docs/CONFIG.md's table is
`markdown_table()` (a test keeps them equal). In `models` because `models.paths` reads ``HOME``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

# Binary (IEC) and decimal (SI) units, as nvidia-smi / rocm-smi (GiB) and spec sheets (GB) write them.
UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
# The largest budget accepted: 1 PiB. The biggest single machines hold tens of TiB of RAM and the
# biggest accelerators a few hundred GiB, so a budget above this is a typo (e.g. "99999999999TiB").
MAX_MEMORY_BUDGET = 2**50
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)\s*$")


def parse_memory_size(value: int | float | str, *, name: str = "memory_budget") -> int:
    """``"16GiB"``, ``"512MiB"``, ``"16GB"``, ``"1.5G"``, ``"1048576"`` or an int -> bytes
    (``K``/``M``/``G``/``T`` binary, ``KB``/``MB``/``GB``/``TB`` decimal); ValueError naming `name`
    otherwise (negative, unknown unit, over `MAX_MEMORY_BUDGET`)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a size such as '16GiB' or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str):
        match = _SIZE.match(value.lower())
        if match is None or match["unit"] not in UNITS:
            raise ValueError(
                f"{name}={value!r} is not a memory size: write a number with an optional unit, "
                f"e.g. '16GiB', '512MiB', '16GB' or '17179869184' (units: KiB MiB GiB TiB, KB MB GB TB)"
            )
        number, unit = float(match["number"]), match["unit"]
    else:
        raise ValueError(f"{name} must be a size such as '16GiB' or a number of bytes, got {type(value).__name__}")
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"{name} must be a finite size >= 0 bytes, got {value!r}")
    size = number * UNITS[unit]
    if size > MAX_MEMORY_BUDGET:
        raise ValueError(f"{name}={value!r} is more memory than any machine has (the limit is "
                         f"{format_bytes(MAX_MEMORY_BUDGET)}, MAX_MEMORY_BUDGET); write e.g. '16GiB'")
    return int(size)


def format_bytes(count: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"unknown"``."""
    if count is None:
        return "unknown"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


PREFIX = "ATTN_DISPATCH_"
ON_VALUES = ("1", "true", "on", "yes")
OFF_VALUES = ("0", "false", "off", "no")


def _raw(name: str) -> str:
    """The variable's value without surrounding spaces; empty when unset."""
    return os.environ.get(name, "").strip()


@dataclass(frozen=True)
class Switch:
    """An on/off variable."""

    name: str
    on_by_default: bool
    effect: str
    values: ClassVar[str] = "1/0, true/false, on/off, yes/no (any case)"

    @property
    def default(self) -> str:
        return "on" if self.on_by_default else "off"

    def read(self) -> bool:
        """Whether the switch is on now; ValueError (one line) for any other value."""
        text = _raw(self.name).lower()
        if not text:
            return self.on_by_default
        if text in ON_VALUES:
            return True
        if text in OFF_VALUES:
            return False
        raise ValueError(f"{self.name}={os.environ[self.name]!r} is not an on/off value: use {self.values}, "
                         f"or unset it for the default ({self.default})")


@dataclass(frozen=True)
class _Valued:
    """A variable that holds a value; unset or empty means `default` (in words, for the docs)."""

    name: str
    default: str
    effect: str

    def text(self) -> str | None:
        """The value as written, without surrounding spaces; None when unset or empty."""
        return _raw(self.name) or None


class Size(_Valued):
    """A memory size such as ``16GiB`` (`models.environment.parse_memory_size`)."""

    values: ClassVar[str] = "a size: 16GiB, 512MiB, 16GB, 1.5G or a number of bytes"

    def read(self) -> int | None:
        """Bytes, or None when unset or empty; ValueError (one line) for anything not a size."""
        text = self.text()
        if text is None:
            return None
        try:
            return parse_memory_size(text, name=self.name)
        except ValueError as error:
            raise ValueError(f"{error}. Fix the environment variable {self.name} (e.g. {self.name}=16GiB) or "
                             "unset it") from None


class PathVariable(_Valued):
    """A file or directory."""

    values: ClassVar[str] = "a path"

    def read(self) -> Path | None:
        """The path, or None when unset or empty (the reader's default applies)."""
        text = self.text()
        return None if text is None else Path(text)


class Text(_Valued):
    """Free text."""

    values: ClassVar[str] = "any text"

    def read(self) -> str | None:
        """The text, or None when unset or empty."""
        return self.text()


Variable = Switch | Size | PathVariable | Text

HOME = PathVariable(
    f"{PREFIX}HOME", "the per-user cache directory (`~/.cache/attn-dispatch` on Linux)",
    "Where threshold tables, calibration journals, first-call tunings, backend probes and the built fast path live.",
)
MEMORY_BUDGET = Size(
    f"{PREFIX}MEMORY_BUDGET", "none (free memory only)",
    "Caps the extra memory one attention call may use, e.g. `16GiB` to stand in for a 16 GB card on a bigger one. "
    "`Dispatcher(memory_budget=...)` wins over it.",
)
MEASURE = Switch(
    f"{PREFIX}MEASURE", True,
    "Measuring on your own calls: a size bucket no measured table entry decides runs its first calls with one "
    "candidate each (PyTorch's own choice first), keeps PyTorch's unless another is faster beyond the noise, and "
    "stores the result in the home. `Dispatcher(measure=...)` wins over it.",
)
IGNORE_SDPA_KERNEL = Switch(
    f"{PREFIX}IGNORE_SDPA_KERNEL", False,
    "On: the dispatcher chooses among its own kernels even inside `torch.nn.attention.sdpa_kernel(...)`, except "
    "that a mask together with `is_causal=True` inside `sdpa_kernel([SDPBackend.MATH])` still raises RuntimeError, "
    "as PyTorch does (docs/USAGE.md); off: calls made there are PyTorch's own. Read when a dispatcher, `install()` or `patched()` starts; "
    "`respect_sdpa_kernel()` wins over it.",
)
HOT_PATH = Switch(
    f"{PREFIX}HOT_PATH", True,
    "A shape called again is matched by one C++ check of its tensors instead of a dictionary lookup. Read when a "
    "dispatcher is made.",
)
FAST_PATH = Switch(
    f"{PREFIX}FAST_PATH", True,
    "`attention`, `patched()` and `register_transformers()` serve warm calls from the compiled C++ entry point "
    "where `attn-dispatch build-fast-path` (or `calibrate`) built it. Read when a dispatcher is made.",
)
LOG = Switch(
    f"{PREFIX}LOG", False,
    "Logs each new decision once at INFO on stderr (otherwise at DEBUG on the `attn_dispatch` logger).",
)
RECORD = PathVariable(
    f"{PREFIX}RECORD", "none",
    "Appends every new size bucket the dispatcher decides to this JSON Lines file, for "
    "`attn-dispatch calibrate --workload FILE`.",
)
TRAINING_PROFILE = PathVariable(
    f"{PREFIX}TRAINING_PROFILE", "`<home>/training_profile.json` when it exists",
    "Forward+backward timings that rank kernels for training calls "
    "(`python -m attn_dispatch.calibration.training_profile` writes one).",
)
COMMIT = Text(
    f"{PREFIX}COMMIT", "the checkout's git commit",
    "The commit `attn-dispatch bench` reports where the code has no `.git` (a copy on another machine).",
)

VARIABLES: tuple[Variable, ...] = (
    HOME, MEMORY_BUDGET, MEASURE, IGNORE_SDPA_KERNEL, HOT_PATH, FAST_PATH, LOG, RECORD,
    TRAINING_PROFILE, COMMIT,
)


def check() -> None:
    """Read every variable now: ValueError (one line, naming the variable and the values it
    accepts) for the first bad one."""
    for variable in VARIABLES:
        variable.read()


def markdown_table() -> str:
    """docs/CONFIG.md's table: name, values, default, effect of every variable."""
    rows = ["| variable | values | default | effect |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.values} | {v.default} | {v.effect} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
