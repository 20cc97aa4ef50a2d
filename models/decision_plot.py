"""A table's decision map: per class, the winning kernel of each (log2 Lq, log2 Lk) bucket and its
predicted speed-up over PyTorch's default (``sdpa_default``: listed in the bucket, else predicted
by the table's cost model(s), else by the card's analytic prior), drawn as a PNG: one panel per
class, x = KV length, y = query length, colour = the winning kernel (one hue per family, shades per
variant, a hatch per conversion), contours = the speed-up.

matplotlib is imported here only, lazily, and drawn through its object API (no pyplot state, no
backend switch in the caller's process).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel
from attn_dispatch.models.measured import ClassKey
from attn_dispatch.models.priors import prior_seconds
from attn_dispatch.models.table import TableClass, ThresholdTable

BASELINE = "sdpa_default"
FAMILY_SEPARATOR = "["


def family_of(name: str) -> str:
    """``small_q[splits=8]`` -> ``small_q``; ``convert[bf16->fp32]+sdpa_flash`` -> ``convert+sdpa_flash``."""
    family = inner_kernel(name).split(FAMILY_SEPARATOR, 1)[0]
    return "convert+" + family if name.startswith("convert[") else family


@dataclass(frozen=True)
class MapPanel:
    """One class of a table as grids over its buckets (`q_buckets` rows, `kv_buckets` columns):
    `winners` and `speedup` (predicted sdpa_default seconds / winner seconds; None: unknown) per
    bucket; `source` of sdpa_default's times ("table", "cost model", "prior")."""

    key: ClassKey
    title: str
    q_buckets: tuple[int, ...]
    kv_buckets: tuple[int, ...]
    winners: dict[tuple[int, int], str]
    speedup: dict[tuple[int, int], float | None]
    source: str

    def grid(self, values: dict[tuple[int, int], float | None]) -> np.ndarray:
        """``[len(q_buckets), len(kv_buckets)]`` array of `values` (NaN where missing)."""
        out = np.full((len(self.q_buckets), len(self.kv_buckets)), np.nan)
        for (q, kv), value in values.items():
            if value is not None and math.isfinite(value):
                out[self.q_buckets.index(q), self.kv_buckets.index(kv)] = value
        return out


def _baseline_seconds(table: ThresholdTable, table_class: TableClass, buckets: list[tuple[int, int]]
                      ) -> tuple[dict[tuple[int, int], float], str]:
    """Predicted sdpa_default seconds per bucket not listing it, and where they came from."""
    device_type = table.identity.device_type
    problems = [table_class.problem_at(bucket, device_type) for bucket in buckets]
    if not problems:
        return {}, "table"
    if table.usable_models:
        seconds = table.model_seconds(problems, [BASELINE] * len(problems))
        return {b: float(s) for b, s in zip(buckets, seconds, strict=True)}, "cost model"
    kernel = SdpaDefaultKernel()
    return {b: prior_seconds(p, kernel, table.spec) for b, p in zip(buckets, problems, strict=True)}, "prior"


def class_panel(table: ThresholdTable, key: ClassKey) -> MapPanel:
    """The panel of one class of `table`."""
    table_class = table.classes[key]
    cells = {bucket: cell for bucket, cell in table_class.cells.items() if cell.ranking}
    listed = {bucket: dict(cell.ranking).get(BASELINE) for bucket, cell in cells.items()}
    missing = [bucket for bucket, seconds in listed.items() if seconds is None]
    predicted, source = _baseline_seconds(table, table_class, missing)
    speedup: dict[tuple[int, int], float | None] = {}
    for bucket, cell in cells.items():
        baseline = listed[bucket] if listed[bucket] is not None else predicted.get(bucket)
        winner_s = cell.ranking[0][1]
        speedup[bucket] = baseline / winner_s if baseline is not None and winner_s > 0 else None
    q_all = [b[0] for b in cells]
    kv_all = [b[1] for b in cells]
    t = table_class.template
    title = f"{key.describe()}\n(B{t.batch} H{t.q_heads}/{t.kv_heads} D{t.head_dim})"
    return MapPanel(
        key=key, title=title,
        q_buckets=tuple(range(min(q_all), max(q_all) + 1)) if cells else (),
        kv_buckets=tuple(range(min(kv_all), max(kv_all) + 1)) if cells else (),
        winners={bucket: cell.ranking[0][0] for bucket, cell in cells.items()},
        speedup=speedup, source=source if missing else "table",
    )


def decision_panels(table: ThresholdTable) -> list[MapPanel]:
    """One panel per class of `table`, in class order (dtype, causality, mask kind, ...)."""
    return [class_panel(table, key) for key in sorted(table.classes)]


