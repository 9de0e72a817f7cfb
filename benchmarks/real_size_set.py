"""A real-size training set from a small one: every image of an AID-layout folder repeated through symbolic links,
so an epoch holds at least ``--min-train`` training images (a real run's merges, barriers and evaluation amortised
over a real epoch, not over the seven steps of aid-dev) while only the small set travels.

Each repeat ``r`` of ``<Class>/<name>_<n>.jpg`` is the link ``<Class>/<name>_<n>_r<r>.jpg``; the links point at the
original files, so the set costs no disk. Standard library only (``gpu_lease.py`` runs it before the wheels are
installed).

    python benchmarks/real_size_set.py SOURCE_CLASS_FOLDERS TARGET --min-train 10000 --train-ratio 0.5
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def repeats_needed(images: int, min_train: int, train_ratio: float) -> int:
    """How many copies of ``images`` give at least ``min_train`` training images at ``train_ratio``."""
    if images == 0:
        raise ValueError("the source folder holds no images")
    return max(1, math.ceil(min_train / (images * train_ratio)))


def build_real_size_set(source: Path, target: Path, min_train: int, train_ratio: float) -> int:
    """Fill ``target`` with one folder per class of ``source``, each image linked as many times as needed; the
    number of images in ``target``. An existing ``target`` is refused (it could hold another set)."""
    classes = sorted(folder for folder in source.iterdir() if folder.is_dir() and not folder.name.startswith("."))
    files = {folder.name: sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
             for folder in classes}
    repeats = repeats_needed(sum(map(len, files.values())), min_train, train_ratio)
    target.mkdir(parents=True)
    made = 0
    for name, images in files.items():
        (target / name).mkdir()
        for image in images:
            for repeat in range(repeats):
                (target / name / f"{image.stem}_r{repeat}{image.suffix}").symlink_to(image.resolve())
                made += 1
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the small set's class folders (e.g. .aid-dev/AID)")
    parser.add_argument("target", type=Path, help="a new folder for the real-size set's class folders")
    parser.add_argument("--min-train", type=int, default=10_000, help="training images per epoch, at least")
    parser.add_argument("--train-ratio", type=float, default=0.5, help="the dataset's train_ratio (AID: 0.5)")
    args = parser.parse_args()
    if not args.source.is_dir():
        print(f"real_size_set: {args.source} is not a folder of class folders")
        return 2
    if args.target.exists():
        print(f"real_size_set: {args.target} exists already: remove it or name a new folder")
        return 2
    made = build_real_size_set(args.source, args.target, args.min_train, args.train_ratio)
    print(f"real_size_set: {made} images in {args.target} ({int(made * args.train_ratio)} for training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
