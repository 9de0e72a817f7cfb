"""Class colours for land-use maps, chosen by class name: no white, black or grey (white and transparency mean "no
class"), the same for a class whatever else the map holds, deterministic.

A name with a known meaning gets its conventional colour (:data:`NAMED`): vegetation green (crops yellow to orange),
water blue, built-up red to purple (residential a red ramp, dark where dense), transport dark slate, bare ground sand
to brown. Names match by keyword, case and separators ignored ("DenseResidential" = "dense_residential"), the longest
keyword in the name winning ("parking_lot" is parking, not park); no two classes of UC Merced, AID, NWPU-RESISC45 or
EuroSAT are closer than 14 ΔE (CIE76). Any other class, and a second class of a keyword already used, gets colour
``i % palette_size()`` (``i`` its index) of colorcet's Glasbey palette ``glasbey_bw_minc_20``, in its own order
(ordered for distinctness), less its colours darker than ``MIN_LIGHTNESS``, greyer than ``MIN_CHROMA`` or within
``MIN_DISTANCE`` of a named colour."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

MIN_LIGHTNESS = 35.0  # CIELAB L*: darker Glasbey colours read as shadow over imagery
MIN_CHROMA = 35.0  # CIELAB C*: greyer Glasbey colours vanish over imagery (and grey, white and black are not classes)
MIN_DISTANCE = 12.0  # CIELAB ΔE: a Glasbey colour this close to a named one is not used
NAMED = {  # keywords (any of them in a normalised class name) -> colour: vegetation, water, built-up, transport,
    # bare and sports grounds
    "forest wood": "#1b6b2f", "chaparral shrub scrub heath": "#757537", "meadow grass": "#8ccf5f",
    "herbaceous vegetation": "#4fa64a", "pasture": "#c2dc6e", "park garden": "#2fbf5a", "golf": "#00a679",
    "agricultur farm cropland arable": "#d8c843", "crop": "#efd64a", "permanentcrop orchard vineyard": "#e08a3c",
    "circularfarmland pivot": "#a9cc3a", "terrace": "#a6ac4c", "river stream canal": "#1f78d1",
    "lake reservoir": "#47a3e8", "sea ocean": "#0c3c8c", "pond": "#6cc3f0", "wetland marsh swamp": "#678363",
    "harbor harbour port dock marina": "#3b789f", "seaice": "#8fd6e0", "snow glacier iceberg": "#bccaf2",
    "beach sand": "#eed68a", "denseresidential": "#a50f1e", "mediumresidential residential": "#e03c3c",
    "sparseresidential": "#f59a8e", "mobilehome": "#f06e2a", "building": "#c2185b", "commercial": "#d05fcf",
    "industr factory": "#7b2f8e", "center centre downtown": "#e7298a", "church temple mosque cathedral": "#8b2500",
    "palace castle": "#a0522d", "school university campus": "#f781bf", "resort hotel": "#ff8c69",
    "square plaza": "#b07aa1", "stadium sport arena": "#d94fa0", "storagetank tank": "#6a5acd",
    "powerstation powerplant": "#552f7c", "road street highway freeway motorway": "#474966",
    "runway taxiway": "#698991", "intersection junction": "#8c7492", "overpass viaduct interchange": "#326668",
    "bridge": "#5e5a43", "railway railroad": "#653b3d", "railwaystation trainstation": "#925b64", "parking": "#afa590",
    "airport airfield": "#b3a5cc", "roundabout": "#dbaea9", "desert dune": "#d9a556", "bare barren soil": "#b08660",
    "mountain rock cliff": "#7d5a3c", "baseball": "#d98c4a", "tennis": "#209c90", "basketball": "#e0a070",
    "trackfield track": "#c0452e", "playground": "#e6a0c4",
}
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


def _rgb(colours: Sequence[str]) -> np.ndarray:
    """Colour names or ``#rrggbb`` as (N, 3) floats in 0..1."""
    from matplotlib.colors import to_rgb

    return np.array([to_rgb(colour) for colour in colours], dtype=np.float64).reshape(-1, 3)


def named_colour(name: str) -> str | None:
    """``#rrggbb`` of the :data:`NAMED` entry whose keyword in ``name`` (lower case, separators dropped) is the
    longest; None where no keyword is in it."""
    key = re.sub(r"[^0-9a-z]", "", name.lower())
    matches = [(len(word), colour) for words, colour in NAMED.items() for word in words.split() if word in key]
    return max(matches)[1] if matches else None


@lru_cache(maxsize=1)
def _glasbey() -> np.ndarray:
    """colorcet's ``glasbey_bw_minc_20`` in its order, less the colours too dark, too grey or too near a named one."""
    import colorcet

    candidates = _rgb(colorcet.glasbey_bw_minc_20)
    points, named = lab(candidates), lab(_rgb(list(NAMED.values())))
    usable = (points[:, 0] >= MIN_LIGHTNESS) & (np.hypot(points[:, 1], points[:, 2]) >= MIN_CHROMA)
    usable &= np.linalg.norm(points[:, None] - named[None], axis=-1).min(axis=1) >= MIN_DISTANCE
    return candidates[usable]


def palette_size() -> int:
    """How many Glasbey colours classes without a named colour get (class ``i`` the one at ``i % palette_size()``)."""
    return len(_glasbey())


def class_colours(names: Sequence[str]) -> np.ndarray:
    """(len(names), 3) float RGB colours in 0..1: a class's :func:`named_colour` unless an earlier class took it, else
    the Glasbey colour of its index."""
    glasbey, taken, colours = _glasbey(), set(), []
    for index, name in enumerate(names):
        named = named_colour(str(name))
        colours.append(_rgb([named])[0] if named and named not in taken else glasbey[index % len(glasbey)])
        taken.add(named)
    return np.array(colours, dtype=np.float64).reshape(-1, 3)


def colour_table(names: Sequence[str], nodata: int | None = None) -> dict[int, tuple[int, int, int, int]]:
    """The colours of :func:`class_colours` as a GeoTIFF colour map (rasterio ``write_colormap``): class index to
    0..255 RGBA, opaque; ``nodata`` (when given) fully transparent black."""
    table = {index: (*(int(v) for v in np.round(255 * colour)), 255)
             for index, colour in enumerate(class_colours(names))}
    if nodata is not None:
        table[nodata] = (0, 0, 0, 0)
    return table
