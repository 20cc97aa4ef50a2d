"""Accuracy policy: which lossy dtype conversions a caller accepts (fp32 -> bf16/fp16, fp16 <-> bf16; lossless ones
are always allowed), and the per-dtype error tolerances against a float64 reference (`TOLERANCES`)."""

from __future__ import annotations

from dataclasses import dataclass

from attn_dispatch.kernels.problem import SHORT_DTYPE_NAMES

LONG_DTYPE_NAMES = {short: long for long, short in SHORT_DTYPE_NAMES.items()}

# (source, target) pairs whose every value is exactly representable in the target.
LOSSLESS_CONVERSIONS = frozenset(
    {
        ("float16", "float32"),
        ("bfloat16", "float32"),
        ("float16", "float64"),
        ("bfloat16", "float64"),
        ("float32", "float64"),
    }
)


def parse_conversion(text: str) -> tuple[str, str]:
    """``"fp32->bf16"`` -> ``("float32", "bfloat16")``."""
    parts = text.split("->")
    if len(parts) != 2 or any(p.strip() not in LONG_DTYPE_NAMES for p in parts):
        raise ValueError(f"conversion {text!r} is not of the form 'SRC->DST' with SRC, DST in "
                         f"{sorted(LONG_DTYPE_NAMES)} (e.g. 'fp32->bf16')")
    return LONG_DTYPE_NAMES[parts[0].strip()], LONG_DTYPE_NAMES[parts[1].strip()]


def format_conversion(source: str, target: str) -> str:
    return f"{SHORT_DTYPE_NAMES[source]}->{SHORT_DTYPE_NAMES[target]}"


def is_lossless(source: str, target: str) -> bool:
    return source == target or (source, target) in LOSSLESS_CONVERSIONS


@dataclass(frozen=True)
class AccuracyPolicy:
    """The lossy conversions a caller accepts: ``AccuracyPolicy()`` none, ``AccuracyPolicy.allowing("fp32->bf16")``,
    ``AccuracyPolicy.allowing("any")``."""

    lossy: frozenset[tuple[str, str]] = frozenset()
    any_lossy: bool = False

    @classmethod
    def allowing(cls, *conversions: str) -> AccuracyPolicy:
        if "any" in conversions:
            return cls(any_lossy=True)
        return cls(lossy=frozenset(parse_conversion(c) for c in conversions))

    def allows(self, source: str, target: str) -> bool:
        return is_lossless(source, target) or self.any_lossy or (source, target) in self.lossy

    def describe(self) -> str:
        if self.any_lossy:
            return "any lossy conversion"
        if not self.lossy:
            return "lossless only"
        return ", ".join(sorted(format_conversion(s, t) for s, t in self.lossy))


LOSSLESS = AccuracyPolicy()


# tolerances: relative L2 error and largest element error / largest reference element, each about 10x the largest
# error seen in the contract suite (docs/RESULTS.md#kernels-per-call)


@dataclass(frozen=True)
class Tolerance:
    relative_l2: float
    relative_max: float

    def accepts(self, relative_l2: float, relative_max: float) -> bool:
        return relative_l2 <= self.relative_l2 and relative_max <= self.relative_max


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(relative_l2=1e-10, relative_max=1e-9),
    "float32": Tolerance(relative_l2=2e-5, relative_max=1e-4),
    "float16": Tolerance(relative_l2=5e-3, relative_max=2e-2),
    "bfloat16": Tolerance(relative_l2=3e-2, relative_max=1e-1),
}


def looser(a: Tolerance, b: Tolerance) -> Tolerance:
    return Tolerance(max(a.relative_l2, b.relative_l2), max(a.relative_max, b.relative_max))
