"""Pictures that explain themselves, drawn with Pillow's built-in font: attention pages (every tile the image, its
overlay, the true class and the prediction marked right or wrong, a colour bar beside the page) and a confusion
matrix that stays legible at 45 classes (full names on both axes, axis titles, cell values, a colour bar)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

RIGHT, WRONG, INK = (0, 128, 0), (200, 0, 0), (0, 0, 0)
TILE_MIN = 112  # images are enlarged to at least this side, so that a caption fits under the pair
PAGE_SIZE = 16  # tiles on one attention page (4 x 4)


def text_font(size: int = 13) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's built-in font at ``size`` pixels."""
    return ImageFont.load_default(size=size)


def _text_width(text: str, font: ImageFont.ImageFont) -> int:
    left, _, right, _ = font.getbbox(text)
    return int(right - left)


def _fit(text: str, width: int, font: ImageFont.ImageFont) -> str:
    """``text``, cut with an ellipsis where it would be wider than ``width`` pixels."""
    if _text_width(text, font) <= width:
        return text
    while text and _text_width(text + "…", font) > width:
        text = text[:-1]
    return text + "…"


def colour_bar(height: int, colormap: int, top_label: str, bottom_label: str, title: str) -> np.ndarray:
    """A vertical uint8 (H, W, 3) colour bar of an OpenCV ``colormap``: high values at the top, labelled."""
    font = text_font(12)
    bar_height = max(height - 40, 20)
    ramp = np.linspace(255, 0, bar_height).astype(np.uint8)[:, None].repeat(16, axis=1)
    colours = cv2.cvtColor(cv2.applyColorMap(ramp, colormap), cv2.COLOR_BGR2RGB)
    width = 24 + max(_text_width(top_label, font), _text_width(bottom_label, font)) + 22
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(Image.fromarray(colours), (6, 20))
    draw = ImageDraw.Draw(canvas)
    draw.text((26, 16), top_label, fill=INK, font=font)
    draw.text((26, 20 + bar_height - 12), bottom_label, fill=INK, font=font)
    label = Image.new("RGB", (bar_height, 16), "white")
    ImageDraw.Draw(label).text((0, 1), _fit(title, bar_height, font), fill=INK, font=font)
    canvas.paste(label.rotate(90, expand=True), (width - 18, 20))
    return np.asarray(canvas)


def _enlarged(image: np.ndarray, side: int) -> np.ndarray:
    if image.shape[0] >= side:
        return image
    return cv2.resize(image, (side, side), interpolation=cv2.INTER_LINEAR)


def captioned_pair(image: np.ndarray, overlaid: np.ndarray, truth: str | None, predicted: str,
                   probability: float | None = None) -> np.ndarray:
    """The image beside its attention overlay (each at least ``TILE_MIN`` px), captioned below with the true class
    and the prediction, "right" in green or "WRONG" in red (Pillow's built-in font has no check marks); without a
    true class, the prediction alone."""
    side = max(image.shape[0], TILE_MIN)
    pair = np.concatenate([_enlarged(image, side), _enlarged(overlaid, side)], axis=1)
    font = text_font(13)
    canvas = Image.new("RGB", (pair.shape[1], side + 36), "white")
    canvas.paste(Image.fromarray(pair), (0, 0))
    draw = ImageDraw.Draw(canvas)
    shown = f"{predicted} {probability:.0%}" if probability is not None else predicted
    if truth is None:
        draw.text((2, side + 2), _fit(f"predicted: {shown}", pair.shape[1] - 4, font), fill=INK, font=font)
    else:
        right = truth == predicted
        draw.text((2, side + 2), _fit(f"true: {truth}", pair.shape[1] - 4, font), fill=INK, font=font)
        draw.text((2, side + 18), _fit(f"{'right' if right else 'WRONG'}: {shown}", pair.shape[1] - 4, font),
                  fill=RIGHT if right else WRONG, font=font)
    return np.asarray(canvas)


def tile_grid(tiles: Sequence[np.ndarray], columns: int = 4, pad: int = 4) -> np.ndarray:
    """Equally sized uint8 (H, W, 3) tiles in a grid with white padding."""
    height, width = tiles[0].shape[:2]
    columns = max(1, min(columns, len(tiles)))
    rows = (len(tiles) + columns - 1) // columns
    grid = np.full((rows * (height + pad) + pad, columns * (width + pad) + pad, 3), 255, dtype=np.uint8)
    for index, tile in enumerate(tiles):
        row, col = divmod(index, columns)
        top, left = pad + row * (height + pad), pad + col * (width + pad)
        grid[top:top + height, left:left + width] = tile
    return grid


