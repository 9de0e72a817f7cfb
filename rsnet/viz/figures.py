"""Figures drawn with matplotlib on its Agg canvas (no pyplot): curves, the confusion matrix and attention pages, as RGB
arrays for TensorBoard and PNG/PDF files (``log.figure_format``)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from rsnet.files import atomic_write

if TYPE_CHECKING:  # matplotlib is imported by the functions that draw: a worker that draws nothing never loads it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_FORMATS = {"png": ("png",), "pdf": ("pdf",), "both": ("png", "pdf")}
DPI = 100
RIGHT, WRONG = "#1a7f37", "#c62828"
PAGE_SIZE = 16  # tiles on one attention page (4 x 4)
PICTURE = 2.56  # inches: each picture of an attention tile 256 px, a tile 512 px wide
COLOUR_MAP = "inferno"  # of attention maps: perceptually uniform, dark (low) to pale yellow (high)
Series = Mapping[str, Sequence[Sequence[tuple[float, float]]]]


def check_figure_format(value: object) -> str:
    """``log.figure_format`` must be a key of :data:`FIGURE_FORMATS`; ValueError naming the setting otherwise."""
    if value not in FIGURE_FORMATS:
        raise ValueError(f"log.figure_format={value!r}: use png (the default), pdf (vector, for a paper) or both")
    return str(value)


def new_figure(width: float, height: float, layout: str | None = "constrained") -> Figure:
    """A ``width`` x ``height`` inch figure on its own Agg canvas (constrained layout: 0.1 inch from its edges)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    if layout == "constrained":
        figure.get_layout_engine().set(w_pad=0.1, h_pad=0.1)
    FigureCanvasAgg(figure)
    return figure


def figure_array(figure: Figure) -> np.ndarray:
    """``figure`` rendered as a uint8 (H, W, 3) RGB array (for TensorBoard)."""
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def save_figure(figure: Figure, stem: Path, figure_format: str = "png") -> list[Path]:
    """``figure`` written atomically as ``<stem>.png`` and/or ``<stem>.pdf``, as :data:`FIGURE_FORMATS` says."""
    paths = []
    for suffix in FIGURE_FORMATS[check_figure_format(figure_format)]:
        path = stem.with_name(f"{stem.name}.{suffix}")
        with atomic_write(path) as handle:
            if suffix == "png":
                Image.fromarray(figure_array(figure)).save(handle, format="PNG")
            else:
                figure.savefig(handle, format=suffix)
        paths.append(path)
    return paths


def line_figure(panels: Sequence[tuple[str, Series]], title: str, xlabel: str) -> Figure:
    """One panel per ``(y label, series)``, side by side, every curve of a series in its colour, named in the legend."""
    from matplotlib.ticker import MaxNLocator

    width = 5.6 * len(panels) + 0.4
    figure = new_figure(width, 4.6)
    figure.suptitle(textwrap.fill(title, int(width * 72 / 8)), fontsize=13)
    for axes, (ylabel, series) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels):
        for index, (name, curves) in enumerate(series.items()):
            for number, curve in enumerate(curves):
                x, y = zip(*curve) if curve else ((), ())
                axes.plot(x, y, color=f"C{index}", marker="o" if len(curve) < 40 else None, markersize=3.5,
                          linewidth=1.8, label=name if number == 0 else None)
        axes.set_xlabel(xlabel, fontsize=11)
        axes.set_ylabel(ylabel, fontsize=11)
        axes.grid(True, color="#e4e4e4")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.legend(fontsize=10, loc="best")
    return figure


def confusion_figure(cm: np.ndarray | Sequence[Sequence[int]], class_names: Sequence[str] | None = None,
                     title: str | None = None) -> Figure:
    """The row-normalised confusion matrix: class names on both axes, non-zero cells' row share in %, a colour bar."""
    cm = np.asarray(cm, dtype=np.float64)
    n = cm.shape[0]
    names = [str(name) for name in class_names] if class_names else [str(i) for i in range(n)]
    rows = cm.sum(axis=1, keepdims=True)
    share = np.divide(cm, rows, out=np.zeros_like(cm), where=rows > 0) * 100.0
    cell = float(np.clip(9.0 / max(n, 1), 0.24, 0.6))  # inches
    label = 0.075 * max(map(len, names)) + 0.5
    figure = new_figure(n * cell + label + 1.6, n * cell + label + (0.9 if title else 0.5))
    axes = figure.add_subplot()
    image = axes.imshow(share, cmap="viridis", vmin=0.0, vmax=100.0)
    ticks = np.arange(n)
    label_size = 10 if n <= 30 else 9
    axes.set_xticks(ticks, names, rotation=90, fontsize=label_size)
    axes.set_yticks(ticks, names, fontsize=label_size)
    axes.set_xlabel("predicted class", fontsize=11)
    axes.set_ylabel("true class", fontsize=11)
    value_size = float(np.clip(cell * 72 * 0.4, 6.5, 11))
    for i, j in zip(*np.nonzero(cm)):
        axes.text(j, i, f"{share[i, j]:.0f}", ha="center", va="center", fontsize=value_size,
                  color="black" if share[i, j] > 60 else "white").set_in_layout(False)  # inside: no margin
    bar = figure.colorbar(image, ax=axes, shrink=min(1.0, 4.5 / (n * cell)), pad=0.02)
    bar.set_label("share of the true class (%)", fontsize=10)
    if title:
        axes.set_title(title, fontsize=12)
    return figure


