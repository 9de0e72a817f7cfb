"""Class colours for land-use maps: saturated, mutually distinct colours (no white, black or grey: white and
transparency mean "no class"), the same for a class whatever the number of classes.

The colours are picked from colorcet's Glasbey palette ``glasbey_bw_minc_20``: its colours of CIELAB lightness
``MIN_LIGHTNESS`` or more and chroma ``MIN_CHROMA`` or more (bright enough and saturated enough to read over aerial
imagery at partial opacity), ordered by a farthest-point walk in CIELAB (each next colour is the one farthest from all
colours before it), so the first classes get the most distinct colours: the first 45 are at least 23 ΔE (CIE76)
apart, the first 20 at least 34. Past :func:`palette_size` classes (149) the colours repeat:
class ``i`` gets the colour of class ``i % palette_size()``."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

MIN_LIGHTNESS = 35.0  # CIELAB L*: darker colours read as shadow over imagery
MIN_CHROMA = 35.0  # CIELAB C*: greyer colours vanish over imagery (and grey, white and black are not classes)
_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375],
                 [0.2126729, 0.7151522, 0.0721750],
                 [0.0193339, 0.1191920, 0.9503041]])  # linear sRGB to CIE XYZ (D65)
_WHITE = np.array([0.95047, 1.0, 1.08883])  # D65


def lab(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) sRGB colours in 0..1 as CIELAB (D65) ``L*, a*, b*``."""
    rgb = np.asarray(rgb, dtype=np.float64)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ _XYZ.T / _WHITE
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


@lru_cache(maxsize=1)
def _palette() -> np.ndarray:
    """Every usable Glasbey colour, in farthest-point order (read-only)."""
    import colorcet
    from matplotlib.colors import to_rgb

    candidates = np.array([to_rgb(colour) for colour in colorcet.glasbey_bw_minc_20])
    points = lab(candidates)
    usable = (points[:, 0] >= MIN_LIGHTNESS) & (np.hypot(points[:, 1], points[:, 2]) >= MIN_CHROMA)
    candidates, points = candidates[usable], points[usable]
    order = [0]
    distance = np.linalg.norm(points - points[0], axis=1)
    while len(order) < len(candidates):
        order.append(int(np.argmax(distance)))
        distance = np.minimum(distance, np.linalg.norm(points - points[order[-1]], axis=1))
    palette = candidates[order]
    palette.flags.writeable = False
    return palette


def palette_size() -> int:
    """How many classes get a colour of their own (after that, colours repeat)."""
    return len(_palette())


def class_colours(count: int) -> np.ndarray:
    """(count, 3) float RGB colours in 0..1, one per class index; class ``i`` past :func:`palette_size` classes gets
    the colour of class ``i % palette_size()``."""
    if count < 0:
        raise ValueError(f"class count {count}: a map needs zero or more classes")
    palette = _palette()
    return palette[np.arange(count) % len(palette)]


def colour_table(count: int, nodata: int | None = None) -> dict[int, tuple[int, int, int, int]]:
    """The colours of :func:`class_colours` as a GeoTIFF colour map (rasterio ``write_colormap``): class index to
    0..255 RGBA, opaque; ``nodata`` (when given) fully transparent black."""
    table = {index: (*(int(v) for v in np.round(255 * colour)), 255)
             for index, colour in enumerate(class_colours(count))}
    if nodata is not None:
        table[nodata] = (0, 0, 0, 0)
    return table
