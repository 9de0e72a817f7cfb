"""The preview PNG of a land-use map: the scene's imagery under the class grid (partly transparent; no class: the
imagery unchanged), the scene's coordinates on the axes, a scale bar, a legend of the classes present with their share
of the mapped area, largest first, and a title. The figure follows the scene's aspect ratio."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from rsnet.files import disk_full_named
from rsnet.mapping.palette import class_colours
from rsnet.viz.figures import figure_array, new_figure

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ALPHA = 0.5  # opacity of the class colours over imagery
MAP_INCHES = 9.0  # the map's long side (100 px an inch)
ENTRY_INCHES = 0.2  # the height of a legend row
FONT = 9.0  # points: legend, axis labels; tick labels 1 pt less
NARROW = 2.0  # inches: a map side below this gets upright x tick labels and its scale bar outside


@dataclass(frozen=True)
class PreviewGeometry:
    """Where the scene and the class grid lie, and how to label that.

    Bounds are ``(left, bottom, right, top)`` in the CRS's units; a raster without coordinates gives pixel coordinates
    (left=0, right=width, top=0, bottom=height: y grows downwards). The class grid (``map_bounds``) may overhang the
    scene's right and bottom edges by less than one cell; the preview shows the scene's bounds. ``metres_per_unit``
    sizes the scale bar (None: no scale bar): ground metres in one CRS unit along x at the scene's centre (a bar is
    true there only: Web Mercator's scale changes with latitude, a degree of longitude towards the poles)."""

    scene_bounds: tuple[float, float, float, float]
    map_bounds: tuple[float, float, float, float]
    crs_name: str | None
    units: str
    metres_per_unit: float | None
    geographic: bool = False


def legend_entries(names: Sequence[str], shares: np.ndarray, classes: np.ndarray,
                   nodata: int) -> list[tuple[int, str]]:
    """``(class index, "name 42.1 %")`` for each class present (a share above zero, or a cell of ``classes``), by
    share, largest first (ties: by index)."""
    present = set(np.flatnonzero(np.asarray(shares) > 0).tolist())
    present.update(np.unique(classes[classes != nodata]).tolist())
    order = sorted(present, key=lambda index: (-float(shares[index]), index))
    return [(int(index), f"{names[index]} {_percent(float(shares[index]))}") for index in order]


def write_preview(path: Path, classes: np.ndarray, nodata: int, names: Sequence[str], shares: np.ndarray,
                  title: str, geometry: PreviewGeometry, imagery: np.ndarray | None = None,
                  error_name: Path | None = None) -> None:
    """The preview of the class grid ``classes`` (``nodata``: no class) as a PNG at ``path``, flushed to disk; a full
    disk is a DiskFullError naming ``error_name`` (the final file, when ``path`` is a temporary one) or ``path``.

    ``shares``: each class's fraction of the mapped area; ``imagery``: a (H, W, 3) uint8 RGB picture of the scene
    covering ``geometry.scene_bounds`` (None: the classes are drawn opaque on white). Both arrays are drawn as given:
    decimate them beforehand (about 1000 px a side is what the figure shows)."""
    _check(path, classes, nodata, names, shares, geometry, imagery)
    pixels = figure_array(preview_figure(classes, nodata, names, shares, title, geometry, imagery))
    with disk_full_named(error_name or path), open(path, "wb") as handle:
        Image.fromarray(pixels).save(handle, format="PNG")
        handle.flush()
        os.fsync(handle.fileno())


def preview_figure(classes: np.ndarray, nodata: int, names: Sequence[str], shares: np.ndarray, title: str,
                   geometry: PreviewGeometry, imagery: np.ndarray | None = None) -> Figure:
    """The figure :func:`write_preview` writes (its inputs, unchecked), sized to the map and its legend."""
    left, bottom, right, top = geometry.scene_bounds
    width, height = _map_inches(geometry)
    entries = legend_entries(names, shares, classes, nodata)
    beside, columns, (extra_width, extra_height) = _legend_layout(entries, width, height)
    figure = new_figure(width + extra_width + 1.5, height + extra_height + 1.2)
    axes = figure.add_subplot()
    if imagery is not None:
        axes.imshow(imagery, extent=(left, right, bottom, top), interpolation="antialiased")
    colours = class_colours(names)
    map_left, map_bottom, map_right, map_top = geometry.map_bounds
    axes.imshow(_class_rgba(classes, nodata, colours, ALPHA if imagery is not None else 1.0),
                extent=(map_left, map_right, map_bottom, map_top), interpolation="nearest")
    axes.set_xlim(left, right)
    axes.set_ylim(bottom, top)
    axes.set_anchor("N")
    _label_axes(axes, geometry, width, height)
    if geometry.metres_per_unit:
        _scale_bar(axes, geometry, width, height)
    _legend(figure, axes, entries, colours, beside, columns)
    heading = figure.suptitle(textwrap.fill(title, max(30, int((width + 1.5) * 72 / (0.6 * (FONT + 2))))),
                              fontsize=FONT + 2)
    _fit(figure, axes, width, height, [heading, *figure.legends])
    return figure


