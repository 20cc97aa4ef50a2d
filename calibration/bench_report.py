"""`attn-dispatch bench`'s report: the dispatcher's ratios to the oracle and to PyTorch's default per
scenario (`summarise`), the report in Markdown and JSON (`BenchReport`) and its one-line verdict
(`verdict`), from the harness's results (`calibration.scenario_bench`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from attn_dispatch.calibration.noise import MachineState
from attn_dispatch.calibration.scenario_bench import ShapeResult

FORMAT_VERSION = 1
MS = 1e3  # seconds -> milliseconds
NOT_OK = ("infeasible", "failed", "inaccurate", "skipped")
VERDICT_MARGIN = 0.03  # a geo-mean within this fraction of PyTorch's default time: no gain, no loss


def geometric_mean(values: list[float]) -> float | None:
    """Geometric mean of positive finite values (None when there are none)."""
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _worst(shapes: list[ShapeResult], role: str, paired: bool = False) -> tuple[float | None, str | None]:
    ratio = ShapeResult.paired_ratio if paired else ShapeResult.ratio
    rated = [(r, s.shape.label) for s in shapes if (r := ratio(s, role)) is not None]
    return max(rated) if rated else (None, None)


def ran_pytorchs_kernel(shape: ShapeResult) -> bool:
    """Whether the dispatcher ran the kernel PyTorch's default path runs on `shape`: its ratio to that path is then
    call overhead and timing noise, not a speed-up."""
    pytorch = shape.path("pytorch")
    return pytorch is not None and shape.chosen == _kernel_of(pytorch.label)


def summarise(shapes: list[ShapeResult]) -> dict:
    """Ratios of the dispatcher to the oracle and to PyTorch's default over `shapes` (of the
    medians, and paired per round: ``*_paired_*``). ``pytorch_best`` is over the shapes where the
    dispatcher ran another kernel than PyTorch's (None where it ran PyTorch's on every shape rated:
    ``pytorch_same_kernel`` counts those)."""
    worst_oracle, worst_oracle_shape = _worst(shapes, "oracle")
    worst_pytorch, worst_pytorch_shape = _worst(shapes, "pytorch")
    to_pytorch = [s.ratio("pytorch") for s in shapes if s.ratio("pytorch") is not None]
    other_kernel = [s.ratio("pytorch") for s in shapes if s.ratio("pytorch") is not None and not ran_pytorchs_kernel(s)]
    failures = Counter((path.label, path.status) for shape in shapes for path in shape.paths
                       if path.status in NOT_OK)
    return {
        "shapes": len(shapes),
        "oracle_geomean": geometric_mean([s.ratio("oracle") for s in shapes]),
        "oracle_worst": worst_oracle, "oracle_worst_shape": worst_oracle_shape,
        "pytorch_geomean": geometric_mean(to_pytorch),
        "pytorch_best": min(other_kernel) if other_kernel else None,
        "pytorch_same_kernel": len(to_pytorch) - len(other_kernel),
        "pytorch_worst": worst_pytorch, "pytorch_worst_shape": worst_pytorch_shape,
        "oracle_paired_geomean": geometric_mean([s.paired_ratio("oracle") for s in shapes]),
        "oracle_paired_worst": _worst(shapes, "oracle", paired=True)[0],
        "pytorch_paired_geomean": geometric_mean([s.paired_ratio("pytorch") for s in shapes]),
        "pytorch_paired_worst": _worst(shapes, "pytorch", paired=True)[0],
        "chose_oracle": sum(1 for s in shapes if s.oracle is not None and s.chosen == _kernel_of(s.oracle.label)),
        "dispatcher_failures": sum(1 for s in shapes if (p := s.path("dispatcher")) is not None and p.status != "ok"),
        "pytorch_failures": sum(1 for s in shapes if (p := s.path("pytorch")) is not None and p.status != "ok"),
        "failures": [{"path": label, "status": status, "shapes": count}
                     for (label, status), count in sorted(failures.items())],
    }


def _kernel_of(label: str) -> str:
    """The kernel a path label stands for."""
    return {"pytorch_default": "sdpa_default", "pytorch_math": "sdpa_math"}.get(label, label)


@dataclass
class BenchReport:
    """A whole bench run: its conditions and every shape's result."""

    conditions: dict
    shapes: list[ShapeResult] = field(default_factory=list)
    machine: MachineState | None = None

    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(s.shape.suite for s in self.shapes))

    def summaries(self) -> dict[str, dict]:
        out = {name: summarise([s for s in self.shapes if s.shape.suite == name]) for name in self.scenarios()}
        out["all"] = summarise(self.shapes)
        return out

    def to_dict(self) -> dict:
        return {"format_version": FORMAT_VERSION, "kind": "attn-dispatch bench", "conditions": self.conditions,
                "machine": None if self.machine is None else self.machine.to_dict(),
                "summary": self.summaries(), "shapes": [s.to_dict() for s in self.shapes], "verdict": self.verdict()}

    def verdict(self) -> str:
        """One line: gain or no gain on this machine over PyTorch's default, and why."""
        return verdict(self.shapes, self.machine, self.conditions.get("table used"))

    def markdown(self) -> str:
        lines = ["# attn-dispatch bench", "", "Conditions:", ""]
        lines += [f"- {key}: {value}" for key, value in self.conditions.items()]
        lines += ["", "Ratios are dispatcher time / other time (below 1: the dispatcher is faster). Oracle = the "
                  "fastest single kernel measured on that shape (PyTorch's default included). Same kernel: the "
                  "dispatcher ran the kernel PyTorch's default runs, so its ratio to it is call overhead and timing "
                  "noise, not a speed-up; the best ratio to PyTorch's default is over the shapes where it ran another.", "",
                  "| scenario | shapes | dispatcher / oracle (geo-mean) | worst | dispatcher / PyTorch default "
                  "(geo-mean) | best (another kernel) | worst | chose the oracle |", "|---|---|---|---|---|---|---|---|"]
        for name, s in self.summaries().items():
            lines.append(f"| {name} | {s['shapes']} | {_x(s['oracle_geomean'])} | {_x(s['oracle_worst'])} | "
                         f"{_x(s['pytorch_geomean'])} | {_best(s)} | {_x(s['pytorch_worst'])} | "
                         f"{s['chose_oracle']}/{s['shapes']} |")
        for name in self.scenarios():
            lines += ["", f"## {name}", "", "| shape | dispatcher chose | dispatcher ms (spread) | oracle | oracle ms | "
                      "PyTorch default ms | math ms | / oracle | / PyTorch | not run or failed |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            lines += [_row(s) for s in self.shapes if s.shape.suite == name]
        lines += ["", f"**Verdict:** {self.verdict()}"]
        return "\n".join(lines) + "\n"


def verdict(shapes: list[ShapeResult], machine: MachineState | None, table: str | None = None) -> str:
    """``gain on this machine: ...`` or ``no gain on this machine: ...``, with the reason (the
    geo-mean over `shapes` against `VERDICT_MARGIN`, the shapes that kept PyTorch's own call, a
    busy machine)."""
    rated = [s for s in shapes if s.ratio("pytorch") is not None]
    busy = machine is not None and machine.busy
    caveat = (f"; the machine was {machine.words().split(' (')[0]}, so these ratios carry its noise: run it again "
              "when it is quieter") if busy else ""
    if not rated:
        return f"no verdict: no shape timed both the dispatcher and PyTorch's default{caveat}"
    ratio = geometric_mean([s.ratio("pytorch") for s in rated])
    kept = sum(1 for s in rated if ran_pytorchs_kernel(s))
    measured = f"{ratio:.2f}x PyTorch's default time (geo-mean over {len(rated)} shapes)"
    if kept == len(rated):
        why = (f"it kept PyTorch's own call on all {len(rated)} shapes, so it runs what PyTorch runs and the "
               f"{ratio:.2f}x is its call overhead and timing noise")
        if table and table.startswith("analytic prior"):
            why += " (no calibrated table here: `attn-dispatch calibrate` measures this machine's)"
        return f"no gain on this machine: {why}{caveat}"
    if ratio < 1 - VERDICT_MARGIN and busy:  # a gain read off a busy machine's noise is not claimed
        return (f"no verdict while this machine is busy: the dispatcher took {measured} and ran another kernel than "
                f"PyTorch's on {len(rated) - kept} of them{caveat}")
    if ratio < 1 - VERDICT_MARGIN:
        return (f"gain on this machine: the dispatcher took {measured}; it ran another kernel than PyTorch's on "
                f"{len(rated) - kept} of them")
    if ratio <= 1 + VERDICT_MARGIN:
        return (f"no gain on this machine: the dispatcher took {measured}, within {VERDICT_MARGIN:.0%} of it, "
                f"the bench's noise{caveat}")
    other = geometric_mean([s.ratio("pytorch") for s in rated if not ran_pytorchs_kernel(s)])
    other_words = f"its other kernels ran {other:.2f}x PyTorch's time on the {_shapes(len(rated) - kept)} where it chose them"
    if other <= 1 + VERDICT_MARGIN:  # the slow reading is on the shapes where it ran PyTorch's own kernel
        return (f"no gain on this machine: the dispatcher took {measured}; {other_words}, and the rest is its call "
                f"overhead and timing noise on the {_shapes(kept)} where it kept PyTorch's call{caveat}")
    return (f"no gain on this machine: the dispatcher took {measured}; {other_words}"
            f"{caveat or ' (`attn-dispatch check` re-measures its table on this machine)'}")


def _shapes(count: int) -> str:
    return f"{count} shape{'' if count == 1 else 's'}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _best(summary: dict) -> str:
    """The best ratio to PyTorch's default where the dispatcher ran another kernel; ``same kernel`` where it ran
    PyTorch's on every shape rated."""
    if summary["pytorch_best"] is None and summary["pytorch_same_kernel"]:
        return "same kernel"
    return _x(summary["pytorch_best"])


def _ratio_cell(shape: ShapeResult, role: str) -> str:
    """The dispatcher's ratio to the oracle or PyTorch's default (`role`), marked ``same kernel`` where the dispatcher
    ran that very kernel."""
    ratio = _x(shape.ratio(role))
    other = shape.oracle if role == "oracle" else shape.path(role)
    same = other is not None and shape.chosen == _kernel_of(other.label)
    return f"same kernel ({ratio})" if ratio != "-" and same else ratio


def _ms(shape: ShapeResult, role: str | None = None, label: str | None = None) -> str:
    path = shape.path(role) if role else next((p for p in shape.paths if p.label == label), None)
    if path is None:
        return "-"
    if path.status != "ok":
        return path.status
    text = f"{path.median_s * MS:.3f}"
    return f"{text} ({path.spread:.0%})" if role == "dispatcher" else text


def _row(shape: ShapeResult) -> str:
    oracle = shape.oracle
    problems = sorted({f"{p.label}: {p.status}" for p in shape.paths if p.status in NOT_OK})
    oracle_ms = f"{oracle.median_s * MS:.3f}" if oracle else "-"
    return (f"| {shape.shape.label} | {shape.chosen or '-'} | {_ms(shape, 'dispatcher')} | "
            f"{_kernel_of(oracle.label) if oracle else '-'} | {oracle_ms} | {_ms(shape, 'pytorch')} | {_ms(shape, label='math')} | "
            f"{_ratio_cell(shape, 'oracle')} | {_ratio_cell(shape, 'pytorch')} | {'; '.join(problems) or '-'} |")
