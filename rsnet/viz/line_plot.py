"""A small line plot drawn with Pillow (matplotlib is not a dependency): curves of (x, y) points, axes with
ticks, one colour per series and a legend. Used for a run's curves.png and by bench_scheduler.py."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
SIZE, MARGIN = (900, 580), (70, 50, 190, 55)  # left, top, right, bottom


def _ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values from at or below ``low`` to at or above ``high``."""
    raw = (high - low) / max(count - 1, 1) or 1.0
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    first, last = math.floor(low / step), math.ceil(high / step)
    return [i * step for i in range(first, max(last, first + 1) + 1)]


def draw_line_plot(series: Mapping[str, Sequence[Sequence[tuple[float, float]]]], title: str, xlabel: str,
                   ylabel: str) -> Image.Image:
    """Every curve of every series (one colour per series, its name in the legend), as an image."""
    points = [p for curves in series.values() for curve in curves for p in curve]
    if not points:
        raise ValueError("line_plot: no points to draw")
    x_ticks = _ticks(0.0, max(x for x, _ in points))
    y_ticks = _ticks(min(y for _, y in points), max(y for _, y in points))
    (x0, x1), (y0, y1) = (x_ticks[0], x_ticks[-1]), (y_ticks[0], y_ticks[-1])
    left, top, right, bottom = MARGIN
    width, height = SIZE[0] - left - right, SIZE[1] - top - bottom

    def to_pixel(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) / ((x1 - x0) or 1) * width, top + height - (y - y0) / ((y1 - y0) or 1) * height

    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    for x in x_ticks:
        px, _ = to_pixel(x, y0)
        draw.line([(px, top), (px, top + height)], fill="#e6e6e6")
        draw.text((px - 10, top + height + 6), f"{x:g}", fill="black")
    for y in y_ticks:
        _, py = to_pixel(x0, y)
        draw.line([(left, py), (left + width, py)], fill="#e6e6e6")
        draw.text((left - 40, py - 6), f"{y:g}", fill="black")
    draw.rectangle([left, top, left + width, top + height], outline="black")
    draw.text((left + width / 2 - 40, SIZE[1] - 22), xlabel, fill="black")
    draw.text((8, top - 18), ylabel, fill="black")
    draw.text((8, 8), title, fill="black")
    for index, (name, curves) in enumerate(series.items()):
        colour = COLOURS[index % len(COLOURS)]
        for curve in curves:
            pixels = [to_pixel(x, y) for x, y in curve]
            if len(pixels) > 1:
                draw.line(pixels, fill=colour, width=2)
            for px, py in pixels:
                draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colour)
        legend_y = top + 10 + 20 * index
        draw.line([(left + width + 15, legend_y + 6), (left + width + 40, legend_y + 6)], fill=colour, width=3)
        draw.text((left + width + 46, legend_y), name, fill="black")
    return image


def line_plot(series: Mapping[str, Sequence[Sequence[tuple[float, float]]]], path: Path, title: str, xlabel: str,
              ylabel: str) -> Path:
    """:func:`draw_line_plot` saved as PNG ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_line_plot(series, title, xlabel, ylabel).save(path)
    return path
