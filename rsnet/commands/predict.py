"""Classify a folder of images with a training checkpoint or an exported model (``rsnet-predict``; in a checkout
also ``python scripts/predict.py``). Every setting, with its default, is in conf/predict.yaml (``--help`` lists them).

    rsnet-predict checkpoint=outputs/run images=my_scenes/ [out=preds.csv] [topk=3] [attention_dir=attn/] \
        [head=main|ensemble] [device=auto] [batch_size=32] [recursive=false] [skip_corrupt=false] [tta=none|d4]

``checkpoint`` is a checkpoint written by rsnet-train (the full model: every head and attention maps), a
run folder (its checkpoints/best.pt, else last.pt) or what rsnet-export wrote (its folder,
``model.ts``/``model.onnx``/``model.pt``/``model.safetensors`` or ``model.json``); a file path always means that file.
Images (.tif .tiff .jpg .jpeg .png .bmp, any case) are resized to the model's image size (as the datasets decode them)
and normalised with its mean/std. One line per image is printed (and written to ``out`` as CSV): the
predicted class, its probability and the top-k classes. With ``attention_dir`` every image gets
``<name>_cam_<head>.png`` for each CAM head (the image beside its overlay, the prediction, a colour bar); an export
(main branch: its CAM) is rebuilt as a PyTorch model from its own weights for them, which an ONNX file does not
allow.
An unreadable image stops the run, listing every unreadable image, unless ``skip_corrupt=true`` (then
they are skipped and listed). ``out`` and ``attention_dir`` are checked writable before any image is classified;
the CSV is written atomically. ``tta=d4`` classifies every image by the mean logits of its 8 flips and 90-degree
rotations (attention maps stay those of the image itself).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from PIL import Image
from omegaconf import DictConfig
from torch import Tensor, nn
from tqdm import tqdm

from rsnet.cli import check_renamed_setting, user_errors
from rsnet.commands import hydra_config_path
from rsnet.commands.overrides import check_overrides
from rsnet.data.decode import DEFAULT_HIGH_BIT_DEPTH, DecodeReport, decode_image, describe_rescaled
from rsnet.data.errors import CorruptImageError
from rsnet.data.normalize import to_float_chw
from rsnet.data.specs import IMAGE_EXTENSIONS
from rsnet.evaluation import TTAModel, tta_setting
from rsnet.export import attention_model
from rsnet.files import atomic_write, check_writable_dir
from rsnet.settings import bool_setting, check_writable, int_setting, resolve_device
from rsnet.trained_model import load_model


@dataclass
class Predictor:
    """Everything prediction needs, from either kind of model file."""

    forward: Callable[[Tensor], Tensor]  # normalised images -> logits of the scored head
    class_names: list[str]
    image_size: int
    mean: list[float]
    std: list[float]
    full_model: nn.Module | None  # only for checkpoints: the multi-branch model (attention maps)
    description: str
    high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH  # how 16-bit/float images become 8 bit, as in training


def _head_logits(model: nn.Module, head: str | None) -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:
        output = model(x)
        if isinstance(output, Tensor):
            return output
        if head is None:
            return output.prediction_logits
        if head not in output.logits:
            raise ValueError(f"the model has no head {head!r}; heads: {', '.join(output.logits)}")
        return output.logits[head]

    return forward


def load_predictor(path: str | Path, device: torch.device, head: str | None = None, tta: str = "none",
                   attention: bool = False) -> Predictor:
    """Load a training checkpoint (full model) or an exported model, as :func:`rsnet.trained_model.load_model`
    resolves it; with ``tta="d4"`` its forward averages the logits of the 8 dihedral views (:class:`TTAModel`).
    ``attention``: an export is also rebuilt as an rsnet model for its attention maps
    (:func:`rsnet.export.attention_model`)."""
    loaded = load_model(path, device, setting="checkpoint")
    meta, model = loaded.metadata, loaded.model
    scored = TTAModel(model) if tta == "d4" else model
    settings = dict(class_names=list(meta["class_names"]), image_size=int(meta["image_size"]),
                    mean=list(meta["mean"]), std=list(meta["std"]),
                    high_bit_depth=meta.get("high_bit_depth", DEFAULT_HIGH_BIT_DEPTH))
    if loaded.source.kind == "export":
        if head is not None and head != meta.get("head", head):
            raise ValueError(f"{path} is an export of head {meta.get('head')!r}; head={head} needs a checkpoint")
        full_model = attention_model(model) if attention else None
        return Predictor(forward=scored, full_model=full_model, **settings, description=f"{loaded.source}: "
                         f"{meta.get('format', '?')} model ({meta.get('head', 'main')} head, tta {tta})")
    with torch.no_grad():  # probe once: name the scoring head, reject an unknown one before reading images
        size = settings["image_size"]
        probe = model(torch.zeros(1, 3, size, size, device=device))
    heads = ["main"] if isinstance(probe, Tensor) else list(probe.logits)
    if head is not None and head not in heads:
        raise ValueError(f"the model in {path} has no head {head!r}; heads: {', '.join(heads)}")
    head_name = head or ("main" if isinstance(probe, Tensor) else probe.ensemble or probe.main)
    epoch = "?" if loaded.epoch is None else loaded.epoch
    return Predictor(forward=_head_logits(scored, head), full_model=model, **settings,
                     description=f"{loaded.source}: {model.model_config.get('arch', '?')} "
                                 f"({head_name} head, epoch {epoch}, tta {tta})")


def list_images(folder: str | Path, recursive: bool = False) -> list[Path]:
    """Sorted image files of ``folder`` (or ``folder`` itself when it is one image)."""
    folder = Path(folder)
    if folder.is_file():
        if folder.suffix.lower() not in IMAGE_EXTENSIONS:
            raise ValueError(f"{folder} is not an image ({', '.join(IMAGE_EXTENSIONS)})")
        return [folder]
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    pattern = folder.rglob("*") if recursive else folder.iterdir()
    files = sorted(p for p in pattern if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {folder}"
                         + ("" if recursive else " (sub-folders are searched with recursive=true)"))
    return files


class UnreadableImageError(ValueError):
    """An image that cannot be decoded; ``path`` names it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot read image {path}: {' '.join(reason.split())}")
        self.path = path