def _check(path: Path, classes: np.ndarray, nodata: int, names: Sequence[str], shares: np.ndarray,
           geometry: PreviewGeometry, imagery: np.ndarray | None) -> None:
    """ValueError naming ``path`` for inputs the preview cannot draw."""
    problem = None
    valid = classes[classes != nodata] if classes.ndim == 2 else classes
    left, bottom, right, top = geometry.scene_bounds
    if classes.ndim != 2 or classes.size == 0:
        problem = f"classes has shape {classes.shape}; pass a (rows, cols) grid of class indices"
    elif np.shape(shares) != (len(names),):
        problem = f"shares has shape {np.shape(shares)}; pass one share per class name ({len(names)})"
    elif valid.size and (valid.min() < 0 or valid.max() >= len(names)):
        problem = f"classes holds {valid.min()}..{valid.max()}; pass indices below {len(names)} or nodata={nodata}"
    elif not (right > left and top != bottom):
        problem = f"scene_bounds {geometry.scene_bounds} is empty; pass (left, bottom, right, top) of the scene"
    elif imagery is not None and (imagery.ndim != 3 or imagery.shape[2] != 3 or imagery.dtype != np.uint8):
        problem = f"imagery is {imagery.dtype} {imagery.shape}; pass a (H, W, 3) uint8 RGB picture or None"
    if problem:
        raise ValueError(f"preview {path}: {problem}")


def _percent(share: float) -> str:
    """``share`` (0..1) as "42.1 %"; below 0.05 % but above 0: "<0.1 %"."""
    return "<0.1 %" if 0 < share < 0.0005 else f"{100 * share:.1f} %"


def _map_inches(geometry: PreviewGeometry) -> tuple[float, float]:
    """The map's width and height in inches: :data:`MAP_INCHES` on its long side, the scene's aspect ratio."""
    left, bottom, right, top = geometry.scene_bounds
    ratio = abs(top - bottom) / (right - left)
    return (MAP_INCHES, MAP_INCHES * ratio) if ratio <= 1 else (MAP_INCHES / ratio, MAP_INCHES)


