"""Classify a folder of images with a training checkpoint or an exported model (``rsnet-predict``): one line per image,
a CSV, attention maps; or, with ``map=``, map each image window by window; a shell over :mod:`rsnet.inference` and
:mod:`rsnet.mapping` (docs/usage.md, Prediction and Mapping a scene)."""

from __future__ import annotations

import csv
import hashlib
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from rsnet.cli import check_renamed_setting, user_errors
from rsnet.commands import hydra_config_path
from rsnet.commands.overrides import check_overrides
from rsnet.files import atomic_write, check_writable_dir
from rsnet.commands.values import bool_setting, check_writable, int_setting, tta_setting
from rsnet.devices import resolve_device

# the model code (torch, timm) is imported where images are classified (predict), not here: --help and a refused
# setting answer without it
if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor, nn

    from rsnet.data.decode import DecodeReport
    from rsnet.inference import Predictor, UnreadableImageError
    from rsnet.mapping.region import SceneMap


def _decode(paths: Sequence[Path], predictor: Predictor, bad: list[UnreadableImageError],
            report: DecodeReport) -> tuple[list[Path], list[np.ndarray]]:
    """The readable ``paths`` and their pixels; every unreadable one is appended to ``bad``, every one rescaled
    from 16-bit or float pixels recorded in ``report``."""
    from rsnet.inference import UnreadableImageError, read_image

    good, pixels = [], []
    for path in paths:
        try:
            pixels.append(read_image(path, predictor.image_size, predictor.decoding, report))
            good.append(path)
        except UnreadableImageError as error:
            bad.append(error)
    return good, pixels


def _listing(bad: Sequence[UnreadableImageError], limit: int = 10) -> str:
    names = ", ".join(str(error.path) for error in bad[:limit])
    return names + (f" and {len(bad) - limit} more" if len(bad) > limit else "")


def _relative(path: Path, root: Path) -> Path:
    try:
        return path.relative_to(root) if root.is_dir() else Path(path.name)
    except ValueError:
        return Path(path.name)


def picture_names(paths: Sequence[Path], root: Path) -> dict[Path, str]:
    """Each image's name for its attention pictures: its path under ``root`` without the extension, folders joined by
    ``__``, plus 8 hex digits of its path's SHA-1 where two would share a name."""
    relative = {path: _relative(path, root) for path in paths}
    plain = {path: "__".join(name.with_suffix("").parts) for path, name in relative.items()}
    shared = Counter(plain.values())
    return {path: name if shared[name] == 1 else
            f"{name}-{hashlib.sha1(relative[path].as_posix().encode(errors='surrogateescape')).hexdigest()[:8]}"
            for path, name in plain.items()}


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the predictions as CSV, atomically; a file name that is not UTF-8 is written with the bytes the file
    system holds (``surrogateescape``), so every row names its file as it is."""
    with atomic_write(path, "w", errors="surrogateescape") as handle:
        writer = csv.DictWriter(handle, fieldnames=["file", "class", "probability", "top_k"])
        writer.writeheader()
        writer.writerows({**row, "probability": f"{row['probability']:.6f}"} for row in rows)


def predict(args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Classify every image of ``args["images"]`` (the settings of conf/predict.yaml): print one line each, then
    write the CSV and attention maps."""
    topk = int_setting("topk", args["topk"], 1)
    batch_size = int_setting("batch_size", args["batch_size"], 1)
    tta = tta_setting(args["tta"])
    out = check_writable(str(args["out"]), "out") if args["out"] else None  # before the long part, not after it
    from rsnet.data.decode import describe_rescaled  # the model code (torch) only once the settings are good
    from rsnet.inference import list_images, load_predictor

    # cheap checks before loading the model
    paths = list_images(str(args["images"]), bool_setting("recursive", args["recursive"]))
    attention_dir = Path(str(args["attention_dir"])) if args["attention_dir"] else None
    if attention_dir is not None:
        check_writable_dir(attention_dir, "attention_dir")
    device = resolve_device(str(args["device"]))
    predictor = load_predictor(str(args["checkpoint"]), device, args["head"], tta, attention=attention_dir is not None,
                               max_pixels=args.get("max_pixels"))
    print(f"{predictor.description}: {len(predictor.class_names)} classes, {predictor.image_size} px, "
          f"{len(paths)} images", file=sys.stderr)
    rows, bad, report = _classify_all(predictor, paths, args, batch_size, topk, attention_dir)
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