def read_image(path: Path, image_size: int, high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH,
               report: DecodeReport | None = None) -> np.ndarray:
    """Decode to RGB uint8 (image_size, image_size) exactly as the datasets do (rsnet.data.decode_image)."""
    try:
        return decode_image(path, image_size, high_bit_depth, report)
    except CorruptImageError as error:  # undecodable and missing files; its own text hints at a training setting
        raise UnreadableImageError(path, error.reason or "cannot be decoded") from error


def _decode(paths: Sequence[Path], predictor: Predictor, bad: list[UnreadableImageError],
            report: DecodeReport) -> tuple[list[Path], list[np.ndarray]]:
    """The readable ``paths`` and their pixels; every unreadable one is appended to ``bad``, every one rescaled
    from 16-bit or float pixels recorded in ``report``."""
    good, pixels = [], []
    for path in paths:
        try:
            pixels.append(read_image(path, predictor.image_size, predictor.high_bit_depth, report))
            good.append(path)
        except UnreadableImageError as error:
            bad.append(error)
    return good, pixels


def _listing(bad: Sequence[UnreadableImageError], limit: int = 10) -> str:
    names = ", ".join(str(error.path) for error in bad[:limit])
    return names + (f" and {len(bad) - limit} more" if len(bad) > limit else "")