# One hue per family (matplotlib's tab10 colours; PyTorch's default a light grey, so the kernels
# that beat it stand out), shades per variant. A convert kernel takes the colour of the kernel it
# runs after converting, hatched with one pattern per conversion.
FAMILY_COLOURS = {
    "sdpa_default": "#c7c7c7", "sdpa_flash": "#ff7f0e", "sdpa_cudnn": "#d62728", "sdpa_efficient": "#9467bd",
    "sdpa_math": "#e377c2", "math": "#8c564b", "chunked": "#2ca02c", "small_q": "#1f77b4",
}
OTHER_FAMILY_COLOUR = "#17becf"
# Variant shades span this lightness range (HLS): darker is too close to black, lighter to white.
SHADE_LIGHTNESS = (0.28, 0.72)
CONVERT_HATCHES = ("////", "\\\\\\\\", "xxxx", "....", "++++", "||||", "----", "oo")
# Hatch lines in white on fills darker than this luminance, else in black.
DARK_FILL = 0.45
BORDER_WIDTH = 0.5  # thin black line between buckets of different kernels: small regions stay visible
# Speed-up contour levels (x over sdpa_default) drawn on every panel.
SPEEDUP_LEVELS = (1.25, 2.0, 4.0, 8.0, 16.0)
# Layout, chosen by eye on the 12-class H200 table (docs/images/decision_map_h200.png).
PANEL_INCHES = (4.6, 3.9)
HEADER_INCHES = 1.6  # title and legend
MAX_COLUMNS = 4
DPI = 110
LEGEND_COLUMNS = 8
LEGEND_ROW_HEIGHT = 0.025  # figure fraction per legend row
MARGIN = 0.02  # figure fraction below the legend
TITLE_TOP = 0.96  # figure fraction where the panels end
FONT = {"title": 10, "panel": 8, "ticks": 7}
CONTOUR_WIDTH, OUTLINE_WIDTH = 1.0, 2.4  # white contour lines in a black outline: visible on every colour
MAX_TICKS = 6
HALF_CELL = 0.5  # buckets are centred on integers: cells span +-0.5
KIBI = 1024


def _require_matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as missing:
        raise ImportError(
            f"drawing the winning kernels needs matplotlib ({missing}); install it with `pip install matplotlib` "
            "or run `attn-dispatch show` without --plot"
        ) from None
    return Figure, FigureCanvasAgg


def inner_kernel(name: str) -> str:
    """``convert[fp16->fp32]+chunked[q=512,kv=4096]`` -> ``chunked[q=512,kv=4096]``; other names as given."""
    return name.split("]+", 1)[1] if name.startswith("convert[") and "]+" in name else name


def conversion_of(name: str) -> str | None:
    """``convert[fp16->fp32]+...`` -> ``fp16->fp32``; None for a kernel that converts nothing."""
    return name[len("convert["):name.index("]")] if name.startswith("convert[") and "]" in name else None


def _shade(base: str, index: int, count: int) -> tuple[float, float, float, float]:
    """Variant `index` of `count` in the hue of `base`: darkest first, over `SHADE_LIGHTNESS`."""
    import colorsys

    from matplotlib.colors import to_rgb

    if count == 1:
        return (*to_rgb(base), 1.0)
    hue, _, saturation = colorsys.rgb_to_hls(*to_rgb(base))
    low, high = SHADE_LIGHTNESS
    return (*colorsys.hls_to_rgb(hue, low + (high - low) * index / (count - 1), saturation), 1.0)