def map_images(args: Mapping[str, Any]) -> list[SceneMap]:
    """Map every image of ``args["images"]`` window by window into the folder ``args["map"]`` (the settings of
    conf/predict.yaml) on ``args["device"]`` (one device, or a list), printing one line per map written."""
    batch_size = int_setting("batch_size", args["batch_size"], 1)
    tta = tta_setting(args["tta"])
    window, stride, readers = (None if args[key] is None else int_setting(key, args[key], 1)
                               for key in ("window", "stride", "readers"))
    for setting in ("out", "attention_dir"):
        if args[setting]:
            raise ValueError(f"{setting}= is for images classified whole, and map= maps each image window by "
                             f"window into {args['map']}: drop {setting}=, or classify in a separate run")
    folder = check_writable_dir(Path(str(args["map"])), "map")
    progress = bool_setting("progress_bar", args["progress_bar"])
    devices = _map_devices(args["device"])
    from rsnet.inference import list_images  # the model code (torch) only once the settings are good
    from rsnet.mapping.region import map_scenes
    from rsnet.model_loading import model_digest

    paths = list_images(str(args["images"]), bool_setting("recursive", args["recursive"]))
    print(f"{args['checkpoint']}: {len(paths)} image(s) to map on {', '.join(devices)}", file=sys.stderr)
    slowdown = args.get("slowdown")
    return map_scenes(str(args["checkpoint"]), paths, folder, window, stride, batch_size, devices, readers, progress,
                      model_digest(str(args["checkpoint"])), {"slowdown": None if slowdown is None else list(slowdown)},
                      head=args["head"], tta=tta, max_pixels=args.get("max_pixels"), amp=args.get("amp", "none"))


def _map_devices(value: Any) -> list[str]:
    """``device`` for map=: a name (``auto``: a GPU if any, else the CPU) or a list of them, each checked."""
    from omegaconf import ListConfig

    names = [str(name) for name in value] if isinstance(value, (list, tuple, ListConfig)) else [str(value)]
    if not names:
        raise ValueError("device=[]: name at least one device, e.g. device=cpu or device=[cuda:0,cpu]")
    return [str(resolve_device(name)) for name in names]


def _classify_all(predictor: Predictor, paths: list[Path], args: Mapping[str, Any], batch_size: int, topk: int,
                  attention_dir: Path | None) -> tuple[list[dict[str, Any]], list[UnreadableImageError], DecodeReport]:
    """Classify ``paths`` batch by batch, printing each row as it comes: the rows, the unreadable images and the
    decode report."""
    import numpy as np
    from rsnet.data.decode import DecodeReport
    from rsnet.progress import progress_bar

    rows: list[dict[str, Any]] = []
    names = picture_names(paths, Path(args["images"]))
    skip_corrupt, bad, report = bool_setting("skip_corrupt", args["skip_corrupt"]), [], DecodeReport()
    shown = progress_bar(total=len(paths), unit="img", desc="classifying", leave=False, dynamic_ncols=True,
                         disable=not bool_setting("progress_bar", args["progress_bar"]))
    with shown as bar:
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
            inputs = predictor.preprocess(images)
            for row in _rows(predictor, inputs, batch_paths, topk):
                rows.append(row)
                bar.write(f"{row['file']}\t{row['class']}\t{row['probability']:.4f}\t[{row['top_k']}]", file=sys.stdout)
            if attention_dir is not None:
                _save_attention(predictor.full_model, predictor.display_images(images), inputs, batch_paths, names,
                                attention_dir, predictor.class_names)
    return rows, bad, report


def _rows(predictor: Predictor, inputs: Tensor, paths: list[Path], k: int) -> list[dict[str, Any]]:
    """One batch's rows: file, top class, its probability and the top ``k`` as text."""
    return [{"file": str(path), "class": top[0][0], "probability": top[0][1],
             "top_k": "; ".join(f"{name} {p:.4f}" for name, p in top)}
            for path, top in zip(paths, predictor.top_k(inputs, k))]


def _save_attention(model: nn.Module, images: np.ndarray, inputs: Tensor, paths: list[Path], names: dict[Path, str],
                    attention_dir: Path, class_names: Sequence[str]) -> None:
    """One PNG per image and CAM head (Grad-CAM equals the CAM for every head: not written twice)."""
    from PIL import Image

    from rsnet.viz.attention import captioned_attention
    from rsnet.viz.figures import attention_pages

    for head, tiles in captioned_attention(model, images, inputs, class_names).items():
        for tile, path in zip(tiles, paths):
            page = attention_pages([tile], f"{path.name}: CAM of head {head}")[0]
            with atomic_write(attention_dir / f"{names[path]}_cam_{head}.png") as handle:
                Image.fromarray(page).save(handle, format="PNG")


@hydra.main(config_path=hydra_config_path(), config_name="predict", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Classify the images, or map them with ``map=``; a bad setting or input is one line (exit status 2)."""
    with user_errors():
        (map_images if cfg.get("map") else predict)(cfg)


def run() -> None:
    """The ``rsnet-predict`` command (and scripts/predict.py)."""
    with user_errors():
        check_renamed_setting(sys.argv[1:], "model", "checkpoint")
        check_overrides("predict", sys.argv[1:], sys.argv[0])
    main()


if __name__ == "__main__":
    run()