def _safe_name(path: Path, root: Path) -> str:
    try:
        relative = path.relative_to(root) if root.is_dir() else Path(path.name)
    except ValueError:
        relative = Path(path.name)
    return "__".join(relative.with_suffix("").parts)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the predictions as CSV, atomically."""
    with atomic_write(path, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=["file", "class", "probability", "top_k"])
        writer.writeheader()
        writer.writerows({**row, "probability": f"{row['probability']:.6f}"} for row in rows)


def predict(args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Classify every image of ``args["images"]`` (the settings of conf/predict.yaml): print one line each, then
    write the CSV and attention maps."""
    device = resolve_device(str(args["device"]))
    topk = int_setting("topk", args["topk"], 1)
    batch_size = int_setting("batch_size", args["batch_size"], 1)
    tta = tta_setting(args["tta"])
    out = check_writable(str(args["out"]), "out") if args["out"] else None  # before the long part, not after it
    # cheap checks before loading the model
    paths = list_images(str(args["images"]), bool_setting("recursive", args["recursive"]))
    attention_dir = Path(str(args["attention_dir"])) if args["attention_dir"] else None
    if attention_dir is not None:
        check_writable_dir(attention_dir, "attention_dir")
    predictor = load_predictor(str(args["checkpoint"]), device, args["head"], tta, attention=attention_dir is not None)
    print(f"{predictor.description}: {len(predictor.class_names)} classes, {predictor.image_size} px, "
          f"{len(paths)} images", file=sys.stderr)
    k = min(topk, len(predictor.class_names))
    rows: list[dict[str, Any]] = []
    skip_corrupt, bad, report = bool_setting("skip_corrupt", args["skip_corrupt"]), [], DecodeReport()
    bar = tqdm(total=len(paths), unit="img", desc="classifying", leave=False, dynamic_ncols=True,
               disable=not bool_setting("progress_bar", args["progress_bar"]))
    with bar:
        for start in range(0, len(paths), batch_size):
            batch_paths, decoded = _decode(paths[start:start + batch_size], predictor, bad, report)
            if bad and not skip_corrupt:
                _decode(paths[start + batch_size:], predictor, bad, report)  # to list every unreadable image at once
                raise ValueError(f"{len(bad)} unreadable image(s): {_listing(bad)}; fix or remove them, or pass "
                                 f"skip_corrupt=true to skip them ({bad[0]})")
            bar.update(min(batch_size, len(paths) - start))
            if not batch_paths:
                continue
            images = np.stack(decoded)
            inputs = to_float_chw(images, predictor.mean, predictor.std).to(device)
            for row in _classify(predictor, inputs, batch_paths, k):
                rows.append(row)
                bar.write(f"{row['file']}\t{row['class']}\t{row['probability']:.4f}\t[{row['top_k']}]", file=sys.stdout)
            if attention_dir is not None:
                _save_attention(predictor.full_model, images, inputs, batch_paths, Path(args["images"]),
                                attention_dir, predictor.class_names)
    if bad:
        print(f"skipped {len(bad)} unreadable image(s) (skip_corrupt=true): {_listing(bad)}", file=sys.stderr)
    if report.rescaled:
        print(f"warning: {describe_rescaled(report.rescaled.values(), len(paths), predictor.high_bit_depth)}",
              file=sys.stderr)
    if not rows:
        raise ValueError(f"none of the {len(paths)} images in {args['images']} could be read")
    if out is not None:
        write_csv(out, rows)
        print(f"wrote {out}", file=sys.stderr)
    if attention_dir is not None:
        print(f"wrote attention maps to {attention_dir}", file=sys.stderr)
    return rows


def _classify(predictor: Predictor, inputs: Tensor, paths: list[Path], k: int) -> list[dict[str, Any]]:
    """One batch's rows: file, top class, its probability and the top ``k`` as text."""
    with torch.no_grad():
        probs = torch.softmax(torch.as_tensor(predictor.forward(inputs)).float(), dim=1).cpu()
    top_p, top_i = probs.topk(k, dim=1)
    rows = []
    for path, p_row, i_row in zip(paths, top_p.tolist(), top_i.tolist()):
        names = [predictor.class_names[i] for i in i_row]
        rows.append({"file": str(path), "class": names[0], "probability": p_row[0],
                     "top_k": "; ".join(f"{n} {p:.4f}" for n, p in zip(names, p_row))})
    return rows


def _save_attention(model: nn.Module, images: np.ndarray, inputs: Tensor, paths: list[Path], root: Path,
                    attention_dir: Path, class_names: Sequence[str]) -> None:
    """One PNG per image and CAM head: the image beside its overlay (enlarged to a readable size), the head's
    prediction and a colour bar. (Grad-CAM equals the CAM for every head: not written twice.)"""
    from rsnet.viz.attention import captioned_attention
    from rsnet.viz.figures import attention_pages

    for head, tiles in captioned_attention(model, images, inputs, class_names).items():
        for tile, path in zip(tiles, paths):
            page = attention_pages([tile], f"{path.name}: CAM of head {head}")[0]
            with atomic_write(attention_dir / f"{_safe_name(path, root)}_cam_{head}.png") as handle:
                Image.fromarray(page).save(handle, format="PNG")


@hydra.main(config_path=hydra_config_path(), config_name="predict", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Classify the images; a bad setting or input is one line (exit status 2)."""
    with user_errors():
        predict(cfg)


def run() -> None:
    """The ``rsnet-predict`` command (and scripts/predict.py)."""
    with user_errors():
        check_renamed_setting(sys.argv[1:], "model", "checkpoint")
        check_overrides("predict", sys.argv[1:], sys.argv[0])
    main()


if __name__ == "__main__":
    run()