def render_confusion_matrix(cm: np.ndarray | Sequence[Sequence[int]], class_names: Sequence[str] | None = None,
                            title: str | None = None) -> np.ndarray:
    """:func:`confusion_figure` as a uint8 (H, W, 3) array."""
    return figure_array(confusion_figure(cm, class_names, title))


@dataclass
class AttentionTile:
    """One image beside its attention overlay (:data:`COLOUR_MAP`), captioned with the true class (None: unknown) and
    the prediction."""

    image: np.ndarray
    overlaid: np.ndarray
    truth: str | None
    predicted: str
    probability: float | None = None


def _fit(text: str, inches: float, points: float) -> str:
    """``text``, cut with an ellipsis where it would be wider than ``inches`` at ``points`` pt."""
    limit = max(int(inches * 72 / (0.62 * points)), 4)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _caption(axes: Axes, tile: AttentionTile, width: float, height: float) -> None:
    """Below ``axes`` (``width`` x ``height`` inches): the true class, then the prediction and its probability, with
    ✓ in green when right, ✗ in red when wrong; without a true class, the prediction alone."""
    shown = tile.predicted + (f" {tile.probability:.0%}" if tile.probability is not None else "")
    if tile.truth is None:
        lines = [("predicted: " + shown, "black")]
    else:
        right = tile.truth == tile.predicted
        lines = [("true: " + tile.truth, "black"), (("✓ " if right else "✗ ") + shown, RIGHT if right else WRONG)]
    for number, (text, colour) in enumerate(lines):
        axes.text(0.0, -0.03 - number * 0.18 / height, _fit(text, width, 9.5), transform=axes.transAxes,
                  ha="left", va="top", fontsize=9.5, color=colour)


def attention_pages(tiles: Sequence[AttentionTile], title: str, columns: int = 4,
                    per_page: int = PAGE_SIZE) -> list[np.ndarray]:
    """``tiles`` on pages of ``per_page`` (:func:`attention_figure`) as uint8 (H, W, 3) arrays."""
    count = (len(tiles) + per_page - 1) // per_page
    return [figure_array(attention_figure(tiles[start:start + per_page],
                                          title + (f" (page {number} of {count})" if count > 1 else ""), columns))
            for number, start in enumerate(range(0, len(tiles), per_page), 1)]


def attention_figure(tiles: Sequence[AttentionTile], title: str, columns: int = 4) -> Figure:
    """``tiles``, ``columns`` a row, each picture :data:`PICTURE` inches a side, titled, beside a colour bar saying
    each map is scaled from its own minimum to its maximum."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    side, gap, caption, bar = PICTURE, 0.2, 0.42, 0.9
    across = max(1, min(columns, len(tiles)))
    down = (len(tiles) + across - 1) // across
    width = gap + across * (2 * side + gap) + bar
    heading = textwrap.fill(title, int((width - 2 * gap) * 72 / 6.5))
    head = 0.3 + 0.2 * (heading.count("\n") + 1)
    height = head + down * (side + caption + gap)
    figure = new_figure(width, height, layout=None)
    figure.text(gap / width, 1 - 0.12 / height, heading, ha="left", va="top", fontsize=11.5)
    for index, tile in enumerate(tiles):
        row, col = divmod(index, across)
        left, top = gap + col * (2 * side + gap), head + row * (side + caption + gap)
        for offset, picture in ((0.0, tile.image), (side, tile.overlaid)):
            axes = figure.add_axes(((left + offset) / width, 1 - (top + side) / height, side / width, side / height))
            axes.imshow(picture, interpolation="bilinear" if picture.shape[0] < side * DPI else "antialiased")
            axes.set_axis_off()
            if offset == 0.0:
                _caption(axes, tile, 2 * side, side)
    grid = min(down * (side + caption + gap) - gap, 3.2)
    bar_axes = figure.add_axes(((width - bar + 0.15) / width, 1 - (head + grid) / height, 0.16 / width, grid / height))
    colour_bar = figure.colorbar(ScalarMappable(Normalize(0.0, 1.0), COLOUR_MAP), cax=bar_axes, ticks=[0.0, 1.0])
    colour_bar.ax.set_yticklabels(["min", "max"], fontsize=9.5)
    colour_bar.set_label("attention (each map min–max normalised)", fontsize=10)
    return figure