def _legend_layout(entries: Sequence[tuple[int, str]], width: float,
                   height: float) -> tuple[bool, int, tuple[float, float]]:
    """Whether the legend goes beside the map (else below it), in how many columns, and about how many inches it adds
    to the figure's width and height: the smaller figure wins."""
    count = max(len(entries), 1)
    column = max((len(label) for _, label in entries), default=10) * 0.55 * FONT / 72 + 0.5  # inches
    side_columns = -(-count // max(8, int(height / ENTRY_INCHES)))
    side = (side_columns * column, max(0.0, (-(-count // side_columns) + 1) * ENTRY_INCHES - height))
    below_columns = min(count, max(1, int((width + 1.0) / column)))
    below = (max(0.0, below_columns * column - width), (-(-count // below_columns) + 2) * ENTRY_INCHES)
    if (width + side[0]) * (height + side[1]) <= (width + below[0]) * (height + below[1]):
        return True, side_columns, side
    return False, below_columns, below


def _class_rgba(classes: np.ndarray, nodata: int, colours: np.ndarray, alpha: float) -> np.ndarray:
    """The grid as (rows, cols, 4) uint8 RGBA: each class in its colour at ``alpha``, nodata fully transparent."""
    table = np.zeros((len(colours) + 1, 4), dtype=np.uint8)
    table[:-1, :3] = np.round(255 * colours)
    table[:-1, 3] = round(255 * alpha)
    return table[np.where(classes == nodata, len(colours), classes)]


def _label_axes(axes: Axes, geometry: PreviewGeometry, width: float, height: float) -> None:
    """Ticks in the CRS's units (plain numbers; upright on a map narrower than :data:`NARROW` inches) and the axes'
    names."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    if geometry.crs_name is None:
        x_name, y_name = "column (px)", "row (px)"
    elif geometry.geographic:
        x_name, y_name = f"longitude ({geometry.units}), {geometry.crs_name}", f"latitude ({geometry.units})"
    else:
        x_name, y_name = f"easting ({geometry.units}), {geometry.crs_name}", f"northing ({geometry.units})"
    upright = width < NARROW
    for axis, ticks in ((axes.xaxis, width / (0.35 if upright else 1.1)), (axes.yaxis, height / 0.5)):
        axis.set_major_locator(MaxNLocator(nbins=max(2, int(ticks)), steps=[1, 2, 2.5, 5, 10]))
        formatter = ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        axis.set_major_formatter(formatter)
    axes.tick_params(labelsize=FONT - 1)
    if upright:
        axes.tick_params(axis="x", labelrotation=90)
    axes.set_xlabel(textwrap.fill(x_name, max(20, int(width * 72 / (0.6 * FONT)))), fontsize=FONT)
    axes.set_ylabel(y_name, fontsize=FONT)


def _scale_bar(axes: Axes, geometry: PreviewGeometry, width: float, height: float) -> None:
    """A bar of a round length (1, 2 or 5 x 10^k m) near a fifth of the map's width (on a narrow map: up to 60 % of
    it), at the map's lower left on white, or above its upper right when the map is thinner than :data:`NARROW`."""
    from matplotlib.font_manager import FontProperties
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    left, _, right, _ = geometry.scene_bounds
    units_per_inch = (right - left) / width
    inches = max(width / 5, min(0.6 * width, 0.8))
    metres = _round_length(inches * units_per_inch * geometry.metres_per_unit)
    inside = min(width, height) >= NARROW
    placement = dict(loc="lower left") if inside else dict(
        loc="lower right", bbox_to_anchor=(1.0, 1.0), bbox_transform=axes.transAxes)
    bar = AnchoredSizeBar(axes.transData, metres / geometry.metres_per_unit, _length_label(metres), pad=0.3,
                          borderpad=0.5 if inside else 0.1, sep=3, frameon=inside, size_vertical=0.04 * units_per_inch,
                          fontproperties=FontProperties(size=FONT), **placement)
    bar.patch.set(facecolor="white", alpha=0.8, edgecolor="none")
    axes.add_artist(bar)


def _round_length(metres: float) -> float:
    """The length of 1, 2 or 5 x 10^k m nearest ``metres`` (on a log scale)."""
    power = 10.0 ** np.floor(np.log10(metres))
    candidates = np.array([1.0, 2.0, 5.0, 10.0]) * power
    return float(candidates[np.argmin(np.abs(np.log(candidates / metres)))])


def _length_label(metres: float) -> str:
    """``metres`` as "200 m", "2 km", "0.5 m", and where: the ground length at the centre of the map."""
    return (f"{metres / 1000:g} km" if metres >= 1000 else f"{metres:g} m") + " at centre"


def _legend(figure: Figure, axes: Axes, entries: Sequence[tuple[int, str]], colours: np.ndarray, beside: bool,
            columns: int) -> None:
    """The classes present in their colours, beside the map (top-aligned) or below the figure, in ``columns``."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colours[index], edgecolor="0.3", linewidth=0.5, label=label)
               for index, label in entries]
    options = dict(handles=handles, ncols=columns, fontsize=FONT, title="share of the mapped area",
                   title_fontsize=FONT, frameon=False, alignment="left", handlelength=1.6, columnspacing=1.2)
    if beside:
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **options)
    else:
        figure.legend(loc="outside lower center", **options)


def _fit(figure: Figure, axes: Axes, width: float, height: float, spanning: Sequence[Artist]) -> None:
    """Resize ``figure`` until the layout gives the map ``width`` x ``height`` inches (no empty band beside it), or
    more width where one of the ``spanning`` artists (the title, a legend below) needs it."""
    for _ in range(4):
        figure.draw_without_rendering()
        renderer = figure.canvas.get_renderer()
        wide = max(artist.get_window_extent(renderer).width for artist in spanning)
        box = axes.get_position(original=True)
        size = figure.get_size_inches()
        grown = np.array([max(size[0] + width - box.width * size[0], wide / figure.dpi + 0.3),
                          size[1] + height - box.height * size[1]])
        if np.allclose(grown, size, atol=0.02):
            return
        figure.set_size_inches(grown)
