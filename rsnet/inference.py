"""Classify images from Python with a training checkpoint (every head, attention maps) or an export; images are decoded
as the datasets decode them. ``rsnet-predict`` is a shell over this module (docs/usage.md, Prediction)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from rsnet.data.decode import DEFAULT_HIGH_BIT_DEPTH, DecodeReport, Decoding, decode_image
from rsnet.data.errors import CorruptImageError
from rsnet.data.normalize import to_float_chw
from rsnet.data.raster import Bands, bands_from_metadata, max_pixel_value, pictures
from rsnet.data.specs import IMAGE_EXTENSIONS
from rsnet.evaluation import TTAModel
from rsnet.export import attention_model
from rsnet.devices import resolve_device
from rsnet.model_loading import load_model


class UnreadableImageError(ValueError):
    """An image that cannot be decoded; ``path`` names it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot read image {path}: {' '.join(reason.split())}")
        self.path = path


def read_image(path: str | Path, image_size: int, decoding: Decoding = DEFAULT_HIGH_BIT_DEPTH,
               report: DecodeReport | None = None) -> np.ndarray:
    """Decode to RGB uint8 (image_size, image_size, 3), or a model's :class:`Bands`, as the datasets do; else
    :class:`UnreadableImageError`."""
    try:
        return decode_image(Path(path), image_size, decoding, report)
    except CorruptImageError as error:  # undecodable and missing files; its own text hints at a training setting
        raise UnreadableImageError(Path(path), error.reason or "cannot be decoded") from error


def list_images(folder: str | Path, recursive: bool = False) -> list[Path]:
    """Sorted image files of ``folder`` (or ``folder`` itself when it is one image)."""
    folder = Path(folder)
    if folder.is_file():
        if folder.suffix.lower() not in IMAGE_EXTENSIONS:
            raise ValueError(f"{folder} is not an image ({', '.join(IMAGE_EXTENSIONS)})")
        return [folder]
    if not folder.is_dir():
        kind = "image file" if folder.suffix.lower() in IMAGE_EXTENSIONS else "image file or folder"
        raise FileNotFoundError(f"images={folder}: no such {kind}; pass an image, or a folder of images")
    pattern = folder.rglob("*") if recursive else folder.iterdir()
    files = sorted(p for p in pattern if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {folder}"
                         + ("" if recursive else " (sub-folders are searched with recursive=true)"))
    return files


@dataclass
class Predictor:
    """A trained model with its preprocessing: images as :meth:`read_images` decodes them in (uint8 RGB, or the
    ``bands`` of a multispectral model), class probabilities out."""

    forward: Callable[[Tensor], Tensor]  # normalised images -> logits of the scored head
    class_names: list[str]
    image_size: int
    mean: list[float]
    std: list[float]
    device: torch.device
    full_model: nn.Module | None  # checkpoints, and exports loaded with attention=True: for attention maps
    description: str
    high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH  # how 16-bit/float images become 8 bit, as in training
    bands: Bands | None = None  # the bands a multispectral model reads (None: RGB pictures)
    footprint: dict[str, float | None] = field(default_factory=dict)  # a training image: pixels, metres (maps)

    @property
    def decoding(self) -> Decoding:
        """How a file becomes the model's pixels: its bands, else the high-bit-depth rule of RGB pictures."""
        return self.bands or self.high_bit_depth

    def read_images(self, paths: Sequence[str | Path], report: DecodeReport | None = None) -> np.ndarray:
        """The images at ``paths`` as one (N, image_size, image_size, C) batch, decoded as in training."""
        return np.stack([read_image(path, self.image_size, self.decoding, report) for path in paths])

    def preprocess(self, images: np.ndarray) -> Tensor:
        """(N, H, W, C) images at the model's image size -> normalised float (N, C, H, W) on the model's device."""
        return to_float_chw(images, self.mean, self.std, max_pixel_value(self.bands)).to(self.device)

    def display_images(self, images: np.ndarray) -> np.ndarray:
        """uint8 RGB pictures of decoded ``images``: themselves, or the RGB composite of a model's bands."""
        return pictures(images, self.bands)

    def probabilities(self, inputs: np.ndarray | Tensor) -> Tensor:
        """Class probabilities (N, classes) on the CPU of decoded images (N, H, W, C) or preprocessed ones."""
        if isinstance(inputs, np.ndarray):
            inputs = self.preprocess(inputs)
        with torch.no_grad():
            return torch.softmax(torch.as_tensor(self.forward(inputs)).float(), dim=1).cpu()

    def top_k(self, inputs: np.ndarray | Tensor, k: int = 1) -> list[list[tuple[str, float]]]:
        """Per image, its ``k`` most probable classes as (class name, probability), most probable first."""
        top_p, top_i = self.probabilities(inputs).topk(min(k, len(self.class_names)), dim=1)
        return [[(self.class_names[i], p) for i, p in zip(indices, probs)]
                for indices, probs in zip(top_i.tolist(), top_p.tolist())]


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


def load_predictor(path: str | Path, device: str | torch.device = "auto", head: str | None = None,
                   tta: str = "none", attention: bool = False, max_pixels: int | None = None) -> Predictor:
    """Load a training checkpoint or an export at ``path``; ``head``: a checkpoint's scored head (default: its ensemble,
    else main); ``attention``: an export is also rebuilt for attention maps; ``max_pixels``: the most pixels of an
    image file a multispectral model reads (None: the default)."""
    device = resolve_device(device) if isinstance(device, str) else device
    loaded = load_model(path, device, setting="checkpoint")
    meta, model = loaded.metadata, loaded.model
    scored = TTAModel(model) if tta == "d4" else model
    bands = bands_from_metadata(meta.get("bands"))
    settings = dict(class_names=list(meta["class_names"]), image_size=int(meta["image_size"]),
                    mean=list(meta["mean"]), std=list(meta["std"]), device=device,
                    high_bit_depth=meta.get("high_bit_depth", DEFAULT_HIGH_BIT_DEPTH),
                    bands=bands and bands.with_max_pixels(max_pixels, "max_pixels"),
                    footprint=dict(meta.get("footprint") or {}))
    if loaded.source.kind == "export":
        if head is not None and head != meta.get("head", head):
            raise ValueError(f"{path} is an export of head {meta.get('head')!r}; head={head} needs a checkpoint")
        full_model = attention_model(model) if attention else None
        return Predictor(forward=scored, full_model=full_model, **settings, description=f"{loaded.source}: "
                         f"{meta.get('format', '?')} model ({meta.get('head', 'main')} head, tta {tta})")
    with torch.no_grad():  # one forward on zeros: name the scoring head, reject an unknown one before reading images
        size = settings["image_size"]
        sample_output = model(torch.zeros(1, len(settings["mean"]), size, size, device=device))
    heads = ["main"] if isinstance(sample_output, Tensor) else list(sample_output.logits)
    if head is not None and head not in heads:
        raise ValueError(f"the model in {path} has no head {head!r}; heads: {', '.join(heads)}")
    head_name = head or ("main" if isinstance(sample_output, Tensor) else sample_output.ensemble or sample_output.main)
    epoch = "?" if loaded.epoch is None else loaded.epoch
    return Predictor(forward=_head_logits(scored, head), full_model=model, **settings,
                     description=f"{loaded.source}: {model.model_config.get('arch', '?')} "
                                 f"({head_name} head, epoch {epoch}, tta {tta})")
