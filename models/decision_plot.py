"""Draw a table's decision map (`models.decision_map`) as a PNG: one panel per class, x = KV
length, y = query length (log2 buckets), colour = the predicted fastest kernel (one hue per
family, shades per variant), contours = predicted speed-up over PyTorch's default.

matplotlib is imported here only, lazily, and drawn through its object API (no pyplot state, no
backend switch in the caller's process).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from attn_dispatch.models.decision_map import MapPanel, decision_panels, family_of
from attn_dispatch.models.table import ThresholdTable

# One sequential colormap per family: the hue says the family, the shade the variant.
FAMILY_COLORMAPS = {
    "sdpa_flash": "Oranges", "sdpa_cudnn": "Reds", "sdpa_efficient": "Purples", "sdpa_default": "Greys",
    "sdpa_math": "RdPu", "math": "cividis", "chunked": "Greens", "small_q": "Blues",
}
CONVERT_COLORMAP = "YlGn"
# Shades are taken from this part of each colormap (lighter ends are too pale on white).
SHADE_RANGE = (0.45, 0.9)
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
            f"drawing a decision map needs matplotlib ({missing}); install it with `pip install matplotlib` "
            "or run `attn-dispatch show` without --plot"
        ) from None
    return Figure, FigureCanvasAgg


def kernel_colours(names: list[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per kernel name: its family's colormap, variants spread over `SHADE_RANGE`."""
    from matplotlib import colormaps

    by_family: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        by_family.setdefault(family_of(name), []).append(name)
    colours = {}
    for family, members in by_family.items():
        cmap = colormaps[FAMILY_COLORMAPS.get(family, CONVERT_COLORMAP if family.startswith("convert") else "Greys")]
        low, high = SHADE_RANGE
        for i, name in enumerate(members):
            shade = (low + high) / 2 if len(members) == 1 else high - (high - low) * i / (len(members) - 1)
            colours[name] = cmap(shade)
    return colours


def _length_label(bucket: int) -> str:
    length = 2**bucket
    return f"{length // KIBI}k" if length >= KIBI else str(length)


def _draw_panel(axes, panel: MapPanel, colours: dict, order: list[str]) -> None:
    from matplotlib import patheffects
    from matplotlib.colors import ListedColormap

    index = {name: i for i, name in enumerate(order)}
    grid = panel.grid({b: float(index[w]) for b, w in panel.winners.items()})
    cmap = ListedColormap([colours[name] for name in order]).with_extremes(bad="white")
    q0, kv0 = panel.q_buckets[0], panel.kv_buckets[0]
    extent = (kv0 - HALF_CELL, panel.kv_buckets[-1] + HALF_CELL, q0 - HALF_CELL, panel.q_buckets[-1] + HALF_CELL)
    axes.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-HALF_CELL, vmax=len(order) - HALF_CELL, origin="lower",
                extent=extent, aspect="auto", interpolation="nearest")
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
    """Write the decision map of `table` to `path` (PNG); returns the path.

    Raises
    ------
    ImportError: matplotlib is missing (the message says how to install it).
    ValueError: the table has no class to draw.
    """
    Figure, FigureCanvasAgg = _require_matplotlib()
    from matplotlib.patches import Patch

    panels = [panel for panel in decision_panels(table) if panel.winners]
    if not panels:
        raise ValueError("this table has no decision cells to draw; calibrate the card again")
    order = sorted({w for panel in panels for w in panel.winners.values()}, key=lambda n: (family_of(n), n))
    colours = kernel_colours(order)
    columns = min(MAX_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows + HEADER_INCHES), dpi=DPI)
    FigureCanvasAgg(figure)
    for i, panel in enumerate(panels):
        _draw_panel(figure.add_subplot(rows, columns, i + 1), panel, colours, order)
    sources = sorted({panel.source for panel in panels})
    identity = table.identity
    figure.suptitle(
        f"{identity.model_key} ({identity.software_key}), table of {table.provenance.created}\n"
        f"colour = predicted fastest kernel; contours = its predicted speed-up over PyTorch's default "
        f"(sdpa_default's times from the {' and '.join(sources)})",
        fontsize=FONT["title"],
    )
    handles = [Patch(facecolor=colours[name], edgecolor="none", label=name) for name in order]
    legend_columns = min(LEGEND_COLUMNS, len(handles))
    figure.legend(handles=handles, loc="lower center", ncol=legend_columns, fontsize=FONT["ticks"], frameon=False)
    legend_rows = math.ceil(len(handles) / legend_columns)
    figure.tight_layout(rect=(0, MARGIN + LEGEND_ROW_HEIGHT * legend_rows, 1, TITLE_TOP))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