def kernel_colours(names: list[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per kernel name: its family's hue (`FAMILY_COLOURS`), one shade per variant; a
    convert kernel gets the colour of the kernel it runs (`inner_kernel`)."""
    inner = sorted({inner_kernel(name) for name in names})
    by_family: dict[str, list[str]] = {}
    for name in inner:
        by_family.setdefault(family_of(name), []).append(name)
    colours = {}
    for family, members in by_family.items():
        base = FAMILY_COLOURS.get(family, OTHER_FAMILY_COLOUR)
        for i, name in enumerate(members):
            colours[name] = _shade(base, i, len(members))
    return {name: colours[inner_kernel(name)] for name in names}


def convert_hatches(names: list[str]) -> dict[str, str]:
    """A hatch pattern per convert kernel name, one per conversion (``fp16->fp32`` ...)."""
    conversions = sorted({c for c in map(conversion_of, names) if c is not None})
    pattern = {c: CONVERT_HATCHES[i % len(CONVERT_HATCHES)] for i, c in enumerate(conversions)}
    return {name: pattern[conversion_of(name)] for name in names if conversion_of(name) is not None}


def _hatch_colour(fill: tuple[float, ...]) -> str:
    luminance = 0.299 * fill[0] + 0.587 * fill[1] + 0.114 * fill[2]
    return "white" if luminance < DARK_FILL else "black"


def _length_label(bucket: int) -> str:
    length = 2**bucket
    return f"{length // KIBI}k" if length >= KIBI else str(length)


def _draw_convert_hatches(axes, panel: MapPanel, colours: dict, hatches: dict) -> None:
    """A hatched square over every bucket a convert kernel wins."""
    from matplotlib.patches import Rectangle

    for (q, kv), name in panel.winners.items():
        if name in hatches:
            axes.add_patch(Rectangle((kv - HALF_CELL, q - HALF_CELL), 1, 1, fill=False, hatch=hatches[name],
                                     edgecolor=_hatch_colour(colours[name]), linewidth=0))


def _draw_borders(axes, panel: MapPanel) -> None:
    """A thin line between neighbouring buckets won by different kernels."""
    from matplotlib.collections import LineCollection

    segments = []
    for (q, kv), name in panel.winners.items():
        right, above = panel.winners.get((q, kv + 1)), panel.winners.get((q + 1, kv))
        if right is not None and right != name:
            segments.append([(kv + HALF_CELL, q - HALF_CELL), (kv + HALF_CELL, q + HALF_CELL)])
        if above is not None and above != name:
            segments.append([(kv - HALF_CELL, q + HALF_CELL), (kv + HALF_CELL, q + HALF_CELL)])
    axes.add_collection(LineCollection(segments, colors="black", linewidths=BORDER_WIDTH))


def _draw_panel(axes, panel: MapPanel, colours: dict, hatches: dict, order: list[str]) -> None:
    from matplotlib import patheffects
    from matplotlib.colors import ListedColormap

    index = {name: i for i, name in enumerate(order)}
    grid = panel.grid({b: float(index[w]) for b, w in panel.winners.items()})
    cmap = ListedColormap([colours[name] for name in order]).with_extremes(bad="white")
    q0, kv0 = panel.q_buckets[0], panel.kv_buckets[0]
    extent = (kv0 - HALF_CELL, panel.kv_buckets[-1] + HALF_CELL, q0 - HALF_CELL, panel.q_buckets[-1] + HALF_CELL)
    axes.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-HALF_CELL, vmax=len(order) - HALF_CELL, origin="lower",
                extent=extent, aspect="auto", interpolation="nearest")
    _draw_convert_hatches(axes, panel, colours, hatches)
    _draw_borders(axes, panel)
    speed = panel.grid(panel.speedup)
    if np.isfinite(speed).sum() >= 4 and min(speed.shape) >= 2:
        levels = [math.log2(level) for level in SPEEDUP_LEVELS]
        log_speed = np.ma.masked_invalid(np.log2(np.where(speed > 0, speed, np.nan)))
        outline = [patheffects.withStroke(linewidth=OUTLINE_WIDTH, foreground="black")]
        contours = axes.contour(panel.kv_buckets, panel.q_buckets, log_speed, levels=levels, colors="white",
                                linewidths=CONTOUR_WIDTH)
        contours.set(path_effects=outline)
        for label in axes.clabel(contours, fmt=lambda v: f"{2**v:g}x", fontsize=FONT["ticks"], colors="white"):
            label.set_path_effects(outline)
    for ticks, setter, labels in ((panel.kv_buckets, axes.set_xticks, axes.set_xticklabels),
                                  (panel.q_buckets, axes.set_yticks, axes.set_yticklabels)):
        shown = list(ticks)[:: max(1, len(ticks) // MAX_TICKS)]
        setter(shown)
        labels([_length_label(b) for b in shown], fontsize=FONT["ticks"])
    axes.set_xlabel("KV length (Lk)", fontsize=FONT["panel"])
    axes.set_ylabel("query length (Lq)", fontsize=FONT["panel"])
    axes.set_title(panel.title, fontsize=FONT["panel"])


def plot_decision_map(table: ThresholdTable, path: str | os.PathLike) -> Path:
    """Write the decision map of `table` to `path` (PNG); returns the path. ImportError without
    matplotlib (saying how to install it), ValueError for a table with no class to draw."""
    Figure, FigureCanvasAgg = _require_matplotlib()
    from matplotlib.patches import Patch

    panels = [panel for panel in decision_panels(table) if panel.winners]
    if not panels:
        raise ValueError("this table has no decision cells to draw; calibrate the card again")
    order = sorted({w for panel in panels for w in panel.winners.values()}, key=lambda n: (family_of(inner_kernel(n)), conversion_of(n) or "", n))
    colours, hatches = kernel_colours(order), convert_hatches(order)
    columns = min(MAX_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows + HEADER_INCHES), dpi=DPI)
    FigureCanvasAgg(figure)
    for i, panel in enumerate(panels):
        _draw_panel(figure.add_subplot(rows, columns, i + 1), panel, colours, hatches, order)
    sources = sorted({panel.source for panel in panels})
    identity = table.identity
    figure.suptitle(
        f"{identity.model_key} ({identity.software_key}), table of {table.provenance.created}\n"
        f"colour = predicted fastest kernel (hue: family, shade: variant, hatch: convert first); contours = its "
        f"predicted speed-up over PyTorch's default "
        f"(sdpa_default's times from the {' and '.join(sources)})",
        fontsize=FONT["title"],
    )
    handles = [Patch(facecolor=colours[name], hatch=hatches.get(name), label=name,
                     edgecolor=_hatch_colour(colours[name]) if name in hatches else "none", linewidth=0)
               for name in order]
    legend_columns = min(LEGEND_COLUMNS, len(handles))
    figure.legend(handles=handles, loc="lower center", ncol=legend_columns, fontsize=FONT["ticks"], frameon=False)
    legend_rows = math.ceil(len(handles) / legend_columns)
    figure.tight_layout(rect=(0, MARGIN + LEGEND_ROW_HEIGHT * legend_rows, 1, TITLE_TOP))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