def attention_pages(tiles: Sequence[np.ndarray], title: str, columns: int = 4,
                    per_page: int = PAGE_SIZE) -> list[np.ndarray]:
    """``tiles`` (from :func:`captioned_pair`) on pages of ``per_page``, each page titled and with the overlay's
    colour bar at its right."""
    pages = []
    count = (len(tiles) + per_page - 1) // per_page
    for number, start in enumerate(range(0, len(tiles), per_page), 1):
        grid = tile_grid(tiles[start:start + per_page], columns)
        bar = colour_bar(min(grid.shape[0], 320), cv2.COLORMAP_JET, "high", "low", "attention")
        page = Image.new("RGB", (grid.shape[1] + bar.shape[1], grid.shape[0] + 22), "white")
        page.paste(Image.fromarray(grid), (0, 22))
        page.paste(Image.fromarray(bar), (grid.shape[1], 22))
        heading = title + (f" (page {number} of {count})" if count > 1 else "")
        ImageDraw.Draw(page).text((4, 3), heading, fill=INK, font=text_font(14))
        pages.append(np.asarray(page))
    return pages


def render_confusion_matrix(cm: np.ndarray | Sequence[Sequence[int]],
                            class_names: Sequence[str] | None = None) -> np.ndarray:
    """A row-normalised confusion matrix (rows: true class, columns: predicted class) as uint8 (H, W, 3): full
    class names on both axes (the columns' turned upright), axis titles, every non-zero cell's percentage and a
    colour bar. Cells stay at least 18 px, so 45 classes (NWPU-RESISC45) remain readable."""
    cm = np.asarray(cm, dtype=np.float64)
    n = cm.shape[0]
    names = list(class_names) if class_names else [str(i) for i in range(n)]
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros_like(cm), where=rows > 0)
    cell = int(np.clip(900 // max(n, 1), 18, 48))
    font, value_font = text_font(12), text_font(max(8, min(12, cell // 2 - 1)))
    label = max(_text_width(name, font) for name in names) + 8
    left, top = 20 + label, 20 + label
    heat = cv2.applyColorMap(np.uint8(norm * 255.0 + 0.5), cv2.COLORMAP_VIRIDIS)
    heat = cv2.resize(cv2.cvtColor(heat, cv2.COLOR_BGR2RGB), (n * cell, n * cell), interpolation=cv2.INTER_NEAREST)
    bar = colour_bar(min(n * cell, 320), cv2.COLORMAP_VIRIDIS, "100 %", "0 %", "share of the true class")
    canvas = Image.new("RGB", (left + n * cell + 8 + bar.shape[1], max(top + n * cell + 4, top + bar.shape[0])),
                       "white")
    canvas.paste(Image.fromarray(heat), (left, top))
    canvas.paste(Image.fromarray(bar), (left + n * cell + 8, top))
    draw = ImageDraw.Draw(canvas)
    for i, name in enumerate(names):
        draw.text((left - 4 - _text_width(name, font), top + i * cell + (cell - 12) // 2), name, fill=INK, font=font)
        upright = Image.new("RGB", (label, 14), "white")
        ImageDraw.Draw(upright).text((label - 4 - _text_width(name, font), 0), name, fill=INK, font=font)
        canvas.paste(upright.rotate(90, expand=True), (left + i * cell + (cell - 14) // 2, 20))
    _axis_titles(canvas, left, top, n * cell, font)
    for i in range(n):
        for j in range(n):
            if cm[i, j]:
                text = f"{norm[i, j] * 100:.0f}"
                colour = INK if norm[i, j] > 0.6 else (255, 255, 255)
                x = left + j * cell + (cell - _text_width(text, value_font)) // 2
                draw.text((x, top + i * cell + cell // 4), text, fill=colour, font=value_font)
    return np.asarray(canvas)


def _axis_titles(canvas: Image.Image, left: int, top: int, extent: int, font: ImageFont.ImageFont) -> None:
    """"predicted class" above the columns, "true class" (turned upright) left of the rows."""
    draw = ImageDraw.Draw(canvas)
    draw.text((left + extent // 2 - _text_width("predicted class", font) // 2, 2), "predicted class", fill=INK,
              font=font)
    title = Image.new("RGB", (_text_width("true class", font) + 4, 16), "white")
    ImageDraw.Draw(title).text((2, 1), "true class", fill=INK, font=font)
    canvas.paste(title.rotate(90, expand=True), (2, top + extent // 2 - title.width // 2))
